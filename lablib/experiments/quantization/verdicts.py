"""Lab 06's verdicts: each common claim answered from this run's numbers, and the run's headline.

`claims` takes what the notebook measured (the quality table, the storage rows, lm_head both ways, the
8B and 70B weights alone, the GPU speed runs when there are any, attention and MLP quantized apart) and
gives each claim a verdict, the evidence in numbers and where they were measured; a claim this run did not
measure is read from the H200's recording where one holds it, labelled so, or says "not measured here", never a
borrowed number without its label. `under_one_percent` and `headline` say the same in one
line; `gate_judged`, `int4_costs_more` and `kernels_logged` are the Checks cell's claims about this run.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...models import embedded_path, parameter_count
from ...session import Shown
from ...workloads import load_workload
from .layers import attention_more_sensitive
from .measures import check_disjoint, quality_gate
from .sizes import WEIGHT_FORMATS

INT4, EIGHT_BIT = ("gptq-w4a16", "awq-w4a16"), ("fp8-dynamic", "w8a8-int8")


def under_one_percent(rows: Sequence[dict[str, Any]], threshold_pct: float = 1.0) -> str:
    """The common claim "the accuracy loss is under 1%", answered scheme by scheme from a quality table."""
    parts = [f"{r['scheme']} {r['ppl_change_pct']:+.2f}% ({'under' if r['ppl_change_pct'] < threshold_pct else 'not under'})"
             for r in rows if r["scheme"] != "bf16"]
    under = [r["scheme"] for r in rows if r["scheme"] != "bf16" and r["ppl_change_pct"] < threshold_pct]
    over = [r["scheme"] for r in rows if r["scheme"] != "bf16" and r["ppl_change_pct"] >= threshold_pct]
    verdict = ("holds for every scheme run" if not over else "holds for none of the schemes run" if not under else
               f"holds for {', '.join(under)}; not for {', '.join(over)}")
    return (f"'under {threshold_pct:g}%' (perplexity against bf16's {rows[0]['ppl']:.3f}, {rows[0]['eval']}): "
            f"{'; '.join(parts)}. Verdict: {verdict}.")


def headline(stored: Sequence[dict[str, Any]], quality: Sequence[dict[str, Any]], max_increase_pct: float) -> str:
    """This run's numbers per scheme in one line each: bytes against bf16, bits per Linear weight, quality, the gate."""
    q = {r["scheme"]: r for r in quality}
    lines = []
    for r in stored[1:]:
        g = quality_gate(q[r["scheme"]]["ppl"], quality[0]["ppl"], max_increase_pct)
        lines.append(f"{r['scheme']}: x{r['vs_bf16']:.2f} of bf16's bytes, {r['bits_per_weight']:.2f} bits per Linear "
                     f"weight; perplexity {g.increase_pct:+.2f}%, {q[r['scheme']]['agreement']:.0%} of greedy tokens "
                     f"as bf16's; {'passes' if g else 'fails'} your {max_increase_pct:g}% gate")
    return "\n".join(lines)


def gate_judged(rows: Sequence[dict[str, Any]], max_increase_pct: float) -> bool:
    """The Checks cell's "every int4 scheme's verdict at your gate is stated": at least one int4 scheme ran, and each
    one's stated verdict is the gate's at `max_increase_pct` on its perplexity (a table gated at another X fails)."""
    ref = next(r["ppl"] for r in rows if r["scheme"] == "bf16")
    int4 = [r for r in rows if r["scheme"] in INT4]
    return bool(int4) and all(r["gate"] == quality_gate(r["ppl"], ref, max_increase_pct).sentence for r in int4)


def int4_costs_more(rows: Sequence[dict[str, Any]]) -> bool:
    """Every int4 scheme run costs more perplexity than every 8-bit one (False unless both kinds ran)."""
    int4 = [r["ppl_change_pct"] for r in rows if r["scheme"] in INT4]
    eight = [r["ppl_change_pct"] for r in rows if r["scheme"] in EIGHT_BIT]
    return bool(int4 and eight) and min(int4) > max(eight)


def kernels_logged(rows: Sequence[dict[str, Any]]) -> bool:
    """The speed runs' quantized engines (vLLM's online fp8 and every checkpoint scheme) each logged the kernel vLLM
    chose; False without one such row, or without fp8 among them (a fresh GPU machine runs fp8 and no checkpoint)."""
    quantized = [r for r in rows if r["scheme"] not in ("bf16", "bf16-kv-fp8")]
    return any(r["scheme"] == "fp8" for r in quantized) and all("Kernel" in r["linear_kernels"] for r in quantized)


