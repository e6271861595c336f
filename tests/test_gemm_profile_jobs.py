"""bench/gemm_profile.py's job strings (CPU): each EXPERIMENT part sets its switch in the job's
environment, and an unknown part is refused rather than timing the default build under its name."""

from __future__ import annotations

import pytest

from bench.gemm_profile import job_env


def test_job_parts_set_their_switches():
    assert job_env("O_PROJ:1024:time:") == {"MK_GEMM_EXPERIMENT": ""}
    assert job_env("O_PROJ:64:floor:") == {"MK_GEMM_EXPERIMENT": ""}
    assert job_env("DOWN:256:launch:") == {"MK_GEMM_EXPERIMENT": ""}
    assert job_env("DOWN:64:time:nostore+nob1+batch+tile=m64n128+nosig") == {
        "MK_GEMM_EXPERIMENT": "nostore,nob1", "MK_GEMM_EPI_BATCH": "1"}
    assert job_env("O_PROJ:64:journal:noop") == {"MK_GEMM_EXPERIMENT": ""}


@pytest.mark.parametrize("job", ["O_PROJ:1024:time:tmastore=1", "O_PROJ:1024:time:nostor",
                                 "O_PROJ:1024:time", "O_PROJ:1024:timing:"])
def test_bad_jobs_are_refused(job):
    with pytest.raises(SystemExit, match="gemm_profile: job"):
        job_env(job)


def test_ktrace_part_sets_the_k_step_trace():
    assert job_env("GATE_UP:4096:journal:ktrace=128") == {
        "MK_GEMM_EXPERIMENT": "", "MK_GEMM_KTRACE": "128"}
    assert job_env("GATE_UP:1024:journal:ktrace=64+reglow=80+reghigh=208") == {
        "MK_GEMM_EXPERIMENT": "", "MK_GEMM_KTRACE": "64", "MK_REG_LOW": "80",
        "MK_REG_HIGH": "208"}
