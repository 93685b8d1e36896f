"""What tests/test_browser.py needs around the browser: JupyterLab as a child process, headless Chromium, the page.

- `missing_tools()` names what is absent (Debian's chromium and chromedriver, selenium, jupyterlab), so the test
  can skip saying what and how to install it (`scripts/browser-deps.sh`).
- `JupyterLab` starts `python -m jupyter lab` from this interpreter (so the kernel is this venv's) on a free
  port with a token, its own config, data-for-settings, workspace and runtime folders under a temp directory,
  news and update checks off; `stop()` asks the server to shut its kernels down, then ends the server's
  process group and any child (a kernel runs in a session of its own) by pid.
- `chromium()` starts headless Chromium through Debian's chromedriver (given by path, so selenium fetches
  nothing), with the browser console logged; `stop_chromium()` quits it and ends what is left by pid.
- `Page` drives JupyterLab the way a person does (open a notebook, Run All from the menu, click, pick from a
  dropdown, save, refresh) and reads what the page shows: widgets' text, and what the plotly.js figures hold.
- `severe_errors()` sorts the console's SEVERE entries into unexpected ones and the listed, explained ones.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

INSTALL = "scripts/browser-deps.sh"  # installs Debian's chromium and chromium-driver with apt


def chromium_binary() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def chromedriver_binary() -> str | None:
    found = shutil.which("chromedriver")
    return found or next((p for p in ("/usr/lib/chromium/chromedriver",) if os.access(p, os.X_OK)), None)


def missing_tools() -> list[str]:
    """What the browser test lacks, each with the command that installs it; [] when all is there."""
    missing = []
    if chromium_binary() is None:
        missing.append(f"chromium (Debian package 'chromium'; install: {INSTALL})")
    if chromedriver_binary() is None:
        missing.append(f"chromedriver (Debian package 'chromium-driver'; install: {INSTALL})")
    for module, how in (("selenium", "scripts/setup.sh test"), ("jupyterlab", "scripts/setup.sh test")):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"python package {module} (install: {how})")
    return missing


def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """probe() until it returns something truthy; after `timeout` seconds fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except AssertionError:  # the probe saw a failure: waiting longer will not help
            raise
        except Exception as e:  # a page mid-render: an element gone stale, a script error; try again
            last = f"{type(e).__name__}: {e}"
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}; last saw: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end_tree(pid: int, group: bool, grace_s: float = 10.0) -> None:
    """SIGTERM the process (its group when it leads one) and its children by pid; SIGKILL what is left."""
    import psutil

    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    if group:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if group:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 serving `root`, its state kept under `home` (nothing from ~/.jupyter)."""

    def __init__(self, root: Path, home: Path):
        self.root, self.home = root, home
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "jupyterlab.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float) -> JupyterLab:
        settings = self.home / "lab-settings"
        notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        notification.parent.mkdir(parents=True, exist_ok=True)  # no "receive Jupyter news?" toast, no fetch of it
        notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH")} | {
            "JUPYTER_CONFIG_DIR": str(self.home / "config"), "JUPYTER_RUNTIME_DIR": str(self.home / "runtime"),
            "JUPYTER_DATA_DIR": str(self.home / "data"),  # no user kernelspec shadows this venv's python3
            "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(self.home / "workspaces"),
            "IPYTHONDIR": str(self.home / "ipython"), "JUPYTER_PLATFORM_DIRS": "1",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # no debugger warning on the kernel's stderr
            "LABLIB_RESULTS": str(self.root / "results"),  # the panels' stores in the served folder, not the clone's
        }
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--ServerApp.port={self.port}",
               "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={self.token}",
               "--ServerApp.open_browser=False", f"--ServerApp.root_dir={self.root}",
               "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
               "--LabApp.extension_manager=readonly"]  # offline: no news, no update check, no PyPI search
        if os.geteuid() == 0:  # a container's root: jupyter refuses to start without this
            cmd.append("--allow-root")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                return json.loads(self.api("GET", "/api/status", timeout=5)) is not None
            except (urllib.error.URLError, OSError):
                return False

        deadline = time.monotonic() + timeout
        while not up():
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab did not answer /api/status in {timeout:.0f} s:\n{self.log()}")
            time.sleep(0.5)
        return self

    def api(self, method: str, path: str, timeout: float = 10) -> bytes:
        req = urllib.request.Request(self.url + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()

    def kernels(self) -> list[dict[str, Any]]:
        return json.loads(self.api("GET", "/api/kernels"))

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:  # the kernels first: each runs in a session of its own, outside the server's group
                for k in self.kernels():
                    self.api("DELETE", f"/api/kernels/{k['id']}", timeout=15)
            except (urllib.error.URLError, OSError, ValueError):
                pass
        _end_tree(self.proc.pid, group=True)
        self.proc.wait(timeout=10)
        self._log.close()
        self.proc = None


def chromium(profile: Path, log_path: Path):
    """Headless Chromium through Debian's chromedriver, its console log kept (goog:loggingPrefs)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium_binary()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1800", f"--user-data-dir={profile}", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--disable-extensions", "--disable-crash-reporter"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=chromedriver_binary(), log_output=str(log_path),
                      popen_kw={"start_new_session": True})
    driver = webdriver.Chrome(options=opts, service=service)
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(60)
    return driver


