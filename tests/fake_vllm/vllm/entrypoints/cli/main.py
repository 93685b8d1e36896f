"""A fake `vllm bench serve` (test support only): `python -m vllm.entrypoints.cli.main bench serve ...`.

Reads vLLM's `custom` dataset (JSON lines with "prompt" and "output_tokens"), sends every
request to `--base-url` + `--endpoint` at once (only `--request-rate inf` is supported; at most
`--max-concurrency` in flight when given), streaming, with the key from OPENAI_API_KEY, and writes
a result file with the fields of vLLM 0.26's (`request_throughput`, `output_throughput`,
`median_ttft_ms`, ... and, as `--save-detailed` adds them, the per-request lists `input_lens`,
`output_lens`, `ttfts`, `itls`, `latencies`, `start_times` (the client's perf_counter when it sent
each request), `generated_texts`, `errors`). FAKE_VLLM_BENCH_FAIL=msg makes it print msg and exit 1.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request


def _one(url, headers, model, prompt, n, out, i, sem=None):
    if sem is not None:
        with sem:
            return _one(url, headers, model, prompt, n, out, i)
    t0 = time.perf_counter()
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": n, "stream": True, "ignore_eos": True,
                       "temperature": 0.0, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    times, usage = [], {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices"):
                times.append(time.perf_counter())
            if chunk.get("usage"):
                usage = chunk["usage"]
    out[i] = {"start": t0, "ttft": times[0] - t0, "itl": [b - a for a, b in zip(times, times[1:])],
              "latency": times[-1] - t0, "output": usage.get("completion_tokens", len(times)),
              "input": usage.get("prompt_tokens", 0)}


def bench_serve(argv):
    ap = argparse.ArgumentParser()
    for flag in ("--backend", "--base-url", "--endpoint", "--model", "--tokenizer", "--dataset-name", "--dataset-path",
                 "--custom-output-len", "--num-prompts", "--request-rate", "--seed", "--temperature",
                 "--percentile-metrics", "--metric-percentiles", "--result-dir", "--result-filename",
                 "--max-concurrency"):
        ap.add_argument(flag)
    for flag in ("--skip-chat-template", "--disable-shuffle", "--ignore-eos", "--save-result", "--save-detailed"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--goodput", nargs="+")
    a = ap.parse_args(argv)
    if os.environ.get("FAKE_VLLM_BENCH_FAIL"):
        print(os.environ["FAKE_VLLM_BENCH_FAIL"])
        sys.exit(1)
    assert a.dataset_name == "custom" and a.custom_output_len == "-1" and a.request_rate == "inf", a
    rows = [json.loads(line) for line in open(a.dataset_path)][: int(a.num_prompts)]
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out = [None] * len(rows)
    sem = threading.Semaphore(int(a.max_concurrency)) if a.max_concurrency else None
    start = time.perf_counter()
    threads = [threading.Thread(target=_one, args=(a.base_url + a.endpoint, headers, a.model, r["prompt"],
                                                   int(r["output_tokens"]), out, i, sem)) for i, r in enumerate(rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    done = [o for o in out if o]
    ttft = sorted(o["ttft"] * 1e3 for o in done)
    tpot = sorted((o["latency"] - o["ttft"]) / (o["output"] - 1) * 1e3 for o in done if o["output"] > 1)
    total_out, total_in = sum(o["output"] for o in done), sum(o["input"] for o in done)
    result = {"duration": duration, "completed": len(done), "failed": len(rows) - len(done),
              "total_input_tokens": total_in, "total_output_tokens": total_out,
              "request_throughput": len(done) / duration, "output_throughput": total_out / duration,
              "total_token_throughput": (total_in + total_out) / duration,
              "median_ttft_ms": statistics.median(ttft), "p99_ttft_ms": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
              "median_tpot_ms": statistics.median(tpot) if tpot else None,
              "input_lens": [o["input"] for o in done], "output_lens": [o["output"] for o in done],
              "ttfts": [o["ttft"] for o in done], "itls": [o["itl"] for o in done],
              "latencies": [o["latency"] for o in done],
              "start_times": [o["start"] for o in done], "generated_texts": [""] * len(done),
              "errors": [""] * len(done)}
    if a.goodput:  # vLLM 0.26's rule (benchmarks/serve.py calculate_metrics): every SLO met, TPOT 0 for one token
        slo = {k: float(v) / 1e3 for k, v in (pair.split(":") for pair in a.goodput)}
        figures = [{"ttft": o["ttft"], "e2el": o["latency"],
                    "tpot": (o["latency"] - o["ttft"]) / (o["output"] - 1) if o["output"] > 1 else 0.0} for o in done]
        result["request_goodput"] = sum(all(f[k] <= v for k, v in slo.items()) for f in figures) / duration
    os.makedirs(a.result_dir, exist_ok=True)
    with open(os.path.join(a.result_dir, a.result_filename), "w") as f:
        json.dump(result, f)
    print(f"Output token throughput (tok/s): {result['output_throughput']:.2f}")


def main():
    if sys.argv[1:3] != ["bench", "serve"]:
        print(f"fake vllm CLI: only `bench serve` is faked, got {sys.argv[1:3]}")
        sys.exit(2)
    bench_serve(sys.argv[3:])


if __name__ == "__main__":
    main()
