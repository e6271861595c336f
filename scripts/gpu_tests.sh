#!/usr/bin/env bash
# The megakernel core GPU suite, in one command on the device machine (H100/H200):
#   . .gpu/prelude.sh && export PYTHONPATH=$PWD:$PYTHONPATH && bash scripts/gpu_tests.sh [OUTDIR]
# Runs: the compile gate, `pytest -m gpu` (megakernel tests), the micro-benchmarks, and
# compute-sanitizer memcheck / racecheck / synccheck on a small plan. Logs and JSON go to OUTDIR
# ($OUT on the device tool, else bench/results/).
set -u
OUTDIR=${1:-${OUT:-bench/results}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 MK_TRACE_OUT="$OUTDIR"
DATE=$(date +%Y-%m-%d)
rc=0
{
  echo "== $(date -u) $(nvidia-smi -L 2>/dev/null | head -1) commit ${MK_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
  python3 -m pytest -q -m "compile or gpu" tests/test_megakernel_compile.py tests/test_megakernel_gpu.py \
      -p no:cacheprovider -rA 2>&1
} > "$OUTDIR/gpu_tests_$DATE.log" 2>&1 || rc=1
tail -5 "$OUTDIR/gpu_tests_$DATE.log"
timeout 240 python3 bench/megakernel_core.py --out "$OUTDIR/megakernel_core_$DATE.json" \
    --trace-dir "$OUTDIR" > "$OUTDIR/bench_$DATE.log" 2>&1 || { rc=1; tail -30 "$OUTDIR/bench_$DATE.log"; }
SAN="$OUTDIR/sanitizers_$DATE.log"
: > "$SAN"
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck synccheck; do
    extra=""
    [ "$tool" = memcheck ] && extra="--report-api-errors no"
    echo "== compute-sanitizer --tool $tool" >> "$SAN"
    timeout 200 compute-sanitizer --tool $tool $extra \
        python3 bench/megakernel_core.py --sanitize > "$OUTDIR/san_$tool.tmp" 2>&1
    echo "exit $?" >> "$SAN"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK|rror|azard|sanitize plan ok|Invalid|Race" "$OUTDIR/san_$tool.tmp" | head -40 >> "$SAN"
    rm -f "$OUTDIR/san_$tool.tmp"
  done
else
  echo "compute-sanitizer not found" >> "$SAN"
fi
cat "$SAN"
exit $rc
