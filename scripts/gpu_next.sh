#!/usr/bin/env bash
# The next GPU session's A/B run, in one command on the device machine (about 15-20 min):
#   . .gpu/prelude.sh && export PYTHONPATH=$PWD:$PYTHONPATH && MK_COMMIT=<sha> bash scripts/gpu_next.sh
# Steps (MK_STEPS, default all, most telling first; logs under $OUT, else bench/results/):
#   journal   where a step's time goes per opcode, with each role's own times (loader / consumer /
#             storer; new this session): decode B=1 and 256 of the 70B TP8 rank (megakernel only)
#   cf_check  MK_GEMM_CONSUMER_FREE=1 + MK_ATTN_CONSUMER_FREE=1 (GEMM operand pages and attention
#             K/V pages freed by the consumers): GEMM, split-K and attention GPU tests, the
#             two-layer step vs mk.vm, racecheck of that step
#   cf_time   the end-to-end step with neither / GEMM only / attention only / both, at B=1 and 256
#             (megakernel only)
#   abort     MK_ABORT_POLL_AFTER_NS=2000 (page waits poll the abort word only after 2 us): the
#             two-layer check, then the e2e step at B=1 and 256 (compare with cf_time_00)
#   norm      MK_NORM_W_HOIST=1 (RMSNORM's weight loads first): the rows GPU tests and the check,
#             then the e2e step at B=1 and 256 with the journal (RMSNORM's mean us)
# What to read: journal_*.log role columns (attention's ~30 us per instruction, RMSNORM's 23 us);
# cf_*.log pass/fail and the two e2e tables.
set -u
OUTDIR=${1:-${OUT:-bench/results}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
STEPS=${MK_STEPS:-"journal cf_check cf_time abort norm"}
B="python launch/bench.py --systems megakernel --skip-check --mixed none --reps 10 --warmup 3 --no-png"
rc=0
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
if has journal; then
  timeout 240 $B --batch 1,256 --journal --out "$OUTDIR/journal.json" > "$OUTDIR/journal.log" 2>&1 || rc=1
  rm -f "$OUTDIR"/*_journal.pt
  grep -v "^\[mk\." "$OUTDIR/journal.log" | grep -A14 "megakernel journal" | head -40
fi
if has cf_check; then
  L="$OUTDIR/cf_check.log"
  (                             # a subshell: the switches stay inside it
    export MK_GEMM_CONSUMER_FREE=1 MK_ATTN_CONSUMER_FREE=1
    timeout 360 python -m pytest -m gpu -q -rA -p no:cacheprovider tests/test_gemm_gpu.py \
        tests/test_splitk_gpu.py tests/test_attention_gpu.py 2>&1 | tail -8
    for a in "--layers 2" "--layers 2 --split-k 0"; do
      echo "== check $a (consumer free)"
      timeout 100 python -m mk.megakernel_step check $a 2>&1 | grep -v "^\[mk" | tail -1 \
          | cut -c1-300
    done
    echo "== racecheck, two-layer step, split-K auto, consumer free"
    timeout 150 compute-sanitizer --tool racecheck python -m \
        mk.megakernel_step check --layers 2 --decode-steps 1 --split-k 0 2>&1 \
        | grep -E "SUMMARY|passed" | cut -c1-200
  ) > "$L" 2>&1 || rc=1
  cat "$L"
fi
if has cf_time; then
  for gc in "0 0" "1 0" "0 1" "1 1"; do
    set -- $gc
    MK_GEMM_CONSUMER_FREE=$1 MK_ATTN_CONSUMER_FREE=$2 timeout 150 $B --batch 1,256 \
        --out "$OUTDIR/cf_time_$1$2.json" > "$OUTDIR/cf_time_$1$2.log" 2>&1 || rc=1
    echo "== MK_GEMM_CONSUMER_FREE=$1 MK_ATTN_CONSUMER_FREE=$2"
    grep -E "^decode" "$OUTDIR/cf_time_$1$2.log"
  done
fi
if has abort; then
  (
    export MK_ABORT_POLL_AFTER_NS=2000
    echo "== check --layers 2 --split-k 0 (abort poll after 2 us)"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 2>&1 | grep -v "^\[mk" \
        | tail -1 | cut -c1-300
    timeout 150 $B --batch 1,256 --out "$OUTDIR/abort_time.json" > "$OUTDIR/abort_time.log" 2>&1
    grep -E "^decode" "$OUTDIR/abort_time.log"
  ) 2>&1 | tee "$OUTDIR/abort.log" || rc=1
fi
if has norm; then
  (
    export MK_NORM_W_HOIST=1
    timeout 200 python -m pytest -m gpu -q -p no:cacheprovider tests/test_megakernel_gpu.py \
        2>&1 | tail -3
    echo "== check --layers 2 --split-k 0 (norm weights hoisted)"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 2>&1 | grep -v "^\[mk" \
        | tail -1 | cut -c1-300
    timeout 200 $B --batch 1,256 --journal --out "$OUTDIR/norm_time.json" \
        > "$OUTDIR/norm_time.log" 2>&1
    rm -f "$OUTDIR"/norm_time_*_journal.pt
    grep -E "^decode|^RMSNORM|^LM_NORM" "$OUTDIR/norm_time.log"
  ) 2>&1 | tee "$OUTDIR/norm.log" || rc=1
fi
exit $rc
