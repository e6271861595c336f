"""Shared setup of the CPU compile gates (tests/test_megakernel_compile.py,
tests/test_gemm_compile.py): the CuTe DSL environment, set once per process before cutlass is
imported (the DSL reads it once), and the ptxas helpers.

    from _compile_gate import BAD_PTXAS, DUMP, dump_dir, ptxas_report, ptxas_figures
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import pytest

# before cutlass is imported: sm_90a, and dumps into a scratch folder (CUTE_DSL_DUMP_DIR must
# exist, or nothing is written and nothing complains)
DUMP = os.environ.get("CUTE_DSL_DUMP_DIR") or tempfile.mkdtemp(prefix="mk_dump_")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("CUTE_DSL_DUMP_DIR", DUMP)
# C7518: wgmmas serialized by a compiler-inserted wait (an accumulator set or read in the shadow of
# a chain in flight; session 47's two-block swapped chain, removed). No default variant has one.
BAD_PTXAS = ("C7506", "C7508", "C7510", "C7518", "C7519")


def _find_ptxas():
    """ptxas from the `nvidia-cuda-nvcc` wheel of the test extra first (it matches the DSL's PTX
    ISA), else a CUDA toolkit's."""
    from mk.cuda_tools import find_tool
    return find_tool("ptxas")


def ptxas_report(ptx: str, workdir: str) -> str:
    """ptxas -v on the PTX. A local ptxas older than the DSL's PTX ISA gets the .version line
    lowered to its own (the kernel uses no newer instruction; ptxas rejects it otherwise)."""
    ptxas = _find_ptxas()
    # A gate that silently does not run proves nothing: no ptxas is a failure, not a skip.
    assert ptxas is not None, ("no ptxas found: install the test extra (pip install -e '.[test]' "
                               "brings nvidia-cuda-nvcc) or a CUDA toolkit")
    os.makedirs(workdir, exist_ok=True)
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


def assert_clean(rep: str):
    """No spills, no stack frame, no BAD_PTXAS warning; returns the registers ptxas used."""
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    assert spills and all(a == "0" and b == "0" for a, b in spills), rep
    stack = re.findall(r"(\d+) bytes stack frame", rep)
    assert all(s == "0" for s in stack), rep
    bad = [c for c in BAD_PTXAS if c in rep]
    assert not bad, f"ptxas warned {bad}:\n{rep}"
    used = [int(v) for v in re.findall(r"Used (\d+) registers", rep)]
    assert used, rep
    return max(used)


def assert_split_variant(ptx: str, required: dict, want_partials: int, workdir: str) -> int:
    """A split-K variant's PTX: every `required` pattern present, no call, want_partials partial
    stores (8-byte st.global.v2.b32, one per accumulator pair), then ptxas clean and silent.
    Returns the registers ptxas used."""
    missing = [k for k, rx in required.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    got = len(re.findall(r"st\.global\.v2\.b32", ptx))
    assert got == want_partials, f"{got} partial stores (st.global.v2.b32), expected {want_partials}"
    rep = ptxas_report(ptx, workdir)
    regs = assert_clean(rep)
    assert "warning" not in rep.lower(), rep        # ptxas silent
    print([ln.strip() for ln in rep.splitlines() if "registers" in ln or "spill" in ln])
    return regs


@pytest.fixture(scope="module")
def dump_dir():
    pytest.importorskip("cutlass")
    # the folder actually in force (read once per process), made sure to exist
    d = os.environ["CUTE_DSL_DUMP_DIR"]
    os.makedirs(d, exist_ok=True)
    yield d


def probe_module(name: str):
    """bench/probes/<name>.py as a module (the probes are scripts, not a package)."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(root, "bench", "probes", name + ".py"))
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    return probe


def swapped_probe():
    """bench/probes/swapped_decode_probe.py (its compile_ptx, and wgmma_modes: the PTX's wgmma
    shapes / transposes, which the swapped decode chain's tests count)."""
    return probe_module("swapped_decode_probe")


def hgmma_loop(sass: str, shape: str) -> list[str]:
    """The loop around the HGMMA.<shape> instructions in `nvdisasm -c` output (a GEMM's K loop,
    an attention unit's key-block loop): the instructions from the label that the first backward
    branch after the last HGMMA.<shape> jumps to (at or before the first HGMMA) through that
    branch."""
    lines = sass.splitlines()
    label_at = {m.group(1): i for i, ln in enumerate(lines)
                if (m := re.match(r"^(\.L_x_\d+):", ln))}
    hgmma = [i for i, ln in enumerate(lines) if f"HGMMA.{shape}" in ln]
    assert hgmma, f"no HGMMA.{shape} in the SASS"
    for k in range(hgmma[-1] + 1, len(lines)):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", lines[k])
        if m and label_at.get(m.group(1), len(lines)) <= hgmma[0]:
            return [ln for ln in lines[label_at[m.group(1)]:k + 1]
                    if re.match(r"^\s+/\*[0-9a-f]+\*/", ln)]
    raise AssertionError("no backward branch closes the HGMMA loop")


def megakernel_sass(tmp_path, switches: dict, m: int, build: str, op: str) -> str:
    """The SASS (bench/code_size.compile_sass) of the megakernel variant of M class m, build
    `build` (mk.megakernel.BUILDS) around opcode op, with the MK_* switches `switches` (every
    other MK_ variable dropped), compiled in a process of its own: the switches are read at
    import."""
    import sys
    from pathlib import Path
    bench = Path(__file__).resolve().parent.parent / "bench"
    from mk.cuda_tools import find_tool
    if find_tool("ptxas") is None or find_tool("nvdisasm") is None:
        pytest.fail("ptxas / nvdisasm missing: pip install -e '.[test]' brings both")
    code = ("import sys; sys.path.insert(0, %r); import code_size as cs; "
            "print(cs.compile_sass(%d, sys.argv[1], build=%r, op=%r))" % (str(bench), m, build, op))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MK_")}
    env.update(switches)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=str(bench.parent))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
