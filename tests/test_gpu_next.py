"""scripts/gpu_next.sh's contract for a device call (no GPU needed: a deadline every step misses
makes each step print its skip line and run nothing)."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_next.sh"


def run_script(tmp_path, steps: str, deadline: int = 1):
    env = dict(os.environ, MK_STEPS=steps, MK_DEADLINE_S=str(deadline))
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_steps_run_in_the_order_asked(tmp_path):
    """Steps run in MK_STEPS's order, whatever their order in the file (verify's block comes
    first there: session 35 lost a timing listed before it), each once, with what remains of
    the deadline; a skipped step makes the call's status nonzero."""
    for steps in (["memcheck", "synccheck", "verify"], ["verify", "memcheck"]):
        r = run_script(tmp_path, " ".join(steps))
        skipped = re.findall(r"^== (\w+) skipped: .* MK_DEADLINE_S=(-?\d+)", r.stdout, re.M)
        assert [s for s, _ in skipped] == steps, r.stdout + r.stderr
        assert all(int(d) <= 1 for _, d in skipped), skipped
        assert r.returncode == 1, r.returncode


def test_an_unknown_step_is_refused_before_anything_runs(tmp_path):
    """A step name with no block of its own is refused by name (exit 2), before the steps
    asked next to it run."""
    r = run_script(tmp_path, "memcheck no_such_step", deadline=570)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "step 'no_such_step' has 0 blocks" in r.stderr
    assert "memcheck" not in r.stdout


# What a device call carries besides the tracked tree: .gpu/ with CuTe DSL's archive
# (../shared/gpu/cutlass-dsl-4.8.1-cu13-py312.tar.xz) and prelude.sh, under one 64 MiB limit.
# Sizes are counted in whole 4 KiB blocks, as the disk holds them: counted in bytes, the tree
# session 70's call was refused for fitted by 0.2 MiB; in blocks it was 0.9 MiB over.
DEVICE_CARRY_LIMIT = 64 << 20
BLOCK = 4096
GPU_DIR_SIZES = (54_558_872, 1_108)
# one session's results (~0.3-0.7 MiB of JSON, logs and charts) must still fit
SESSION_RESULTS_BYTES = 1 << 19


def blocks(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def test_the_tree_fits_a_device_call():
    """The tracked tree plus .gpu/ stays under the device tool's 64 MiB with room for one more
    session's results (session 70's first call was refused for a tree over the limit). When
    this fails, move the oldest results into an archive (bench/results/README.md says how)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    tree = sum(blocks((ROOT / f).stat().st_size) for f in files if f and (ROOT / f).is_file())
    gpu_dir = sum(blocks(s) for s in GPU_DIR_SIZES)
    room = DEVICE_CARRY_LIMIT - gpu_dir - tree
    assert room >= SESSION_RESULTS_BYTES, (
        f"tracked tree {tree / 2**20:.2f} MiB + .gpu {gpu_dir / 2**20:.2f} MiB leaves "
        f"{room / 2**20:.2f} MiB of the device call's 64 MiB: archive old bench/results")
