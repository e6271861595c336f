"""bench/gemm_ncu.py (CPU): the figures of an Nsight Compute details CSV, kernel by kernel."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import gemm_ncu  # noqa: E402

COLUMNS = ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]


def test_summary_prints_the_chosen_metrics_per_kernel(tmp_path, capsys):
    rows = [
        ("0", "kernel_cutlass_mk", "GPU Speed Of Light Throughput", "Duration", "us", "715.49"),
        ("0", "kernel_cutlass_mk", "GPU Speed Of Light Throughput", "L2 Cache Throughput", "%",
         "59.43"),
        ("0", "kernel_cutlass_mk", "Memory Workload Analysis", "L1/TEX Hit Rate", "%", "1.0"),
        ("0", "kernel_cutlass_mk", "SpeedOfLight", "", "", ""),     # a rule row: no metric
        ("1", "nvjet_sm90_tst_256x128", "GPU Speed Of Light Throughput", "Duration", "us",
         "598.59"),
    ]
    path = tmp_path / "d.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(r)
    assert gemm_ncu.summary(str(path)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "== kernel 0: kernel_cutlass_mk"
    # METRICS order, units kept, metrics outside METRICS left out
    assert [ln.split()[0] for ln in out[1:3]] == ["Duration", "L2"]
    assert out[1].endswith("715.49 us") and out[2].endswith("59.43 %")
    assert not any("Hit Rate" in ln and "L1" in ln for ln in out)
    assert out[3] == "== kernel 1: nvjet_sm90_tst_256x128" and out[4].endswith("598.59 us")


def test_summary_of_an_empty_csv_fails(tmp_path, capsys):
    path = tmp_path / "e.csv"
    path.write_text(",".join(COLUMNS) + "\n")
    assert gemm_ncu.summary(str(path)) == 1
    assert "holds no rows" in capsys.readouterr().err


def test_raw_summary_prints_the_chosen_metrics_and_the_largest_stalls(tmp_path, capsys):
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    names = ["ID", "Kernel Name", "gpu__time_duration.sum", "l1tex__t_bytes.sum",
             "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
    names += [stall.format(r) for r in ("barrier", "long_scoreboard", "wait", "sleeping",
                                        "math_pipe_throttle", "branch_resolving", "no_instruction")]
    units = ["", "", "us", "byte", "%"] + [""] * 7
    kernels = [["0", "kernel_cutlass_mk", "101.5", "9", "62.9",
                "0.5", "1,234.5", "2.0", "0.1", "3.0", "0.2", "0.3"],
               ["1", "nvjet_sm90_tst_128x256", "82.0", "9", "86.8",
                "0", "0", "0", "0", "0", "0", "x"]]
    path = tmp_path / "raw.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([names, units] + kernels)
    gemm_ncu.raw_summary(str(path))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "== raw: 0 kernel_cutlass_mk"
    assert out[1].split() == ["gpu__time_duration.sum", "101.5", "us"]
    assert out[2].split()[0].startswith("sm__pipe_tensor_op") and out[2].endswith("62.9 %")
    assert not any("l1tex__t_bytes" in ln for ln in out)
    # the six largest stall reasons, largest first (thousands separators read), the 7th left out
    stalls = [ln.split()[1] for ln in out if ln.strip().startswith("stalled")][:6]
    assert stalls[0].startswith("long_scoreboard") and stalls[1].startswith("math_pipe")
    assert not any("sleeping" in s for s in stalls)
    assert "== raw: 1 nvjet_sm90_tst_128x256" in out


def test_side_by_side_splits_the_duration_and_reads_gzip(tmp_path, capsys):
    """Two kernels of a gzipped raw page: tensor busy / idle us from the pipe's share of the
    duration, L2 -> SM MB from read sectors, DRAM MB by its unit, stalled warps per scheduler as
    ratio x issue rate; a kernel missing a metric gets '-', and the ratio column compares them."""
    import gzip
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    names = ["ID", "Kernel Name", "gpu__time_duration.sum",
             "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
             "lts__t_sectors_srcunit_tex_op_read.sum", "dram__bytes_read.sum",
             "smsp__issue_active.avg.per_cycle_active", stall.format("gmma")]
    units = ["", "", "us", "%", "sector", "Gbyte", "", "inst"]
    kernels = [["0", "kernel_cutlass_mk", "100", "68", "1,000,000", "0.5", "0.2", "1.5"],
               ["1", "nvjet_sm90", "80", "85", "500,000", "0.25", "0.1", ""]]
    path = tmp_path / "raw.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        csv.writer(f).writerows([names, units] + kernels)
    rows = dict(gemm_ncu.side_by_side(names, units, kernels))
    assert rows["tensor busy us"] == [68.0, 68.0]
    assert rows["tensor idle us"] == [32.0, 12.0]
    assert rows["L2 -> SM reads MB"] == [32.0, 16.0]
    assert rows["DRAM reads MB"] == [500.0, 250.0]
    assert rows["warps stalled on gmma"][0] == 0.2 * 1.5
    assert rows["warps stalled on gmma"][1] is None
    assert rows["warps stalled on barrier"] == [None, None]
    gemm_ncu.raw_summary(str(path))
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("tensor idle us"))
    assert line.split("|")[-1].strip() == f"{32 / 12:.2f}"
    gmma = next(ln for ln in out.splitlines() if "stalled on gmma" in ln)
    assert gmma.split("|")[2].strip() == "-"
