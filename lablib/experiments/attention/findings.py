"""Lab 02's findings: the IO model's prediction, and what each measurement of `experiments.attention` says.

Nothing here runs a kernel or an engine. `prediction` is `mechanisms.attention.predict` per sequence (batch 1)
at the microbenchmark's shape (hidden 2048, causal), `prediction_summary` its log-log slopes and speedups,
`describe_prediction` the same in sentences; `with_prediction` puts the IO model's rows beside a sweep that
ran on an H200. The readers take the `Shown` a measurement returned (`rows_of`, `table`, `speedups`,
`describe_here`), the claims take its value (Checks.live passes the value), and `observations` is the
"What you should see" cell: this run's numbers, each with where it was measured.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ... import validate
from ...bench.attention import TILED
from ...mechanisms.attention import (
    H200,
    AttentionShape,
    Gpu,
    loglog_slopes,
    naive_traffic,
    predict,
)
from ...session import Shown

PREDICT_LENS = tuple(2**i for i in range(8, 17))  # 256 .. 65536, the microbenchmark's lengths


def prediction(seq_lens: Sequence[int] = PREDICT_LENS, head_dim: int = 128, *, hidden: int = 2048, causal: bool = True,
               element_bytes: int = 2, gpu: Gpu = H200) -> list[dict[str, Any]]:
    """The IO model per sequence (batch 1) at the microbenchmark's shape: one dict per length (PredictionRow's fields)."""
    validate.integer("prediction", "hidden", hidden, "pass the model width, e.g. 2048.")
    validate.integer("prediction", "head_dim", head_dim, "pass the head dim, e.g. 64 or 128.")
    if hidden % head_dim:
        raise validate.refuse("prediction", "head_dim", head_dim, f"a divisor of hidden={hidden}", "e.g. 64 or 128.")
    rows = predict(seq_lens, head_dim, heads=hidden // head_dim, causal=causal, element_bytes=element_bytes, gpu=gpu)
    return [dataclasses.asdict(r) | {"head_dim": head_dim, "heads": hidden // head_dim, "causal": causal,
                                     "gpu": gpu.name, "sram_bytes": gpu.sram_bytes,
                                     "ridge": gpu.peak_flops / gpu.hbm_bandwidth} for r in rows]


SLOPED = ("naive_bytes", "flash_bytes", "naive_extra_bytes", "flash_extra_bytes", "naive_time_s", "flash_time_s", "flops")


def prediction_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Log-log slopes between the two longest lengths, the speedup and bytes ratio at each end, the bounds."""
    ns, first, last = [r["n"] for r in rows], rows[0], rows[-1]
    slopes = {k: loglog_slopes(ns, [r[k] for r in rows])[-1] for k in SLOPED}
    return {"gpu": last["gpu"], "head_dim": last["head_dim"], "n_min": first["n"], "n_max": last["n"], "slopes": slopes,
            "speedups": [r["speedup"] for r in rows], "bytes_ratio_max": last["bytes_ratio"],
            "naive_bound": last["naive_bound"], "flash_bound": last["flash_bound"],
            "naive_intensity": last["naive_intensity"], "flash_intensity": last["flash_intensity"],
            "ridge": last["ridge"]}


def describe_prediction(s: dict[str, Any]) -> str:
    """The summary in sentences, every number from it."""
    sl = s["slopes"]
    return "\n".join([
        f"IO model, {s['gpu']}, d = {s['head_dim']}, N = {s['n_min']:,} .. {s['n_max']:,} (log-log slopes at the top):",
        (f"  HBM bytes: naive {sl['naive_bytes']:.3f}, flash (FA2) {sl['flash_bytes']:.3f}; both ~N^2, flash "
        f"{s['bytes_ratio_max']:.2f}x fewer at N = {s['n_max']:,}"),
        f"  extra memory: naive (S and P) {sl['naive_extra_bytes']:.3f}, flash (logsumexp) {sl['flash_extra_bytes']:.3f}",
        f"  FLOPs {sl['flops']:.3f}; predicted time: naive {sl['naive_time_s']:.3f}, flash {sl['flash_time_s']:.3f}",
        (f"  bound at the top: naive {s['naive_bound']} ({s['naive_intensity']:.0f} FLOP/byte), flash "
        f"{s['flash_bound']} ({s['flash_intensity']:.0f}); the ridge is {s['ridge']:.0f} FLOP/byte"),
        (f"  predicted speedup: {s['speedups'][0]:.2f}x at N = {s['n_min']:,} to {s['speedups'][-1]:.2f}x at "
        f"N = {s['n_max']:,}")])


