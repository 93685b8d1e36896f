"""`labs/conftest.py` fails a lab cell under nbval whose output carries a library warning, and passes a clean one."""
import shutil
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]


def test_warnings_in_reads_streams_only():
    from labs.conftest import warnings_in
    outs = [{"output_type": "stream", "name": "stderr", "text": "x.py:3: FutureWarning: `past_key_values` is old\n"},
            {"output_type": "stream", "name": "stderr", "text": "`generation_config` default values is deprecated\n"},
            {"output_type": "stream", "name": "stdout", "text": "tok/s 12.5\n"},
            {"output_type": "execute_result", "data": {"text/plain": "UserWarning: in a table, not printed"}}]
    assert len(warnings_in(outs)) == 2 and warnings_in(outs[2:]) == [] and warnings_in(None) == []


def test_a_cell_printing_a_library_warning_fails_under_nbval(pytester):
    shutil.copy(ROOT / "labs" / "conftest.py", pytester.path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('clean')"),
                nbformat.v4.new_code_cell("import warnings\nwarnings.warn('old API', FutureWarning)")]
    nbformat.write(nb, pytester.path / "lab.ipynb")
    result = pytester.runpytest_subprocess("--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider", "lab.ipynb")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*printed a library warning an attendee would see*FutureWarning*old API*"])
