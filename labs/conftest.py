"""Under nbval (`pytest labs/`), a cell whose output carries a library's warning fails: an attendee sees none."""
import re

import pytest

# A Python warning as the kernel prints it ("...: FutureWarning: ..."), or a library's logged deprecation notice
# (transformers logs "... is deprecated ..." through logging, not through warnings).
WARNING = re.compile(r"\b\w*Warning: |\bis deprecated\b|\bdeprecated and will be removed\b")


def warnings_in(outputs) -> list[str]:
    """The output lines of one cell that are warnings (streams only: tables and figures are the lab's own text)."""
    lines = (line for out in outputs or () if out.get("output_type") == "stream"
             for line in str(out.get("text", "")).splitlines())
    return [line for line in lines if WARNING.search(line)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    found = warnings_in(getattr(item, "test_outputs", None))
    if outcome.excinfo is None and found:
        outcome.force_exception(AssertionError(
            f"{item.name} printed a library warning an attendee would see: {found[0][:300]}"
            f"{f' (and {len(found) - 1} more)' if len(found) > 1 else ''}. Fix: silence it where lablib calls "
            "the library (warnings.catch_warnings or the library's logger), or stop using what it warns about."))
