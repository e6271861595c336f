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