def _disjoint(quality: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    """Whether the evaluation set every row was scored on shares nothing with the calibration set each checkpoint
    was calibrated on (check_disjoint on the sets the rows name), and the sets named."""
    named = {r["eval"].split("@")[0] for r in quality if r.get("eval")}
    calibrated = {(r.get("calibration") or {}).get("workload", "").split("@")[0] for r in quality} - {""}
    try:
        for c in calibrated:
            for e in named:
                check_disjoint(load_workload(c), load_workload(e))
    except ValueError as err:
        return False, str(err)
    return bool(named), f"evaluation {sorted(named)} against calibration {sorted(calibrated) or 'none'}"


def _verdict(held: Sequence[bool]) -> str:
    return "holds" if held and all(held) else "does not hold" if not any(held) else "holds only in part"


def claims(quality: Sequence[dict[str, Any]], stored: Sequence[dict[str, Any]], lm_head: Sequence[dict[str, Any]],
           weights: Sequence[dict[str, Any]], speed: Shown | None = None,
           layers: Sequence[dict[str, Any]] | None = None,
           recording: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """Each common claim about quantized serving: a verdict, the evidence in this run's numbers, and their source.

    quality: quality_table's rows; stored: storage_rows'; lm_head: lm_head_rows'; weights: weights_alone's (with
    llama-3.1-70b); speed: what `speed()` returned (its rows, or nothing recorded yet); layers: layer_rows'
    (attention and MLP quantized apart); recording: step quantization-quality's facts (`quality_recording()`),
    from which AWQ against GPTQ is read, labelled as recorded, when this run did not quantize both (a CPU run leaves
    AWQ out for time). A claim neither this run nor a recording measured says so ("not measured here") rather than
    borrow a number.
    """
    here, arith = "live on this CPU (embedded model)", "arithmetic on the published config"
    gpu_where = speed.label if speed is not None else "no speed runs passed"
    out: list[dict[str, str]] = []

    def add(claim: str, verdict: str, evidence: str, where: str) -> None:
        out.append({"claim": claim, "verdict": verdict, "evidence": evidence, "where": where})

    by = {(w["model"], w["format"]): w for w in weights}
    gb = {f: by[("llama-3.1-70b", f)]["weights_GB"] for f in WEIGHT_FORMATS if ("llama-3.1-70b", f) in by}
    small = ", ".join(f"{r['scheme']} x{r['vs_bf16']:.2f}" for r in stored if r["scheme"] in ("fp8-dynamic", "w8a8-int8"))
    share = lm_head[0]["lm_head_share"]  # the tied embedding / lm_head table's share of the target's weights
    params = parameter_count(json.loads((embedded_path("target") / "config.json").read_text()))
    if gb:
        ratio = gb["fp8 / int8, per channel"] / gb["bf16"]
        add("a 70B model from FP16 to INT8 halves its memory", _verdict([0.45 <= ratio <= 0.55]),
            f"Llama-3.1-70B weights {gb['bf16']:.1f} GB -> {gb['fp8 / int8, per channel']:.1f} GB (x{ratio:.3f}: "
            "embeddings and lm_head stay 16-bit; the KV cache is not halved)" +
            (f"; the embedded model's checkpoints {small}: its 16-bit embedding is {share:.0%} of its weights"
             if small else ""),
            arith + (f"; {here}" if small else ""))
        g128, awq, g64 = (gb[f] for f in ("w4a16 g128, symmetric (GPTQ)", "w4a16 g128, asymmetric (AWQ)",
                                          "w4a16 g64, symmetric (GPTQ)"))
        add("4-bit GPTQ/AWQ compress 140 GB to under 40 GB", _verdict([g128 < 40, awq < 40, g64 < 40]),
            f"Llama-3.1-70B bf16 {gb['bf16']:.1f} GB -> GPTQ g128 {g128:.1f} GB, AWQ g128 {awq:.1f} GB (its zero "
            f"points), g64 {g64:.1f} GB" + (": under 40 at group 128 only" if g128 < 40 <= g64 else "") +
            "; weights alone, before any KV cache", arith)
    run = [r for r in quality if r["scheme"] != "bf16"]
    add("the accuracy loss is under 1%", _verdict([r["ppl_change_pct"] < 1.0 for r in run]),
        "; ".join(f"{r['scheme']} {r['ppl_change_pct']:+.2f}%" for r in run) + f" perplexity vs bf16 ({quality[0]['eval']})",
        here)
    gptq, awq_r = (next((r for r in run if r["scheme"] == s), None) for s in ("gptq-w4a16", "awq-w4a16"))
    claim = "AWQ keeps more salient weights and suits generation better than GPTQ"
    awq_where, vllm_ppl = here, ""
    if not (gptq and awq_r) and recording:  # this run left one out: the H200 recording has both, scored the same way
        cpu = {r["scheme"]: r for r in recording.get("cpu_rows") or ()}
        if "gptq-w4a16" in cpu and "awq-w4a16" in cpu:
            gptq, awq_r = cpu["gptq-w4a16"], cpu["awq-w4a16"]
            served = {r["scheme"]: r for r in recording.get("rows") or ()}
            if "gptq-w4a16" in served and "awq-w4a16" in served:
                vllm_ppl = (f"; served by vLLM: AWQ {served['awq-w4a16']['ppl_change_pct']:+.2f}%, GPTQ "
                            f"{served['gptq-w4a16']['ppl_change_pct']:+.2f}% perplexity")
            awq_where = (f"recorded on {recording.get('gpu') or 'a GPU'}, {recording.get('date') or 'date unknown'} "
                         f"(step quantization-quality: checkpoints made there, scored on its CPU"
                         f"{' and by vLLM' if vllm_ppl else ''}, on {gptq.get('eval') or 'its evaluation set'})")
    if gptq and awq_r:
        add(claim, _verdict([awq_r["ppl_change_pct"] < gptq["ppl_change_pct"], awq_r["agreement"] > gptq["agreement"]]),
            "; ".join(f"{name} {r['ppl_change_pct']:+.2f}% perplexity, {r['agreement']:.0%} greedy agreement, first "
                      f"divergence {r['mean_first_divergence']:.1f} tokens on average"
                      for name, r in (("AWQ", awq_r), ("GPTQ", gptq))) +
            f" (both group {gptq.get('group_size')}, {(gptq.get('calibration') or {}).get('samples')} calibration "
            f"windows, a {params / 1e6:.1f}M-parameter model){vllm_ppl}", awq_where)
    else:
        add(claim, "not measured here", "needs both 'gptq-w4a16' and 'awq-w4a16' in SCHEMES" +
            (" (the recording of step quantization-quality does not hold both either)" if recording else
             " (or a recording of step quantization-quality holding both: recording=quality_recording())"), here)
    rows = (speed.value if speed is not None else None) or []
    at = {(r["scheme"], r["batch"]): r for r in rows}
    fp8 = next((r for r in run if r["scheme"] == "fp8-dynamic"), None)
    online = [(b, at[("fp8", b)]["decode_tok_s"], at[("bf16", b)]["decode_tok_s"])
              for s, b in sorted(at) if s == "fp8" and ("bf16", b) in at]
    evidence = (f"fp8-dynamic took no calibration data and {fp8['quantize_s']:.2f} s to quantize" if fp8
                else "fp8-dynamic not in SCHEMES")
    evidence += ("; on the GPU, online fp8 (no checkpoint) vs bf16: " +
                 ", ".join(f"batch {b} {x:,.0f} vs {y:,.0f} tok/s" for b, x, y in online) if online
                 else "; Hopper speed not measured here")
    add("FP8 is Hopper's native format, no offline quantization needed",
        ("holds" if online and all(x > y for _, x, y in online) else "holds for the data-free part" if fp8
         else "not measured here"), evidence, f"{here}; {gpu_where}")
    lm = {r["lm_head"]: r for r in lm_head}
    kept, both = lm["kept 16-bit"], lm["quantized too"]
    # keeping lm_head (the tied embedding) 16-bit is right when quantizing it does not pay: no smaller, or worse
    head_kept = both["size_vs_kept_pct"] >= 0 or both["ppl_change_pct"] > kept["ppl_change_pct"]
    evidence = (f"embeddings stay bf16 in every checkpoint ({all('BF16' in r['rest_dtypes'] for r in stored)}); "
                f"quantizing lm_head ({kept['scheme']}) too: checkpoint {both['size_vs_kept_pct']:+.1f}%"
                f"{' (the tied table is untied)' if both['size_vs_kept_pct'] >= 0 else ''}, perplexity "
                f"{kept['ppl_change_pct']:+.2f}% -> {both['ppl_change_pct']:+.2f}%, so keeping it 16-bit "
                f"{'pays' if head_kept else 'does not pay here'}")
    held = [head_kept]
    sensitive = attention_more_sensitive(layers) if layers else None
    if sensitive is None:
        evidence += "; attention against MLP: not measured here (no layer rows, or a part saved nothing)"
    else:
        by = {r["quantized"]: r for r in layers or ()}
        a_, m_ = by["attention only"], by["MLP only"]
        held.append(sensitive)
        evidence += (f"; {a_['scheme']} on attention only: {a_['saved_pct']:.1f}% of bytes saved for "
                     f"{a_['ppl_change_pct']:+.2f}% perplexity, on the MLP only {m_['saved_pct']:.1f}% for "
                     f"{m_['ppl_change_pct']:+.2f}% ({a_['cost_per_saved']:+.3f} vs {m_['cost_per_saved']:+.3f} "
                     f"per percent saved): {'attention' if sensitive else 'the MLP'} is the more sensitive part, "
                     f"so treating attention more carefully {'matches' if sensitive else 'does not match'} this model")
    add("attention dynamic, MLP static, embeddings kept in full precision", _verdict(held),
        evidence + "; static against dynamic activation scales not tested: every scheme here quantizes activations "
        "per token at run time (or not at all), in attention and MLP alike", here)
    run = [r for r in quality if r["scheme"] != "bf16"]
    disjoint, sets = _disjoint(quality)
    gated = bool(run) and all(str(r.get("gate", "")).startswith(("passes", "fails")) for r in run)
    same = bool(run) and all(r.get("eval") == quality[0]["eval"] for r in run)
    followed = gated and same and disjoint
    add("validate quality with the same business test set before and after",
        "followed here" if followed else "not followed here",
        f"bf16 (before) and {len(run)} schemes (after) scored on {quality[0]['eval']}: "
        f"{'the same texts for every one' if same else 'NOT the same texts for every one'}; quality gate "
        f"{'judged every scheme' if gated else 'NOT run on every scheme'}; "
        + (f"disjoint from the calibration set ({sets})" if disjoint else f"NOT disjoint from calibration: {sets}"),
        here)
    int4 = [(b, at[("gptq-w4a16", b)]["decode_tok_s"], at[("bf16", b)]["decode_tok_s"])
            for s, b in sorted(at) if s == "gptq-w4a16" and ("bf16", b) in at]
    evidence = "; ".join(f"batch {b}: GPTQ {x:,.0f} vs bf16 {y:,.0f} decode tok/s (x{x / y:.2f})" for b, x, y in int4)
    if int4:  # how far the bytes turned into speed: the weights' ratio against the speed's, and why it fades
        b = int4[0][0]
        g, b16 = at[("gptq-w4a16", b)], at[("bf16", b)]
        if g.get("weight_gib") and b16.get("weight_gib"):
            evidence += (f"; weights {b16['weight_gib']:.2f} -> {g['weight_gib']:.2f} GiB "
                         f"(x{b16['weight_gib'] / g['weight_gib']:.2f} fewer bytes with the 16-bit embeddings and "
                         "lm_head)")
        if g.get("roofline_tok_s") and b16.get("roofline_tok_s") and g.get("tpot_ms") and b16.get("tpot_ms"):
            evidence += (f"; at batch {b} reading its bytes (weights and KV cache) at peak bandwidth would take "
                         f"{1e3 * b / g['roofline_tok_s']:.2f} ms a step for GPTQ and "
                         f"{1e3 * b / b16['roofline_tok_s']:.2f} ms for bf16, the steps took "
                         f"{g['tpot_ms']:.2f} and {b16['tpot_ms']:.2f} ms ({g['of_roofline']:.0%} and "
                         f"{b16['of_roofline']:.0%} of each roofline): what does not shrink with the weights (the "
                         f"int4 kernel, {g.get('linear_kernels') or 'unnamed'}, unpacking as it multiplies; attention; "
                         "the rest of the step) takes most of int4's step, and once batched the GEMM turns "
                         "compute-bound, where 4-bit weights save nothing and unpacking them still costs")
    else:  # FP8's half the bytes, where it ran, says how far bytes turn into speed; int4's own runs are missing
        evidence = (("GPTQ is not among this run's speed schemes (its 8B checkpoint is made by prepare_checkpoints)"
                     if speed is not None and speed.live else
                     "int4 on the H200: not measured yet (step quantization-b)" if rows else
                     "the H200 speed runs are not recorded yet (steps quantization-a and quantization-b)") +
                    ("; for comparison, online fp8 (about half bf16's Linear bytes) over bf16: " +
                     ", ".join(f"batch {b} x{x / y:.2f}" for b, x, y in online) if online else ""))
    add("fewer bytes per weight, faster decode (int4's ~3.5x fewer bytes)",
        _verdict([x > y for _, x, y in int4]) if int4 else "not measured here", evidence, gpu_where)
    return out
