"""Pack what scripts/record_reference.py brought back from the GPU into data/reference/.

    python scripts/pack_reference.py RUN_DIR [RUN_DIR ...] [--labs LAB_DIR ...]

The runs are merged onto what data/reference/ already holds (a step recorded again replaces
the old recording; facts are overlaid key by key, and lab 09's tp_scaling, recorded in parts over several
commands and machines, row by row: `overlay`), so one GPU session can add to the last.
Each RUN_DIR is a folder the GPU command wrote ($OUT): reference.jsonl (Results), facts-*.json
(engine start-up, VRAM, greedy agreement, the gpu_memory_utilization sweep) and
bench_throughput.json (`vllm bench throughput` on the same shapes). Each LAB_DIR is what
`scripts/gpu_session.sh labs` brought back (nbval.log and the notebooks' results/): the labs'
own live runs, which replace the previous ones as a whole, and the studies a lab ran live
(results/facts-KEY.json, `ResultStore.keep_facts`), each taken as facts[KEY]: that study's recording. Results are kept whole
except the generated token ids (not needed by any figure), times rounded to microseconds,
and gzipped; the README with the headline figures is generated from these files.
"""
from __future__ import annotations

import gzip
import io
import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "reference"
sys.path.insert(0, str(ROOT))


def _round(x):
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def existing() -> tuple[list[dict], dict]:
    """What data/reference/ holds now: the base every new run is merged onto (a run re-recorded replaces its step)."""
    results, facts = [], {}
    if (OUT / "h200.jsonl.gz").exists():
        with gzip.open(OUT / "h200.jsonl.gz", "rt", encoding="utf-8") as f:
            results = [json.loads(line) for line in f if line.strip()]
    if (OUT / "facts.json").exists():
        facts = {k: v for k, v in json.loads((OUT / "facts.json").read_text()).items() if k != "headline"}
    return results, facts


def overlay(facts: dict, new: dict) -> None:
    """`new`'s facts onto `facts`, key by key; tp_scaling's rows merged by (model, scheme, t, pp, all_reduce, batch)
    instead (lablib.experiments.parallel.grid.merge_scaling: its parts are recorded by different commands,
    on 2- and 4-GPU machines, and a part recorded again replaces only its own rows)."""
    from lablib.experiments.parallel.grid import SCALING, merge_scaling

    if SCALING in new:
        new = {**new, SCALING: merge_scaling(facts.get(SCALING), new[SCALING])}
    facts.update(new)


def _bench(path: Path) -> dict:
    """`vllm bench serve`'s detailed result as lablib keeps it (summary_of), plus the mean gap between its chunks."""
    from lablib.bench.vllm_bench import summary_of

    detailed = json.loads(path.read_text())
    gaps = [g for per_request in detailed.get("itls") or [] for g in per_request]
    return {**summary_of(detailed), "mean_itl_ms": sum(gaps) / len(gaps) * 1e3 if gaps else None}


def recompare(d: Path, facts: dict) -> None:
    """Redo a run's lab / `vllm bench serve` comparisons with today's compare_serve, from the raw files it brought
    back (the lab's Results and vLLM's detailed results), so every figure derived since the run is there too."""
    from lablib.results import ResultStore
    from lablib.bench.referee import agreement
    from lablib.bench.vllm_bench import compare_serve

    reread_backends(d, facts)
    if not (d / "reference.jsonl").exists():
        return
    runs = {r.step: r for r in ResultStore(d / "reference.jsonl").load()}
    serve = facts.get("serve") or {}
    found = sorted((d / "serve").glob("bench-serve-*rate-inf.json"))
    if found and "serve-rate-inf" in runs and serve.get("compare"):
        serve["compare"] = compare_serve(runs["serve-rate-inf"], _bench(found[0]))
    for key, sub, prefix in (("serve_check", "serve-check", ""), ("serve_check_embedded", "serve-check-embedded",
                                                                  "embedded-")):
        check = facts.get(key) or {}
        for i, old in enumerate(check.get("rounds", [])):
            found = sorted((d / sub / f"round{i}").glob("bench-serve-*rate-inf.json"))
            if found and f"{prefix}check{i}-rate-inf" in runs:
                check["rounds"][i] = {**compare_serve(runs[f"{prefix}check{i}-rate-inf"], _bench(found[0])),
                                      "lab_first": old.get("lab_first")}
        if check.get("rounds"):
            check["agreement"] = agreement(check["rounds"])