def stop_chromium(driver, screenshot: Path | None = None) -> None:
    """Quit the browser (after saving what the page showed last, for a failure's post-mortem); end what is left."""
    from selenium.common.exceptions import WebDriverException

    pid = driver.service.process.pid if driver.service.process else None
    try:
        if screenshot is not None:
            driver.save_screenshot(str(screenshot))
    except WebDriverException:  # a browser already gone: nothing to save
        pass
    try:
        driver.quit()
    except WebDriverException:  # the same; what is left of it is ended below
        pass
    if pid is not None:
        _end_tree(pid, group=True, grace_s=5)


# The console's SEVERE entries the test allows: (substring of the message, why it is unrelated to the lab and
# cannot be avoided on an offline machine). Anything else SEVERE fails the test.
ALLOWED_SEVERE: list[tuple[str, str]] = []


def severe_errors(entries: list[dict[str, Any]]) -> tuple[list[str], list[tuple[str, str]]]:
    """(unexpected SEVERE messages, [(allowed message, reason)])."""
    bad, allowed = [], []
    for e in entries:
        if e.get("level") != "SEVERE":
            continue
        msg = e.get("message", "")
        why = next((reason for needle, reason in ALLOWED_SEVERE if needle in msg), None)
        (bad.append(msg) if why is None else allowed.append((msg, why)))
    return bad, allowed


# Read from the page: what each plotly.js figure in a cell's outputs holds (plotly sets `gd.data` on its div).
FIGURES_JS = """
const cell = document.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];
if (!cell) return null;
return Array.from(cell.querySelectorAll('.js-plotly-plot')).map(gd => ({
  traces: (gd.data || []).length,
  points: (gd.data || []).reduce((n, t) => n + ((t.x && t.x.length) || 0), 0),
  lowest: ((ys) => ys.length ? Math.min(...ys) : null)(
    (gd.data || []).flatMap(t => Array.from(t.y || []).filter(y => typeof y === 'number'))),
  title: (gd.layout && gd.layout.title && gd.layout.title.text) || '',
  annotations: ((gd.layout && gd.layout.annotations) || []).map(a => a.text),
  visible: gd.offsetWidth > 0 && gd.offsetHeight > 0,
}));
"""


