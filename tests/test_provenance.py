"""Result provenance: the commit and the kernel knobs a bench JSON records."""

import os

from mk.provenance import git_commit, knob_env


def test_knob_env_records_the_variables_the_code_reads(monkeypatch):
    """MK_TILES (read by mk.tiles) is recorded; a script's own variable (MK_STEPS) and where
    things go (MK_CACHE_DIR, MK_COMMIT) are not."""
    for k in list(os.environ):
        if k.startswith("MK_"):
            monkeypatch.delenv(k)
    assert knob_env() == {}
    monkeypatch.setenv("MK_TILES", "DOWN@256=m128n256")
    monkeypatch.setenv("MK_NISLOTS", "3")
    monkeypatch.setenv("MK_STEPS", "planab")
    monkeypatch.setenv("MK_CACHE_DIR", "/tmp/x")
    monkeypatch.setenv("MK_COMMIT", "abc1234")
    assert knob_env() == {"MK_NISLOTS": "3", "MK_TILES": "DOWN@256=m128n256"}
    assert git_commit() == "abc1234"


def test_run_record_names_the_command_and_commit(monkeypatch):
    """A bench result's header: the script's path in the repository with the arguments it was
    given (sys.argv's when none are), the commit (MK_COMMIT where set) and the caller's fields."""
    import datetime
    import sys

    from mk.provenance import ROOT, run_record
    monkeypatch.setenv("MK_COMMIT", "abc1234")
    rec = run_record(str(ROOT / "bench" / "generate_overlap.py"), ["--job", "16:128:128:256"],
                     device="GPU X")
    assert rec["command"] == "python bench/generate_overlap.py --job 16:128:128:256"
    assert rec["commit"] == "abc1234" and rec["device"] == "GPU X"
    assert datetime.datetime.fromisoformat(rec["date"]) <= datetime.datetime.now()
    monkeypatch.setattr(sys, "argv", ["host_step.py", "--repeat", "3"])
    assert run_record(str(ROOT / "bench" / "host_step.py"))["command"] == \
        "python bench/host_step.py --repeat 3"
