"""bench/ab_summary.py (CPU): A/B rows from two launch/bench.py JSONs, errors for bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import ab_summary  # noqa: E402


def _bench_json(path: Path, commit: str, ms: dict, path_us: dict | None = None) -> None:
    """path_us: {batch: {opcode: run us summed over the 2 layers}} as a journaled run has them."""
    points = [dict(batch=b, results=dict(megakernel=dict(status="ok", ms=v, p10_ms=v - 0.1,
                                                         p90_ms=v + 0.1)))
              for b, v in ms.items()]
    for p in points:
        if path_us and p["batch"] in path_us:
            # a run of us + 2 with hops of +1 and -3 before it: us on the path
            ops = {op: dict(count=2, run_us=us + 2.0, dep_gap_us=1.0, queue_gap_us=-3.0)
                   for op, us in path_us[p["batch"]].items()}
            p["results"]["megakernel"]["journal"] = dict(critical_path=dict(ops=ops))
    points.append(dict(batch=999, results=dict(megakernel=dict(status="error"))))
    path.write_text(json.dumps(dict(git_commit=commit, device="H200", command="bench",
                                    shape=dict(layers=2), points=points)))


def test_pairs_rows_and_append(tmp_path, capsys):
    _bench_json(tmp_path / "off.json", "aaa", {1: 10.0, 64: 20.0, 256: 40.0})
    _bench_json(tmp_path / "on.json", "bbb", {1: 9.0, 256: 44.0})
    out = tmp_path / "sum.json"
    assert ab_summary.main(["x=off.json,on.json", "--dir", str(tmp_path), "--out", str(out),
                            "--note", "n"]) == 0
    s = json.loads(out.read_text())
    (p,) = s["ab"]
    assert (p["name"], p["off_commit"], p["on_commit"], s["note"]) == ("x", "aaa", "bbb", "n")
    assert [(r["batch"], r["off_ms"], r["on_ms"], r["change_pct"]) for r in p["rows"]] == \
        [(1, 10.0, 9.0, -10.0), (256, 40.0, 44.0, 10.0)]          # batches in both, ok only
    assert "-10.0%" in capsys.readouterr().out
    assert ab_summary.main(["y=on.json,off.json", "--dir", str(tmp_path), "--out", str(out),
                            "--append", "--note", "m"]) == 0
    s = json.loads(out.read_text())
    assert [p["name"] for p in s["ab"]] == ["x", "y"]
    # both calls' notes are kept: the summary's joined, each pair's own
    assert s["note"] == "n\nm" and [p["note"] for p in s["ab"]] == ["n", "m"]


def test_critical_path_per_layer(tmp_path, capsys):
    """Journaled runs: each pair holds the critical path per layer and opcode, off and on ((run +
    the hops' gaps before it) us / the model's layers), largest first; --path prints it;
    unjournaled batches have none."""
    _bench_json(tmp_path / "off.json", "aaa", {1: 10.0, 64: 20.0},
                {64: {"GATE_UP": 70.0, "SPLITK_REDUCE": 74.0}})
    _bench_json(tmp_path / "on.json", "bbb", {1: 9.0, 64: 19.0},
                {64: {"GATE_UP": 68.0, "SPLITK_REDUCE": 40.0, "RMSNORM": 8.0}})
    out = tmp_path / "sum.json"
    assert ab_summary.main(["x=off.json,on.json", "--dir", str(tmp_path), "--out", str(out),
                            "--path"]) == 0
    (p,) = json.loads(out.read_text())["ab"]
    assert p["critical_path_us_per_layer"] == {
        "64": {"SPLITK_REDUCE": [37.0, 20.0], "GATE_UP": [35.0, 34.0], "RMSNORM": [0.0, 4.0]}}
    printed = capsys.readouterr().out
    assert "x B=64: critical path per layer 72.0 -> 58.0 us" in printed
    assert "SPLITK_REDUCE" in printed


@pytest.mark.parametrize("pair,why", [("nofiles", "is not NAME=OFF.json,ON.json"),
                                      ("x=off.json", "is not NAME=OFF.json,ON.json"),
                                      ("x=off.json,missing.json", "missing.json"),
                                      ("x=off.json,empty.json", "no megakernel timing")])
def test_bad_pairs_say_why(tmp_path, capsys, pair, why):
    _bench_json(tmp_path / "off.json", "aaa", {1: 10.0})
    (tmp_path / "empty.json").write_text(json.dumps(dict(points=[])))
    assert ab_summary.main([pair, "--dir", str(tmp_path)]) == 1
    assert why in capsys.readouterr().err
