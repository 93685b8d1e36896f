"""The main job's HTML report: the whole road at a glance, then the numbers, then where they came from.

The page reads top to bottom as a newcomer needs it:
0. one sentence, computed from the Results, of what this machine measured and what the H200 recorded; and, where
   the run shared its CPU with other work (`hardware.contention`), a warning with the figures;
1. one picture of the road (`plots.journey.ladder_figure`): each model up the ladder in a panel of its own, live
   here or recorded on the H200, output tok/s per rung on a log scale, each bar's factor over the one before;
2. why the live rungs look the way they do here (on a CPU, naive generate can match static
   batching), in sentences whose every number is computed from the Results on the page;
3. every rung in numbers a person reads (tok/s, seconds, ms, GiB, GB/s, % of roofline);
4. the steps this machine could not run, and this machine's runs in detail (latency, memory);
5. provenance: each rung's hardware, versions, model, workload and config, collapsed
   (`<details>`), so any number can be traced to the machine that measured it.

One file that works offline: plotly.js is inlined once, in the first figure, and nothing is
loaded from a CDN (an email attachment or a workshop laptop without a network opens it).
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from . import plots
from .experiments.journey import best_on_road, side_roads
from .hardware.contention import ADVICE, CpuShare
from .plots.journey import ladder_figure, model_name, tok_s_text, where
from .results.record import Result
from .stats import latency_text

GIB = 2**30
CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;line-height:1.45}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}.lede{font-size:1.1em}
details{margin:.3em 0}summary{cursor:pointer}pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}
.gloss{color:#555;font-size:13px}.warn{border-left:4px solid #c62828;background:#fdecea;padding:.5em 1em}"""


def _e(v: object) -> str:
    return html.escape(str(v))


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _mbu(r: Result) -> str:
    mbu = r.roofline.get("mbu")
    if isinstance(mbu, (int, float)) and not isinstance(mbu, bool):
        return f"{mbu * 100:.1f}%"
    if mbu == "unknown":
        return "unknown (no peak bandwidth for this hardware)"
    return "—"


def _memory(r: Result) -> str:
    peak = r.memory.get("peak_bytes")
    if peak is None:
        return "—"
    src = {"nvml": "GPU", "rss": "process RSS"}.get(r.memory.get("source"), r.memory.get("source") or "?")
    others = r.memory.get("others_bytes")
    if others:  # other engines sat idle on the GPU while this one ran: their memory is not this rung's
        peak -= others
        src += f", less {others / GIB:.2f} held by idle engines started with it"
    gmu, kv = r.config.get("gpu_memory_utilization"), r.config.get("kv_cache_memory_bytes")
    held = (f", KV cache kv_cache_memory_bytes={kv / GIB:.2f} GiB" if kv else
            f", reserved by gpu_memory_utilization={gmu}" if gmu else "")
    return f"{peak / GIB:.2f} ({src}{held})"


def rung_rows(results: list[Result]) -> list[dict[str, str]]:
    """One row per rung, every value formatted in the unit named by its column."""
    rows = []
    for r in results:
        s, bw = r.summary, r.roofline.get("achieved_bw")
        rows.append({
            "rung": r.step, "measured": where(r), "model": model_name(r),
            "workload": f"{r.workload.get('name', '?')} ({s['requests']} requests)",
            "output tok/s": tok_s_text(s["output_tok_s"]), "wall time (s)": f"{s['wall_s']:.1f}",
            "TTFT p50 / p99": f"{latency_text(s['ttft_s']['p50'])} / {latency_text(s['ttft_s']['p99'])}",
            "TPOT p50 (ms)": _ms(s["tpot_s"]["p50"]), "peak memory (GiB)": _memory(r),
            "decode bandwidth (GB/s)": f"{bw / 1e9:.1f}" if isinstance(bw, (int, float)) else "—",
            "% of roofline (MBU)": _mbu(r)})
    return rows


def idle_slot_fraction(r: Result) -> float | None:
    """Static batching's waste: the share of a batch's decode slots spent on requests already finished.

    A batch (the requests that started together) decodes until its longest member is done, so it runs
    b x max(outputs) slots for sum(outputs) tokens. None when the run has no batches of more than one.
    """
    batches: dict[float, list[int]] = {}
    for q in r.requests:
        if q.start is not None:
            batches.setdefault(q.start, []).append(q.output_tokens)
    slots = sum(len(b) * max(b) for b in batches.values() if len(b) > 1)
    return None if not slots else 1 - sum(sum(b) for b in batches.values() if len(b) > 1) / slots