def with_prediction(value: dict[str, Any]) -> dict[str, Any]:
    """value plus "prediction" {head_dim: rows} for its prefill shapes when it ran on an H200 in bf16, else a note why not."""
    prov, cfg = value["provenance"], value["provenance"]["config"]
    if "H200" not in str(prov.get("device")) or cfg["dtype"] != "bf16":
        return value | {"prediction": None, "prediction_note": f"no IO-model line: the model's peaks are the H200's, "
                        f"this ran on {prov.get('device')} in {cfg['dtype']}"}
    return value | {"prediction": {d: prediction(cfg["seq_lens"], d, hidden=cfg["hidden"], causal=cfg["causal"])
                                   for d in cfg["head_dims"]}, "prediction_note": None}


# --- reading a measurement (a Shown: rows and provenance) -------------------------------------------------------

def rows_of(shown: Shown, panel: str = "prefill") -> list[dict[str, Any]]:
    """The rows of one panel ("prefill" or "decode"; "hf" for hf_prefill values); [] when nothing was measured."""
    return [] if shown.value is None else [r for r in shown.value["rows"] if r.get("panel", "hf") == panel]


def table(shown: Shown, panel: str = "prefill", columns: list[str] | None = None) -> Any:
    """A DataFrame of one panel's rows with a provenance column (one line saying why, when nothing was measured)."""
    return shown.derived(rows_of(shown, panel) or None).table(columns)  # same label, same stand-ins


def speedups(shown: Shown) -> list[dict[str, Any]]:
    """Per prefill (kernel, N, d) where naive and the kernel both ran: naive time / kernel time, with the IO model's."""
    rows = rows_of(shown)
    naive = {(r["N"], r["head_dim"]): r for r in rows if r["kernel"] == "naive" and r["status"] == "ok"}
    pred = (shown.value or {}).get("prediction") or {}
    out = []
    for r in rows:
        base = naive.get((r["N"], r["head_dim"]))
        if r["kernel"] != "naive" and r["status"] == "ok" and base:
            model = next((p["speedup"] for p in pred.get(r["head_dim"], []) if p["n"] == r["N"]), None)
            out.append({"kernel": r["kernel"], "N": r["N"], "head_dim": r["head_dim"],
                        "measured": base["median_ms"] / r["median_ms"], "predicted": model})
    return out


def _short(reason: str) -> str:
    """A row's reason in one short line: the benchmark's own hint when it added one, else the error's start."""
    head, _, hint = reason.partition("; torch's CPU SDPA")
    return f"{head[:60]}... (torch's CPU SDPA{hint})" if hint else reason[:110]


def describe_here(shown: Shown) -> str:
    """What the CPU preset showed: which kernels ran and matched the reference, which this machine lacks and why."""
    rows = rows_of(shown) + rows_of(shown, "decode")
    ok = sorted({r["kernel"] for r in rows if r["status"] == "ok"})
    worst = max((r["max_abs_err"] for r in rows if r["status"] == "ok"), default=float("nan"))
    missing = {r["kernel"]: r["reason"] for r in rows if r["status"] == "unavailable"}
    lines = [(f"{len(ok)} kernels ran and matched the float64 reference ({shown.value['provenance']['config']['dtype']}, "
             f"worst |out - ref| {worst:.2e}): {', '.join(ok)}  [{shown.label}]")]
    lines += [f"  not here: {k}: {_short(why)}" for k, why in missing.items()]
    wrong = [f"{r['kernel']} N={r['N']}" for r in rows if r["status"] == "wrong"]
    return "\n".join(lines + ([f"  OUTSIDE TOLERANCE: {', '.join(wrong)}"] if wrong else []))


def speedup_table(shown: Shown) -> Any:
    """speedups as a DataFrame with a provenance column (one line saying why, when nothing was measured)."""
    return shown.derived(speedups(shown) or None).table()


# The Checks cell's claims, each on a Shown's value ({"rows", "provenance"}): Checks.live passes the value.

def all_correct(value: dict[str, Any]) -> bool:
    """No kernel that ran is outside tolerance of the float64 reference (status 'wrong')."""
    return all(r["within_tol"] for r in value["rows"] if r["status"] in ("ok", "wrong"))


