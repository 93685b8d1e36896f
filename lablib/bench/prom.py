"""The server's own view of a load test: Prometheus metrics, parsed and sampled over time.

A client sees only latencies; the server knows why they moved. vLLM's OpenAI server
exposes `GET /metrics` in the Prometheus text format, and three gauges tell the story of a
rate sweep: `vllm:num_requests_running` (sequences in the running batch),
`vllm:num_requests_waiting` (queued because the batch or the KV cache is full) and
`vllm:kv_cache_usage_perc` (fraction of KV blocks in use, 0-1; older vLLM releases call it
`vllm:gpu_cache_usage_perc`). Below the server's capacity the waiting queue stays near 0 and
TTFT is prefill time; past it the KV cache fills, requests wait, and TTFT grows with the
queue while TPOT stays flat. `MetricsScraper` polls the page in a background thread during
a load test, so a figure can put those gauges under the client-side latencies on one time axis.

The page is read by `prometheus_client`'s own text parser (the library vLLM's server
writes it with), so escapes, timestamps, `NaN`/`+Inf` and the `# TYPE` lines mean what the
format says. From it a scrape keeps what it needs: counters and gauges, histogram and
summary `_sum`/`_count` (their `_bucket`, quantile and `_created` samples are left out:
summed over label sets they mean nothing), label sets collapsed by summing (e.g. over
several engines), or only the samples whose labels match a filter.
"""
from __future__ import annotations

import math
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

DEFAULT_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
# The server's own latency histograms: what a client's figures should match. The first three are the engine's
# (from a request's arrival at the engine); http_s is the API server's whole request, from the HTTP request reaching
# the app to its last chunk handed to the socket (prometheus-fastapi-instrumentator, summed over handlers; /metrics is
# not counted), so it also holds the API server's own work: tokenizing, queueing for the engine, streaming out.
SERVER_LATENCIES = {"ttft_s": "vllm:time_to_first_token_seconds", "itl_s": "vllm:inter_token_latency_seconds",
                    "e2e_s": "vllm:e2e_request_latency_seconds", "http_s": "http_request_duration_seconds"}


def _families(text: str) -> Iterator[tuple[str, Any]]:
    """(family type, sample) for every sample of the page, as prometheus_client parses it.

    A page the parser refuses as a whole (one malformed line) is parsed again one sample line
    at a time under the page's own `# TYPE` lines, and the lines it still refuses are skipped:
    a line this reader does not understand is not worth failing a scrape for.
    """
    from prometheus_client.parser import text_string_to_metric_families  # deferred: prometheus_client

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        families = None
    if families is not None:
        for fam in families:
            for sample in fam.samples:
                yield fam.type, sample
        return
    types: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[:2] == ["#", "TYPE"]:
            types[parts[2]] = parts[3]
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            samples = [s for fam in text_string_to_metric_families(line + "\n") for s in fam.samples]
        except ValueError:
            continue
        for sample in samples:
            base = next((sample.name[: -len(x)] for x in ("_bucket", "_sum", "_count", "_created")
                         if sample.name.endswith(x)), sample.name)
            yield types.get(sample.name, types.get(base, "unknown")), sample