def _best(results: list[Result], engine: str) -> Result | None:
    runs = [r for r in results if r.engine == engine]
    return max(runs, key=lambda r: r.summary["output_tok_s"]) if runs else None


def _recorded_pair(rec: list[Result]) -> tuple[Result | None, Result | None, list[Result]]:
    """The H200's HF static batching and bf16 vLLM on one model and workload, and every recording of those."""
    hf = _best(rec, "hf-static")
    same = [r for r in rec if hf and r.model.get("name") == hf.model.get("name")  # one model, one workload
            and r.workload.get("name") == hf.workload.get("name")]
    return hf, _best([r for r in same if not r.config.get("quantization")], "vllm"), same  # not the FP8 rung


def headline(results: list[Result]) -> str:
    """The report's first sentence, every number from `results`: naive generate and the best rung of the road as
    this machine ran them, then vLLM over HF static batching as the H200 recorded them ("" where neither ran)."""
    out = []
    naive = next((r for r in results if r.provenance == "live" and r.step == "hf-naive"
                  and r.workload.get("name") == "journey"), None)
    best = best_on_road(results)
    if naive and best and best is not naive:
        a, b = naive.summary["output_tok_s"], best.summary["output_tok_s"]
        gpu = naive.hardware.get("gpu")
        out.append(f"Here, on {f'the GPU ({gpu})' if gpu else 'the CPU'}: naive generate {tok_s_text(a)} output tok/s "
                   f"&rarr; the road's best, {_e(best.step)}, {tok_s_text(b)} output tok/s ({b / a:.2f}&times;).")
    hf, vllm, _ = _recorded_pair([r for r in results if r.provenance == "recorded"])
    if hf and vllm:
        x, y = hf.summary["output_tok_s"], vllm.summary["output_tok_s"]
        out.append(f"Recorded on the {_e(vllm.hardware.get('gpu') or 'GPU')}: vLLM {tok_s_text(y)} output tok/s, "
                   f"{y / x:.1f}&times; HF static batching ({tok_s_text(x)} output tok/s), on {_e(model_name(vllm))}.")
    return " ".join(out)


def _cpu_note(cpu: CpuShare | None) -> str:
    """The contention check's verdict near the top: a warning where the run shared its CPU, a quiet line if not."""
    if cpu is None or cpu.contended is None:
        return ""
    if cpu.contended:
        return f'<p class="warn"><b>{_e(ADVICE[0].upper() + ADVICE[1:])}.</b> The HF rungs got {_e(cpu.figures())}.</p>'
    return f'<p class="gloss">The HF rungs had their CPU to themselves: {_e(cpu.figures())}.</p>'


