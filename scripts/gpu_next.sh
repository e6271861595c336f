#!/usr/bin/env bash
# The next GPU session's run of the experimental compile-time switches (all off by default, their
# default PTX byte-identical to the GPU-verified kernel), in one command on the device machine:
#   . .gpu/prelude.sh && export PYTHONPATH=$PWD:$PYTHONPATH && MK_COMMIT=<sha> bash scripts/gpu_next.sh
# The switches (what each removes: bench/E2E_NOTES.md, GEMM_NOTES.md, ATTENTION_NOTES.md):
#   MK_ATTN_Q_HOIST=1           attention's Q fragment loads issued at once (suspect of its ~30 us
#                               fixed cost per instruction: 16-32 dependent L2 round trips)
#   MK_NORM_W_HOIST=1           RMSNORM's norm-weight loads issued per chunk (suspect of its 23 us)
#   MK_ABORT_POLL_AFTER_NS=2000 page waits read the abort word only after 2 us
#   MK_SPLITK_LOADS_FIRST=1     SPLITK_REDUCE's partial loads ahead of the adds (2 x nsplit dependent
#                               round trips -> nsplit / 2)
#   MK_ATTN_REDUCE_LOADS_FIRST=1 ATTN_REDUCE's LSE and partial loads two splits ahead (its 13.5 us)
#   MK_ATTN_TABLE_PREFETCH=1    the attention loader's page-table entries 32 per warp load (suspect
#                               of the ~2.4 us per 64-key block: one L2 round trip per block)
# Steps (MK_STEPS, default all, most telling first; logs under $OUT, else bench/results/):
#   attnexp attention leave-one-out experiments (MK_ATTN_EXPERIMENT nomath / noload / nostore and
#          combinations, each its own compiled variant, bench/ATTENTION_NOTES.md "Leave-one-out
#          experiments"): decode ctx1024 B=1 / 64, ctx512 B=64, ctx8192 B=32 in the standalone
#          harness, cold / warm us and the difference to "none": attnexp.log, attnexp.json (~2 min)
#   base   the step as it is: decode B=1 and 256 of the 70B TP8 rank, timed, with the journal's
#          per-opcode breakdown and each role's own times (megakernel only)
#   check  every switch on: GEMM, split-K, attention, rows GPU tests, the two-layer step vs mk.vm
#          (split-K never / auto), racecheck of that step
#   time   every switch on: the same points as base, with the journal
#   each   one switch at a time: the same points, timed (no journal), to attribute the gain
#   ncu    Nsight Compute warp-stall sampling per source line (CUTE_DSL_LINEINFO=1), one launch of
#          4 layers at B = 1 and 256 (MK_NCU_BATCH): ncu_b*.ncu-rep, ncu_b*_source.csv.gz, ncu_details.csv
#   spread every switch on, decode splits spread over the SMs (PlanConfig.kv_split_min=64: at
#          B=1 the one attention instruction per layer becomes 16): the two-layer check with
#          spread splits, then B=1 / 16 / 64 timed (compare with time / base at B=1)
# Read: attnexp.log (the case x experiment table), base.log vs all.log (the opcode tables),
# check.log (all passed, 0 hazards), each_*.log (packed in each.tar.gz). At most 7 files per
# call: the device tool brings back 8.
# Device time (estimate, one H200, warm): attnexp ~2 min, base + check + time + spread ~12-14 min,
# each ~8 min: run MK_STEPS=attnexp alone (files attnexp.log / .json), MK_STEPS="base check time
# spread" next, "each" in a third call.
set -u
OUTDIR=${1:-${OUT:-bench/results}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
STEPS=${MK_STEPS:-"attnexp base check time spread each"}
SWITCHES=${MK_SWITCHES:-"MK_ATTN_Q_HOIST=1 MK_ATTN_TABLE_PREFETCH=1 MK_NORM_W_HOIST=1 MK_SPLITK_LOADS_FIRST=1 MK_ATTN_REDUCE_LOADS_FIRST=1 MK_ABORT_POLL_AFTER_NS=2000"}
B="python launch/bench.py --systems megakernel --skip-check --mixed none --reps 10 --warmup 3 --no-png"
rc=0
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
table() { grep -v "^\[mk\." "$1" | grep -E "^decode|^[A-Z_]+ +[0-9]|^step span|^opcode"; }
if has attnexp; then
  timeout 480 python bench/attention.py \
      --experiments ${MK_ATTN_EXPERIMENTS:-none,nomath,noload,nostore,noload+nomath,noload+nomath+nostore} \
      --cases ${MK_ATTN_EXP_CASES:-decode-ctx1024-b1,decode-ctx512-b64,decode-ctx1024-b64,decode-ctx8192-b32} \
      --exp-timeout 420 --out "$OUTDIR/attnexp.json" > "$OUTDIR/attnexp.log" 2>&1 || rc=1
  echo "== attention leave-one-out (us cold / warm [minus none])"
  grep -E "^\[attention\] (exp|experiments|FAIL|experiment .* FAILED)" "$OUTDIR/attnexp.log" \
      || tail -30 "$OUTDIR/attnexp.log"
fi
if has base; then
  timeout 240 $B --batch 1,256 --journal --out "$OUTDIR/base.json" > "$OUTDIR/base.log" 2>&1 || rc=1
  rm -f "$OUTDIR"/base_*_journal.pt "$OUTDIR"/base_*_timeline.png
  echo "== base"; table "$OUTDIR/base.log"
fi
if has check; then
  (
    export $SWITCHES
    echo "== switches: $SWITCHES"
    timeout 420 python -m pytest -m gpu -q -p no:cacheprovider ${MK_CHECK_TESTS:-tests/test_gemm_gpu.py \
        tests/test_splitk_gpu.py tests/test_attention_gpu.py tests/test_megakernel_gpu.py} 2>&1 \
        | tail -6
    for a in "--layers 2 --split-k 1" "--layers 2 --split-k 0"; do
      echo "== check $a"
      timeout 100 python -m mk.megakernel_step check $a 2>&1 | grep -v "^\[mk" | tail -1 \
          | cut -c1-300
    done
    echo "== racecheck, two-layer step, split-K auto"
    timeout 150 compute-sanitizer --tool racecheck python -m mk.megakernel_step check \
        --layers 2 --decode-steps 1 --split-k 0 2>&1 | grep -E "SUMMARY|passed" | cut -c1-200
  ) > "$OUTDIR/check.log" 2>&1 || rc=1
  cat "$OUTDIR/check.log"
fi
if has time; then
  (
    export $SWITCHES
    timeout 240 $B --batch 1,256 --journal --out "$OUTDIR/all.json" > "$OUTDIR/all.log" 2>&1
  ) || rc=1
  rm -f "$OUTDIR"/all_*_journal.pt "$OUTDIR"/all_*_timeline.png
  echo "== every switch on"; table "$OUTDIR/all.log"
fi
if has spread; then
  (
    export $SWITCHES
    echo "== check --layers 2 --kv-split 256 --kv-split-min 64"
    timeout 100 python -m mk.megakernel_step check --layers 2 --kv-split 256 --kv-split-min 64 \
        2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
    timeout 200 $B --batch 1,16,64 --plan kv_split_min=64 --out "$OUTDIR/spread.json" \
        > "$OUTDIR/spread_time.log" 2>&1
    grep -E "^decode" "$OUTDIR/spread_time.log"
  ) 2>&1 || rc=1
fi
if has ncu; then
  # where the warps of the step wait, per source line (CUTE_DSL_LINEINFO: the Python lines of the
  # instruction bodies): Nsight Compute's warp-stall sampling of one megakernel launch, 4 layers
  for b in ${MK_NCU_BATCH:-1 256}; do
    CUTE_DSL_LINEINFO=1 timeout 240 ncu --clock-control none -k regex:Megakernel -c 1 \
        --section SourceCounters --section WarpStateStats --section SpeedOfLight \
        -f -o "$OUTDIR/ncu_b$b" $B --batch $b --layers 4 --reps 1 --warmup 1 \
        --out /tmp/ncu_b$b.json > /tmp/ncu_b$b.log 2>&1 || { rc=1; tail -20 /tmp/ncu_b$b.log; }
    ncu -i "$OUTDIR/ncu_b$b.ncu-rep" --page source --csv --print-source cuda,sass \
        > "$OUTDIR/ncu_b${b}_source.csv" 2> /tmp/ncu_src.err \
      || ncu -i "$OUTDIR/ncu_b$b.ncu-rep" --page source --csv --print-source sass \
        > "$OUTDIR/ncu_b${b}_source.csv" 2>> /tmp/ncu_src.err || cat /tmp/ncu_src.err
    ncu -i "$OUTDIR/ncu_b$b.ncu-rep" --page details --csv >> "$OUTDIR/ncu_details.csv" 2>&1
    echo "== ncu batch $b"; ls -la "$OUTDIR"/ncu_b$b*; head -c 600 "$OUTDIR/ncu_b${b}_source.csv"; echo
  done
  gzip -f "$OUTDIR"/ncu_b*_source.csv
fi
if has each; then
  for sw in $SWITCHES; do
    name=$(echo "${sw%%=*}" | tr 'A-Z' 'a-z')
    ( export "$sw"; timeout 150 $B --batch 1,256 --out "$OUTDIR/each_$name.json" \
        > "$OUTDIR/each_$name.log" 2>&1 ) || rc=1
    echo "== $sw"; grep -E "^decode" "$OUTDIR/each_$name.log"
  done
  # one file for the device tool (it brings back 8 at most)
  tar -C "$OUTDIR" -czf "$OUTDIR/each.tar.gz" $(cd "$OUTDIR" && ls each_*) && rm -f "$OUTDIR"/each_*
fi
exit $rc