def kernels_ran(value: dict[str, Any]) -> set[str]:
    return {r["kernel"] for r in value["rows"] if r["status"] == "ok"}


def tiled_beat_naive(value: dict[str, Any], min_n: int = 4096) -> bool:
    """Every tiled kernel that ran is faster than naive at every N >= min_n where naive ran too."""
    ups = speedups(Shown(value, True, ""))
    return bool(ups) and all(u["measured"] > 1 for u in ups if u["kernel"] in TILED and u["N"] >= min_n)


def flash_memory_small(value: dict[str, Any]) -> bool:
    """At the longest prefill sdpa_flash ran, its extra memory is under a tenth of naive's S and P (the IO model's)."""
    top = max((r for r in value["rows"] if r["panel"] == "prefill" and r["kernel"] == "sdpa_flash"
               and r["status"] == "ok"), key=lambda r: r["N"])
    s_and_p = naive_traffic(AttentionShape(top["N"], top["head_dim"], top["batch"], top["heads"], causal=True))
    return top["extra_mem_bytes"] < 0.1 * s_and_p.extra_bytes


def decode_bandwidth_grows(value: dict[str, Any], kernel: str = "sdpa_flash") -> bool:
    """The kernel's achieved decode bandwidth is higher at the longest KV length than at the shortest."""
    got = sorted((r["N"], r["achieved_gbps"]) for r in value["rows"] if r["panel"] == "decode"
                 and r["kernel"] == kernel and r["status"] == "ok")
    return len(got) > 1 and got[-1][1] > got[0][1]


def same_next_token(value: dict[str, Any]) -> bool:
    """Every HF implementation that ran picked the reference's (eager's) next token at every prompt length."""
    return all(r["same_next_token"] for r in value["rows"] if r["status"] == "ok")


def _longest_both(value: dict[str, Any], a: str = "eager", b: str = "sdpa") -> tuple[int, float, float] | None:
    t = {(r["impl"], r["prompt_tokens"]): r["median_ms"] for r in value["rows"] if r["status"] == "ok"}
    both = [n for (i, n) in t if i == a and (b, n) in t]
    return (max(both), t[(a, max(both))], t[(b, max(both))]) if both else None


def sdpa_beats_eager(value: dict[str, Any]) -> bool:
    """sdpa's prefill is faster than eager's at the longest prompt both ran."""
    got = _longest_both(value)
    return got is not None and got[2] < got[1]


def observations(summary: dict[str, Any], here: Shown, hf_here: Shown, gpu: Shown, hf_gpu: Shown) -> str:
    """This run's numbers for "What you should see", each with where it was measured."""
    sp = summary["speedups"]
    lines = [(f"IO model: predicted speedup {sp[0]:.2f}x at N = {summary['n_min']:,} to {sp[-1]:.2f}x at "
             f"N = {summary['n_max']:,} (Dao et al. 2022 measured 2-4x on an A100)  [simulated]"),
             describe_here(here).splitlines()[0]]
    for name, shown in (("HF prefill, embedded model", hf_here), ("HF prefill, synthetic 8B", hf_gpu)):
        got = _longest_both(shown.value) if shown.value is not None else None
        lines.append(f"{name}: " + (f"at {got[0]:,} tokens eager {got[1]:.1f} ms, sdpa {got[2]:.1f} ms "
                                    f"({got[1] / got[2]:.2f}x)" if got else "nothing to compare") + f"  [{shown.label}]")
    if gpu.value is None:
        return "\n".join(lines + [f"GPU sweep: nothing measured here  [{gpu.label}]"])
    ups = speedups(gpu)
    for k in dict.fromkeys(u["kernel"] for u in ups if u["kernel"] in TILED):
        u = max((u for u in ups if u["kernel"] == k), key=lambda u: (u["N"], u["head_dim"]))
        model = f", the IO model {u['predicted']:.2f}x" if u["predicted"] else ""
        lines.append(f"GPU: {k} {u['measured']:.2f}x faster than naive at N = {u['N']:,}, d = {u['head_dim']}{model}")
    ooms = sorted({f"{r['kernel']} N={r['N']} d={r['head_dim']}" for r in gpu.value["rows"] if r["status"] == "oom"})
    return "\n".join(lines + [f"GPU: out of memory at {', '.join(ooms) or 'no point'}  [{gpu.label}]"])
