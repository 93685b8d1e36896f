"""lablib's folders are layers: each module imports only from its own layer or the ones below it.

The layers, bottom to top (lablib/__init__.py's docstring and README.md list them with the reasons):
base (validate, stats, config, results.record, results.store) · models, workloads · mechanisms ·
hardware · engines · bench · results (compare, reference) · session · experiments · plots, widgets ·
report, cli. The test parses every module (no import needed), resolves each `import`/`from` of a
lablib module, including imports inside functions, and fails on any arrow that runs back up.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lablib"
LAYERS = [
    ("base", ["validate", "stats", "config", "results.record", "results.store"]),
    ("models", ["models", "workloads"]),
    ("mechanisms", ["mechanisms"]),
    ("hardware", ["hardware"]),
    ("engines", ["engines"]),
    ("bench", ["bench"]),
    ("results", ["results"]),
    ("session", ["session"]),
    ("experiments", ["experiments"]),
    ("presentation", ["plots", "widgets"]),
    ("top", ["report", "cli", "instructor"]),
]


def layer_of(module: str) -> int:
    """The layer of a dotted module under lablib ("results.store" → base; "results.reference" → results)."""
    best, rank = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > rank:
                best, rank = i, len(p)
    assert best is not None, f"lablib.{module} is in no layer: add it to LAYERS (and to the README's table)"
    return best


def modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        rel = f.relative_to(PKG).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:  # lablib/__init__.py itself re-exports lazily from every layer: exempt
            out[".".join(parts)] = f
    return out


def imports(module: str, path: Path) -> list[tuple[str, int]]:
    """Every lablib module `module` imports (relative imports resolved), with the line."""
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("lablib"):
                target = node.module[len("lablib."):] if node.module != "lablib" else ""
            else:
                continue
            names = [a.name for a in node.names]
            for n in names if node.module is None or not target else [None]:
                t = f"{target}.{n}" if n and target else (n or target)
                if t:
                    found.append((t, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("lablib."):
                    found.append((a.name[len("lablib."):], node.lineno))
    return found


def test_every_import_runs_down_the_layers():
    mods = modules()
    upward = []
    for name, path in sorted(mods.items()):
        mine = layer_of(name)
        for target, line in imports(name, path):
            if layer_of(target) > mine:
                upward.append(f"lablib/{path.relative_to(PKG)}:{line}: {name} ({LAYERS[mine][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def _resolve(target: str, mods: dict[str, Path]) -> str:
    """The module an import names: `experiments.speculative.loops` itself, or for a name imported from a module
    (`experiments.speculative.loops.greedy`) the module it comes from."""
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target


def import_graph() -> dict[str, set[str]]:
    """Every lablib module's lablib imports, inner (function-local) ones included, as module -> modules."""
    mods = modules()
    return {name: {t for t in (_resolve(x, mods) for x, _ in imports(name, path)) if t and t != name}
            for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere():
    """Within a layer and within a package too, function-local imports counted: a cycle hidden behind an import
    inside a function still breaks whichever module is imported first."""
    found = cycles(import_graph())
    assert not found, "import cycles (each line one cycle's modules):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle_through_an_inner_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_its_own_package_or_anothers_private_names():
    """A package's __init__ is its docstring: its modules import each other, never the package front; a helper
    two modules need is public in the lower one, never `from .x import _helper`."""
    mods, bad = modules(), []
    for name, path in sorted(mods.items()):
        pkg = name.rpartition(".")[0] if path.name != "__init__.py" else None
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private and (node.level or (node.module or "").startswith("lablib")):
                bad.append(f"lablib/{path.relative_to(PKG)}:{node.lineno}: imports private {private}")
            if pkg and node.level == 1 and node.module is None and path.name != "__init__.py":
                continue  # `from . import sibling`: a module, not the front
            if pkg and node.level == 1 and not node.module:
                bad.append(f"lablib/{path.relative_to(PKG)}:{node.lineno}: imports its own package's __init__")
    assert not bad, "\n".join(bad)


def test_the_walker_sees_relative_and_inner_imports(tmp_path):
    f = tmp_path / "offline.py"
    f.write_text("from ..engines.base import X\nfrom . import loadgen\ndef g():\n    from ...session import mode\n")
    got = [t for t, _ in imports("bench.offline", f)]
    assert sorted(got) == ["bench.loadgen", "engines.base", "session"]  # an import inside a function is an arrow too
    assert layer_of("session") > layer_of("bench.offline")


def test_every_module_is_in_a_layer_and_the_top_level_stays_small():
    for name in modules():
        layer_of(name)
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 8, f"lablib/ has {len(top)} top-level modules ({top}): put new ones in a layer folder"


BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked}:
            raise ImportError('blocked for this test: ' + name)
