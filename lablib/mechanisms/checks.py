"""The workload check the mechanisms share: (prompt_len, output_len) pairs.

Every simulator takes its workload as (prompt_len, output_len) pairs and a few integer
knobs; a bad one is refused in the project's one message shape (`lablib.validate`), naming
the function, the value, the allowed range and a fix, before any simulation starts.
"""

from collections.abc import Sequence

from lablib.validate import integer, refuse


def check_requests(requests: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Validate (prompt_len, output_len) pairs; both must be integers >= 1."""
    if len(requests) == 0:
        raise refuse("workload", "requests", [], "at least one (prompt_len, output_len) pair",
                     "pass the workload's lengths, e.g. load_workload('journey').lengths.")
    checked = []
    for i, pair in enumerate(requests):
        if len(pair) != 2:
            raise refuse("workload", f"requests[{i}]", pair, "a (prompt_len, output_len) pair",
                         "give each request as two token counts.")
        for name, value in zip(("prompt_len", "output_len"), pair):
            integer("workload", f"requests[{i}].{name}", value, "lengths count tokens; correct or drop that request.")
        checked.append((pair[0], pair[1]))
    return checked