def _story(results: list[Result]) -> str:
    """Why the live rungs look as they do here and what the recorded ones add, every number from the data."""
    live = [r for r in results if r.provenance == "live"]
    rec = [r for r in results if r.provenance == "recorded"]
    out = []
    naive = next((r for r in live if r.step == "hf-naive"), None)  # naive generate itself, not a later lab's HF rung
    static = _best(live, "hf-static")
    if naive and static:
        a, b = naive.summary["output_tok_s"], static.summary["output_tok_s"]
        text = (f"On this machine, <b>{_e(naive.step)}</b> made {tok_s_text(a)} output tok/s and the fastest static "
                f"batch, <b>{_e(static.step)}</b>, {tok_s_text(b)} ({b / a:.2f}&times; naive).")
        if not naive.hardware.get("gpu") and b / a < 2:
            m, t1, tb = naive.model, naive.summary["tpot_s"]["p50"], static.summary["tpot_s"]["p50"]
            batch, idle = static.config.get("batch_size"), idle_slot_fraction(static)
            text += " Static batching is slower here than one request at a time." if b <= a else (
                f" Batches of {batch} gained far less than {batch}&times;." if batch else "")
            size = (f"{m['parameters'] / 1e6:.1f}M parameters, " if m.get("parameters") else "") + (
                f"{m['weight_bytes'] / 1e6:.0f} MB of weights" if m.get("weight_bytes") else "")
            text += (" On a CPU that is expected, and it is not a fault of batching. Batching pays by sharing what "
                     "one decode step costs between the requests of a batch. On a GPU most of that cost is reading the "
                     f"weights; this model is tiny{f' ({size})' if size else ''}, so on this CPU a step is compute and "
                     "fixed per-step overhead instead.")
            if t1 and tb and batch:
                text += (f" Here one request's decode step took {_ms(t1)} ms and a step of {batch} requests "
                         f"{_ms(tb)} ms ({tb / t1:.1f}&times; as long, for at most {batch}&times; the tokens)")
                text += (": the cost grew with the batch, so there was little to share." if tb / t1 >= batch / 2 else
                         ", so the batch did share the step's fixed cost, and lost it elsewhere.")
            if idle is not None:
                text += (" Static batching wastes work of its own: each batch decodes until its longest member is "
                         f"done, so {idle:.0%} of {_e(static.step)}'s decode slots went to requests already finished.")
        out.append(text)
    hf, vllm, same = _recorded_pair(rec)
    if hf and vllm:
        x, y = hf.summary["output_tok_s"], vllm.summary["output_tok_s"]
        weights, gpu = vllm.model.get("weight_bytes"), vllm.hardware.get("gpu") or "GPU"
        size = f", {weights / GIB:.1f} GiB of weights" if weights else ""
        text = (f"The speedups show where each step must read the whole model's weights: the recorded rungs, "
                f"{_e(where(vllm))}, on {_e(model_name(vllm))}{size}."
                f" There HF static batching (<b>{_e(hf.step)}</b>) made {tok_s_text(x)} output tok/s and vLLM "
                f"(<b>{_e(vllm.step)}</b>) {tok_s_text(y)}, {y / x:.1f}&times; as many")
        mbu = vllm.roofline.get("mbu")
        text += f", at {mbu:.0%} of the {_e(gpu)}'s memory-bandwidth roofline (MBU)." if isinstance(mbu, float) else "."
        server = _best(same, "vllm-server")
        if server:
            text += (f" Behind its OpenAI server (<b>{_e(server.step)}</b>, {server.summary['requests']} requests "
                     f"streamed over HTTP at once) the same engine made {tok_s_text(server.summary['output_tok_s'])}.")
        out.append(text)
    out += _side_road_lines(results)
    return "".join(f"<p>{p}</p>" for p in out)


def _side_road_lines(results: list[Result]) -> list[str]:
    """One sentence per rung measured against its own baseline (`journey.side_roads`): its factor on those
    requests, beside the whole road's own gain where it was measured."""
    out = []
    for row in side_roads(results):
        place = "recorded on the H200" if row["where"] == "recorded" else "live here"
        text = (f"<b>{_e(row['rung'])}</b> against <b>{_e(row['baseline'])}</b> ({place}, {_e(row['model'])}, "
                f"{_e(row['workload'])}, {row['requests']} requests): {tok_s_text(row['tok_s'])} vs "
                f"{tok_s_text(row['baseline_tok_s'])} output tok/s"
                + (f" ({row['tok_s_ratio']:.2f}&times;)" if row["tok_s_ratio"] else ""))
        x = row["ttft_speedup"]
        if x:
            text += (f", TTFT p50 {latency_text(row['ttft_p50_s'])} vs {latency_text(row['baseline_ttft_p50_s'])} "
                     + (f"({x:.2f}&times; sooner)" if x >= 1 else f"({1 / x:.2f}&times; later)"))
        if row["tpot_speedup"]:
            text += f", TPOT p50 {_ms(row['tpot_p50_s'])} vs {_ms(row['baseline_tpot_p50_s'])} ms"
        if row["tokens_per_forward"]:
            text += f"; {row['tokens_per_forward']:.2f} tokens per target forward"
        text += "."
        if row["journey_gain"]:
            text += (f" The rest of the road, {place} on this model, gained {row['journey_gain']:.2f}&times; over "
                     "naive generate on the journey workload.")
        verdict = row["tok_s_ratio"]
        text += (" In throughput it paid here." if verdict and verdict > 1 else
                 f" In throughput it did not pay here: lab {row['lab']} measures why." if verdict else "")
        out.append(text)
    return out


