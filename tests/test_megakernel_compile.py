"""Compile gate (CPU, CI): the megakernel compiles for sm_90a with fake tensors, its PTX holds the
instructions its roles are meant to use, and ptxas reports no spills and no C7506/C7508/C7510."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile

import pytest

pytestmark = pytest.mark.compile

# before cutlass is imported (its env is read once): sm_90a, and dumps into a scratch folder
_DUMP = tempfile.mkdtemp(prefix="mk_dump_")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", _DUMP)

REQUIRED_PTX = {
    "setmaxnreg": r"setmaxnreg\.(inc|dec)",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "ld.acquire": r"ld\.acquire\.gpu",
    "release atomic": r"(red|atom)\.release\.gpu",
    "nanosleep": r"nanosleep",
    "mbarrier try_wait": r"mbarrier\.try_wait",
    "globaltimer (bounded waits)": r"%globaltimer",
}
BAD_PTXAS = ("C7506", "C7508", "C7510")


def _find_ptxas():
    for c in (shutil.which("ptxas"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "ptxas")):
        if c and os.path.exists(c):
            return c
    return None


def compile_to_ptx(journal: bool, dump_dir: str, handoff: str | None = None) -> str:
    """Compile the megakernel with fake (dynamic-shape) tensors; return its PTX text."""
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32, Int64
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

    import mk.megakernel as M
    S = cute.sym_int
    T, H, NB = S(), S(divisibility=8), S()
    args = [make_fake_compact_tensor(Int32, (S(), 32), stride_order=(1, 0), assumed_align=4), Int32(1),
            make_fake_compact_tensor(Int32, (S(),), assumed_align=4), Int32(1),
            make_fake_compact_tensor(Int32, (16,), assumed_align=4),
            make_fake_tensor(BFloat16, (T, H, NB), stride=(S(divisibility=8), 1, S(divisibility=8)),
                             assumed_align=16),
            make_fake_tensor(BFloat16, (S(), H), stride=(S(divisibility=8), 1), assumed_align=16),
            Int32(1), Float32(1e-5), Int64(1),
            make_fake_compact_tensor(Int64, (S(), 8), stride_order=(1, 0), assumed_align=8),
            make_fake_compact_tensor(Int64, (S(), 4), stride_order=(1, 0), assumed_align=8),
            Int32(132), make_fake_stream()]
    # KeepPTX as a compile option: works even when cutlass was imported before the env was set
    dsl = M.MegakernelDSL(journal=journal, handoff=handoff or M.DEFAULT_HANDOFF)
    comp = cute.compile[cute.GPUArch("sm_90a"), cute.KeepPTX, cute.KeepCUBIN](dsl, *args)
    ptx = comp.__ptx__
    if not ptx:
        new = sorted(glob.glob(os.path.join(dump_dir, "*Megakernel*.ptx")), key=os.path.getmtime)
        assert new, f"no PTX kept (KeepPTX / CUTE_DSL_DUMP_DIR={dump_dir})"
        ptx = open(new[-1]).read()
    return ptx


def ptxas_report(ptx: str, workdir: str) -> str:
    """ptxas -v on the PTX. A local ptxas older than the DSL's PTX ISA gets the .version line
    lowered to its own (the kernel uses no newer instruction; ptxas rejects it otherwise)."""
    ptxas = _find_ptxas()
    if ptxas is None:
        pytest.skip("no ptxas on this machine")
    path = os.path.join(workdir, "mk.ptx")
    open(path, "w").write(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                       capture_output=True, text=True)
    out = r.stdout + r.stderr
    m = re.search(r"current version is '(\d+\.\d+)'", out)
    if r.returncode and m:
        open(path, "w").write(re.sub(r"^\.version \d+\.\d+", f".version {m.group(1)}", ptx,
                                     flags=re.M))
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                           capture_output=True, text=True)
        out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    return out


@pytest.fixture(scope="module")
def dump_dir():
    pytest.importorskip("cutlass")
    # CuTe DSL reads CUTE_DSL_DUMP_DIR once per process: another test module may have set it first
    # (and removed its folder since). Use the folder actually in force, and make sure it exists.
    d = os.environ["CUTE_DSL_DUMP_DIR"]
    os.makedirs(d, exist_ok=True)
    yield d
    if d == _DUMP:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("journal,handoff", [(False, None), (True, None), (False, "warp"),
                                             (False, "group")],
                         ids=["plain", "journal", "handoff-warp", "handoff-group"])
def test_megakernel_compiles_for_sm90a(dump_dir, journal, handoff):
    ptx = compile_to_ptx(journal, dump_dir, handoff)
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    rep = ptxas_report(ptx, dump_dir)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    assert spills and all(a == "0" and b == "0" for a, b in spills), rep
    stack = re.findall(r"(\d+) bytes stack frame", rep)
    assert all(s == "0" for s in stack), rep
    bad = [c for c in BAD_PTXAS if c in rep]
    assert not bad, f"ptxas warned {bad}:\n{rep}"
    print(rep.strip().splitlines()[-3:])


def test_import_mk_does_not_load_cutlass():
    import subprocess
    import sys
    code = ("import sys, mk, mk.instructions.base as b; b._load_all(); "
            "import mk.trace; assert 'cutlass' not in sys.modules, 'cutlass imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
