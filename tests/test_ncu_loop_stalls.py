"""bench/ncu_loop_stalls.py: the GEMM consumer loop's warp-stall samples from an ncu source
export (synthetic exports with known samples, and the session-21 export kept in bench/results)."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import ncu_loop_stalls as nls  # noqa: E402

HEAD = ["Address", "Source", "Warp Stall Sampling (All Samples)",
        "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed", "stall_no_inst",
        "stall_wait", "stall_no_inst (Not Issued)"]


def export(tmp_path, lines, name="k.source.csv"):
    """lines: (address, sass, no_inst samples, wait samples, executed), written in a shuffled
    order (the export lists SASS under source lines, not by address)."""
    buf = io.StringIO()
    buf.write('"Function Name","kernel"\n')
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(HEAD)
    for a, s, ni, wt, ex in lines[::-1]:
        w.writerow([hex(a), s, ni + wt, 0, ex, ni, wt, 0])
    p = tmp_path / name
    p.write_text(buf.getvalue())
    return p


def kernel(base, loop_no_inst):
    """A prologue, a loop of two HGMMAs closed by a backward branch, an epilogue."""
    return [(base + 0x00, "MOV R1, R2", 0, 5, 1),
            (base + 0x10, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3", 0, 30, 10),
            (base + 0x20, "HGMMA.64x112x16.F32.BF16 R24, gdesc[UR8], R24", loop_no_inst, 10, 40),
            (base + 0x30, "HGMMA.64x112x16.F32.BF16 R24, gdesc[UR12], R24, gsb0", 0, 20, 40),
            (base + 0x40, f"@P1 BRA {hex(base + 0x10)}", 0, 0, 10),
            (base + 0x50, "EXIT", 0, 100, 1)]


def test_the_loop_is_the_branch_back_over_the_hgmmas(tmp_path):
    r = nls.summarize(export(tmp_path, kernel(0x7f0000001000, 40)), "64x112x16")
    assert r["loop_closed_by_branch"] and r["lines"] == 4
    assert r["first_address"] == hex(0x7f0000001010) and r["last_address"] == hex(0x7f0000001040)
    assert r["samples"] == 30 + 40 + 10 + 20 and r["hgmma_lines"] == 2
    assert r["kernel_share"] == pytest.approx(100 / 205)
    assert r["samples_per_hgmma"] == pytest.approx(100 / 80)
    assert r["reasons"] == {"wait": pytest.approx(0.6), "no_inst": pytest.approx(0.4)}


def test_two_builds_side_by_side_and_other_shapes_refused(tmp_path, capsys):
    a = export(tmp_path, kernel(0x1000, 0), "harness.source.csv")
    b = export(tmp_path, kernel(0x9000, 60), "step.source.csv")
    assert nls.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("harness.source.csv") and out[2].startswith("step.source.csv")
    assert nls.summarize(b, "64x112x16")["reasons"]["no_inst"] == pytest.approx(60 / 120)
    with pytest.raises(SystemExit, match="no HGMMA.64x256x16"):
        nls.summarize(a, "64x256x16")


def test_the_session_21_export():
    f = ROOT / "bench/results/gemm_stalls_O_PROJ_1024_2026-12-01_s21.source.csv.gz"
    rows, stalls = nls.sass_rows(f)
    assert "stall_no_inst" in stalls and len(rows) > 1000
    r = nls.summarize(f, "64x128x16")
    hg = sum(1 for d in rows if "HGMMA.64x128x16" in d["sass"])
    assert r["loop_closed_by_branch"] and r["hgmma_lines"] == hg == 8
    assert 0 < r["kernel_share"] < 1 and abs(sum(r["reasons"].values()) - 1) < 1e-6


def test_cold_code_and_sampling_rate(tmp_path):
    """cold: no_inst samples outside the loop, as a share of the kernel's; ex/sel: the loop's
    executed warp instructions per `selected` sample in it (None without that column)."""
    lines = kernel(0x1000, 40)
    lines[0] = (0x1000, "MOV R1, R2", 15, 5, 1)          # the prologue waits for its code
    r = nls.summarize(export(tmp_path, lines), "64x112x16")
    total = 20 + 30 + 50 + 20 + 0 + 100
    assert r["cold_share"] == pytest.approx(15 / total)
    assert r["executed_per_selected"] is None
    buf = io.StringIO()
    buf.write('"Function Name","kernel"\n')
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(HEAD + ["stall_selected"])
    for a, sass, ni, wt, ex in lines:
        w.writerow([hex(a), sass, ni + wt + 1, 0, ex, ni, wt, 0, 1])
    p = tmp_path / "sel.source.csv"
    p.write_text(buf.getvalue())
    r = nls.summarize(p, "64x112x16")
    assert r["executed_per_selected"] == pytest.approx((10 + 40 + 40 + 10) / 4)
    assert r["cold_share"] == pytest.approx(15 / (total + len(lines)))


def test_the_session_44_exports_were_sampled_alike():
    """ktncu at 74c1763: the step's and the lean build's GATE_UP tiles, sampled at the same
    interval (ex/sel within 2%); the step's build waits for code outside the loop far more."""
    full, lean = (nls.summarize(
        ROOT / f"bench/results/ncu_ktncu_{b}_source_74c1763_2026-12-05_s44.csv.gz", "64x112x16")
        for b in ("full", "lean"))
    assert full["executed_per_selected"] == pytest.approx(lean["executed_per_selected"], rel=0.02)
    assert full["cold_share"] > 2 * lean["cold_share"] > 0