def reread_backends(d: Path, facts: dict) -> None:
    """The attention backend each forced-backend engine of the `attention` step ran, read again from the vLLM
    worker logs the run brought back (lablib.engines.vllm_worker.attention_backends): the first sweep's parser
    missed the wording vLLM uses when `attention_backend` forces one, so its rows said 'unknown'."""
    from lablib.engines.vllm_worker import attention_backends

    rows = ((facts.get("attention") or {}).get("vllm_backends") or {}).get("rows") or []
    ran = {}
    for f in sorted(d.glob("lablib-vllm-*.log")):
        log = f.read_text(errors="replace")
        forced, chose = re.findall(r"'attention_backend': '(\w+)'", log), attention_backends(log)
        if forced and chose:
            ran[forced[0]] = chose[-1]
    for row in rows:
        if row.get("ran") in (None, "unknown") and row["backend"] in ran:
            row["ran"] = ran[row["backend"]]


def nbval_summary(log: str) -> dict[str, str]:
    """Notebook → "N of M cells passed" (and which failed) from a `pytest --nbval -v` log."""
    cells: dict[str, dict[int, str]] = {}
    for nb, cell, outcome in re.findall(r"labs/(\w+)::ipynb::Cell (\d+) (PASSED|FAILED)", log):
        cells.setdefault(nb, {})[int(cell)] = outcome
    out = {}
    for nb, c in cells.items():
        failed = [k for k, v in sorted(c.items()) if v == "FAILED"]
        out[nb] = f"{len(c) - len(failed)} of {len(c)} cells passed" + (f" (failed: cell {', '.join(map(str, failed))})"
                                                                        if failed else "")
    return out


def nbval_seconds(log: str) -> dict[str, float]:
    """Notebook → its cells' wall time (s) from the `--durations=0` table of a `pytest --nbval -v` log: each cell's
    setup, call and teardown summed (what a live lab costs an attendee, engine starts included)."""
    out: dict[str, float] = {}
    for secs, nb in re.findall(r"([\d.]+)s (?:call|setup|teardown)\s+labs/(\w+)(?:\.ipynb|::ipynb)::Cell \d+", log):
        out[nb] = out.get(nb, 0.0) + float(secs)
    return out


def cut_short(notebook: str, line: str) -> str:
    """" (...cut short)" where the log reported fewer cells than the notebook has code cells (the run hit its time
    limit: the cell it stopped in has no duration, so the seconds are a floor), else ""."""
    path = ROOT / "labs" / f"{notebook}.ipynb"
    got = re.search(r"of (\d+) cells", line)
    if not path.exists() or not got:
        return ""
    cells = sum(c.get("cell_type") == "code" for c in json.loads(path.read_text())["cells"])
    ran = int(got.group(1))
    return f" over the {ran} of {cells} cells that ran (cut short: at least that)" if ran < cells else ""


