"""Argument checks the mechanisms share: integers in range, and (prompt_len, output_len) pairs.

Every simulator takes its workload as (prompt_len, output_len) pairs and a few
integer knobs; a bad one is reported the same way everywhere, naming the value,
the allowed range and a fix, before any simulation starts.
"""

from collections.abc import Sequence


def require_int(name: str, value: object, minimum: int, fix: str) -> None:
    """Raise ValueError unless value is an int (not a bool) >= minimum; `fix` says what to pass instead."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} is out of range: it must be an integer >= {minimum}. Fix: {fix}")


def check_requests(requests: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate (prompt_len, output_len) pairs; both must be integers >= 1."""
    if len(requests) == 0:
        raise ValueError("requests is empty: pass at least one (prompt_len, output_len) pair.")
    checked = []
    for i, pair in enumerate(requests):
        if len(pair) != 2:
            raise ValueError(f"requests[{i}]={pair!r} is not a (prompt_len, output_len) pair.")
        for name, value in zip(("prompt_len", "output_len"), pair):
            require_int(f"requests[{i}].{name}", value, 1, "lengths count tokens; correct or drop that request.")
        checked.append((pair[0], pair[1]))
    return checked
