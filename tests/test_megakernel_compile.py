"""Compile gate (CPU, CI): the megakernel (rows family only: the variant of rows-only plans; and the
all-opcode variant of a TP=1 model step: rows + the 5 GEMM slots of an M class + attention +
EMBED/LM_NORM) compiles for sm_90a with fake tensors, its PTX holds the instructions its roles are
meant to use, and ptxas reports no spills and no C7506/C7508/C7510. The single-opcode GEMM
variants: tests/test_gemm_compile.py."""

from __future__ import annotations

import os
import re

import pytest

from _compile_gate import assert_clean, dump_dir, ptxas_report  # noqa: F401  (env set first)

pytestmark = pytest.mark.compile

REQUIRED_PTX = {
    "setmaxnreg": r"setmaxnreg\.(inc|dec)",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "ld.acquire": r"ld\.acquire\.gpu",
    "release atomic": r"(red|atom)\.release\.gpu",
    "nanosleep": r"nanosleep",
    "mbarrier try_wait": r"mbarrier\.try_wait",
    "globaltimer (bounded waits)": r"%globaltimer",
}


def compile_to_ptx(journal: bool, handoff: str | None = None, gemm: tuple = ()) -> str:
    """Compile the megakernel with fake (dynamic-shape) tensors; return its PTX text."""
    import mk.megakernel as M
    comp = M.compile_fake(journal=journal, handoff=handoff or M.DEFAULT_HANDOFF, gemm=gemm)
    assert comp.__ptx__, "no PTX kept"
    return comp.__ptx__


@pytest.mark.parametrize("journal,handoff", [(False, None), (True, None), (False, "warp"),
                                             (False, "group")],
                         ids=["plain", "journal", "handoff-warp", "handoff-group"])
def test_megakernel_compiles_for_sm90a(dump_dir, journal, handoff):
    ptx = compile_to_ptx(journal, handoff)
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    rep = ptxas_report(ptx, os.path.join(dump_dir, f"rows_{journal}_{handoff}"))
    regs = assert_clean(rep)
    import mk.megakernel as M
    assert M.reg_split_ok(M.REG_LOW, M.REG_HIGH, regs), (regs, M.REG_LOW, M.REG_HIGH)
    print(rep.strip().splitlines()[-3:])


# (M class, KV page size): decode, mid, prefill classes of the tile table
FULL_VARIANTS = [(64, 16), (256, 16), (1024, 64)]


@pytest.mark.parametrize("m,page_size", FULL_VARIANTS, ids=[f"M{m}-ps{p}" for m, p in FULL_VARIANTS])
def test_all_opcode_variant_compiles_without_spills(dump_dir, m, page_size):
    """The variant a TP=1 model step runs: every opcode but TP_REDUCE in one kernel. Its consumer
    runs at the QKV_ROPE split (80/208) and holds 5 GEMM bodies + the attention consumer; the
    storer holds the GEMM, attention and gather storers. No spill, no stack frame."""
    import mk.megakernel as M
    slots = M.class_slots(m)
    assert {g.op for g in slots} == set(M.GEMM_OPS)
    comp = M.compile_fake(gemm=slots, attn_page_size=page_size, gather=True)
    ptx = comp.__ptx__
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    assert re.search(r"wgmma\.mma_async", ptx) and re.search(r"ex2\.approx", ptx)
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    rep = ptxas_report(ptx, os.path.join(dump_dir, f"full_M{m}_ps{page_size}"))
    regs = assert_clean(rep)
    low, high = M.reg_split(slots)
    assert M.reg_split_ok(low, high, regs), (regs, low, high)
    print(f"M{m} ps{page_size} split {low}/{high}",
          [ln.strip() for ln in rep.splitlines() if "registers" in ln or "spill" in ln])


@pytest.mark.parametrize("handoff", ["warp", "group"])
def test_attention_variant_other_handoffs_compile(dump_dir, handoff):
    """The attention bodies follow the page barriers' share of every hand-off mode (256 for the
    default "thread", 8 for "warp" / "group"): rows + attention + gather, no spills."""
    import mk.megakernel as M
    comp = M.compile_fake(handoff=handoff, attn_page_size=16, gather=True)
    rep = ptxas_report(comp.__ptx__, os.path.join(dump_dir, f"attn_{handoff}"))
    assert_clean(rep)


def test_import_mk_does_not_load_cutlass():
    import subprocess
    import sys
    code = ("import sys, mk, mk.instructions.base as b; b._load_all(); "
            "import mk.trace; assert 'cutlass' not in sys.modules, 'cutlass imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