def _kv_table(pairs: list[tuple[str, Any]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs
                               if v not in (None, "", [], {})) + "</table>"


def _provenance(r: Result) -> str:
    hw, m = r.hardware, r.model
    machine = ", ".join(str(x) for x in (
        hw.get("gpu") and f"GPU {hw['gpu']}", hw.get("driver_version") and f"driver {hw['driver_version']}",
        hw.get("cpu") and f"CPU {hw['cpu']}", hw.get("cpu_cores_logical") and f"{hw['cpu_cores_logical']} cores",
        hw.get("ram_bytes") and f"{hw['ram_bytes'] / GIB:.0f} GiB RAM", hw.get("platform")) if x)
    pairs = [("measured", f"{where(r)}, at {r.recorded_at}"), ("machine", machine),
             ("versions", ", ".join(f"{k} {v}" for k, v in r.versions.items() if v)),
             ("model", f"{model_name(r)}, {m.get('dtype', '?')}, {m.get('path', '')}"),
             ("synthetic", m.get("synthetic") if isinstance(m.get("synthetic"), str) else None),
             ("workload", ", ".join(f"{k} {v}" for k, v in r.workload.items())),
             ("engine and config", f"{r.engine}: " + ", ".join(f"{k}={v}" for k, v in r.config.items())),
             ("lab", r.lab), ("notes", "; ".join(r.notes))]
    record = {k: v for k, v in r.to_dict().items() if k not in ("requests", "memory")}
    record["memory"] = {k: v for k, v in r.memory.items() if not isinstance(v, list)}
    return (f"<details><summary><b>{_e(r.step)}</b>: {_e(where(r))}</summary>{_kv_table(pairs)}"
            f"<details><summary>the whole record (JSON, without per-request timings and the memory timeline)"
            f"</summary><pre>{_e(json.dumps(record, indent=1, default=str))}</pre></details></details>")


def write_report(results: list[Result], path: str | Path, title: str = "LLM inference: the whole road",
                 skipped: list[dict[str, str]] | None = None, cpu: CpuShare | None = None) -> Path:
    """Write the report of `results` (the road, in order: `experiments.journey.road`) and return its path.
    `cpu`: the live run's contention check (`hardware.contention.CpuMeter.result()`), shown near the top."""
    results = list(results)
    if not results:
        raise ValueError("write_report: no Results to report. Fix: run at least one step first.")
    live = [r for r in results if r.provenance == "live"]
    places = list(dict.fromkeys(where(r) for r in results))
    counts = ", ".join(f"{sum(where(r) == p for r in results)} {p}" for p in places)
    figs = [ladder_figure(results)]
    if live:
        figs += [plots.throughput_vs_batch(live), plots.latency_cdf(live, "ttft"), plots.latency_cdf(live, "tpot"),
                 plots.phase_breakdown(live), plots.memory_timeline(live)]
    divs = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    rows = rung_rows(results)
    head = "".join(f"<th>{_e(k)}</th>" for k in rows[0])
    numeric = {"output tok/s", "wall time (s)", "TPOT p50 (ms)", "decode bandwidth (GB/s)"}
    body = "".join("<tr>" + "".join(f"<td{' class=n' if k in numeric else ''}>{_e(v)}</td>" for k, v in row.items())
                   + "</tr>" for row in rows)
    lead = headline(results)
    skipped_html = "".join(f"<li><b>{_e(s['step'])}</b>: {_e(s['why'])}</li>" for s in skipped or [])
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)}</title><style>{CSS}</style></head>
<body><h1>{_e(title)}</h1>
{f'<p class="lede"><b>{lead}</b></p>' if lead else ""}
{_cpu_note(cpu)}
<p class="lede">Every rung of the journey, from naive Hugging Face <code>generate</code> to vLLM behind its server,
{len(results)} in all: {_e(counts)}. Live rungs were measured by this run; recorded ones ship in
<code>data/reference/</code>.</p>
{divs[0]}
<h2>Reading the road</h2>{_story(results)}
<h2>Every rung in numbers</h2><table><tr>{head}</tr>{body}</table>
<p class="gloss">TTFT: time to first token (queueing and prefill). TPOT: time per output token after the first, per
request. Decode bandwidth: the weight and KV-cache bytes a decode step reads, per second. MBU (model bandwidth
utilisation): that bandwidth as a share of the hardware's peak, the decode roofline; unknown where the peak table
has no entry (a CPU).</p>
{"<h2>Steps not run on this machine</h2><ul>" + skipped_html + "</ul>" if skipped_html else ""}
{"<h2>This machine's runs in detail</h2>" + "".join(divs[1:]) if live else ""}
<h2>Provenance</h2><p class="gloss">Where each rung was measured: hardware, versions, model, workload, engine
configuration. Click a rung to open it.</p>{"".join(_provenance(r) for r in results)}
</body></html>"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
