#!/bin/bash
# GPU call: GEMM timing through the megakernel (bench/gemm.py --suite) + where-the-time-goes jobs
# (bench/gemm_profile.py: variants, journal) + ncu of two launches + the SASS HGMMA check.
# Usage (on the GPU machine, after the prelude): bash bench/gemm_gpu_profile.sh "$OUT" "TIME_JOBS" "NCU_JOBS" [suite args]
set -u
OUT=$1; TJOBS=$2; NJOBS=$3; shift 3
T=/tmp/gprof; rm -rf $T; mkdir -p $T
D=$(date +%F)
LOCK=/tmp/mk_gemm_gpu.lock
# the suite holds the GPU lock for its whole run; the profile jobs compile meanwhile and wait
if [ "$#" -gt 0 ]; then
  python3 -c "import fcntl,subprocess,sys; f=open('$LOCK','w'); fcntl.flock(f,2); sys.exit(subprocess.call(sys.argv[1:]))" \
    python3 bench/gemm.py --out $T/gemm_megakernel.json "$@" > $T/suite.log 2>&1 &
  SUITE=$!
  sleep 2
fi
python3 bench/gemm_profile.py --jobs "$TJOBS" --out $T/profile_jobs.json > $T/profile.log 2>&1 &
PROF=$!
if [ -n "$NJOBS" ]; then
  ncu --clock-control none --profile-from-start off --target-processes all \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section SourceCounters --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --import-source no -f -o $T/ncu_%p \
      python3 bench/gemm_profile.py --jobs "$NJOBS" --out $T/ncu_jobs.json > $T/ncu.log 2>&1 &
  NCU=$!
fi
# SASS of two compiled variants (same PTX as the launched kernels): HGMMA in the consumer
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
[ -n "$NJOBS" ] && wait $NCU
[ "$#" -gt 0 ] && wait $SUITE
for f in $T/ncu_*.ncu-rep; do
  [ -e "$f" ] || continue
  ncu -i $f --page details --csv > ${f%.ncu-rep}.details.csv 2>&1
  ncu -i $f --page source --csv --print-source sass > ${f%.ncu-rep}.source.csv 2>&1
done
python3 bench/gemm_ncu_summary.py $T > $T/ncu_summary.txt 2>&1
cat $T/sass.log $T/profile.log $T/ncu.log $T/ncu_summary.txt | head -c 20000 > $OUT/gemm_profile_$D.log
[ -f $T/gemm_megakernel.json ] && cp $T/gemm_megakernel.json $OUT/gemm_megakernel_$D.json
[ -f $T/gemm_megakernel.png ] && cp $T/gemm_megakernel.png $OUT/gemm_megakernel_$D.png
cp $T/suite.log $OUT/gemm_megakernel_$D.log 2>/dev/null
cp $T/profile_jobs.json $OUT/gemm_profile_jobs_$D.json 2>/dev/null
tar -C $T -czf $OUT/gemm_prof_raw.tgz --exclude='*.ptx' --exclude='*.cubin' . 2>/dev/null
tail -n 45 $T/suite.log; cat $T/sass.log; grep -h '^{' $T/profile.log $T/ncu.log | cut -c1-400; head -c 5000 $T/ncu_summary.txt
