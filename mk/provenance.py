"""Where a recorded result came from: the commit of the code that made it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# MK_ variables that only say where things go, not what runs
_WHERE_VARS = {"MK_COMMIT", "MK_CACHE_DIR", "MK_NO_PROGRESS", "MK_BENCH_TRACEBACK",
               "MK_COMPILE_CACHE"}


def _read_vars() -> set:
    """The MK_* names that mk's and launch's sources quote (the variables the code reads)."""
    names = set()
    for d in ("mk", "launch"):
        for f in (ROOT / d).rglob("*.py"):
            names.update(re.findall(r"[\"'](MK_[A-Z0-9_]+)[\"']", f.read_text(errors="replace")))
    return names - _WHERE_VARS


def knob_env() -> dict:
    """The set MK_* environment variables that mk or launch read and that can change what runs
    (kernel knobs such as MK_TILES or MK_NISLOTS), for a result's record: an A/B by
    environment variable must be told apart in its JSON. Scripts' own variables (MK_STEPS, ...)
    are left out."""
    names = _read_vars()
    return {k: v for k, v in sorted(os.environ.items()) if k in names}


def git_commit(root: Path = ROOT) -> str:
    """HEAD (+ "-dirty" with uncommitted changes to tracked files), or MK_COMMIT when set: a
    copied working tree (the device tool's) can carry a .git older than its files."""
    if os.environ.get("MK_COMMIT"):
        return os.environ["MK_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_record(script: str, argv: list[str] | None = None, **fields) -> dict:
    """A recorded result's header: the date, the commit (git_commit) and the command that made
    it (the script's path in the repository and its arguments: argv, default sys.argv[1:]);
    then `fields`."""
    import datetime
    import sys
    args = argv if argv is not None else sys.argv[1:]
    command = "python " + " ".join([os.path.relpath(os.path.abspath(script), ROOT), *args])
    return dict(date=datetime.datetime.now().isoformat(timespec="seconds"), commit=git_commit(),
                command=command, **fields)
