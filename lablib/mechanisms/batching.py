"""Static against continuous batching, on a toy cost model of one forward step.

A decode step streams every weight from memory once however many sequences
ride along, so a step costs a fixed overhead plus a small amount per sequence:
batching is nearly free throughput, and the scheduler's job is to keep the
batch full. The cost model here is

    step time = step_overhead + prefill_per_token x prefill tokens
                              + decode_per_seq x decoding sequences

Static batching (HF `generate` on a padded batch) takes requests in arrival
order B at a time, prefills them together, then decodes until the batch's
LONGEST member is done. Members that finish early keep their padded row, which
still costs decode time and produces nothing, and requests that arrive meanwhile
wait for the whole batch.

Continuous batching (iteration-level scheduling: Orca, Yu et al., OSDI 2022;
vLLM) re-forms the batch every step: up to max_num_seqs sequences run, each step
carries at most max_num_batched_tokens tokens (one per decoding sequence, the
rest prompt tokens, split across steps if chunked_prefill), finished requests
leave and waiting ones join at the next step. With mixed output lengths the
batch stays full; with identical lengths both schedules are the same.

Both simulators return per-request records (start, first token, finish: one
Gantt bar each), per-step records and a summary. Everything is deterministic.
"""

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from lablib.mechanisms.checks import check_requests
from lablib.validate import integer
from lablib.stats import percentile