def lab_runs(dirs: list[Path], old: dict | None = None) -> dict:
    """The labs' own live runs on the GPU: nbval outcome per notebook, every live Result's figures, the journey
    ratio and serving capacity of lab 03, and its cross-check against `vllm bench serve`.

    Merged onto `old` (what data/reference/ holds) notebook by notebook: a notebook run again replaces its nbval
    line and its rows (rows belong to the notebook whose results/NOTEBOOK.jsonl held them); the others stay, and so
    do the derived figures a new run does not provide.
    """
    from lablib.results import Result, ResultStore
    from lablib.bench.vllm_bench import compare_serve

    out = {k: v for k, v in (old or {}).items()}
    nbval: dict[str, str] = {}
    seconds: dict[str, float] = {}  # each notebook's live wall time, where the log has pytest's durations
    runs: dict[tuple[str, str], tuple[str, Result]] = {}
    bench = None
    old_date = re.search(r"\d{4}-\d\d-\d\d$", out.get("what", ""))  # the date the earlier runs were all made
    out["nbval"] = {nb: v if " on 20" in v or not old_date else f"{v} on {old_date.group()}"
                    for nb, v in out.get("nbval", {}).items()}
    for d in dirs:
        if (d / "nbval.log").exists():
            log = d / "nbval.log"
            day = datetime.fromtimestamp(log.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d")  # when it ended
            text = log.read_text(errors="replace")
            nbval.update({nb: f"{v} on {day}" for nb, v in nbval_summary(text).items()})
            seconds.update(nbval_seconds(text))
        for f in sorted((d / "results").glob("*.jsonl")):
            for r in ResultStore(f).load():
                if r.provenance == "live":
                    runs[(f.stem, r.step)] = (f.stem, r)  # the later directory's run of a step replaces the earlier
        for f in sorted((d / "results" / "serve").glob("bench-serve-*rate-inf.json")):
            bench = _bench(f)
    notebooks = {nb for nb, _ in runs} | set(nbval)
    rows = [r for r in out.get("rows", []) if r.get("notebook") not in notebooks]
    rows += [{"notebook": nb, "lab": r.lab, "step": r.step, "requests": r.summary["requests"],
              "output_tok_s": r.summary["output_tok_s"], "ttft_p50_s": r.summary["ttft_s"]["p50"],
              "ttft_p99_s": r.summary["ttft_s"]["p99"], "tpot_p50_s": r.summary["tpot_s"]["p50"]}
             for nb, r in runs.values()]
    out["rows"] = rows
    out["nbval"] = {**out.get("nbval", {}), **nbval}
    # a notebook run again replaces its time, or drops one its new log does not give
    out["nbval_seconds"] = {**{k: v for k, v in out.get("nbval_seconds", {}).items() if k not in nbval}, **seconds}
    if runs:
        first = min((r for _, r in runs.values()), key=lambda r: r.recorded_at)
        out["what"] = (f"the labs executed under nbval on the {first.hardware.get('gpu') or 'GPU'} with live vLLM "
                       f"(each line says when; the rows are those runs' Results)")
    by_step = {r.step: r for _, r in runs.values()}
    if "vllm-embedded-journey" in by_step and "hf-static-b64-embedded-journey" in by_step:
        out["embedded_journey_ratio_vllm_over_hf_static_b64"] = (
            by_step["vllm-embedded-journey"].summary["output_tok_s"]
            / by_step["hf-static-b64-embedded-journey"].summary["output_tok_s"])
    if "serve-rate-inf" in by_step:
        burst = by_step["serve-rate-inf"]
        out["serve_capacity_rps"] = burst.summary["requests_s"]
        if bench is not None:
            out["serve_compare"] = compare_serve(burst, bench)
            # the same mean as vLLM's: over every gap between chunks
            out["serve_compare"]["mean_itl_ms"] = {"lab": out["serve_compare"]["client"]["client_itl_ms"],
                                                   "vllm_bench": bench["mean_itl_ms"]}
            out["serve_compare"]["duration_s"] = {"lab": burst.wall_s, "vllm_bench": bench.get("duration")}
    return out


def lab_facts(dirs: list[Path]) -> tuple[dict, dict, list[dict]]:
    """The studies the labs ran live (results/facts-KEY.json, written by `ResultStore.keep_facts`): facts[KEY] each,
    the later folder's replacing the earlier's; the day each was recorded (its own "date", else the file's); and
    the live Results of the steps its rows name, as recorded Results (what the recording step would have stored:
    the journey's recorded rungs read them by step)."""
    from lablib.results import ResultStore

    kept: dict = {}
    dates: dict = {}
    results: list[dict] = []
    for d in dirs:
        for f in sorted((d / "results").glob("facts-*.json")):
            key = f.stem.removeprefix("facts-")
            kept[key] = json.loads(f.read_text())
            dates[key] = kept[key].get("date") or datetime.fromtimestamp(f.stat().st_mtime,
                                                                          timezone.utc).strftime("%Y-%m-%d")
            rows = kept[key].get("rows", []) if isinstance(kept[key], dict) else []
            # the Results these rows were made from: their step and, where the row says it, the moment it was recorded
            # (results/ outlives a run on a warm machine: another run of the same step may sit in the same file)
            wanted = {(r["step"], r.get("recorded_at")) for r in rows if isinstance(r, dict) and r.get("step")}
            by_step: dict[str, dict] = {}  # one Result per step: the last one in file order that matches
            for store in sorted((d / "results").glob("*.jsonl")):
                for r in ResultStore(store).load():
                    if r.provenance == "live" and ((r.step, r.recorded_at) in wanted or (r.step, None) in wanted):
                        row = {**r.to_dict(), "provenance": "recorded"}
                        for q in row["requests"]:
                            q["output_ids"] = None
                        by_step[r.step] = _round(row)
            results += by_step.values()
    return kept, dates, results


def newer_than_packed(kept: dict, dates: dict, results: list[dict], packed: dict) -> tuple[dict, dict, list[dict]]:
    """`lab_facts`'s studies without those older than the recording of the same key already packed (`packed`:
    key -> day): an old lab folder packed again never rolls a recording back."""
    older = {k for k in kept if dates[k] < packed.get(k, "")}
    if older:
        print(f"pack_reference: {sorted(older)} kept by a lab older than the recordings packed already: not taken")
    steps = {r.get("step") for k in older for r in kept[k].get("rows", []) if isinstance(r, dict)}
    return ({k: v for k, v in kept.items() if k not in older}, {k: d for k, d in dates.items() if k not in older},
            [r for r in results if r["step"] not in steps])


def main(dirs: list[Path], labs: list[Path] | None = None) -> None:
    results, facts = existing()
    if labs:
        facts["lab_runs"] = lab_runs(labs, facts.get("lab_runs"))
        kept, dates, lab_results = newer_than_packed(*lab_facts(labs), facts.get("recorded_dates", {}))
        overlay(facts, kept)
        facts["recorded_dates"] = {**facts.get("recorded_dates", {}), **dates}
    if labs:
        results += lab_results  # after the old ones: a step recorded again replaces its earlier recording
    n_old = len(results)
    for d in dirs:
        day = None  # the run's last day: the day its facts keys were recorded (a key recorded again takes it)
        if (d / "reference.jsonl").exists():
            for line in (d / "reference.jsonl").read_text().splitlines():
                r = json.loads(line)
                for q in r["requests"]:
                    q["output_ids"] = None
                results.append(_round(r))
                day = max(day or "", r["recorded_at"][:10])
        for f in sorted(d.glob("facts-*.json")):
            new = {k: v for k, v in json.loads(f.read_text()).items() if k != "step_seconds"}
            if day:
                facts["recorded_dates"] = {**facts.get("recorded_dates", {}), **{k: day for k in new}}
            if "scheduler_sweep" in new:  # rows of one engine each: a new run adds settings, replaces the same ones
                key = lambda r: (r["max_num_seqs"], r.get("max_num_batched_tokens"))  # noqa: E731
                merged = {key(r): r for r in facts.get("scheduler_sweep", []) + new["scheduler_sweep"]}
                new["scheduler_sweep"] = sorted(merged.values(), key=lambda r: (key(r)[0], key(r)[1] or 0))
            overlay(facts, new)
        if (d / "bench_throughput.json").exists():
            facts["vllm_bench_throughput"] = json.loads((d / "bench_throughput.json").read_text())
        recompare(d, facts)
    if any(r["step"].startswith("serve-rate-") for r in results[n_old:]):  # a new rate sweep replaces the old whole
        results = [r for i, r in enumerate(results) if i >= n_old or not r["step"].startswith("serve-rate-")]
    by_step = {r["step"]: r for r in results}  # a later recording of a step replaces an earlier one
    OUT.mkdir(parents=True, exist_ok=True)
    with io.TextIOWrapper(gzip.GzipFile(OUT / "h200.jsonl.gz", "wb", mtime=0), encoding="utf-8") as f:  # reproducible bytes
        for r in by_step.values():
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    s = {k: v["summary"] for k, v in by_step.items()}
    first = next(iter(by_step.values()))
    head = {
        "gpu": first["hardware"].get("gpu"), "driver": first["hardware"].get("driver_version"),
        "versions": first["versions"], "date": first["recorded_at"][:10],
        "last_date": max(r["recorded_at"][:10] for r in by_step.values()),
    }
    if "vllm-8b-journey" in s and "hf-static-b64-8b-journey" in s:
        head["journey_ratio"] = s["vllm-8b-journey"]["output_tok_s"] / s["hf-static-b64-8b-journey"]["output_tok_s"]
    if "vllm-8b-single" in by_step:
        head["single_stream_mbu"] = by_step["vllm-8b-single"]["roofline"].get("mbu")
        head["single_stream_tok_s"] = s["vllm-8b-single"]["output_tok_s"]
    bench = facts.get("vllm_bench_throughput")
    if bench and "vllm-8b-256x128x128" in s:
        head["lab_over_vllm_bench_total_tok_s"] = s["vllm-8b-256x128x128"]["total_tok_s"] / bench["tokens_per_second"]
        head["lab_over_vllm_bench_requests_s"] = s["vllm-8b-256x128x128"]["requests_s"] / bench["requests_per_second"]
    if "serve" in facts:
        head["serve_capacity_rps"] = facts["serve"].get("capacity_rps")
        fig = (facts["serve"].get("compare") or {}).get("figures", {})
        head["lab_over_vllm_bench_serve_output_tok_s"] = (fig.get("output_tok_s") or {}).get("ratio")
    facts["headline"] = head
    facts = _round(facts)  # the README is rendered from exactly what facts.json keeps
    (OUT / "facts.json").write_text(json.dumps(facts, indent=1))
    write_readme(by_step, facts)
    print(json.dumps(head, indent=1))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _check_text(check: dict, what: str) -> str:
    """The README section of one repeated cross-check (lablib.experiments.serving.runs.cross_check): a row per round, the spread."""
    rounds = check.get("rounds", [])
    if not rounds:
        return ""
    rows = "\n".join(
        f"| {i} | {'lab' if r.get('lab_first') else 'vllm bench serve'} | {r['figures']['output_tok_s']['lab']:,.0f} | "
        f"{r['figures']['output_tok_s']['vllm_bench']:,.0f} | {r['figures']['output_tok_s']['ratio']:.3f} | "
        f"{r['figures']['ttft_p50_ms']['lab']:,.0f} | {r['figures']['ttft_p50_ms']['vllm_bench']:,.0f} | "
        f"{_pct((r.get('clumped') or {}).get('lab'))} | {_pct((r.get('clumped') or {}).get('vllm_bench'))} | "
        f"{(r.get('client') or {}).get('lag') or float('nan'):.2f} |"
        for i, r in enumerate(rounds))
    first_slower = sum(1 for r in rounds if (r["figures"]["ttft_p50_ms"]["lab"] > r["figures"]["ttft_p50_ms"]["vllm_bench"])
                       == bool(r.get("lab_first")))
    return f"""
### Repeated cross-check, {what}: {len(rounds)} rounds on one server, the first client alternating

| round | first | lab output tok/s | vLLM output tok/s | lab / vLLM | lab TTFT p50 ms | vLLM TTFT p50 ms | token events read in clumps, lab | same, vLLM | lab client lag |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

{(check.get("agreement") or {}).get("verdict", "")} (spread: (max - min) / mean over its rounds,
`lablib.bench.referee.agreement`). In {first_slower} of {len(rounds)} rounds the client that went first saw the higher
median TTFT, whichever it was. A single burst settles no gap of a few percent. (Lab client lag: its mean request
latency over the API server's, or the engine's in runs that predate reading the HTTP histogram,
`lablib.bench.client.client_check`; nan where the run predates the check.)
"""


def advisor_section(facts: dict) -> str:
    """Lab 10's advisor checked under its own load: each goal served on the GPU, measured, set against what the
    advisor's model (the lablib packing this) predicts for the same engine and arrivals (`check.compared`)."""
    got = facts.get("advisor_check")
    if not got:
        return ""
    from lablib.experiments.advisor.check import compared
    from lablib.experiments.advisor.record import GOALS

    lines = []
    for name, g in got["goals"].items():
        if "measured" not in g or name not in GOALS:
            lines.append(f"| {name} | {g.get('error', 'not measured')} | | | | | |")
            continue
        c, a = compared(GOALS[name], g), g["advice"]
        p90 = next(r for r in c["rows"] if r["figure"] == "TPOT" and r["percentile"] == "p90")
        lines.append(f"| {name} | {a['scheme']}, max_num_seqs {a['max_num_seqs']}, TP={a['t']} | {g['rate_rps']:.2f} "
                     f"| {p90['measured_ms'] or 0:.2f} | {p90['predicted_ms'] or 0:.2f} "
                     f"| {'no figure' if p90['error'] is None else format(p90['error'], '+.1%')} "
                     f"| {(g.get('goodput') or {}).get('attainment', float('nan')):.1%} |")
    return ("## The advisor under its own load (lab 10, `advisor-check`: synthetic 8B, vLLM's OpenAI server, Poisson "
            f"arrivals)\n\nRecorded on {got.get('gpu')}, {got.get('date')}. Predicted: the advisor's model as packed "
            "here, for the engine and arrivals served; the aim is TPOT p90 within 10%.\n\n"
            "| goal | served | rate req/s | TPOT p90 measured ms | predicted ms | error | met the TPOT target |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(lines))


def write_readme(by_step: dict, facts: dict) -> None:
    h = facts["headline"]
    rows = "\n".join(
        f"| `{k}` | {v['engine']} | {v['model'].get('name')} | {v['workload']['name']} ({v['workload']['requests']}) | "
        f"{v['summary']['output_tok_s']:,.1f} | {v['summary']['total_tok_s']:,.1f} | "
        f"{(v['summary']['ttft_s']['p50'] or 0) * 1e3:,.1f} | {v['roofline'].get('mbu') if isinstance(v['roofline'].get('mbu'), str) else round(v['roofline'].get('mbu') or 0, 3)} |"
        for k, v in by_step.items())
    sweep = "\n".join(
        f"| {r['gpu_memory_utilization']} | {r['kv_tokens']:,} | {r['max_concurrency']:,.0f} | {r['output_tok_s']:,.0f} | "
        f"{r['vram_before_bytes'] / 2**20:,.0f} | {r['vram_after_close_bytes'] / 2**20:,.0f} | {r['back_to_baseline']} |"
        for r in facts.get("sweep", []))
    knobs = "\n".join(
        f"| {r['max_num_seqs']} | {r.get('max_num_batched_tokens') or 'default'} | {r['output_tok_s']:,.0f} | "
        f"{(r['ttft_p99_s'] or 0) * 1e3:,.0f} | {(r['tpot_p50_s'] or 0) * 1e3:,.1f} | {r['kv_tokens']:,} | "
        f"{r['back_to_baseline']} |" for r in facts.get("scheduler_sweep", []))
    serve_rows = "\n".join(
        f"| {v['config']['rate']:g} | {v['summary']['requests']} | {v['summary']['output_tok_s']:,.0f} | "
        + " | ".join(f"{(v['summary'][k][q] or 0) * 1e3:,.1f}" for k in ("ttft_s", "tpot_s", "itl_s") for q in ("p50", "p99"))
        + f" | {len(v['notes'])} |"
        for v in sorted((v for k, v in by_step.items() if k.startswith("serve-rate-")), key=lambda v: v["config"]["rate"]))
    serve = facts.get("serve", {})
    compare = "\n".join(
        f"| {k} | {v['lab']:,.3f} | {v['vllm_bench']:,.3f} | {v['ratio']:.3f} |"
        for k, v in (serve.get("compare") or {}).get("figures", {}).items() if v.get("ratio") is not None)
    lab = facts.get("lab_runs", {})
    lab_rows = "\n".join(
        f"| {r.get('lab', '')} | `{r['step']}` | {r['requests']} | {r['output_tok_s']:,.0f} | {(r['ttft_p50_s'] or 0) * 1e3:,.1f} | "
        f"{(r['ttft_p99_s'] or 0) * 1e3:,.1f} | {(r['tpot_p50_s'] or 0) * 1e3:,.2f} |" for r in lab.get("rows", []))
    wall = lab.get("nbval_seconds", {})
    lab_nbval = "\n".join(f"- `{k}`: {v}" + (f", {wall[k]:,.0f} s live{cut_short(k, v)}" if k in wall else "")
                          + ("" if (ROOT / "labs" / f"{k}.ipynb").exists() else
                             " (a name from the labs' earlier numbering)")
                          for k, v in lab.get("nbval", {}).items())
    lab_cmp = "\n".join(
        f"| {k} | {v['lab']:,.3f} | {v['vllm_bench']:,.3f} | {v['ratio']:.3f} |"
        for k, v in (lab.get("serve_compare") or {}).get("figures", {}).items() if v.get("ratio") is not None)
    advisor_text = advisor_section(facts)
    check_text = "".join(_check_text(facts[key], what) for key, what in (
        ("serve_check", "the synthetic 8B"), ("serve_check_embedded", "the embedded model")) if facts.get(key))
    client = (serve.get("compare") or {}).get("client") or {}
    clumped = (serve.get("compare") or {}).get("clumped") or {}
    client_text = (f"The lab's client ({client['library']}): {client['verdict']}." if client.get("lag") else
                   f"The lab's client then was httpx, which costs 4-10x the CPU per token of aiohttp "
                   f"(`scripts/client_overhead.py`). It read {_pct(clumped.get('lab'))} of its token events in clumps, "
                   f"two or more in one read, which a client does only when events waited for it; vLLM's client "
                   f"{_pct(clumped.get('vllm_bench'))}. The lab now uses aiohttp, as `vllm bench serve` does, and compares "
                   f"its request latency with the server's own (`lablib.bench.client.client_check`); these runs predate both.")
    served = sorted((v for k, v in by_step.items() if k.startswith("serve-rate-")), key=lambda v: v["config"]["rate"])
    finite = [v for v in served if v["config"]["rate"] != float("inf")]
    burst_tok = next((v["summary"]["output_tok_s"] for v in served if v["config"]["rate"] == float("inf")), None)
    top = finite[-1] if finite else None
    sweep_text = "" if not (top and burst_tok) else (
        f"A test of 256 requests at an offered rate r cannot deliver more than r times the tokens per request, and "
        f"its last requests drain after the arrivals stop; at the highest rate, {top['config']['rate']:g} req/s, "
        f"throughput reached {top['summary']['output_tok_s']:,.0f} output tok/s against the burst's {burst_tok:,.0f}.")
    lab_fig = (lab.get("serve_compare") or {}).get("figures", {}).get("output_tok_s") or {}
    itl = (lab.get("serve_compare") or {}).get("mean_itl_ms") or {}
    dur = (lab.get("serve_compare") or {}).get("duration_s") or {}
    lab_clumped = (lab.get("serve_compare") or {}).get("clumped") or {}
    lab_text = "" if not lab_fig.get("ratio") or 0.9 < lab_fig["ratio"] < 1.1 else (
        f"At {lab_fig['ratio']:.2f} this is outside lab 03's own check (0.9-1.1), the run's one failed cell. The evidence "
        f"points at the lab's client of then (httpx): it read {_pct(lab_clumped.get('lab'))} of its token events in "
        f"clumps, vLLM's client {_pct(lab_clumped.get('vllm_bench'))}, so it was reading a backlog, and its last tokens, "
        f"which end the burst, came late: the lab's burst lasted {dur.get('lab') or 0:.2f} s, vLLM's "
        f"{dur.get('vllm_bench') or 0:.2f} s. The mean gap between chunks still looked the same "
        f"({itl.get('lab') or 0:.1f} ms in the lab, {itl.get('vllm_bench') or 0:.1f} ms in vLLM's): a backlogged client "
        f"reads some tokens late and the next ones at once. Since then the lab's client is aiohttp, the server is warmed "
        f"with the whole workload before the first measurement (the lab's burst here was the server's first full batch), "
        f"and the lab checks its client against the server's own latencies; none of that has run on the GPU yet.")
    cold, warm = facts.get("cold_start", {}), facts.get("warm_start", {})
    big = facts.get("big_start", {})
    g = facts.get("greedy_agreement", {})
    text = f"""# Reference runs recorded on the GPU

Generated by `scripts/pack_reference.py` from what `scripts/record_reference.py` measured; do not edit by hand.
The labs show these on machines without a GPU, each labelled *recorded on {h['gpu']}, {h['date']}*.

- GPU: {h['gpu']}, driver {h['driver']}; vLLM {h['versions'].get('vllm')}, torch {h['versions'].get('torch')},
  transformers {h['versions'].get('transformers')}, Python {h['versions'].get('python')}; recorded {h['date']}.
- Models: the embedded target (`data/models/target`) and a synthetic Llama-3.1-8B (random weights of the real
  architecture; *synthetic weights: speed and memory are real, the text is not*), bf16.
- Protocol: `lablib.bench.run` (one warm-up request, greedy, `ignore_eos`, exact output lengths); every request
  arrives at t=0 (offline).

## Headline figures

| figure | value |
| --- | --- |
| journey ratio: vLLM / HF static batching (b=64), synthetic 8B, journey workload, output tok/s | {h.get('journey_ratio', 0):.1f}x |
| single-stream decode, synthetic 8B, 128 in / 512 out | {h.get('single_stream_tok_s', 0):.0f} tok/s, MBU {h.get('single_stream_mbu', 0):.2f} |
| lab throughput / `vllm bench throughput` (256 × 128 in / 128 out, total tok/s) | {h.get('lab_over_vllm_bench_total_tok_s', 0):.3f} |
| lab / `vllm bench throughput` (requests/s) | {h.get('lab_over_vllm_bench_requests_s', 0):.3f} |
| engine start, embedded model: cold (first on the machine) / warm | {cold.get('startup_s', 0):.1f} s / {warm.get('startup_s', 0):.1f} s in `LLM(...)`; {cold.get('startup_wall_s', 0):.1f} s / {warm.get('startup_wall_s', 0):.1f} s with the worker's spawn and imports |
| engine start, synthetic 8B (cold compile for its shape) | {big.get('startup_s', 0):.1f} s in `LLM(...)`, {big.get('startup_wall_s', 0):.1f} s wall; KV capacity {big.get('kv_tokens', 0):,} tokens, {big.get('max_concurrency', 0):.0f} concurrent 4k-token sequences, backend {big.get('attention_backend')} |
| online serving capacity, synthetic 8B, OpenAI server, 256 journey requests at once | {h.get('serve_capacity_rps') or 0:.1f} requests/s |
| lab's client / `vllm bench serve`, same server and requests, output tok/s | {h.get('lab_over_vllm_bench_serve_output_tok_s') or 0:.3f} (see below) |
| greedy tokens, HF (bf16) vs vLLM (bf16), embedded model, 16 journey requests | {g.get('identical_requests')} of {g.get('of')} identical; {g.get('mean_matching_prefix_fraction', 0):.2f} of tokens before the first divergence |

## Every recorded run

| step | engine | model | workload (requests) | output tok/s | total tok/s | TTFT p50 ms | MBU |
| --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

## gpu_memory_utilization sweep (embedded model, `enforce_eager=True`, journey workload): VRAM after each engine

| gpu_memory_utilization | KV tokens | max concurrency (2k seqs) | output tok/s | VRAM before start, MiB | VRAM after close, MiB | back to baseline |
| --- | --- | --- | --- | --- | --- | --- |
{sweep}

Throughput here is the tiny embedded model in eager mode, where the engine's CPU-side work, not the GPU,
sets the pace; it varies between runs and is not a lesson about `gpu_memory_utilization`. The KV capacity
column is: it grows linearly with the budget.

## Scheduler knobs (synthetic 8B, journey workload, every request at t=0, `max_model_len=4096`): one engine each

| max_num_seqs | max_num_batched_tokens | output tok/s | TTFT p99 ms | TPOT p50 ms | KV tokens | VRAM back to baseline |
| --- | --- | --- | --- | --- | --- | --- |
{knobs}

{facts.get('scheduler_sweep_note', '').capitalize()}.

## Online serving (synthetic 8B, vLLM's OpenAI server, the journey 4 times over = 256 requests, prefix caching off)

Rates are fractions of the capacity measured by the first test (every request at once, rate=inf):
{serve.get('capacity_rps') or 0:.2f} requests/s. The server started in {(serve.get('server') or {}).get('startup_s') or 0:.1f} s
(`gpu_memory_utilization={(serve.get('server') or {}).get('gpu_memory_utilization')}`). Latencies in ms.

| offered rate (req/s) | requests | output tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | ITL p50 | ITL p99 | failed |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{serve_rows}

### Cross-check: the lab's client vs `vllm bench serve`, same server, same 256 requests, all at once

| figure | lab | vllm bench serve | lab / vLLM |
| --- | --- | --- | --- |
{compare}

A burst lasts about 5 s and its throughput is set by when its longest requests end, so single bursts scatter
(the rounds below). TTFT differs by definition: the lab counts from the moment a request was due (the burst's
start), `vllm bench serve` from when its client sent each request; `ttft_from_send_p50_ms` counts the lab's the
same way as vLLM's. {client_text}

{sweep_text}

{check_text}

{advisor_text}

## The labs themselves on the H200 (nbval, live vLLM; the embedded model unless a step names a synthetic shape)

{lab.get('what', '')}:
{lab_nbval}

| lab | step | requests | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms |
| --- | --- | --- | --- | --- | --- | --- |
{lab_rows}

Journey ratio on the embedded model, vLLM / HF static b=64: {lab.get('embedded_journey_ratio_vllm_over_hf_static_b64') or 0:.1f}x.
Serving capacity (256 requests at once): {lab.get('serve_capacity_rps') or 0:.1f} requests/s. Cross-check at rate=inf:

| figure | lab | vllm bench serve | lab / vLLM |
| --- | --- | --- | --- |
{lab_cmp}

{lab_text}
"""
    # The notes written by hand under the marker (the log of GPU sessions) survive a re-pack: the generated part
    # above is replaced, the marker and everything after it are kept as they are.
    marker = "<!-- Written by hand below this line: pack_reference.py keeps it. -->"
    old = (OUT / "README.md").read_text() if (OUT / "README.md").exists() else ""
    kept = old[old.index(marker):] if marker in old else ""
    (OUT / "README.md").write_text(text + kept)


if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--labs") if "--labs" in args else len(args)
    main([Path(p) for p in args[:cut]], [Path(p) for p in args[cut + 1:]])