def parse_labels(text: str) -> dict[str, str]:
    """`a="1",b="x\\"y"` → {"a": "1", "b": 'x"y'} (escapes \\\\, \\" and \\n undone, by prometheus_client)."""
    if not text.strip():
        return {}
    for _, sample in _families(f"x{{{text}}} 0\n"):
        return dict(sample.labels)
    return {}


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text page as (name, labels, value); comments and time stamps dropped."""
    return [(s.name, dict(s.labels), float(s.value)) for _, s in _families(text)]


def parse_prometheus(text: str, labels: Mapping[str, str] | None = None) -> dict[str, float]:
    """Metric name → value, summed over label sets; with `labels`, only the samples carrying all of them.

    Histogram and summary buckets/quantiles and `_created` time stamps are skipped; their
    `_sum` and `_count` are kept (so mean TTFT = `..._sum / ..._count`). Names are the
    samples' own (a counter keeps its `_total`).
    """
    out: dict[str, float] = {}
    for kind, s in _families(text):
        if s.name.endswith(("_bucket", "_gbucket", "_created")) or (kind == "summary" and "quantile" in s.labels):
            continue
        if labels and any(s.labels.get(k) != v for k, v in labels.items()):
            continue
        out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def select(text: str, names: Sequence[str]) -> str:
    """The lines of a page that belong to `names` (their samples and their `# TYPE`/`# HELP` lines), the rest dropped.

    A scrape during a load test runs in the client's process, and a vLLM page of ~600 lines takes
    prometheus_client's parser 5-11 ms of Python, holding the GIL that the client's event loop
    needs: on the H200 the lab's client, scraping every 0.5 s, read 25% of a tiny model's token
    events in clumps at 256 streams, and none with the scraper off. Cutting the page to the
    gauges a timeline shows first (string prefixes, no parsing) leaves the parser a few lines.
    """
    wanted = set(names)
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2] in wanted:
                keep.append(line)
        elif line.split("{", 1)[0].strip().split(" ", 1)[0] in wanted:
            keep.append(line)
    return "\n".join(keep) + "\n"


def fetch_metrics(url: str, api_key: str | None = None, timeout_s: float = 5.0) -> str:
    """The text of a `/metrics` page (stdlib only, so the scraper thread needs no event loop)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never via a proxy
    with opener.open(req, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", "replace")


def window_means(before: Mapping[str, float], after: Mapping[str, float],
                 names: Mapping[str, str] = SERVER_LATENCIES) -> dict[str, float | int | None]:
    """Each histogram's mean over the window between two scrapes: (sum after - before) / (count after - before).

    Histograms only accumulate, so two scrapes around a load test give the server's own mean
    of, e.g., the gap between a request's tokens during exactly that test (`itl_s`), and how
    many it observed (`itl_s_count`); None where the page lacks the histogram or saw nothing.
    """
    out: dict[str, float | int | None] = {}
    for key, name in names.items():
        s0, s1 = before.get(f"{name}_sum"), after.get(f"{name}_sum")
        c0, c1 = before.get(f"{name}_count"), after.get(f"{name}_count")
        n = None if c0 is None or c1 is None else c1 - c0
        out[key] = (s1 - s0) / n if n and s0 is not None and s1 is not None else None
        out[f"{key}_count"] = None if n is None else int(n)
    return out


class MetricsScraper:
    """Poll `/metrics` every `interval_s` in a background thread; keep a timeline of chosen gauges.

    Use as a context manager around a load test. `t0` (a `time.perf_counter()` value) sets
    the time origin, so the timeline shares the load test's clock; by default it is the moment
    the scraper starts. A failed scrape is counted in `errors` and skipped, never raised: the
    server being busy is exactly when scrapes are slow.
    """

    def __init__(self, base_url: str, names: Sequence[str] = DEFAULT_GAUGES, interval_s: float = 0.5,
                 api_key: str | None = None, t0: float | None = None, labels: Mapping[str, str] | None = None,
                 on_sample: Callable[[dict[str, float | None]], None] | None = None):
        if not (isinstance(interval_s, (int, float)) and interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError(f"MetricsScraper.interval_s={interval_s!r}: allowed a finite number of seconds > 0.")
        self.url = base_url.rstrip("/") + "/metrics"
        self.names = tuple(names)
        self.interval_s = float(interval_s)
        self.api_key = api_key
        self.labels = dict(labels) if labels else None
        self.t0 = t0
        self.on_sample = on_sample  # called with each new sample, from the scraper's thread (a live figure)
        self.samples: list[dict[str, float | None]] = []  # {"t": seconds since t0, name: value or None}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> dict[str, float | None]:
        """One sample now (appended to the timeline); a name the page lacks reads None."""
        t0 = self.t0 if self.t0 is not None else time.perf_counter()
        page = fetch_metrics(self.url, self.api_key, timeout_s=max(1.0, 4 * self.interval_s))
        values = parse_prometheus(select(page, self.names), self.labels)
        sample: dict[str, float | None] = {"t": time.perf_counter() - t0}
        sample.update({n: values.get(n) for n in self.names})
        self.samples.append(sample)
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                self.scrape_once()
            except Exception as e:  # noqa: BLE001 - a failed scrape is data, not a crash
                self.errors.append(f"{time.perf_counter() - (self.t0 or started):.3f}s: {type(e).__name__}: {e}")
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - started)))

    def start(self) -> MetricsScraper:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> MetricsScraper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def timeline(self) -> dict[str, Any]:
        """The JSON-ready record a Result keeps: the url, names, interval, samples and scrape errors."""
        return {"url": self.url, "names": list(self.names), "interval_s": self.interval_s,
                "samples": list(self.samples), "errors": list(self.errors)}

    def series(self, name: str) -> tuple[list[float], list[float | None]]:
        """(times, values) of one gauge, ready for a line plot."""
        return [s["t"] for s in self.samples], [s.get(name) for s in self.samples]  # type: ignore[misc]
