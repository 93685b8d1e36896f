"""The one set of field checks: every refusal in lablib has the same shape.

    Owner.field=value: allowed <what is allowed>; Fix: <what to do instead>

A user who gave a batch of 0, a fraction of 1.5 or an unknown engine reads the same kind
of sentence wherever the mistake was made (a config, a simulator, a sweep, the CLI), and it
comes before any model loads or any GPU memory is touched. Pure Python: every layer may
import it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def refuse(owner: str, field: str, value: Any, allowed: str, fix: str) -> ValueError:
    """The ValueError every check raises: `Owner.field=value: allowed ...; Fix: ...`."""
    return ValueError(f"{owner}.{field}={value!r}: allowed {allowed}; Fix: {fix}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(owner: str, field: str, value: Any, fix: str, minimum: int = 1, maximum: int | None = None) -> int:
    """An int (not a bool) in [minimum, maximum]; returned unchanged."""
    if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
        span = f"integers >= {minimum}" if maximum is None else f"integers {minimum}..{maximum}"
        raise refuse(owner, field, value, span, fix)
    return value


def optional_integer(owner: str, field: str, value: Any, fix: str, minimum: int = 1) -> int | None:
    """None, or an int >= minimum."""
    return None if value is None else integer(owner, field, value, fix, minimum)


def number(owner: str, field: str, value: Any, fix: str, low: float = -math.inf, high: float = math.inf, *,
           low_open: bool = False, high_open: bool = False, allow_inf: bool = False) -> float:
    """A real number (not a bool, not NaN) between low and high (each end open or closed)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok and math.isinf(value) and not allow_inf:
        ok = False
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = ("(" if low_open else "[") + f"{low:g}", f"{high:g}" + (")" if high_open else "]")
        raise refuse(owner, field, value, f"a number in {lo}, {hi}" + (" or inf" if allow_inf else ""), fix)
    return value


def fraction(owner: str, field: str, value: Any, fix: str) -> float:
    """A fraction in (0, 1]."""
    return number(owner, field, value, fix, 0.0, 1.0, low_open=True)


def choice(owner: str, field: str, value: Any, allowed: Sequence[Any], fix: str | None = None) -> Any:
    """One of `allowed`."""
    if value not in allowed:
        raise refuse(owner, field, value, ", ".join(map(repr, allowed)), fix or f"pick one of {list(allowed)!r}.")
    return value


def integers(owner: str, field: str, values: Iterable[Any], fix: str, minimum: int = 1,
             maximum: int | None = None) -> list[int]:
    """A non-empty list of ints, each in [minimum, maximum]."""
    out = list(values)
    if not out:
        raise refuse(owner, field, out, f"a non-empty list of integers >= {minimum}", fix)
    for v in out:
        if not _is_int(v) or v < minimum or (maximum is not None and v > maximum):
            span = f">= {minimum}" if maximum is None else f"{minimum}..{maximum}"
            raise refuse(owner, field, out, f"a non-empty list of integers {span} ({v!r} is not)", fix)
    return out


def numbers(owner: str, field: str, values: Iterable[Any], fix: str, low: float = 0.0, *, low_open: bool = True,
            allow_inf: bool = False) -> list[float]:
    """A non-empty list of numbers above `low` (finite unless allow_inf)."""
    out = list(values)
    if not out:
        raise refuse(owner, field, out, f"a non-empty list of numbers > {low:g}", fix)
    for v in out:
        try:
            number(owner, field, v, fix, low, low_open=low_open, allow_inf=allow_inf)
        except ValueError:
            raise refuse(owner, field, out, f"a non-empty list of numbers {'>' if low_open else '>='} {low:g}"
                         + (" (or inf)" if allow_inf else "") + f" ({v!r} is not)", fix) from None
    return out