sys.meta_path.insert(0, Block())
import {module}
"""


def _imports_without(module: str, blocked: set[str]) -> subprocess.CompletedProcess:
    code = BLOCKER.format(blocked=sorted(blocked), module=module)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_light_modules_load_nothing_heavy():
    heavy = {"plotly", "ipywidgets", "anywidget", "torch", "transformers", "pandas", "numpy", "aiohttp"}
    for module in ("lablib", "lablib.mechanisms", "lablib.session", "lablib.engines.vllm_worker",
                   "lablib.engines.vllm", "lablib.bench.offline", "lablib.models", "lablib.hardware"):
        p = _imports_without(module, heavy)
        assert p.returncode == 0, f"import {module} needs one of {sorted(heavy)}:\n{p.stderr[-1500:]}"


def test_the_sse_stub_needs_only_the_standard_library():
    third_party = {"plotly", "ipywidgets", "torch", "numpy", "pandas", "aiohttp", "psutil", "pynvml", "prometheus_client",
                   "transformers", "tqdm"}
    p = _imports_without("lablib.bench.sse_stub", third_party)
    assert p.returncode == 0, p.stderr[-1500:]


def test_every_module_imports_first_in_a_fresh_interpreter():
    """An import cycle only shows when its module is imported first (lablib.experiments.speculative.synthetic once
    broke `lablab` that way while every test that had imported `speculative` before passed): each module is
    imported with no lablib module loaded, in one subprocess (third-party packages stay cached between them)."""
    import subprocess
    import sys

    names = sorted("lablib." + ".".join(p.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")
                   for p in PKG.rglob("*.py") if p.name != "__main__.py")  # __main__ runs its command
    script = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for name in {[n.removesuffix('.__init__') for n in names]!r}:\n"
        "    for m in [m for m in sys.modules if m == 'lablib' or m.startswith('lablib.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{name}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "", out.stdout


# What a function-local import may defer: a package whose import costs far more than lablib's own modules (measured
# on the CPU machine, a fresh interpreter: torch ~1 s, transformers ~0.9 s, nbformat/nbconvert/papermill 1-1.4 s,
# datasets 0.8 s, pandas 0.35 s, aiohttp 0.24 s, ipykernel/jupyter_client/ipywidgets/anywidget 0.1 s,
# prometheus_client 80 ms, IPython 75 ms, numpy 55 ms, asyncio 47 ms, tqdm 40 ms, urllib.request 29 ms, http.client
# 24 ms, llmcompressor 4 s), vLLM (it must never load in the notebook's process), and psutil and pynvml (~20 ms each,
# more than `import lablib.session` spends on its own; pynvml is also missing on a laptop, and the tests swap a fake
# one in sys.modules before the call). A dotted entry (urllib.request) is that module, not its package (urllib.parse
# is cheap and always loaded).
HEAVY = {"torch", "vllm", "transformers", "tokenizers", "huggingface_hub", "plotly", "pandas", "numpy", "llmcompressor",
         "safetensors", "datasets", "IPython", "ipywidgets", "anywidget", "ipykernel", "jupyter_client", "nbformat",
         "nbconvert", "papermill", "aiohttp", "prometheus_client", "tqdm", "psutil", "pynvml", "asyncio", "urllib.request",
         "http.client"}
# A function-local import a cycle forces, with its reason: none today.
LOCAL_FOR_A_CYCLE: dict[str, str] = {}


def _split_imports(module: str, path: Path) -> tuple[list[tuple[ast.AST, set[str], set[str]]], set[str], set[str]]:
    """(function-local import nodes with their lablib modules and other modules, the lablib modules and the other
    modules imported at module level). A submodule's parent packages count as imported at module level:
    importing it runs their __init__."""
    mods = modules()
    tree = ast.parse(path.read_text())
    inside = set()
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(n for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom)))
    local, top_lab, top_ext = [], set(), set()
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        lab, ext = set(), set()
        if isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("lablib"):
            ext.add(node.module)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("lablib."):
                    lab.add(_resolve(a.name[len("lablib."):], mods))
                else:
                    ext.add(a.name)
        else:
            if node.level:
                target = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module[len("lablib."):] if node.module != "lablib" else ""
            for a in node.names:
                name = f"{target}.{a.name}" if target else a.name
                lab.add(name if name in mods else _resolve(target, mods))
        lab.discard("")
        if node in inside:
            local.append((node, lab, ext))
        else:
            top_lab |= lab
            top_ext |= ext
    parts = module.split(".")
    top_lab |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in mods}
    top_lab.discard(module)
    return local, top_lab, top_ext


def _heavy(names: set[str]) -> set[str]:
    """The HEAVY entries among imported module names (`torch.nn` is torch; `urllib.parse` is not urllib.request)."""
    return {h for h in HEAVY for n in names if n == h or n.startswith(h + ".")}


def heavy_at_import() -> dict[str, set[str]]:
    """Each lablib module: the HEAVY packages importing it loads, through its module-level imports, transitively."""
    mods = modules()
    split = {name: _split_imports(name, path) for name, path in mods.items()}
    memo: dict[str, set[str]] = {}

    def walk(m: str, seen: set[str]) -> set[str]:
        if m in memo:
            return memo[m]
        seen.add(m)
        _, lab, ext = split[m]
        out = _heavy(ext)
        for t in lab - seen:
            out |= walk(t, seen)
        return out

    for m in mods:
        memo[m] = walk(m, set())
    return memo


def test_a_function_local_import_defers_a_heavy_module_and_says_so():
    """STYLE.md: a function-local import stays only where it defers a heavy package (HEAVY), itself or through a
    lablib module that imports one at module level, and its line says so (`# deferred: torch`). Everything else is
    imported at the top, where a reader sees a module's dependencies at once."""
    heavy, bad = heavy_at_import(), []
    for name, path in sorted(modules().items()):
        lines = path.read_text().splitlines()
        for node, lab, ext in _split_imports(name, path)[0]:
            where = f"lablib/{path.relative_to(PKG)}:{node.lineno}"
            deferred = _heavy(ext) | {h for t in lab for h in heavy.get(t, ())}
            if where in LOCAL_FOR_A_CYCLE:
                continue
            if not deferred:
                bad.append(f"{where}: `{lines[node.lineno - 1].strip()}` defers nothing heavy: import it at the top")
            elif "# deferred: " not in lines[node.lineno - 1]:
                bad.append(f"{where}: say what it defers: `# deferred: {', '.join(sorted(deferred))}`")
    assert not bad, "\n".join(bad)


