"""The instruction format, the opcode table and the dump tool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mk.batch import SeqChunk, StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.instructions.base import family_of
from mk.ir import (INSTR_WORDS, Instruction, Op, SignalScope, deserialize, dump, format_instruction,
                   main, serialize)
from mk.plan import PlanConfig, plan_step

ROOT = Path(__file__).resolve().parent.parent
MODEL = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, vocab_size=256)
KERNEL = KernelConfig(token_block=8, page_size=4, max_batch_tokens=64, max_seqs=8, max_context=64)
BATCH = StepBatch([SeqChunk(list(range(13)), 3, list(range(4))), SeqChunk([5], 20, list(range(4, 10)))])


def test_every_opcode_has_a_family():
    values = [int(op) for op in Op]
    assert len(values) == len(set(values))
    for op in Op:
        fam = family_of(op)
        assert int(op) in [int(o) for o in fam.opcodes]


def test_encode_decode_roundtrip():
    ins = Instruction(opcode=Op.ATTENTION, layer=7, row0=3, rows=5, col0=1, cols=2,
                      waits=[(10, 3), (11, 1)], signal=99, signal_scope=SignalScope.PEER,
                      signal_rank=3, signal_count=2, args=list(range(14)))
    w = ins.encode()
    assert len(w) == INSTR_WORDS
    assert Instruction.decode(w) == ins
    t = serialize([ins, ins])
    assert t.dtype == torch.int32 and t.shape == (2, INSTR_WORDS)
    assert deserialize(t) == [ins, ins]


def test_plan_stream_roundtrips():
    plan = plan_step(BATCH, MODEL, ParallelConfig(2, 1), KERNEL, PlanConfig(kv_split=8))
    assert plan.instrs.dtype == torch.int32 and plan.instrs.shape[1] == INSTR_WORDS
    assert torch.equal(serialize(deserialize(plan.instrs)), plan.instrs)


def test_bad_stream_refused():
    with pytest.raises(ValueError, match="int32"):
        deserialize(torch.zeros(3, INSTR_WORDS, dtype=torch.int64))
    with pytest.raises(ValueError, match="int32"):
        dump(torch.zeros(3, 5, dtype=torch.int32))


def test_dump_is_readable():
    plan = plan_step(BATCH, MODEL, ParallelConfig(2, 0), KERNEL, PlanConfig(kv_split=8))
    text = dump(plan.instrs)
    lines = text.splitlines()
    assert len(lines) == len(plan)
    for name in ("EMBED", "TP_REDUCE", "QKV_ROPE", "ATTENTION", "ATTN_REDUCE", "O_PROJ", "GATE_UP",
                 "DOWN", "LM_NORM", "LM_HEAD", "RMSNORM"):
        assert name in text
    att = next(line for line in lines if "ATTENTION" in line)
    assert "kv0=" in att and "page_off=" in att and "wait[c" in att
    assert "@all" in text and "@r1" in text          # signal scopes
    assert "residual=1" in text
    only = dump(plan.instrs, opcode=int(Op.LM_HEAD))
    assert only and all("LM_HEAD" in line for line in only.splitlines())
    assert format_instruction(plan.instrs[0].tolist(), 0).startswith("      0 EMBED")


def test_dump_names_split_words():
    cfg = PlanConfig(kv_split=8, split_k=2, splitk_align=8)
    plan = plan_step(BATCH, MODEL, ParallelConfig(1, 0), KERNEL, cfg)
    lines = dump(plan.instrs).splitlines()
    tile = next(line for line in lines if line.split()[1] == "GATE_UP")
    assert "nsplit=2" in tile and "j=" in tile and "k0=" in tile and "split_row=" in tile
    assert "up_col=128" in tile      # intermediate_size at TP 1
    red = next(line for line in lines if "SPLITK_REDUCE" in line)
    assert "op=" in red and "nsplit=2" in red and "stride=" in red


def test_dump_cli(tmp_path, capsys):
    plan = plan_step(BATCH, MODEL, ParallelConfig(1, 0), KERNEL)
    f = tmp_path / "plan.pt"
    plan.save(f)
    assert main(["dump", str(f), "--op", "LM_HEAD"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# {len(plan)} instructions:")
    assert "LM_HEAD" in out and "QKV_ROPE      " not in out
    torch.save(plan.instrs, tmp_path / "raw.pt")
    r = subprocess.run([sys.executable, "-m", "mk.ir", "dump", str(tmp_path / "raw.pt"), "--stop", "3"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().splitlines()) == 4
    r = subprocess.run([sys.executable, "-m", "mk.ir", "dump", str(tmp_path / "missing.pt")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "error" in r.stderr
