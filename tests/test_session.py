"""Lab 00's machine summary, fit table and lab plan; the recorded sweep rows and their figure."""
import pytest

from lablib import session
from lablib.experiments import kv, scheduling, sweeps
from lablib.experiments.serving import runs as serving
from lablib.hardware import fit_table, machine_summary
from lablib.mechanisms import continuous_batching
from lablib.plots import gpu_memory_utilization_figure, schedule_tradeoff

GiB = 2**30


def test_machine_summary_on_this_cpu_machine():
    s = machine_summary()
    assert s["gpu"] is None and s["roofline_entry"] is None and s["cpu_cores_logical"] >= 1


def test_fit_table_follows_memory():
    big = {r["architecture"]: r for r in fit_table(141 * GiB)}
    small = {r["architecture"]: r for r in fit_table(16 * GiB)}
    assert big["llama-3.1-8b"]["kv_KiB_per_token"] == 128  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    huge = {"llama-3.1-70b", "qwen2.5-72b"}  # bf16 weights alone exceed 90% of one H200 (lab 09: TP or quantize)
    assert all(r["fits_2048"] and r["fits_8192"] for name, r in big.items() if name not in huge)
    assert not any(big[name]["fits_2048"] for name in huge)
    assert not small["llama-3.1-8b"]["fits_2048"] and small["qwen2.5-0.5b"]["fits_8192"]
    assert abs(big["llama-3.1-8b"]["weights_GiB"] - 8.03e9 * 2 / GiB) < 0.05
    assert all(r["fits_2048"] is None for r in fit_table())  # no GPU here: nothing to fit into


def test_lab_plan_says_recorded_for_vllm_labs_here():
    plan = {r["lab"]: r["here"] for r in session.lab_plan()}
    assert plan["01_batching"] == "live" and plan["03_kv_cache"].startswith("simulators and HF live, vLLM recorded")


def test_recorded_sweep_rows_and_figure():
    shown = kv.gpu_memory_utilization_rows()
    assert not shown.live and shown.label.startswith("recorded on NVIDIA H200")
    rows = shown.value  # the recording as recorded, whole; the asked values (0.1, 0.3, 0.5 by default) are named
    assert {0.1, 0.3, 0.5} < {r["gpu_memory_utilization"] for r in rows} and len(rows) == 10
    assert shown.stand_ins == {"gpu_memory_utilization": {"asked": [0.1, 0.3, 0.5], "shown": [
        r["gpu_memory_utilization"] for r in rows]}}
    assert all(r["provenance"].startswith("recorded on NVIDIA H200") for r in rows)
    fig = gpu_memory_utilization_figure(rows)
    assert "recorded on NVIDIA H200" in fig.layout.title.text
    assert list(fig.data[0].y) == [r["kv_tokens"] for r in rows]
    with pytest.raises(ValueError, match="no rows"):
        gpu_memory_utilization_figure([])


def test_live_sweep_validates_every_value_before_starting_an_engine():
    with pytest.raises(ValueError, match="gpu_memory_utilization=1.5"):
        kv.gpu_memory_utilization_sweep([0.3, 1.5])


def test_schedule_tradeoff_plots_each_setting():
    lengths = [(20, 10), (200, 40), (50, 5)] * 4
    s = {f"n={n}": continuous_batching(lengths, max_num_seqs=n) for n in (1, 4)}
    fig = schedule_tradeoff(s, ttft_target=100)
    assert list(fig.data[0].text) == ["n=1", "n=4"] and fig.data[0].y[1] > fig.data[0].y[0]


def test_request_count_sweep_reuses_one_engine():
    from lablib import BenchConfig, HFConfig, HFEngine

    engine = HFEngine("embedded", HFConfig("static", 4))
    before = id(engine.model)
    results = sweeps.request_count_sweep(engine, [2, 4], bench=BenchConfig(max_new_tokens=4, progress=False))
    assert [len(r.requests) for r in results] == [2, 4] and id(engine.model) == before
    assert [r.step for r in results] == ["hf-static-n2", "hf-static-n4"]
    with pytest.raises(ValueError, match=r"request_count_sweep\.counts=\[0\]: allowed a non-empty list of integers 1\.\.64"):
        sweeps.request_count_sweep(engine, [0])


def test_a_lab_newer_than_the_recordings_says_so_instead_of_failing():
    from lablib.results.reference import NotRecorded, recorded_facts

    def not_yet():
        return recorded_facts("not_a_recorded_key", "prefix")

    shown = session.live_or_recorded(lambda: 1 / 0, not_yet, force=False)
    assert shown.value is None and not shown.live and not shown.recorded_yet
    assert "not_a_recorded_key is not recorded yet" in shown.label and "--steps prefix" in shown.label
    assert shown.line("{hits} hits") == f"[{shown.label}]"
    assert list(shown.table()["provenance"]) == [shown.label]
    checks = session.Checks("07_prefix_caching")
    checks.live(shown, "hits equal the simulator's", lambda v: False)  # not asserted: nothing measured
    assert checks.not_here and "not checked here" in checks.summary() and checks.done() is None
    with pytest.raises(NotRecorded, match="--steps prefix"):
        not_yet()


