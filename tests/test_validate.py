"""lablib.validate: every check refuses a bad value in the one shape `Owner.field=value: allowed ...; Fix: ...`,
returns a good one unchanged, never takes a bool for a number, and refuses NaN. Pure Python: milliseconds."""

import math
import re

import pytest

from lablib import validate

FIX = "do the right thing."


def refused(fn, *args, **kwargs) -> str:
    """The message of the ValueError fn(*args, **kwargs) raises, checked for the one shape."""
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert re.fullmatch(r"[\w.()\[\]]+\.\w[\w\[\].]*=.+: allowed .+; Fix: .+", msg), msg
    return msg


def test_refuse_builds_the_one_shape():
    e = validate.refuse("Owner", "field", 1.5, "a number in (0, 1]", "e.g. 0.9.")
    assert isinstance(e, ValueError)
    assert str(e) == "Owner.field=1.5: allowed a number in (0, 1]; Fix: e.g. 0.9."
    assert str(validate.refuse("O", "name", "x", "'a', 'b'", "pick one.")) == "O.name='x': allowed 'a', 'b'; Fix: pick one."


@pytest.mark.parametrize("value", [0, -1, 1.0, 2.5, "3", None, True, False, float("nan")])
def test_integer_refuses(value):
    msg = refused(validate.integer, "Cfg", "size", value, FIX)
    assert msg == f"Cfg.size={value!r}: allowed integers >= 1; Fix: {FIX}"


def test_integer_range_and_good_values():
    assert validate.integer("Cfg", "size", 1, FIX) == 1
    assert validate.integer("Cfg", "size", 10**12, FIX) == 10**12
    assert validate.integer("Cfg", "n", 0, FIX, minimum=0) == 0
    assert validate.integer("Cfg", "port", 65535, FIX, 0, 65535) == 65535
    assert refused(validate.integer, "Cfg", "port", 65536, FIX, 0, 65535) == \
        f"Cfg.port=65536: allowed integers 0..65535; Fix: {FIX}"
    assert refused(validate.integer, "Cfg", "port", -1, FIX, 0, 65535).startswith("Cfg.port=-1: allowed integers 0..65535;")
    assert refused(validate.integer, "Cfg", "n", -1, FIX, minimum=0).startswith("Cfg.n=-1: allowed integers >= 0;")


def test_optional_integer():
    assert validate.optional_integer("Cfg", "len", None, FIX) is None
    assert validate.optional_integer("Cfg", "len", 4096, FIX) == 4096
    assert validate.optional_integer("Cfg", "len", 0, FIX, minimum=0) == 0
    for bad in (0, -2, True, 1.5):
        assert refused(validate.optional_integer, "Cfg", "len", bad, FIX).startswith(
            f"Cfg.len={bad!r}: allowed integers >= 1;")


def test_number_bounds_open_and_closed():
    assert validate.number("Cfg", "x", 0.0, FIX, 0.0, 1.0) == 0.0
    assert validate.number("Cfg", "x", 1, FIX, 0.0, 1.0) == 1  # an int is a number (and comes back unchanged)
    assert validate.number("Cfg", "x", -1e300, FIX) == -1e300  # unbounded by default
    assert refused(validate.number, "Cfg", "x", 0.0, FIX, 0.0, 1.0, low_open=True) == \
        f"Cfg.x=0.0: allowed a number in (0, 1]; Fix: {FIX}"
    assert refused(validate.number, "Cfg", "x", 1.0, FIX, 0.0, 1.0, high_open=True) == \
        f"Cfg.x=1.0: allowed a number in [0, 1); Fix: {FIX}"
    assert refused(validate.number, "Cfg", "x", 10.5, FIX, 0.001, 10).startswith("Cfg.x=10.5: allowed a number in [0.001, 10];")
    assert refused(validate.number, "Cfg", "x", -0.1, FIX, 0.0).startswith("Cfg.x=-0.1: allowed a number in [0, inf];")


@pytest.mark.parametrize("value", [float("nan"), True, False, "0.5", None, [0.5]])
def test_number_refuses_nan_bools_and_non_numbers(value):
    msg = refused(validate.number, "Cfg", "x", value, FIX, 0.0, 1.0)
    assert msg.startswith(f"Cfg.x={value!r}: allowed a number in [0, 1];"), msg


