"""Lab 01's reading of its runs: the step-cost fit, the prefill shares and the Checks, on constructed Results."""
import pytest

from lablib.experiments import batching
from lablib.results.record import RequestRecord, Result


def _result(step: str, batch: int, step_s: float, prefill_s: float = 0.1, tokens: int = 5, tok_s_ids=(1, 2, 3),
            finishes=None) -> Result:
    """`batch` requests decoding `tokens` tokens at `step_s` a token after a prefill of `prefill_s`."""
    reqs = []
    for i in range(batch):
        first = prefill_s
        last = first + step_s * (tokens - 1)
        reqs.append(RequestRecord(request_id=f"r{i}", prompt_tokens=4, output_tokens=tokens, arrival=0.0, start=0.0,
                                  first_token=first, last_token=last,
                                  finished=last if finishes is None else finishes[i], output_ids=list(tok_s_ids)))
    wall = max(r.finished for r in reqs)
    return Result(lab="01_batching", step=step, engine="hf-naive" if batch == 1 else "hf-static",
                  config={"batch_size": batch}, model={"name": "m"}, workload={"name": "w"}, requests=reqs,
                  wall_s=wall, engine_facts={"dtype": "float32"}, provenance="live")


def _line(fixed: float, per_seq: float, batches=(1, 2, 4, 8)) -> list[Result]:
    return [_result("hf-naive" if b == 1 else f"hf-static-b{b}", b, fixed + per_seq * b) for b in batches]


def test_step_costs_recovers_an_exact_line_and_its_gain_bound():
    costs = batching.step_costs(_line(0.003, 0.001))
    assert costs["fixed_s"] == pytest.approx(0.003) and costs["per_sequence_s"] == pytest.approx(0.001)
    assert costs["max_gain"] == pytest.approx(4.0)  # (3 + 1) / 1
    b8 = next(r for r in costs["rows"] if r["batch"] == 8)
    assert b8["step_ms"] == pytest.approx(11.0) and b8["vs_B_single_steps"] == pytest.approx(11 / 32)


def test_step_costs_has_no_bound_when_the_step_does_not_grow_and_needs_two_batch_sizes():
    assert batching.step_costs(_line(0.003, 0.0))["max_gain"] is None
    with pytest.raises(ValueError, match="two batch sizes"):
        batching.step_costs(_line(0.003, 0.001, batches=(4,)))


def test_phase_shares_sum_each_requests_prefill_and_decode():
    shares = batching.phase_shares([_result("hf-static-b2", 2, step_s=0.01, prefill_s=0.04, tokens=5)])
    assert shares == [{"step": "hf-static-b2", "batch": 2, "prefill_s": pytest.approx(0.08),
                       "decode_s": pytest.approx(0.08), "prefill_share": pytest.approx(0.5)}]


def test_lines_print_this_runs_fit_and_shares():
    text = batching.lines(_line(0.003, 0.001), "live on this CPU")
    assert "3.00 ms fixed + 1.00 ms per sequence" in text and "at most 4.0x" in text
    assert "[live on this CPU]" in text and "hf-naive" in text.splitlines()[2]


def test_checks_pass_on_a_run_that_batches_and_fail_where_it_does_not(capsys):
    batching.checks(_line(0.003, 0.001))
    assert "4 checks on this run passed" in capsys.readouterr().out
    # a step that costs B single steps: batching shares nothing, and naive wins throughput
    with pytest.raises(AssertionError, match="costs less than 8 steps of one"):
        batching.checks([_result("hf-naive", 1, 0.002)] + [_result(f"hf-static-b{b}", b, 0.0021 * b) for b in (2, 8)])
    # a batch that cost no one any latency would contradict the lab's own latency figures
    cheap = _line(0.003, 0.001)
    cheap[-1] = _result("hf-static-b8", 8, 0.011, prefill_s=0.0)
    with pytest.raises(AssertionError, match="costs a single user latency"):
        batching.checks(cheap)
    with pytest.raises(ValueError, match="needs the hf-naive run"):
        batching.checks(_line(0.003, 0.001)[1:])


def test_vllm_runs_stay_off_the_static_batching_line():
    """On a GPU the journey's results include vLLM's rungs: no fixed batch, so not points of the fit (nor the best)."""
    runs = _line(0.003, 0.001)
    fast = _result("vllm", 1, 0.0005)
    fast.engine = "vllm"
    costs = batching.step_costs(runs + [fast])
    assert costs["fixed_s"] == pytest.approx(0.003) and costs["max_gain"] == pytest.approx(4.0)
    assert "vllm" not in {r["step"] for r in costs["rows"]}
    assert batching.step_costs(_line(-0.001, 0.002))["max_gain"] is None  # a fixed part the noise made negative
