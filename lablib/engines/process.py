"""Process trees: the one place that ends a worker and everything it started.

vLLM runs its model in processes of its own (an engine core under the offline worker, an
engine core and workers under the API server). A forgotten one holds the GPU, so every
engine ends the whole tree: the offline worker by walking its children (psutil), the
server by its process group; and a server child is told by the kernel to stop when the
thread that started it dies (Linux's parent-death signal), so even a SIGKILLed notebook
leaves no server behind.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Iterator



@contextlib.contextmanager
def environ(name: str, value: str | None) -> Iterator[None]:
    """`name` set to `value` (None: unset) in this process's environment for the block, restored after: what a
    worker spawned inside it, and every process vLLM starts under that worker, inherits (vLLM reads its switches,
    e.g. VLLM_USE_V2_MODEL_RUNNER, from the environment of the process that runs it)."""
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def children(pid: int) -> list:
    import psutil  # deferred: psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_tree(pid: int) -> None:
    import psutil  # deferred: psutil

    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = parent.children(recursive=True) + [parent]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs[:-1], timeout=10)  # not the worker: reaped by psutil, its is_alive() stays True


def die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the process that started it dies.

    The server runs in its own session (so stop() can end its whole group), which also
    shields it from the kernel's death: a notebook kernel killed with SIGKILL (a time limit,
    an out-of-memory kill) runs no atexit handler, and the server would hold its share of the
    GPU until someone finds it. The parent-death signal closes that hole; vLLM ends its engine
    core when the api_server exits. It fires when the *thread* that started the server ends,
    so start servers from a thread that lives as long as they do (a notebook's main thread).
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: stop() and atexit remain the only guards
        pass


def end_group(proc: "subprocess.Popen", grace_s: float) -> None:
    """End a process started with `start_new_session=True` and its whole group: SIGTERM, then SIGKILL; wait for it."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                try:  # the leader is gone; end any engine-core or worker that outlived it
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        except subprocess.TimeoutExpired:
            continue
