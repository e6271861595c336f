#!/bin/bash
# One GPU call: GEMM timing through the megakernel (bench/gemm.py --suite), extra GPU commands,
# where-the-time-goes jobs (bench/gemm_profile.py: variants, journal), ncu of launches, SASS check.
# Every GPU-timed part holds /tmp/mk_gemm_gpu.lock; compiles overlap.
# Usage (GPU machine, after the prelude):
#   bash bench/gemm_gpu_profile.sh OUT "TIME_JOBS" "NCU_JOBS" "SRC_JOBS" "EXTRA_CMD" [suite args]
# NCU_JOBS: hardware-counter sections; SRC_JOBS: SourceCounters (PC sampling, SASS patching) alone.
set -u
OUT=$1; TJOBS=$2; NJOBS=$3; SJOBS=$4; EXTRA=$5; shift 5
T=/tmp/gprof; rm -rf $T; mkdir -p $T
D=$(date +%F)
LOCK=/tmp/mk_gemm_gpu.lock
locked() { python3 -c "import fcntl,subprocess,sys; f=open('$LOCK','w'); fcntl.flock(f,2); sys.exit(subprocess.call(sys.argv[1:]))" "$@"; }
(
  [ "$#" -gt 0 ] && locked python3 bench/gemm.py --out $T/gemm_megakernel.json "$@" > $T/suite.log 2>&1
  [ -n "$EXTRA" ] && locked bash -c "$EXTRA" > $T/extra.log 2>&1
) &
SUITE=$!
sleep 2
python3 bench/gemm_profile.py --jobs "$TJOBS" --out $T/profile_jobs.json > $T/profile.log 2>&1 &
PROF=$!
NCU=
if [ -n "$NJOBS" ]; then
  ncu --clock-control none --profile-from-start off --target-processes all \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
      -f -o $T/ncu_hw_%p \
      python3 bench/gemm_profile.py --jobs "$NJOBS" --out $T/ncu_jobs.json > $T/ncu.log 2>&1 &
  NCU=$!
fi
python3 - > $T/sass.log 2>&1 <<'PY'
import os, subprocess, sys
sys.path.insert(0, "tests")
import mk.megakernel as M
from mk.ir import Op
from _compile_gate import ptxas_report
for op, m in ((Op.O_PROJ, 4096), (Op.LM_HEAD, 256)):
    comp = M.compile_fake(gemm=M.class_slots(m, [op]))
    work = f"/tmp/gprof/sass_{op.name}_{m}"
    os.makedirs(work, exist_ok=True)
    rep = ptxas_report(comp.__ptx__, work)
    sass = subprocess.run(["cuobjdump", "--dump-sass", os.path.join(work, "mk.ptx.cubin")],
                          capture_output=True, text=True).stdout
    open(f"/tmp/gprof/sass_{op.name}_{m}.sass", "w").write(sass)
    n = sum(1 for l in sass.splitlines() if "HGMMA" in l)
    print(op.name, m, "HGMMA lines:", n, "|", [l.strip() for l in rep.splitlines() if "registers" in l or "spill" in l])
    print("  first:", next((l.strip() for l in sass.splitlines() if "HGMMA" in l), None))
PY
wait $PROF
[ -n "$NCU" ] && wait $NCU
if [ -n "$SJOBS" ]; then
  MK_PROFILE_TIMEOUT_S=30 timeout 150 ncu --clock-control none --profile-from-start off --target-processes all \
      --section SourceCounters --import-source no -f -o $T/ncu_src_%p \
      python3 bench/gemm_profile.py --jobs "$SJOBS" --out $T/ncu_src_jobs.json > $T/ncu_src.log 2>&1
fi
wait $SUITE
for f in $T/ncu_*.ncu-rep; do
  [ -e "$f" ] || continue
  ncu -i $f --page details --csv > ${f%.ncu-rep}.details.csv 2>&1
  case $f in *src*) ncu -i $f --page source --csv --print-source sass > ${f%.ncu-rep}.source.csv 2>&1;; esac
done
python3 bench/gemm_ncu_summary.py $T > $T/ncu_summary.txt 2>&1
cat $T/sass.log $T/profile.log $T/extra.log $T/ncu.log $T/ncu_src.log $T/ncu_summary.txt 2>/dev/null | head -c 60000 > $OUT/gemm_profile_$D.log
[ -f $T/gemm_megakernel.json ] && cp $T/gemm_megakernel.json $OUT/gemm_megakernel_$D.json
[ -f $T/gemm_megakernel.png ] && cp $T/gemm_megakernel.png $OUT/gemm_megakernel_$D.png
cp $T/suite.log $OUT/gemm_megakernel_$D.log 2>/dev/null
cp $T/profile_jobs.json $OUT/gemm_profile_jobs_$D.json 2>/dev/null
tar -C $T -czf $OUT/gemm_prof_raw.tgz --exclude='*.ptx' --exclude='*.cubin' . 2>/dev/null
tail -n 28 $T/suite.log; tail -n 30 $T/extra.log 2>/dev/null; cat $T/sass.log; grep -h '^{' $T/profile.log $T/ncu.log $T/ncu_src.log 2>/dev/null | cut -c1-330; head -c 3500 $T/ncu_summary.txt
