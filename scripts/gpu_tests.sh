#!/usr/bin/env bash
# The megakernel core GPU suite, in one command on the device machine (H100/H200):
#   . .gpu/prelude.sh && export PYTHONPATH=$PWD:$PYTHONPATH && bash scripts/gpu_tests.sh [OUTDIR]
# Runs: the compile gate + `pytest -m gpu` (megakernel tests), the micro-benchmarks (with an A/B of
# compile variants in the same process), compute-sanitizer memcheck / racecheck / synccheck on a
# small plan, racecheck of other hand-off modes, and the racecheck probe of hand-off patterns
# (bench/probes/racecheck_mbarrier_probe.py). Logs and JSON go to OUTDIR ($OUT on the device tool,
# else bench/results/); at most 6 files, the device tool brings back 8.
# Knobs (environment):
#   MK_STEPS         steps to run (default "tests bench san probe")
#   MK_AB            extra bench variants MODE:BACKOFF_NS,... ("" = none); "group:1000" is the
#                    original kernel (named-barrier hand-offs, 1 us backoff cap)
#   MK_SAN_EXTRA     other hand-off modes to racecheck as well (default "warp")
#   MK_TESTS_EXTRA   more GPU test files for the "tests" step (default: the model-step, ops, GEMM
#                    and attention GPU tests)
# Step "step_san": memcheck + racecheck of a two-layer tiny model step (mk.megakernel_step check).
set -u
OUTDIR=${1:-${OUT:-bench/results}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
DATE=$(date +%Y-%m-%d)
STEPS=${MK_STEPS:-"tests bench step_san san probe"}
AB=${MK_AB-"group:1000,warp:1000,thread:1000,thread:500,thread:100,thread:50"}
SAN_EXTRA=${MK_SAN_EXTRA-"warp"}
MK_TESTS_EXTRA=${MK_TESTS_EXTRA-"tests/test_megakernel_step_gpu.py tests/test_megakernel_ops_gpu.py tests/test_splitk_gpu.py tests/test_gemm_gpu.py tests/test_attention_gpu.py"}
MK_TESTS_EXTRA=$(for f in $MK_TESTS_EXTRA; do [ -f "$f" ] && printf '%s ' "$f"; done)
COMMIT=${MK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
export MK_COMMIT=$COMMIT
rc=0
SAN="$OUTDIR/sanitizers_$DATE.log"
: > "$SAN"
san() {  # san TOOL HANDOFF LABEL ARGS...
  local tool=$1 label=$2; shift 2
  local extra=""
  [ "$tool" = memcheck ] && extra="--report-api-errors no"
  local t0=$SECONDS
  echo "== compute-sanitizer --tool $tool $extra $label" >> "$SAN"
  timeout ${MK_SAN_TIMEOUT:-150} compute-sanitizer --tool $tool $extra python3 "$@" > "$OUTDIR/san.tmp" 2>&1
  echo "exit $? ($((SECONDS - t0)) s)" >> "$SAN"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK|rror|azard|sanitize|Invalid|Race|== probe" \
      "$OUTDIR/san.tmp" | cut -c1-400 | head -60 >> "$SAN"
  echo "== $tool $label: $(tail -n +1 "$OUTDIR/san.tmp" | grep -E "SUMMARY" | tail -1) ($((SECONDS - t0)) s)"
  rm -f "$OUTDIR/san.tmp"
}
HAVE_SAN=0; command -v compute-sanitizer >/dev/null && HAVE_SAN=1
[ $HAVE_SAN = 1 ] || echo "compute-sanitizer not found" >> "$SAN"
# most telling first (a run cut short by its time limit still leaves the earlier logs)
if [ $HAVE_SAN = 1 ]; then
  case " $STEPS " in *" probe "*)
    san racecheck "(probe: which hand-offs racecheck models)" bench/probes/racecheck_mbarrier_probe.py ;;
  esac
  case " $STEPS " in *" step_san "*)
    for tool in memcheck racecheck; do
      san $tool "(two-layer tiny model step vs mk.vm)" -m mk.megakernel_step check --layers 2 \
          --decode-steps 1
    done ;;
  esac
  case " $STEPS " in *" san "*)
    san racecheck "(megakernel, default hand-off)" bench/megakernel_core.py --sanitize
    for h in $SAN_EXTRA; do
      san racecheck "(megakernel, handoff $h)" bench/megakernel_core.py --sanitize --handoff "$h"
    done ;;
  esac
fi
case " $STEPS " in *" tests "*)
  T0=$SECONDS
  {
    echo "== $(date -u) $(nvidia-smi -L 2>/dev/null | head -1) commit $COMMIT"
    python3 -m pytest -q -m "compile or gpu" tests/test_megakernel_compile.py \
        tests/test_megakernel_gpu.py tests/test_megakernel_backend.py $MK_TESTS_EXTRA \
        -p no:cacheprovider -rA 2>&1
    echo "== tests took $((SECONDS - T0)) s"
  } > "$OUTDIR/gpu_tests_$DATE.log" 2>&1 || rc=1
  tail -4 "$OUTDIR/gpu_tests_$DATE.log" ;;
esac
case " $STEPS " in *" bench "*)
  T0=$SECONDS
  timeout 300 python3 bench/megakernel_core.py --out "$OUTDIR/megakernel_core_$DATE.json" \
      --trace-dir "$OUTDIR" --ab "$AB" > "$OUTDIR/bench_$DATE.log" 2>&1 \
      || { rc=1; tail -30 "$OUTDIR/bench_$DATE.log"; }
  echo "== bench took $((SECONDS - T0)) s" >> "$OUTDIR/bench_$DATE.log" ;;
esac
if [ $HAVE_SAN = 1 ]; then
  case " $STEPS " in *" san "*)
    for tool in memcheck synccheck; do
      san $tool "(megakernel, default hand-off)" bench/megakernel_core.py --sanitize
    done ;;
  esac
fi
echo "== sanitizer summary"
cat "$SAN"
exit $rc
