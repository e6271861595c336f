"""Jobs of a bench script run as subprocesses of their own (a compile-time switch read at import
needs a process per value): start them all, then collect their output within one deadline."""

from __future__ import annotations

import subprocess
import time


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    """One job: its stdout and stderr together, as text."""
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def collect(procs: list, timeout_s: float):
    """Yield (key, output) of each (key, Popen) in order, all within timeout_s from now; a job
    still running at the deadline is killed and its output ends with "(timed out)"."""
    t_end = time.time() + timeout_s
    for key, pr in procs:
        try:
            txt, _ = pr.communicate(timeout=max(1.0, t_end - time.time()))
        except subprocess.TimeoutExpired:
            pr.kill()
            txt, _ = pr.communicate()
            txt += "\n(timed out)"
        yield key, txt
