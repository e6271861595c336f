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
    monkeypatch.setenv("MK_ATTN_PAIR_WARP", "3")
    monkeypatch.setenv("MK_STEPS", "planab")
    monkeypatch.setenv("MK_CACHE_DIR", "/tmp/x")
    monkeypatch.setenv("MK_COMMIT", "abc1234")
    assert knob_env() == {"MK_ATTN_PAIR_WARP": "3", "MK_TILES": "DOWN@256=m128n256"}
    assert git_commit() == "abc1234"