class Page:
    """JupyterLab in the browser, as a person uses it; cells are addressed by their index in the notebook."""

    def __init__(self, driver, lab: JupyterLab):
        self.driver, self.lab = driver, lab
        self.console: list[dict[str, Any]] = []  # every console entry so far (get_log empties the browser's buffer)
        self.notes: dict[str, Any] = {}  # what one test observed that a later one builds on

    def read_console(self) -> list[dict[str, Any]]:
        new = self.driver.get_log("browser")
        self.console += new
        return new

    def open(self, notebook: str, timeout: float) -> None:
        self.driver.get(f"{self.lab.url}/lab/tree/{notebook}?token={self.lab.token}")
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """The notebook is shown, and its kernel is idle with the page connected to it (the server says so:
        the page's own indicator reads "idle" before its websocket to the kernel is open)."""
        wait_for("the notebook and an idle kernel", lambda: self.js(
            "return !!document.querySelector('.jp-Notebook .jp-Cell') && "
            "!!document.querySelector('.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]')") and any(
            k["execution_state"] == "idle" and k["connections"] > 0 for k in self.lab.kernels()), timeout)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def command(self, menu: str, command: str) -> None:
        """Click a main-menu entry (by its label) and then one of its items (by its JupyterLab command id)."""
        from selenium.webdriver.common.by import By

        item = next(e for e in self.driver.find_elements(By.CSS_SELECTOR, "#jp-MainMenu .lm-MenuBar-item")
                    if e.text.strip() == menu)
        item.click()
        wait_for(f"menu item {command}", lambda: self.driver.find_element(
            By.CSS_SELECTOR, f".lm-Menu-item[data-command='{command}']"), 10).click()

    def run_all(self, cells: int, timeout: float) -> None:
        """Run All Cells, then wait until every code cell has an execution count and the kernel is idle.

        A traceback in an output fails at once (Run All stops at the first error, so the wait would never end)."""
        self.command("Run", "runmenu:run-all")

        def no_traceback() -> bool:
            tracebacks = [t for t in self.errors_in_outputs() if "Traceback" in t]
            assert not tracebacks, "a cell failed in the browser:\n" + "\n".join(tracebacks)
            return True

        wait_for("every cell to run", lambda: no_traceback() and self.js(
            "const p = Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt'))"
            ".map(e => e.textContent.trim());"
            "return p.length === arguments[0] && p.every(t => /^\\[\\d+\\]:$/.test(t)) && "
            "!!document.querySelector('.jp-Notebook-ExecutionIndicator[data-status=\"idle\"]')", cells), timeout)

    def errors_in_outputs(self) -> list[str]:
        """The text of every stderr output and traceback in the notebook (JupyterLab draws both as stderr)."""
        return self.js("return Array.from(document.querySelectorAll('.jp-Notebook .jp-OutputArea-output"
                       "[data-mime-type=\"application/vnd.jupyter.stderr\"]')).map(e => e.textContent)")

    def cell(self, index: int):
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell")[index]

    def figures(self, index: int) -> list[dict[str, Any]] | None:
        return self.js(FIGURES_JS, index)

    def text(self, index: int, selector: str) -> list[str]:
        return self.js("const c = document.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];"
                       "return c ? Array.from(c.querySelectorAll(arguments[1])).map(e => e.textContent) : [];",
                       index, selector)

    def button(self, index: int, label: str):
        from selenium.webdriver.common.by import By

        return next(b for b in self.cell(index).find_elements(By.CSS_SELECTOR, "button.jupyter-button")
                    if b.text.strip() == label)

    def type_into(self, index: int, description: str, text: str) -> None:
        """Replace what the text box (Text, Combobox) described `description` holds with `text`, then leave it (Tab),
        as a person does; the widget sends its value to the kernel."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        for box in self.cell(index).find_elements(By.CSS_SELECTOR, ".widget-text, .widget-combobox"):
            if box.find_element(By.CSS_SELECTOR, "label").text.strip() == description:
                field = box.find_element(By.CSS_SELECTOR, "input")
                field.click()
                field.send_keys(Keys.CONTROL, "a")
                field.send_keys(Keys.DELETE, text, Keys.TAB)
                return
        raise LookupError(f"no text box {description!r} in cell {index}")

    def add_cell_and_run(self, code: str) -> int:
        """Below the last cell, a new code cell holding `code` (one line), run with Shift+Enter; returns its index."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        count = len(self.driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell"))
        self.cell(count - 1).find_element(By.CSS_SELECTOR, ".jp-InputPrompt").click()  # select it (command mode)
        ActionChains(self.driver).send_keys(Keys.ESCAPE, "b").perform()  # insert a cell below, selected
        wait_for("a new cell", lambda: len(self.driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell"))
                 == count + 1, 10)
        ActionChains(self.driver).send_keys(Keys.ENTER).perform()  # edit mode
        keys = ActionChains(self.driver).send_keys(code)
        keys.key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()  # run it
        return count

    def dropdown(self, index: int, description: str):
        """The <select> of the ipywidgets Dropdown whose description is `description`."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        for box in self.cell(index).find_elements(By.CSS_SELECTOR, ".widget-dropdown"):
            if box.find_element(By.CSS_SELECTOR, "label").text.strip() == description:
                return Select(box.find_element(By.CSS_SELECTOR, "select"))
        raise LookupError(f"no dropdown {description!r} in cell {index}")

    def save(self, path: Path, timeout: float) -> None:
        """Save the notebook (File > Save) and wait until the file on disk holds the widgets' outputs."""
        before = path.stat().st_mtime_ns
        self.command("File", "docmanager:save")
        wait_for(f"{path.name} saved with its widget outputs", lambda: path.stat().st_mtime_ns != before and
                 "application/vnd.jupyter.widget-view+json" in path.read_text(), timeout)