def test_number_infinity_only_when_allowed():
    for inf in (math.inf, -math.inf):
        refused(validate.number, "Cfg", "rate", inf, FIX)
    assert validate.number("Cfg", "rate", math.inf, FIX, 0.0, low_open=True, allow_inf=True) == math.inf
    assert refused(validate.number, "Cfg", "rate", 0, FIX, 0.0, low_open=True, allow_inf=True) == \
        f"Cfg.rate=0: allowed a number in (0, inf] or inf; Fix: {FIX}"
    refused(validate.number, "Cfg", "rate", float("nan"), FIX, 0.0, allow_inf=True)


def test_fraction():
    for good in (1e-9, 0.5, 1, 1.0):
        assert validate.fraction("VLLMConfig", "gpu_memory_utilization", good, FIX) == good
    for bad in (0, 0.0, -0.1, 1.0000001, 1.5, True, float("nan"), math.inf, "0.9"):
        assert refused(validate.fraction, "VLLMConfig", "gpu_memory_utilization", bad, FIX).startswith(
            f"VLLMConfig.gpu_memory_utilization={bad!r}: allowed a number in (0, 1];")


def test_choice():
    assert validate.choice("HFConfig", "mode", "static", ("naive", "static")) == "static"
    assert validate.choice("Cfg", "q", None, (None, "fp8")) is None
    assert refused(validate.choice, "HFConfig", "mode", "fast", ("naive", "static")) == \
        "HFConfig.mode='fast': allowed 'naive', 'static'; Fix: pick one of ['naive', 'static']."
    assert refused(validate.choice, "HFConfig", "mode", "fast", ("naive", "static"), "say 'naive'.").endswith(
        "; Fix: say 'naive'.")


def test_integers():
    assert validate.integers("run", "batch_sizes", (1, 4, 16), FIX) == [1, 4, 16]
    assert validate.integers("run", "n", iter([0, 3]), FIX, minimum=0) == [0, 3]  # any iterable, returned as a list
    assert refused(validate.integers, "run", "batch_sizes", [], FIX) == \
        f"run.batch_sizes=[]: allowed a non-empty list of integers >= 1; Fix: {FIX}"
    assert refused(validate.integers, "run", "batch_sizes", [1, -4], FIX) == \
        f"run.batch_sizes=[1, -4]: allowed a non-empty list of integers >= 1 (-4 is not); Fix: {FIX}"
    assert refused(validate.integers, "run", "batch_sizes", [1, True], FIX).startswith(
        "run.batch_sizes=[1, True]: allowed a non-empty list of integers >= 1 (True is not);")
    assert refused(validate.integers, "run", "batch_sizes", [2.0], FIX).startswith(
        "run.batch_sizes=[2.0]: allowed a non-empty list of integers >= 1 (2.0 is not);")
    assert refused(validate.integers, "run", "k", [1, 9], FIX, 1, 8).startswith(
        "run.k=[1, 9]: allowed a non-empty list of integers 1..8 (9 is not);")


def test_numbers():
    assert validate.numbers("sweep", "fractions", (0.5, 1, 2.0), FIX) == [0.5, 1, 2.0]
    assert validate.numbers("sweep", "rates", [math.inf, 2.0], FIX, allow_inf=True) == [math.inf, 2.0]
    assert validate.numbers("sweep", "x", [0.0], FIX, low_open=False) == [0.0]
    assert refused(validate.numbers, "sweep", "fractions", [], FIX) == \
        f"sweep.fractions=[]: allowed a non-empty list of numbers > 0; Fix: {FIX}"
    assert refused(validate.numbers, "sweep", "fractions", [0.5, 0], FIX) == \
        f"sweep.fractions=[0.5, 0]: allowed a non-empty list of numbers > 0 (0 is not); Fix: {FIX}"
    assert refused(validate.numbers, "sweep", "x", [-1.0], FIX, low_open=False).startswith(
        "sweep.x=[-1.0]: allowed a non-empty list of numbers >= 0 (-1.0 is not);")
    assert refused(validate.numbers, "sweep", "fractions", [math.inf], FIX).startswith(
        "sweep.fractions=[inf]: allowed a non-empty list of numbers > 0 (inf is not);")
    assert refused(validate.numbers, "sweep", "rates", [0], FIX, allow_inf=True).startswith(
        "sweep.rates=[0]: allowed a non-empty list of numbers > 0 (or inf) (0 is not);")
    for bad in (True, float("nan"), "1"):
        assert refused(validate.numbers, "sweep", "fractions", [1.0, bad], FIX).startswith(
            f"sweep.fractions=[1.0, {bad!r}]: allowed a non-empty list of numbers > 0 ({bad!r} is not);")


def test_validate_is_pure_python():
    """Every layer may import it: it needs nothing beyond the standard library."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(validate.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "collections", "typing"}, imported