def test_the_heavy_walk_follows_module_level_imports_only():
    heavy = heavy_at_import()
    assert heavy["plots.style"] >= {"plotly"} and "torch" in heavy["bench.attention"]
    assert not heavy["engines.vllm"] and not heavy["session"] and not heavy["experiments.speculative.lab"]


def _stated_order(doc: str) -> dict[str, float] | None:
    """A package docstring's order line ("Modules import one way ...: a < b < c; d after b.") as module -> rank."""
    m = re.search(r"import one way[^:]*:\s*(.+?)(?:\n\n|\Z)", doc, re.S)
    if not m:
        return None
    clauses = [c.strip(" .") for c in " ".join(m.group(1).split()).split(";")]
    rank = {name.strip(): float(i) for i, name in enumerate(clauses[0].split("<"))}
    for clause in clauses[1:]:
        late, _, after = clause.partition(" after ")
        rank[late.strip()] = rank[after.strip()] + 0.5  # a leaf placed after `after`: nothing imports it
    return rank


def test_each_lab_package_states_its_module_order_and_its_imports_keep_it():
    """A lab's package names every module once in its __init__ docstring, in an order its imports keep (function-local
    ones counted): a reader knows where to start, and the line cannot go stale unseen."""
    graph, bad = import_graph(), []
    for init in sorted((PKG / "experiments").glob("*/__init__.py")):
        pkg = "experiments." + init.parent.name
        rank = _stated_order(ast.get_docstring(ast.parse(init.read_text())) or "")
        members = {n.rpartition(".")[2] for n in graph if n.rpartition(".")[0] == pkg}
        if rank is None:
            bad.append(f"lablib/experiments/{init.parent.name}/__init__.py: no 'Modules import one way: a < b' line")
            continue
        if set(rank) != members:
            bad.append(f"{pkg}: the order line lists {sorted(rank)}, the package holds {sorted(members)}")
            continue
        for m in sorted(members):
            for d in sorted(graph[f"{pkg}.{m}"]):
                if d.rpartition(".")[0] == pkg and rank[d.rpartition(".")[2]] >= rank[m]:
                    bad.append(f"{pkg}.{m} imports {d}, stated after it")
    assert not bad, "\n".join(bad)


def test_the_order_line_parser_reads_chains_and_leaves():
    doc = "Lab 1.\n\nModules import one way, each only from those before it:\na < b <\nc; d after b.\n\n- `a`: ..."
    assert _stated_order(doc) == {"a": 0.0, "b": 1.0, "c": 2.0, "d": 1.5}