@dataclass(frozen=True)
class CostModel:
    """Time of one forward step; units are arbitrary, the defaults read as milliseconds for an 8B model."""

    step_overhead: float = 10.0  # fixed cost of any step: streaming the weights once, launches; must be > 0
    prefill_per_token: float = 0.05  # extra cost per prompt token in the step (compute-bound)
    decode_per_seq: float = 0.2  # extra cost per decoding sequence (reading its KV cache)

    def __post_init__(self) -> None:
        for name, low in (("step_overhead", 0.0), ("prefill_per_token", 0.0), ("decode_per_seq", 0.0)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and math.isfinite(value)
            if not ok or value < low or (name == "step_overhead" and value <= low):
                bound = "> 0" if name == "step_overhead" else ">= 0"
                raise ValueError(f"{name}={value!r} is out of range: it must be a finite number {bound}. "
                                 f"Fix: use the default, {getattr(CostModel, name)}.")

    def step_time(self, prefill_tokens: int, decode_seqs: int) -> float:
        return self.step_overhead + self.prefill_per_token * prefill_tokens + self.decode_per_seq * decode_seqs


@dataclass(frozen=True)
class RequestRecord:
    """One request's life: a Gantt bar from start to finish with a mark at first_token."""

    request_id: int  # index in the input list
    arrival: float  # when it reached the server
    start: float  # when its first step (prefill) began
    first_token: float  # end of the step that completed its prefill
    finish: float  # end of the step that produced its last token
    prompt_len: int
    output_len: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def latency(self) -> float:
        return self.finish - self.arrival


@dataclass(frozen=True)
class StepRecord:
    """One forward step: what it carried and how long it took."""

    start: float
    end: float
    prefill_tokens: int  # prompt tokens processed this step
    decode_seqs: int  # sequences charged a decode slot (static: the whole padded batch)
    tokens_out: int  # output tokens produced (useful slots)


@dataclass(frozen=True)
class ScheduleSummary:
    makespan: float  # last finish - first arrival
    throughput: float  # output tokens per unit time over the makespan
    mean_ttft: float
    p50_ttft: float
    p99_ttft: float
    mean_latency: float
    p50_latency: float
    p99_latency: float
    slot_utilisation: float  # output tokens / (steps x batch slots)
    num_steps: int


@dataclass(frozen=True)
class ScheduleResult:
    policy: str  # "static" or "continuous"
    records: tuple[RequestRecord, ...]  # in request id order
    steps: tuple[StepRecord, ...]
    summary: ScheduleSummary

    def rows(self) -> list[dict[str, float | int | str]]:
        """One flat row per request, with ttft and latency, for a table or a Gantt chart."""
        return [{"policy": self.policy, **asdict(r), "ttft": r.ttft, "latency": r.latency} for r in self.records]


def summarise(records: Sequence[RequestRecord], steps: Sequence[StepRecord], slots: int) -> ScheduleSummary:
    ttft = [r.ttft for r in records]
    lat = [r.latency for r in records]
    makespan = max(r.finish for r in records) - min(r.arrival for r in records)
    produced = sum(r.output_len for r in records)
    return ScheduleSummary(
        makespan=makespan,
        throughput=produced / makespan,
        mean_ttft=sum(ttft) / len(ttft),
        p50_ttft=percentile(ttft, 50),
        p99_ttft=percentile(ttft, 99),
        mean_latency=sum(lat) / len(lat),
        p50_latency=percentile(lat, 50),
        p99_latency=percentile(lat, 99),
        slot_utilisation=sum(s.tokens_out for s in steps) / (len(steps) * slots),
        num_steps=len(steps),
    )


def _check_workload(
    requests: Sequence[tuple[int, int]], arrivals: Sequence[float] | None
) -> tuple[list[tuple[int, int]], list[float], list[int]]:
    """Validate pairs and arrivals; return them and the ids in arrival order (ties by id)."""
    reqs = check_requests(requests)
    times = [0.0] * len(requests) if arrivals is None else [float(a) for a in arrivals]
    if len(times) != len(requests):
        raise ValueError(f"arrivals has {len(times)} entries for {len(requests)} requests: give one per request.")
    for i, a in enumerate(times):
        if not math.isfinite(a) or a < 0:
            raise ValueError(f"arrivals[{i}]={a!r} is out of range: it must be a finite time >= 0.")
    order = sorted(range(len(requests)), key=lambda i: (times[i], i))
    return reqs, times, order


def static_batching(
    requests: Sequence[tuple[int, int]],
    batch_size: int,
    *,
    arrivals: Sequence[float] | None = None,
    cost: CostModel | None = None,
) -> ScheduleResult:
    """Batches of batch_size in arrival order; each waits for its last member and runs to its longest one."""
    reqs, times, order = _check_workload(requests, arrivals)
    integer("static_batching", "batch_size", batch_size, "use the number of sequences the GPU runs at once, e.g. 8.", 1)
    cost = cost or CostModel()
    records: dict[int, RequestRecord] = {}
    steps: list[StepRecord] = []
    t = 0.0
    for b in range(0, len(order), batch_size):
        batch = order[b : b + batch_size]
        t = start = max(t, max(times[i] for i in batch))
        prompt_tokens = sum(reqs[i][0] for i in batch)
        end = t + cost.step_time(prompt_tokens, 0)
        steps.append(StepRecord(t, end, prompt_tokens, 0, len(batch)))
        t = first_token = end
        finish = {i: t for i in batch if reqs[i][1] == 1}
        for k in range(2, max(reqs[i][1] for i in batch) + 1):
            end = t + cost.step_time(0, len(batch))
            live = [i for i in batch if reqs[i][1] >= k]
            steps.append(StepRecord(t, end, 0, len(batch), len(live)))
            t = end
            finish.update({i: t for i in live if reqs[i][1] == k})
        for i in batch:
            records[i] = RequestRecord(i, times[i], start, first_token, finish[i], *reqs[i])
    recs = tuple(records[i] for i in range(len(reqs)))
    return ScheduleResult("static", recs, tuple(steps), summarise(recs, steps, batch_size))


def continuous_batching(
    requests: Sequence[tuple[int, int]],
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 2048,
    chunked_prefill: bool = True,
    arrivals: Sequence[float] | None = None,
    cost: CostModel | None = None,
) -> ScheduleResult:
    """Iteration-level scheduling: the batch is re-formed every step under a sequence and a token budget.

    Each step serves running requests first, in admission order (one token per
    decoding sequence, or the next prompt chunk), then admits arrived requests
    in arrival order while a sequence slot and token budget remain. Without
    chunked_prefill a prompt must fit the step's remaining budget whole. Static
    batching ignores the token budget, so when a batch's prompts exceed it,
    static can win by a step or two of overhead; with a budget above every
    batch's prompts, continuous was never slower in a 600-workload sweep.
    """
    reqs, times, order = _check_workload(requests, arrivals)
    integer("continuous_batching", "max_num_seqs", max_num_seqs, "allow at least one running sequence, e.g. 8.", 1)
    integer("continuous_batching", "max_num_batched_tokens", max_num_batched_tokens, "use vLLM's default, 2048 or more.", 1)
    if not chunked_prefill:
        for i, (p, _) in enumerate(reqs):
            if p > max_num_batched_tokens:
                raise ValueError(
                    f"requests[{i}] has prompt_len={p} > max_num_batched_tokens={max_num_batched_tokens} and "
                    "chunked_prefill is off, so it can never be scheduled. Fix: turn chunked_prefill on or raise "
                    "max_num_batched_tokens."
                )
    cost = cost or CostModel()
    waiting: deque[int] = deque(order)
    running: list[int] = []
    prefilled = [0] * len(reqs)
    generated = [0] * len(reqs)
    start: dict[int, float] = {}
    first: dict[int, float] = {}
    finish: dict[int, float] = {}
    steps: list[StepRecord] = []
    t = 0.0
    while waiting or running:
        budget = max_num_batched_tokens
        chunks: dict[int, int] = {}
        decodes: list[int] = []
        for i in running:
            if budget == 0:
                break
            if prefilled[i] < reqs[i][0]:
                chunks[i] = min(reqs[i][0] - prefilled[i], budget)
                budget -= chunks[i]
            else:
                decodes.append(i)
                budget -= 1
        while waiting and times[waiting[0]] <= t and len(running) < max_num_seqs and budget > 0:
            i = waiting[0]
            chunk = min(reqs[i][0], budget) if chunked_prefill else reqs[i][0]
            if chunk > budget:
                break
            waiting.popleft()
            running.append(i)
            start[i] = t
            chunks[i] = chunk
            budget -= chunk
        if not chunks and not decodes:
            t = max(t, times[waiting[0]])
            continue
        end = t + cost.step_time(sum(chunks.values()), len(decodes))
        produced = 0
        for i, chunk in chunks.items():
            prefilled[i] += chunk
            if prefilled[i] == reqs[i][0]:
                generated[i], first[i] = 1, end
                produced += 1
        for i in decodes:
            generated[i] += 1
            produced += 1
        for i in [i for i in running if generated[i] == reqs[i][1]]:
            finish[i] = end
            running.remove(i)
        steps.append(StepRecord(t, end, sum(chunks.values()), len(decodes), produced))
        t = end
    recs = tuple(
        RequestRecord(i, times[i], start[i], first[i], finish[i], *reqs[i]) for i in range(len(reqs))
    )
    return ScheduleResult("continuous", recs, tuple(steps), summarise(recs, steps, max_num_seqs))