def test_a_recorded_cell_shows_what_it_asked_or_says_what_stands_in(capsys):
    """Issue 11.8, as issue 28 left it: a recording is shown whole, and where the cell asked other values it says so."""
    assert session.stand_ins({"a": (1, 2), "b": 3, "c": 4}, {"a": [1, 2], "b": 5}) == {
        "b": {"asked": 3, "shown": 5}, "c": {"asked": 4, "shown": "not recorded"}}
    got = session.live_or_recorded(lambda: 1 / 0, lambda: {"k": 8}, force=False, asked={"k": 4, "m": None},
                                   where={"m": lambda v: 256})
    assert got.value == {"k": 8} and got.stand_ins == {"k": {"asked": 4, "shown": 8}, "m": {"asked": None, "shown": 256}}
    line = capsys.readouterr().out
    assert line.startswith("Shown instead of what this cell asked (recorded on NVIDIA H200")
    assert "k: asked 4, shown 8; m: asked the engine's default, shown 256." in line
    assert got.derived([1]).stand_ins == got.stand_ins  # a table of its parts keeps them
    session.live_or_recorded(lambda: 1 / 0, lambda: {"k": 4}, force=False, asked={"k": 4})
    assert capsys.readouterr().out == ""  # asked what was recorded: nothing to say
    # the labs' own calls: a value the recording lacks shows the whole sweep and says so; another model says so
    wide = kv.gpu_memory_utilization_rows([0.1, 0.33], force=False)
    assert len(wide.value) == 10 and wide.stand_ins["gpu_memory_utilization"]["asked"] == [0.1, 0.33]
    knobs = "(max_num_seqs, max_num_batched_tokens)"
    assert scheduling.scheduler_rows([8, 64], force=False).stand_ins == {
        "model": {"asked": "embedded", "shown": "synthetic:llama-3.1-8b"},
        knobs: {"asked": [[8, None], [64, None]], "shown": [[8, None], [64, None], [256, None], [256, 512], [256, 2048]]}}
    sweep = serving.rate_sweep_or_recorded("embedded", repeat=4, max_num_seqs=32, force=False)
    assert set(sweep.stand_ins) == {"model", "max_num_seqs"} and "repeat" not in sweep.stand_ins
    capsys.readouterr()
    other = serving.rate_sweep_or_recorded("embedded", repeat=2, workload="shared-prefix-128", api_key="sk-SECRET",
                                           port=8123, force=False)  # a key or a port changes no measurement
    assert other.stand_ins["workload"] == {"asked": "shared-prefix-128", "shown": "journey"}
    assert other.stand_ins["repeat"] == {"asked": 2, "shown": 4} and not {"api_key", "port"} & set(other.stand_ins)
    assert "sk-SECRET" not in capsys.readouterr().out  # the line is printed into the notebook: never the key
    # asked in another order than recorded: the same points, nothing more to say
    every = [r["gpu_memory_utilization"] for r in kv.gpu_memory_utilization_rows(force=False).value]
    assert kv.gpu_memory_utilization_rows(every[::-1], force=False).stand_ins == {}
    assert scheduling.scheduler_rows([64, 8], force=False).stand_ins.keys() == {"model", knobs}
    capsys.readouterr()
    rows = session.live_or_recorded(lambda: 1 / 0, lambda: [{"b": 1, "t": 4}, {"b": 8, "t": 4}], force=False,
                                    asked={"b": [8, 1], "t": 4})  # each knob a field of the rows, read generically
    assert rows.stand_ins == {} and capsys.readouterr().out == ""


def test_a_recording_made_in_parts_names_one_command_per_step():
    """A key recorded by several steps (lab 09's tp-scaling parts, each under a GPU command's 10 minutes) is not one
    `--steps a,b,c` command, which would run past that limit: the message names a command for each."""
    from lablib.results.reference import NotRecorded

    msg = str(NotRecorded("tp_scaling", "tp-scaling-8b,tp-scaling-70b-fp8"))
    assert "one GPU command for each of tp-scaling-8b, tp-scaling-70b-fp8" in msg and "--steps tp-scaling-8b," not in msg
    assert "--steps prefix`" in str(NotRecorded("x", "prefix"))


def test_lab_steps_names_what_has_not_run_and_refuses_until_it_has():
    class Lab(session.LabSteps):
        STEPS = {"rows": "measure", "table": "measure", "extra": "explore"}
        OPTIONAL = frozenset({"extra"})

        def __init__(self):
            self.rows = self.table = self.extra = None

    lab = Lab()
    assert lab.missing() == ["measure"]  # once per step, the optional one left out
    with pytest.raises(ValueError, match=r"Lab\.extra is empty: run lab\.explore\(\) first"):
        lab.ran("extra")
    with pytest.raises(ValueError, match=r"the steps \['measure'\] have not run; .*\(lab\.measure\(\); Run > Run All"):
        lab.require_all()
    lab.rows = lab.table = [1]
    assert lab.ran("rows") == [1] and lab.missing() == []
    lab.require_all()
