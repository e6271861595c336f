"""Compile gate (CPU, CI): the megakernel (rows family only: the variant of rows-only plans)
compiles for sm_90a with fake tensors, its PTX holds the instructions its roles are meant to use,
and ptxas reports no spills and no C7506/C7508/C7510. The GEMM variants (one per M class):
tests/test_gemm_compile.py."""

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


def test_import_mk_does_not_load_cutlass():
    import subprocess
    import sys
    code = ("import sys, mk, mk.instructions.base as b; b._load_all(); "
            "import mk.trace; assert 'cutlass' not in sys.modules, 'cutlass imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
