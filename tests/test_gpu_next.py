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
