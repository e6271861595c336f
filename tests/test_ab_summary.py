"""bench/ab_summary.py (CPU): A/B rows from two launch/bench.py JSONs, errors for bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import ab_summary  # noqa: E402


def _bench_json(path: Path, commit: str, ms: dict) -> None:
    points = [dict(batch=b, results=dict(megakernel=dict(status="ok", ms=v, p10_ms=v - 0.1,
                                                         p90_ms=v + 0.1)))
              for b, v in ms.items()]
    points.append(dict(batch=999, results=dict(megakernel=dict(status="error"))))
    path.write_text(json.dumps(dict(git_commit=commit, device="H200", command="bench",
                                    points=points)))


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
                            "--append"]) == 0
    assert [p["name"] for p in json.loads(out.read_text())["ab"]] == ["x", "y"]


@pytest.mark.parametrize("pair,why", [("nofiles", "is not NAME=OFF.json,ON.json"),
                                      ("x=off.json", "is not NAME=OFF.json,ON.json"),
                                      ("x=off.json,missing.json", "missing.json"),
                                      ("x=off.json,empty.json", "no megakernel timing")])
def test_bad_pairs_say_why(tmp_path, capsys, pair, why):
    _bench_json(tmp_path / "off.json", "aaa", {1: 10.0})
    (tmp_path / "empty.json").write_text(json.dumps(dict(points=[])))
    assert ab_summary.main([pair, "--dir", str(tmp_path)]) == 1
    assert why in capsys.readouterr().err
