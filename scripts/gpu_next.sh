#!/usr/bin/env bash
# The next GPU session's steps, in one script run on the device machine:
#   . .gpu/prelude.sh && export PYTHONPATH=$PWD:$PYTHONPATH && MK_COMMIT=<sha> MK_STEPS="..." \
#       bash scripts/gpu_next.sh
# Logs under $OUT (else bench/results/); at most 7 files per call (the device tool brings back 8).
# Steps (MK_STEPS; each call at most 10 minutes, so about two or three steps per call):
#   verify the default build's correctness checks (checks() below: the megakernel and whole-step
#          GPU tests, the two-layer step vs mk.vm with split-K never / auto, racecheck): verify.log;
#          MK_VERIFY_EXTRA: more pytest files / node ids (a changed tile's GPU tests);
#          MK_VERIFY_FILES: the pytest files instead of the megakernel and step tests (the whole
#          suite does not fit one 600 s call with the checks: split it over two)
#   swapsplit MK_ATTN_SWAP_SPLIT=1 (a lone decode unit's key blocks over both warpgroups): the
#          attention harness GPU tests, two-layer checks (--kv-split 1024 and default), racecheck
#          + synccheck: swapsplit.log (~7 min)
#   swapsplittime MK_ATTN_SWAP_SPLIT off / on, decode MK_SWAPSPLIT_BATCH (1,16,64,128), journal
#          on: swapsplittime.log, swapsplittime_{off,on}.json (~5 min)
#   repeat the same decode run MK_REPEAT_N (3) times in fresh processes, MK_REPEAT_ENV (none =
#          the default build), MK_REPEAT_BATCH (64,256), journal on, core dumps on exception,
#          read with cuda-gdb where present: repeat.log, repeat_<i>.json (~2 min a run)
#   pairrace racecheck + synccheck of the two-layer step with every decode paired (attn_pair=2,
#          unequal block counts), the environment as it is: pairrace.log (~4 min)
#   normfold PlanConfig.norm_fold: GPU tests -k row_scale, the two-layer checks with it (folds on /
#          off, split-K auto / 2), racecheck; if clean decode MK_NF_BATCH (64,256) default vs
#          --plan MK_NF_ON (norm_fold=1,fold_o_reduce=0,fold_down_reduce=0) and B=64 with
#          norm_fold=1,splitk_max_tokens=32 (O_PROJ / DOWN unsplit), no journal: normfold.log
#          (~8 min)
#   nf2    PlanConfig.norm_fold=2 (unsplit QKV / gate-up tiles scale their rows after an
#          epilogue wait for the row-scale norm): GPU tests, two-layer checks (split-K never /
#          auto), racecheck; if clean decode MK_NF2_BATCH (256,1024) default / norm_fold=1 / 2,
#          no journal: nf2.log, nf2_{off,nf1,nf2}.json (~7 min)
#   qkv256 QKV_ROPE on m128n256 in the 1024 / max classes (MK_TILES): two-layer checks,
#          racecheck; if clean decode B=1024 / 4096 default / the tile: qkv256.log (~7 min)
#   gu64   GATE_UP at <= 64 tokens on gu_m128n56, 32-row reduce slices (the default since
#          session 71): the two-layer checks of 64-token steps, racecheck, bench/gemm.py GATE_UP
#          64, then decode MK_GU64_BATCH (1,16,64,96,128) default / session 70's: gu64.log
#          (~7 min)
#   ktrace the GEMM K-step trace (MK_GEMM_KTRACE): journal jobs of GATE_UP / DOWN at M = 1024
#          and 4096, 128 K steps traced, then decode MK_KT_BATCH (1024) journaled with 64: per
#          K step when the loads were issued / wanted / landed and the tensor pipe's cycles
#          (mk.trace.gemm_ktrace): ktrace*.log, ktrace.json, ktrace_step.json (~5 min)
#   clocks the SM clock and power (nvidia-smi every 100 ms) under each system's timed reps:
#          per point of MK_CL_POINTS ("4096:256 mixed"), the megakernel then torch.compile +
#          CUDA graph, 60 reps each: does the megakernel run at a lower clock under the power cap
#          than the peer (energy per step as a lever)? MK_CL_GAP_MS: each also with that idle
#          before each rep; MK_CL_VARIANTS (NAME:VAR=VALUE[/VAR=VALUE] ...): megakernel builds
#          timed between the two: clocks.log, clocks.csv, clocks_<point>_<system>.json (~6 min)
#   ktsplit why the step's build runs a GEMM K step ~25% slower than the harness's: GATE_UP / DOWN
#          alone through the step's kernel at --layers 2 / 20 / 80 (MK_KTS_LAYERS) with the
#          K-step trace; at 80 layers also --isolated-builds lean (only that opcode's GEMM slot
#          compiled in): ktsplit.log, ktsplit_l*.json (~6 min; session 42: the build, not the data)
#   ktbisect which part of the step's build slows its GEMM tiles: GATE_UP / DOWN alone (B=1024,
#          2 layers, journal; the K-step trace with MK_KTB_KTRACE=64) through the step's kernel
#          and --isolated-builds lean, gemms, families, then the step's kernel and lean with
#          MK_WAIT_SLIM=1 (the mbarrier waits without their inline deadline and error code),
#          then the step's kernel with MK_GEMM_TWIN=0 (compact waits only) and with
#          MK_WAIT_COMPACT=0 MK_GEMM_TWIN=0 (session 43's default): ktbisect.log,
#          ktbisect{,_slim,_compact,_old}.json (~8 min)
#   attnlpt PlanConfig.attn_lpt=1 (session 56, a plan change only: a layer's ATTENTION queued
#          as the prompt's chunks first, then the decode units, each longest first; schedsim
#          -1.7% on the mixed step): the two-layer checks of the 1144- and 478-token steps with
#          it, then if both passed the mixed step (MK_AL_MIXED, 256:1024:1024) and decode
#          MK_AL_BATCH (1280 at ctx 256: the mixed step's kernel class, a plan unchanged by it),
#          default / attn_lpt=1 / default again, megakernel only, no journal: attnlpt.log,
#          attnlpt_*.json (~4 min)
#   normbig bigger row-scale norms: PlanConfig.norm_rows MK_NB_ROWS (32 64) with
#          norm_fill_max_tokens=0 (session 18's one-norm-per-SM rule was for norms on the
#          critical path; under norm_fold=2 the row-scale RMSNORMs run beside the GEMM mainloops,
#          so each 8-row instruction's ~4 us protocol is SM time the GEMMs lose: ~3.7% of the SMs
#          at B=1024, session 46's journal). The two-layer checks with each (208 tokens split-K
#          never / auto, 478 tokens: norms of 32 / 64 rows, folded, row-scale and full), then
#          decode MK_NB_BATCH (256,1024,4096) and the mixed step, default / each, megakernel
#          only, no journal: normbig.log, normbig_{default,r32,r64}.json (~8 min)
#   nself  PlanConfig.norm_fold=3 (session 46: an unsplit QKV / gate-up tile computes its rows'
#          statistic from its own A pages; the norms before unsplit GEMMs are not planned): the
#          two-layer checks (208 tokens split-K never / auto, 478 tokens), racecheck of the
#          split-K-never step (every tile self-scaled), then if clean decode MK_NS_BATCH
#          (256,1024,4096) and the mixed step, default (norm_fold=2) / norm_fold=3, and B=1024
#          with QKV_ROPE unsplit too (splitk_qkv_max_tokens=512: no norm left there, no QKV
#          reduce), megakernel only, no journal: nself.log, nself_{default,nf3,nf3q512}.json
#          (~8 min)
#   nf4    PlanConfig.norm_fold=4 (session 49: O_PROJ / DOWN / EMBED tiles write their rows'
#          per-64-column sums of squares of h into ROW_PART, the unsplit QKV / gate-up tiles sum
#          their rows' set before the mainloop; no norm before unsplit GEMMs): the step GPU tests
#          -k nf4, the two-layer checks (208 tokens split-K never / auto, 478 tokens), racecheck
#          of the split-K-never step, then if clean decode MK_NF4_BATCH (256,1024,4096) and the
#          mixed step, norm_fold=2 / norm_fold=4, megakernel only, no journal: nf4.log,
#          nf4_{nf2,nf4}.json (~9 min)
#   tilemax tiles of the M > 1024 class (B=4096's and the mixed step's) by MK_TILES: each entry
#          of MK_TM_TILES (default "QKV_ROPE@max=m128n256", space-separated) checked on
#          the 1144-token two-layer step (split-K never / auto) with racecheck (the default
#          build's racecheck of that step first), then decode
#          MK_TM_BATCH (4096) and the mixed step (MK_TM_MIXED, 256:1024:1024), megakernel only,
#          no journal, default / each / default again: tilemax.log, tilemax_*.json (~8 min)
#   shares the SM-time shares at the build as it is: decode MK_SH_BATCH (1024,4096) and the mixed
#          step (MK_SH_MIXED, 256:1024:1024), megakernel only, journal on (per opcode its count,
#          busy time and share; the critical path; since session 55 also per kind of
#          instruction): shares.log, shares_default.json (~4 min); MK_SH_PLAN: the same again
#          with --plan MK_SH_PLAN (shares_plan.json, ~+3 min)
#   backoff the counter waits' nanosleep cap: decode MK_BO_BATCH (1,16; none: no decode point)
#          and the mixed step MK_BO_MIXED (none; e.g. 0:1:4096, a prompt alone) at MK_BACKOFF_NS
#          in MK_BO_VALUES ("200 100 50 400 200"), megakernel only: backoff.log (~5 min)
#   slimhang where MK_WAIT_SLIM=1's mixed step hangs: slim at B=4096 + a 1200-token prompt-only
#          step, then the mixed step with MK_WAIT_SLIM_KINDS=2,3,4 (page waits unbounded) and 5,8
#          (instruction slots): a bounded wait that starves names the wait (~6 min)
#   waitslim decode MK_WS_BATCH (1,1024), the runs of MK_WS_RUNS (since session 53: default
#          (the watchdog) / MK_WAIT_WATCHDOG=0 / slim / default); session 51's: default /
#          MK_WAIT_CHECK_EVERY=16 (the mbarrier waits'
#          clock, deadline and abort word on every 16th failed try_wait) /
#          MK_COUNTER_CHECK_EVERY=16 (the counter waits' abort word and clock on every 16th
#          failed poll) / MK_WAIT_SLIM=1 (a probe: unbounded mbarrier waits; decode only) /
#          default again, megakernel only, no journal (MK_WS_MIXED=256:1024:1024: the bounded
#          ones also the mixed step, ~+30 s each): waitslim.log,
#          waitslim_{default,check16,ccheck16,slim,default2}.json (~8 min)
#   twin   MK_GEMM_TWIN=1 (DOWN's tiles through O_PROJ's compiled bodies) with MK_WAIT_COMPACT=1
#          (both the default since session 44): the step and split-K GPU tests, the two-layer
#          checks (208 and 478 tokens, split-K never / auto), racecheck: twin.log (~7 min)
#   twintime  decode MK_TWIN_BATCH (256,1024) old (MK_GEMM_TWIN=0 MK_WAIT_COMPACT=0) / compact
#          (MK_GEMM_TWIN=0) / twin + compact (the default), megakernel only, no journal:
#          twintime.log, twintime_{old,compact,twin}.json (~6 min)
#   ktncu  ncu warp-stall samples of the isolated GATE_UP consumer loop in the step's build and in
#          the lean build (--profile-isolated), bench/ncu_loop_stalls.py side by side (no_inst:
#          waits for instructions): ktncu.log, ncu_ktncu_*_source.csv.gz (~4 min)
#   memcheck the two-layer check at 478 tokens (split-K auto) and compute-sanitizer memcheck of the
#          two-layer step, the build as it is: memcheck.log, memcheck_full.log (~4 min)
#   synccheck compute-sanitizer synccheck of the two-layer step (session 32: 8 "Missing wait"
#          errors on the B pages' `full` phases before own_phase_seen): synccheck.log,
#          synccheck_full.log (~2 min); MK_SYNC_PROBE=1 adds the mbarrier probe's variants
#   attnexp attention leave-one-out experiments (MK_ATTN_EXPERIMENT nomath / noload / nostore and
#          combinations, each its own compiled variant, bench/ATTENTION_NOTES.md "Leave-one-out
#          experiments"): decode ctx1024 B=1 / 64, ctx512 B=64, ctx8192 B=32 in the standalone
#          harness, cold / warm us and the difference to "none": attnexp.log, attnexp.json (~2 min)
#   base   the step as it is: decode B=1 and 256 of the 70B TP8 rank, timed, with the journal's
#          per-opcode breakdown and each role's own times (megakernel only; ~3 min)
#   l2pf   PlanConfig.l2_prefetch_mib (L2_PREFETCH, bench/E2E_NOTES.md): the two-layer step vs
#          mk.vm and racecheck with it, then decode B=1 / 16 / 64 with --plan l2_prefetch_mib=40
#          and without: l2pf.log, l2pf_{on,off}.json (~5 min). Session 6: no gain (+0.1% / +1.1%
#          at B=1 / 64)
#   wgsplit MK_ATTN_WG_SPLIT=1 (the decode attention's key blocks split between the two consumer
#          warpgroups; GPU-verified in the harness, 0 spills in the M64 / M256 variants, spills
#          16 B at M1024): the attention harness and whole-step GPU tests, the two-layer checks,
#          racecheck; then decode B=1 / 64 / 256 with and without: wgsplit.log, wgsplit_*.json.
#          Session 6: -1.9% / -2.5% at B=1 / 64, checks passed, but racecheck of the two-layer
#          step reports 2 shared-memory hazards (bench/ATTENTION_NOTES.md): not timed until clean
#   split  PlanConfig.kv_split_min = MK_SPLIT_MIN (default 64; "64 128" for both): decode
#          attention spread over the SMs (one instruction of 1024 keys per layer is 31% of the
#          B=1 step; at B=64 half the SMs have no attention instruction). The two-layer check
#          with each, then decode B=1 / 16 / 64 (MK_SPLIT_BATCH) with the journal (ATTENTION and
#          ATTN_REDUCE rows) at 0 and each: split.log, split_*.json (~6 min with 64 alone).
#          MK_SPLIT_EXTRA=",kv_spread_min_splits=2": more PlanConfig fields for the non-zero ones
#          (session 9: 64 made default with kv_spread_min_splits 4: B=1..32 gained, 48 / 64 lost)
#   rwide  MK_ATTN_REDUCE_WIDE=1 (ATTN_REDUCE of a decode token's rows on all 256 consumer
#          threads, eight splits' loads at a time; bitwise-equal by construction): the harness's
#          reduce cases with 0 / 1 (checks, cold times), the GPU tests, the two-layer checks
#          (kv_split 64 and kv_split_min 64) and racecheck with it: rwide*.log,
#          rwide_harness_*.json (~7 min). Timed in session 9 (B=1 -3.0%, B=16 -0.7%); with
#          MK_RWIDE_TIME=1 also decode MK_RWIDE_BATCH with and without it: rwide_{on,off}.json
#   caps512 PlanConfig.splitk_qkv_max_tokens=512: the two-layer check with a 430-token first step
#          (M <= 512 class tiles) without split-K and with the cap, then decode B=384 / 512
#          (MK_C512_BATCH) as it is and with the cap, journal on: caps512.log,
#          caps512_{none,qkv}.json (~5 min)
#   tiles  MK_TILES=<MK_TILES_VALUE, default the M <= 256 class on the 64-row tiles> at
#          MK_TILES_BATCH (default 128,256; the 64-row tiles were the default before session 7, when
#          the 128-row tiles measured -10.4% / -13.7% at B=128 / 256): split-K GPU tests and the
#          two-layer check with it, then decode B=128 / 256 with and without: tiles.log,
#          tiles_{on,off}.json ("on" = the old tiles; ~5 min)
#   e2e    launch/bench.py with every system (megakernel, eager, CUDA graph, torch.compile +
#          graph, the floor) at MK_E2E_BATCH (default 1,16,64,256; the rest: "1024,4096" with
#          MK_E2E_MIXED=256:1024:1024 in a second call): e2e.log, e2e.json, e2e.png (~8 min)
#   storecheck MK_ATTN_STORE=$MK_STORE (loop, the default here, or bulk: the attention storer's
#          epilogue copy, bench/E2E_NOTES.md session 7): the attention harness GPU tests, the
#          two-layer checks (and one with KV splits over the SMs: mode 1 pages and ATTN_REDUCE),
#          racecheck: storecheck_$MK_STORE.log (~5 min). Session 7: bulk (without its proxy
#          fences) failed 3 harness tests, passed the rest
#   storetime decode B=1 / 64 / 256 (MK_STORE_BATCH) with and without it, journal on (the
#          storer's columns kv_freed .. p1_rest): storetime_$MK_STORE.log, _{on,off}.json (~6 min).
#          Session 7: bulk 11.659 -> 10.798 ms at B=1 (-7.4%), -5.0% at 64, -0.6% at 256
#   splitk256 decode B=256 (MK_SK_BATCH) with split-K never (--split-k 1) vs auto: the 128-row
#          tiles split O / GATE_UP / DOWN in 2 and QKV in 4 at B=256, and SPLITK_REDUCE is 11% of
#          the step's busy time there: splitk256.log, splitk256_{on,off}.json (~2 min)
#   wgrace MK_ATTN_WG_SPLIT=1's two-layer checks and racecheck only (no pytest, no timing): is
#          session 6's candidate fix racecheck-clean (hazard lines appended): wgrace.log (~4 min)
#   wgtime MK_ATTN_WG_SPLIT=1 timed only (no checks; pair it with wgrace on the other GPU):
#          decode B=1 / 64 / 256 with and without, journal on: wgtime.log, wgtime_{on,off}.json
#   opsplit decode B=256 (MK_OS_BATCH) as it is and with each token GEMM's split-K alone (--plan
#          splitk_<qkv|o|gate_up|down>_max_tokens=256; auto: QKV x4, the others x2), journal on:
#          opsplit.log, opsplit_<none|qkv|o|gate_up|down>.json (~5.5 min)
#   tiles256 decode B=128 / 256 (MK_T256_BATCH) with O_PROJ / DOWN on m128n128 tiles, GATE_UP on
#          gu_m128 (the tile before session 16; after its GPU tests), both, and neither (MK_TILES),
#          journal on:
#          tiles256.log, tiles256_{none,od,gu,both}.json (~8 min: a GPU of its own;
#          MK_T256_VARIANTS="none od": only those, ~2 min at B=256 alone). Before making
#          one a default: tests/test_splitk_gpu.py and the two-layer checks with it (verify)
#   opcombo the split-K caps together: the two-layer check with QKV / GATE_UP / DOWN split at up
#          to 256 tokens, then decode B=192 / 256 (MK_OC_BATCH) as it is, QKV + GATE_UP, and with
#          DOWN too, journal on: opcombo.log, opcombo_{none,qg,qgd}.json (~5.5 min)
#   rslice PlanConfig.splitk_reduce_rows (SPLITK_REDUCE cut into row slices, a planner change only:
#          the kernel is the same; 16 in steps of <= 64 tokens by default since session 10): the
#          two-layer check with split-K auto at MK_RSLICE_CHECK ("16 4") rows, then decode
#          MK_RSLICE_BATCH (64,256) with whole-tile reduces and at each of MK_RSLICE_ROWS ("16"),
#          MK_RSLICE_EXTRA appended to their --plan (e.g. ",splitk_reduce_max_tokens=256"),
#          journal on: rslice.log, rslice_<rows>.json (~4 min)
#   gemm   bench/gemm.py --suite (issue 5's table: the token GEMMs and LM head through the
#          megakernel vs cuBLAS and cuBLAS + epilogue at M = 64 / 256 / 1024 / 4096, checks
#          first; split along K as the planner splits, MK_GEMM_SPLIT=none for whole tiles):
#          gemm.log, gemm.json, gemm.png (~6 min; session 11 ran it with whole tiles)
#   ppbound what a ping-pong consumer schedule (each warpgroup its own tile, one's epilogue under
#          the other's mainloop; bench/GEMM_NOTES.md session 54) could buy at most, no new code:
#          bench/gemm_profile.py time jobs at M = 4096 (MK_PPB_M) of O_PROJ / DOWN / GATE_UP on
#          the table's tile as is and with the epilogue and stores compiled out (noepi+nostore),
#          and on the tile one warpgroup could hold alone (m128n128 / gu_m128n64: 1.33x the
#          operand bytes per flop) as is and without epilogue and stores (the bound: ping-pong
#          hides the epilogue at best and pulls this tile's bytes), m64n256 (1.67x) likewise;
#          DOWN at 1024 too: ppbound.log, ppbound.json (~6 min). Build it only if the bound is
#          >= 5% under the table's tile as is. Session 55 (one H100): the bound is 3-21% OVER
#          the table's tile at every point (O_PROJ 4096 +3.3%, DOWN +16%, GATE_UP +21%, DOWN
#          1024 +6.4%): ping-pong dropped.
#   gemmold bench/gemm.py of the tree at MK_AB_TREE (off) and of this one with whole tiles (on),
#          MK_GEMMOLD_OPS (GATE_UP,O_PROJ) at MK_GEMMOLD_M (4096): the ~8% the megakernel's tiles
#          take over session 3's standalone harness: gemmold.log, gemmold_{off,on}.json (~4 min)
#   page64 decode B=64 / 256 (MK_P64_BATCH) with KV pages of 16 (the default) and 64 tokens,
#          journal on: is the page-16 TMA gather the attention's limit: page64.log,
#          page64_{p16,p64}.json (~4 min)
#   attnstep decode B=256 (MK_ATTNSTEP_BATCH) with ATTENTION's math or loads compiled out
#          (MK_ATTN_EXPERIMENT, MK_ATTNSTEP_EXP="nomath noload"; garbage outputs, timing only:
#          launch/bench.py times such a build with a note since session 11, it refused before),
#          journal on: attnstep_<exp>.log / _{off,on}.json, attnstep.log (~5 min)
#   treeab decode B=1 / 64 / 256 (MK_TREEAB_BATCH) of the source tree at MK_AB_TREE ("off") and
#          of MK_AB_TREE_ON or this one ("on"), journal on: treeab.log, treeab_{off,on}.json (~6 min)
#   l2hint MK_L2_HINTS (L2 eviction priorities on TMA loads, mk/instructions/_rows_kernel.py:
#          "weights" = GEMM weight pages evict first, "kv" = decode K/V pages evict first;
#          "weights,kv" is the default since session 11, "none" the build before): the
#          two-layer check (split-K auto) with each value of MK_L2_VALUES ("weights,kv weights"; the hints
#          change no access, so no pytest / racecheck), then decode MK_L2_BATCH (1,64,256)
#          without hints and with each, journal on: l2hint.log, l2hint_{none,<value>}.json (~6 min)
#   normrows PlanConfig.norm_rows (rows per RMSNORM / LM_NORM instruction; 1 in steps of <= 64
#          tokens and 8 above since session 12, 8 everywhere before) at MK_NORMROWS_VALUES
#          ("4 2 1") in every step: the two-layer check with each, then decode
#          MK_NORMROWS_BATCH (16,64,256) with 8 and each, journal on: at B=64
#          an 8-row RMSNORM takes ~9.8 us where a 1-row one takes ~4 (two per layer on the
#          critical path, 19.6 of 153 us): normrows.log, normrows_<rows>.json (~6 min)
#   planpair plan variants on the default plan's compiled kernel, reps interleaved with its own in
#          one process (launch/bench.py --plan-ab): MK_PP ("l1:attn_lpt=1"; space-separated
#          NAME:FIELD=VALUE,...), at decode MK_PP_BATCH (none) and the mixed step MK_PP_MIXED
#          (0:1:4096), MK_PP_REPS (20) each, megakernel only, no journal: planpair.log,
#          planpair.json (~2 min + ~reps x steps; a plan that changes the kernel or the buffers,
#          e.g. kv_split or norm_fold, is refused: planab)
#   stepgpu the whole-step GPU tests alone (tests/test_megakernel_step_gpu.py, no two-layer checks
#          or racecheck: verify's) and the recorded-launch test of test_megakernel_gpu.py:
#          stepgpu.log (~5.5 min; with genoverlap in one call)
#   genoverlap generation jobs through the megakernel (bench/generate_overlap.py: the 70B TP8
#          rank, random weights, MK_GO_ARGS, default two jobs: 256 prompts of 256 tokens, 64 new
#          tokens, 1024 tokens a step, and 16 prompts of 128, 128 new, 256 a step; 3 rounds),
#          Engine.generate one step at a time vs planned ahead (overlap="plan") vs run ahead
#          (overlap=True); per round also the megakernel's device time and the wall time
#          outside it a step: genoverlap.log, genoverlap.json (~3 min)
#   od64   O_PROJ / DOWN at M <= 64 on MK_OD64_TILES (default m64n128, the tile before session 64;
#          session 64 ran it with MK_OD64_TILES m64n64 against m64n128, made m64n64 the default:
#          128 whole tiles, no split
#          reduce; norm_fold=4's ROW_PART then replaces the RMSNORM phases at B <= 64):
#          bench/gemm.py at M = 64 / 40 default / tiles, the two-layer checks with the tiles
#          (split-K never / auto, a 41-token first step), racecheck, then if clean decode
#          MK_OD64_BATCH (1,16,64) default / tiles: od64.log, od64_gemm_{off,on}.json,
#          od64_{off,on}.json (~8 min). Another class: see the step (MK_OD64_M, MK_OD64_ODD,
#          MK_OD64_LENS; m128n64 at 65..256 tokens, session 64's candidate; session 65: it won at
#          96 / 128 tokens and lost at 192 / 256, so 65..128 became a class of its own)
#   cls128 the 65..128-token class (session 65: O_PROJ / DOWN on m128n64, 128 whole tiles, ROW_PART
#          instead of the RMSNORM phases): the two-layer checks with first steps of 120 and 100
#          tokens (split-K auto / never), racecheck of the 120-token step, then decode
#          MK_C128_BATCH (96,128) at the default, no journal: cls128.log, cls128_on.json (~5 min)
#   launchhost where the host's 0.34 ms a launch goes (session 61's genoverlap): one prepared
#          step of the tiny model launched --reps times by part (bench/launch_host.py: full
#          launch, _args, argument marshalling, the host stub, a launch of arguments marshalled
#          once, a torch kernel; then the full launch under cProfile): launchhost.log,
#          launchhost.json (~1.5 min)
#   planab plan variants A/B (a plan change only, the kernel is the same): MK_PLANAB, space-separated
#          NAME:PLAN entries (PLAN as --plan takes it; default "od1:splitk_o_max_tokens=1,
#          splitk_down_max_tokens=1", O_PROJ / DOWN unsplit in steps of more than one token): the
#          two-layer check (split-K auto) with each, then decode MK_PLANAB_BATCH (16,64) as it is
#          and with each, journal on: planab.log, planab_<base|NAME>.json (~5 min with one plan).
#          MK_PLANAB_CHECK: more arguments of the check (e.g. "--prompt-lens 1,13,64,130,200,70":
#          478 tokens, four token blocks, where the queue policy matters); MK_PLANAB_RACE=1: a
#          racecheck of it too; an entry NAME:PLAN|VAR=VALUE also sets one environment variable
#          (MK_TILES: a tile A/B); MK_PLANAB_NOCHECK=1: the timings alone; MK_PLANAB_MIXED=
#          256:1024:1024: launch/bench.py's mixed step timed too
#   pair   PlanConfig.attn_pair (two decode units per ATTENTION instruction): two-layer checks,
#          racecheck, memcheck with every decode paired, then B=256,1024 (MK_PAIR_BATCH) without
#          pairs and with attn_pair=MK_PAIR_TIMED (default 1: auto), journal on: pair.log,
#          pair_check.log, pair_{off,on}.json (~7 min)
#   fold   --plan MK_FOLD_PLAN (fold_o_reduce=1: O_PROJ's SPLITK_REDUCE folded into the MLP norm
#          after it; "fold_o_reduce=1,fold_down_reduce=1" adds DOWN's, folded into the next
#          layer's attention norm, built in session 14, CPU-verified only): the two-layer checks
#          (split-K never / auto) and racecheck with it, a memcheck of the auto one
#          (memcheck_full.log), then decode MK_FOLD_BATCH (1,16,64) without and with it, journal
#          on: fold.log, fold_check.log, fold_{off,on}.json (~6 min). Session 14: O_PROJ's fold
#          with batched partial loads B=1 / 16 / 64 -1.1% / -1.1% / -2.8% (checks passed,
#          sanitizers of the session-13 body clean)
#   normbatch MK_NORM_ROW_BATCH_BIG (rows of an RMSNORM whose loads are in flight together, one
#          round trip and one named barrier per group, in the variants of 128-row tiles: the M
#          classes above 64; 2 by default since session 14): for each of MK_RB_VALUES (4 8) the
#          two-layer checks with every norm 32 rows (208 tokens split-K never / auto, 478
#          tokens) and with the default plan (478 tokens), racecheck of the first: normbatch.log
#          (~6 min; session 48: 4 and 8 compile without spills in the 256 / 1024 / 4096 classes)
#   normbatchtime the values whose normbatch checks passed in the same call (all of
#          MK_RB_VALUES where normbatch did not run) against the default, decode MK_RB_BATCH
#          (1024,4096) and the mixed step, megakernel only, no journal: normbatchtime.log,
#          normbatchtime_{default,rb<n>}.json (~6 min)
#   gathercons MK_GATHER_ROLE=consumers (EMBED / LM_NORM on both consumer warpgroups, RMSNORM's
#          page protocol, instead of the storer's 64 threads; LM_NORM through RMSNORM's own
#          body since session 49): the ops and step GPU tests, the
#          two-layer checks (208 tokens split-K never / auto, 478 tokens), racecheck of the first:
#          gathercons.log (~6 min)
#   gatherconstime MK_GATHER_ROLE storer (default) / consumers (skipped where gathercons ran in
#          the call and failed), decode MK_GC_BATCH (1024,4096) and the mixed step, megakernel
#          only, no journal: gatherconstime.log, gatherconstime_{storer,consumers}.json (~6 min)
#   claim  claim after loads (the controller claims the next ticket once the loader has issued the
#          previous instruction's loads, not when a ring slot frees; on for the M classes above 64
#          since session 13): the two-layer checks and racecheck with it forced on
#          (MK_CLAIM_CHECK=0: none), then decode MK_CLAIM_BATCH (64,192,256) with it forced off
#          (MK_CLAIM_AFTER_LOADS=0) and with MK_CLAIM_ON_ENV ("MK_CLAIM_AFTER_LOADS=1"; "" for the
#          default policy), journal on: claim.log, claim_check.log, claim_{off,on}.json (~4 min
#          of checks, ~2 min per timing)
#   islots MK_NISLOTS (the controller's instruction ring depth, 4 by default: an SM claims up to
#          that many consecutive tickets, so in a phase of about as many long tiles as SMs one SM
#          can run two back to back): the two-layer checks and racecheck at each of
#          MK_ISLOTS_CHECK ("2"; MK_ISLOTS_CHECK="" for none), then decode MK_ISLOTS_BATCH
#          (64,192,256) at each of MK_ISLOTS_VALUES ("4 3 2"), journal on: islots.log,
#          islots_check_<n>.log, islots_<n>.json (~3 min of checks per depth, ~2 min per timing)
#   stab   is a step time stable across processes: MK_STAB_RUNS (2) processes per tree (MK_AB_TREE
#          = "off" when set, this tree "on"), decode MK_STAB_BATCH (192,256), 30 reps after 5
#          warm-up, no journal: stab.log, stab_<tree>_<i>.json (~6 min with two trees)
#   l2skip L2 prefetch past the early-loaded ring (PlanConfig.l2_prefetch_skip / _o_proj, session
#          16: GATE_UP's K columns after each slice's first 256, O_PROJ left to its early loads):
#          the two-layer checks and racecheck with it (skip 64: the tiny model's slices are
#          short), then decode MK_L2SKIP_BATCH (1,64) as it is and at each MiB of MK_L2SKIP_MIB
#          ("40 24"), journal on: l2skip.log, l2skip_check.log, l2skip_<base|MiB>.json (~5 min)
#   fill   PlanConfig.split_fill_max_tokens (auto split-K factors that fill the SMs, not only powers
#          of two, in steps of at most that many tokens: QKV_ROPE's 10 head tiles split 13 ways
#          instead of 8; 64 by default since session 17, when this step measured B=1 / 16 / 64
#          / 128 / 256 -1.3% / -1.2% / -0.1% / +1.5% / +7.3% with it in every step): the
#          two-layer checks and racecheck with it in every step at --num-sms 40 (odd factors 5
#          / 10 in the tiny model's steps), a memcheck, then decode MK_FILL_BATCH (1,16,64) as it
#          is and with split_fill_max_tokens=0 (powers of two only), journal on: fill.log,
#          fill_check.log, fill_{base,off}.json (~6 min)
#   gutiles GATE_UP on MK_GU_TILE (default gu_m128: two B pages, the table's tile at 64 < M <= 1024
#          until session 16, when this step made gu_m128n64 the default there, run the other way
#          round: B=128 / 192 / 256 / 1024 -4.3% / -2.1% / -7.0% / -2.9%) in the M classes
#          MK_GU_CLASSES ("256 1024"): the GPU tests (tests/test_splitk_gpu.py and the two-page
#          gate/up tests of tests/test_gemm_gpu.py), the two-layer checks (never / auto; the
#          first step is 208 tokens: the 256 class) and racecheck, the auto check with a 478-token
#          first step (the 1024 class), a memcheck; then decode MK_GU_BATCH (128,192,512,1024) as
#          it is and with it, no journal: gutiles.log, gutiles_{off,on}.json (~9 min;
#          MK_GU_NOCHECK=1: the timings only, for a tile whose checks passed before)
#          MK_GU_TILES: the whole MK_TILES value instead (a tile per class, e.g. session 19's
#          "GATE_UP@256=gu_m128n56,GATE_UP@1024=gu_m128n112"), MK_GU_TESTS: the tile's GPU tests
#          (default the two-page gate/up tests)
#   wave   wave quantization in the 257..1024 class (96 / 160 / 192 / 224 wide tiles at 384 /
#          640 / 768 / 896 tokens): the two-layer check of the 1024 class with half-width O_PROJ /
#          DOWN / GATE_UP tiles (MK_WAVE_VARIANTS od128 gu56 both), then decode MK_WAVE_BATCH
#          (320,384,640,768) default / each: wave.log, wave_*.json (~7 min)
#   gemmncu a GEMM's whole-matrix launch against cuBLAS's kernel under Nsight Compute
#          (bench/gemm_ncu.py; MK_GN_OPS DOWN, MK_GN_M 1024: issue 5's last point over 1.0): the
#          tensor pipe, L2 -> SM bytes, issue slots and warp states side by side: gemmncu.log,
#          gemmncu_{details,raw}.csv.gz (~2 min)
#   gemmab MK_AB_ENV (a GEMM switch, VAR=VALUE words) through every GEMM GPU test, the
#          two-layer checks and racecheck; if clean bench/gemm.py at M = MK_AB_M (1024,4096)
#          default / switch / default: gemmab.log, gemmab_checks.log, gemmab_*.json (~9 min).
#          Session 68's cursor step, which it replaces: MK_AB_ENV="MK_GEMM_PAGE_CURSOR=0
#          MK_GEMM_UNIFORM_PAGES=0" (the old loop against the default)
#   gemmtc issue 5's table with the torch.compile peer too (matmul + epilogue compiled, checked
#          against eager torch before it is timed): MK_TC_OPS (O_PROJ,GATE_UP,DOWN; then
#          QKV_ROPE,LM_HEAD) at MK_TC_M (64,256,1024,4096): gemmtc.log, gemmtc.json (~9 min)
#   (attnuni, session 69's MK_ATTN_UNIFORM_PAGES=1: its checks passed, decode +0.9 / +1.1% at
#          B=64 / 256 in session 70, removed)
#   decab  MK_AB_ENV (a compile-time switch, VAR=VALUE words) and / or MK_AB_ARGS (bench.py
#          arguments, e.g. --plan ...) against the default in decode: default / switch /
#          default, MK_DECAB_BATCH (64,256,1024), no journal, no checks (run them first: gemmab,
#          swapsplit, tiles); MK_AB2_ENV / MK_AB2_ARGS a second variant: decab.log,
#          decab_{def,ab[,ab2],def2}.json (~6 min)
#   gemmsrc gemmncu's kernels instruction by instruction: ncu warp-stall sampling of mk's launch
#          and of cuBLAS's (one run each), the consumer loop's share and stall reasons
#          (bench/ncu_loop_stalls.py) and the 40 most-sampled SASS lines
#          (bench/gemm_ncu_summary.py): gemmsrc.log, ncu_gs_{mk,cublas}.source.csv.gz (~3 min)
#   ncu    Nsight Compute warp-stall sampling per source line (CUTE_DSL_LINEINFO=1), one launch of
#          4 layers at B = 1 and 256 (MK_NCU_BATCH): ncu_b*.ncu-rep, ncu_b*_source.csv.gz,
#          ncu_details.csv (at B=1 most samples are idle warps: see bench/E2E_NOTES.md)
#   wide   MK_GEMM_WIDE (one N = 256 chain over two B pages; default since session 23): bench/gemm.py
#          checks and timings with 0 / 1 and with two-B-page tiles elsewhere (MK_WIDE_TILES), the
#          two-layer checks of the 1024 class, racecheck, memcheck: wide.log, wide_gemm_*.json
#   widetime decode MK_WIDE_BATCH (1024,4096) as it is and with MK_WIDE_ON_ENV: widetime_{off,on}.json
#   floor  each GEMM opcode's first tile alone in a launch (bench/gemm_profile.py kind floor:
#          the launch, the roles' prologue, one tile's latency) and its whole matrix, at
#          MK_FLOOR_M (default "64 256"), and (kind launch, since session 27) a launch of one
#          NOOP in the same variant: floor.log, floor.json, floor_summary.log (~2 min in s27)
#   (rl2, MK_GEMM_RESIDUAL_L2, ran in session 28, lost and was removed)
#   (sticket, session 28's MK_STATIC_FIRST_TICKET=1, timed in session 56: no gain, removed)
#   (ownphase, pairwarp, tmastore, epiab, f32store, chain, grant, early: their switches lost,
#   removed in session 63: bench/GEMM_NOTES.md session 63)
#   launchcost the empty kernel of the megakernel's shape, one NOOP, the journal of a NOOP / a
#          first tile (where a short launch's time goes): launchcost.log, .json, _summary.log
#          (~1.5 min). (fclaim, session 28's MK_FIRST_CLAIM_EARLY A/B, ran once, no gain, removed)
#   swapped bench/probes/swapped_decode_probe.py (the decode chain with the keys on wgmma's M,
#          session 30, compiled on the CPU only): its checks vs torch and ns per key block at 16
#          and 1 blocks, then, as the same run's peer, the attention harness's decode-ctx1024-b1
#          (one unit, 16 blocks) with its math in and out (experiments none / nomath):
#          swapped.log, swapped_harness.json (~3 min)
# Suggested calls (30 min of device time; on nvidia-h200-x2 two at once, one per GPU with
# CUDA_VISIBLE_DEVICES and MK_CACHE_DIR of its own). The working tree travels with every call
# (tracked + untracked files) plus the carried paths, 64 MiB in all: carry only .gpu/prelude.sh
# and the slim cutlass-dsl tarball (nothing in mk imports nvshmem4py, and with it the tree went
# over the limit in session 17) and run in the uploaded tree (a tarball of the tree next to them
# went over the limit in session 11). Since session 21 the tree (12.8 MB, most of it
# bench/results) and the full tarball (54.6 MB) no longer fit: carry
# .gpu/cutlass-dsl-4.8.1-cu13-py312-slim.tar.xz (53.4 MB: the same DSL without its unused
# top-level `iket` package, repacked as the original, `xz --x86 --lzma2=preset=9e,dict=192MiB`;
# rebuild it from the full one if it is missing: untar, rm -r
# nvidia_cutlass_dsl/dsl_packages/iket bin, tar | xz as above, ~4 min). Session 46 moved the
# results of sessions 19-31 into bench/results/archive_2026-12-01_03.tar.xz: ~3.6 MiB of
# headroom remain; keep large logs out of bench/results (gzip them, or keep only the summary),
# e.g.
#   . .gpu/prelude.sh >/dev/null && export PYTHONPATH=$PWD:$PYTHONPATH MK_COMMIT=<sha> && ( \
#     CUDA_VISIBLE_DEVICES=0 MK_CACHE_DIR=/tmp/mkc0 MK_STEPS="..." bash scripts/gpu_next.sh $OUT/g0 \
#       > $OUT/g0.txt 2>&1 & CUDA_VISIBLE_DEVICES=1 MK_CACHE_DIR=/tmp/mkc1 MK_STEPS="..." \
#       bash scripts/gpu_next.sh $OUT/g1 > $OUT/g1.txt 2>&1; wait ); tail ...; tar ...
# Steps run in this file's order whatever MK_STEPS's order (verify first). As of session 25
# (defaults: op_major queue, raster_blocks 8, fill split factors up to 64 tokens, O_PROJ / DOWN
# on m128n128 at 65..256 tokens, GATE_UP on 112-row B pages up to 1024 tokens, LM_HEAD on
# m128n128 at 65..256 sequences, norms of ceil(tokens / 132) rows up to 1024 tokens, QKV_ROPE
# split-K up to 1024 tokens with its reduce in row slices, uneven split-K slices at 257..1024
# tokens, prefill ATTENTION in 16-token row chunks, since session 23 one `full` barrier per GEMM
# stage (MK_GEMM_STAGE_FULL=stage) and one N = 256 wgmma chain over two B pages (MK_GEMM_WIDE=1),
# since session 25 O_PROJ / DOWN staged by stmatrix and TMA-stored (no switch since session
# 63); all GPU-checked; always set MK_COMMIT, to this machine's HEAD
# written into the command: the device's copy carries an older .git, so without it (or with
# MK_COMMIT=$(git rev-parse --short HEAD) run there, session 63) the JSONs record the old one):
#   000044. Session 71 (an H100 for six calls at 4b2b785, `*_s71_h100*`): issue 5's table with
#      the step's reduce slices (every shape under cuBLAS + epilogue; DOWN 1024 0.94 the one
#      M >= 1024 point over 0.9), gu256 lost (1.15, removed), the attention + step GPU tests
#      passed, GATE_UP@64 on gu_m128n56 with 32-row slices gained at B=1 / 16 / 64 and became
#      the default (PlanConfig.gate_up_reduce_rows=32). In order:
#      1. `MK_STEPS=gu64` (~6 min; the new default's 64-token checks, racecheck, gemm 64 / 13,
#         decode against session 70's; never GPU-run at HEAD: three starts failed after it).
#         If a check fails, revert the M <= 64 class to gu_m64n112 with gate_up_reduce_rows=16.
#      2. `MK_STEPS=gemm` on the H200 if one comes (issue 5 names it; last run there in session
#         23), else `MK_VERIFY_FILES=tests/test_gemm_gpu.py MK_STEPS=verify`.
#      3. Plan 000040's 4 (wave / cls128 / the decode and prompt steps at the cursor default).
#   000043. Session 70 (an H100 for seven calls at bc4090e, `*_s70_h100*`): issue 5's table
#      again (the same within 0.03), its torch.compile peer recorded (gemmtc), GATE_UP@64 on
#      gu_m128n56 kept off (decode B=64 +0.5% again), MK_ATTN_UNIFORM_PAGES lost (removed),
#      the 36 megakernel GPU tests passed. In order:
#      1. `MK_STEPS=gemm`, on the H200 if one comes (issue 5 names it; never run there since
#         session 55's move to H100s): the first table whose split rows (QKV_ROPE at M <= 1024,
#         GATE_UP 64) reduce in the step's row slices (bench/GEMM_NOTES.md session 70).
#      2. `MK_VERIFY_FILES=tests/test_attention_gpu.py MK_STEPS=verify` at HEAD (attention is
#         back to its pre-switch source, the same opcodes as bc4090e's: a check, ~4 min), then
#         `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify`.
#      3. GATE_UP at 129..256 tokens on gu_m128n112 split in two (session 38's gu256 candidate,
#         never run; compiles at 168 registers, 0 spills in session 70): first the matrix,
#         `MK_STEPS=gemmab MK_AB_ENV=MK_TILES=GATE_UP@256=gu_m128n112 MK_AB_CHECKS=0
#         MK_AB_M=256 MK_AB_OPS=GATE_UP` (~3 min; GATE_UP 256 is mk's worst point against
#         torch.compile, 1.18), then if faster `MK_STEPS=gu256` (checks + decode B=192 / 256).
#      4. GATE_UP@64 on gu_m128n56 with 32-row reduce slices (its B=64 loss came with twice
#         the SPLITK_REDUCE instructions, 256 a layer: bench/GEMM_NOTES.md session 70):
#         `MK_STEPS=decab MK_AB_ARGS="--plan splitk_reduce_rows=32"
#         MK_AB2_ENV=MK_TILES=GATE_UP@64=gu_m128n56 MK_AB2_ARGS="--plan splitk_reduce_rows=32"
#         MK_DECAB_BATCH=64`
#         (~4 min; the same with MK_DECAB_BATCH=1,16 if B=64 gains). If the pair wins at B=64
#         and B=1 / 16 keep their -1%, the tile and the slice rows of the M <= 64 class go in
#         together (splitk_reduce_rows per op, or per class: a planner change, with its checks).
#      5. Plan 000040's 4 (wave / cls128 / the decode and prompt steps at the cursor default).
#   000042. Session 69, second half (an H100 for five calls at 45952f3, `*_s69_h100*`): issue
#      5's table at the cursor default (DOWN 1024 0.93 the one point over the 0.9 target at
#      M >= 1024; GATE_UP 64 at par, 0.98-1.01), MK_GEMM_PHASES_EARLY lost (removed), DOWN 1024
#      under ncu again (tensor idle 20.7 against cuBLAS's 11.8 us; the operand bytes and the
#      epilogue left), GATE_UP@64 on gu_m128n56 checked and -5.4% at M = 64, the step and 27
#      megakernel GPU tests passed. In order:
#      1. On the H200 when one comes: `MK_STEPS=gemm` (issue 5 names it; the M = 64 points are
#         the ones at risk there, bench/GEMM_NOTES.md session 69).
#      2. `MK_STEPS=decab MK_AB_ENV=MK_TILES=GATE_UP@64=gu_m128n56 MK_DECAB_BATCH=1,16,64`
#         (~5 min): if B=64 is not slower, make gu_m128n56 the M <= 64 class's GATE_UP tile
#         (mk/tiles.py TILE_TABLE; its checks passed, `gu64tiles_*`).
#      3. `MK_STEPS=attnuni`, then `MK_STEPS=decab MK_AB_ENV=MK_ATTN_UNIFORM_PAGES=1`.
#      4. `MK_VERIFY_FILES=tests/test_megakernel_gpu.py MK_STEPS=verify` (the 9 megakernel GPU
#         tests the call's limit cut), `MK_STEPS=gemmtc` (two calls), then plan 000040's 4.
#   000041. Session 69 (no device: two failed starts, then loans paused): plan 000040 still
#      stands, in its order (1. `gemm` on the H200 if one comes, 2. verify, 3. gemmab with
#      MK_GEMM_PHASES_EARLY=1, then gemmncu, 4. wave / cls128 / decode and prompt steps; before
#      PHASES_EARLY becomes the default, `decab MK_AB_ENV=MK_GEMM_PHASES_EARLY=1
#      MK_DECAB_BATCH=256,1024` too: session 37's "early" placement of the same waits, by warp
#      0's lanes after the wgmmas, lost 5.7% at B=256), and
#      after its 3: `MK_STEPS=attnuni` (~7 min) then `MK_STEPS=decab
#      MK_AB_ENV=MK_ATTN_UNIFORM_PAGES=1` (~6 min):
#      MK_ATTN_UNIFORM_PAGES=1 (built this session, off), the attention wgmmas' descriptors in
#      uniform registers (decode chain loop 653 -> 578 SASS instructions, R2UR 64 -> 10); if
#      its checks are clean and decode is faster at B=64 / 256 / 1024 and nowhere slower, make
#      it the default. When a call's time is left over: `MK_STEPS=gemmtc` (~9 min, then again
#      with MK_TC_OPS=QKV_ROPE,LM_HEAD): issue 5's third peer, torch.compile of the matmul +
#      epilogue, never recorded (every table since session 3 ran --no-compile). And GATE_UP at
#      M <= 64 on gu_m128n56 split in two (half the partial bytes, reduces of two): `MK_STEPS=
#      gemmab MK_AB_ENV="MK_TILES=GATE_UP@64=gu_m128n56" MK_AB_M=64 MK_AB_OPS=GATE_UP`; if
#      faster, `MK_STEPS=tiles MK_TILES_VALUE=GATE_UP@64=gu_m128n56 MK_TILES_BATCH=1,16,64`.
#   000040. Session 68 (`cursor_*_6f94fec_2026-12-07_s68_h100*`; one H100 start in ten asks):
#      the page cursor + warp-uniform stage pages passed every GEMM GPU test (27), the three
#      two-layer checks and racecheck, and cut DOWN 1024 101.9 -> 91.7 us (1.03 -> 0.93 of
#      cuBLAS + epilogue), -6 to -12% at O_PROJ / GATE_UP / DOWN, M = 1024 / 4096: the default
#      since cf6c0bb. In order:
#      1. `MK_STEPS=gemm` (~5 min): issue 5's whole table at the new default (QKV_ROPE,
#         LM_HEAD and M = 64 / 256 not re-timed), on the H200 if one comes, else the H100.
#      2. `MK_VERIFY_FILES="tests/test_megakernel_gpu.py tests/test_megakernel_step_gpu.py"
#         MK_STEPS=verify` (the megakernel and step GPU tests at the new default).
#      3. `MK_STEPS=gemmab MK_AB_ENV=MK_GEMM_PHASES_EARLY=1` (~9 min): thread 0's B-phase waits
#         before the wgmma wait (built in session 68, off); if faster and nowhere slower, make it
#         the default. Then `MK_STEPS=gemmncu` again (DOWN 1024: what is left of the tensor
#         pipe's idle time).
#      4. Plan 000038's 3 (wave, cls128), and the decode / prompt steps at the new default.
#   000039. Session 67 (`*_s67_h100*`, 13a8995 / 9a6a830; the H200 asked for, an H100 came;
#      8 of 12 asks failed to start): issue 5's table again (DOWN 1024 1.04, GATE_UP 64 1.03: the
#      spread), DOWN 1024 under ncu (gemmncu: tensor pipe busy 67.9 us in mk against 70.1 in
#      cuBLAS, idle 32.0 against 11.8; 1.46x the L2 -> SM bytes) and per instruction (gemmsrc:
#      the consumers in their K loop most of the time, ~8% of the samples on the loop's page
#      divisions); verify at 13a8995 (36 megakernel GPU tests, the three two-layer checks,
#      racecheck 0); the compile cache's GPU test passed and it is on by default. In order:
#      1. `MK_STEPS=cursor` (~8 min): MK_GEMM_PAGE_CURSOR=1's GPU checks and its timing at
#         M = 1024 / 4096; if it is faster at DOWN 1024 and nowhere slower, make it the default
#         (PAGE_CURSOR: "0" -> "1") and rerun `MK_STEPS=gemm`.
#      2. `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify` (the step tests at
#         HEAD, with the compile cache on by default: the checks' processes load each other's
#         variants; a loaded variant's grid line now says "device limits (no cubin to query:
#         ...)").
#      3. On an H200 when one comes: `MK_STEPS="gemm gemmncu"` (~2 min; the issue names it).
#      4. Plan 000038's 3 (wave, cls128).
#   000038. Session 66: no device (every start refused; the budget went to failed starts).
#      Plan 000037 stands, with these steps built for it: 1. `MK_VERIFY_FILES="tests/
#      test_megakernel_gpu.py tests/test_compile_cache.py" MK_STEPS=verify` (the CUstream launch
#      since c2ab19f, the compile cache's two-process test; with MK_COMPILE_CACHE=on exported the
#      checks' processes load each other's variants: racecheck_full.log says "loaded from ... in
#      X s"), then the step tests in a call of their own; if the cache passes, make it the
#      default (compile_cache_dir: unset -> on) and record a load's time against a compile's.
#      2. `MK_STEPS=gemmncu` (DOWN 1024 against cuBLAS under ncu, ~2 min) for issue 5's last
#      miss. 3. `MK_STEPS=wave` (~7 min: half-width tiles in the 257..1024 class at 320..768
#      tokens), then `MK_STEPS=cls128 MK_C128_BATCH=192,256` (the 129..256 variant without
#      O_PROJ / DOWN split code; 12.649 / 13.920 ms at eca0b14).
#   000037. Session 65 (`*_s65_h100*` at eca0b14, 896395e): issue 5's table at the m64n64 default
#      (every point <= 1.0 of cuBLAS + epilogue but DOWN 1024: 1.02-1.04 in six runs; L2 hints
#      do not move it); 53 of 55 GPU tests passed (none failed) before the verify call's cap;
#      65..128 tokens a class of its own with O_PROJ / DOWN on m128n64 (default since 896395e:
#      decode B=96 / 128 -4.7% / -6.5%; its checks and racecheck pass). In order:
#      1. `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify` at HEAD (the step
#         tests, the two-layer checks with the 1144-token step, racecheck: the 129..256 class's
#         variant no longer compiles O_PROJ / DOWN's split code, class_split_ops of 129 tokens),
#         then in a second call `pytest -m gpu tests/test_megakernel_gpu.py` and
#         `tests/test_gemm_gpu.py -k "M64 or M40 or M128 or M100"` (the m64n64 / m128n64 cases)
#         and decode B=192 / 256 (`MK_STEPS=cls128 MK_C128_BATCH=192,256` times the default
#         after its checks: 12.649 / 13.920 ms at eca0b14 in session 65). The host entry's
#         stream is annotated CUstream since c2ab19f (the AOT export needs it; PTX unchanged):
#         any GPU test shows the launch still takes it. Then `pytest -m gpu
#         tests/test_compile_cache.py` (MK_COMPILE_CACHE: a second process loads the first's
#         variants and passes the two-layer check; if it does, consider it on by default under
#         ~/.cache/mk and time a load against a compile).
#      2. DOWN 1024 (the last point over 1.0): ncu of its tiles against cuBLAS's kernel (L2 ->
#         SM bytes per K step, issue slots of the role warps) to say why with a profile; session
#         55's ppbound: with no epilogue and no store at all it still takes 99.0 us against
#         cuBLAS + epilogue's ~98, so the mainloop's rate (1.24x cuBLAS alone) is the gap.
#      3. Wave quantization at 257..384 and 513..896 tokens (not in issue 5 / 6's lists): every
#         O_PROJ / GATE_UP / DOWN phase there is 96 tiles (0.73 of a wave), 160 (1.21), 192
#         (1.45) or 224 (1.70) on 132 SMs; decode B=320 / 384 / 640 / 768 with the 256 class's
#         tiles (MK_TILES ...@1024=...) against the default shows what a finer class split buys.
#   000036. Session 64 (`*_s64_h100*` at 05c1817, 839263e, 129c834): the step tests (19),
#      the two-layer checks and racecheck pass at 05c1817; issue 6's every point in one run
#      below 1 (0.89 / 0.91 / 0.96 / 0.95 / 0.98 / 0.98, mixed 0.996); O_PROJ / DOWN on m64n64
#      at M <= 64 (the default since 129c834: 128 whole tiles, ROW_PART at B <= 64): B=1 / 16 /
#      64 -3.0% / -1.5% / -3.6%, bench/gemm.py M=64 O_PROJ 1.01, DOWN 0.99 of cuBLAS +
#      epilogue; memcheck / synccheck clean, the parity step tests pass. In order:
#      1. `MK_VERIFY_FILES=tests/test_megakernel_gpu.py MK_STEPS=verify`, then
#         `pytest -m gpu tests/test_megakernel_step_gpu.py tests/test_gemm_gpu.py` (the
#         m64n64 default's whole GPU suite: only the parity tests ran with it; test_gemm_gpu
#         has DOWN at M = 64 / 40 on it now).
#      2. Issue 5's table at the new default (`MK_STEPS=gemm`, ~420 s): the M = 64 rows (O_PROJ
#         1.01 in session 64's od64 run) and DOWN 1024 (1.04 in session 55) are the misses.
#      3. genoverlap's small jobs (`MK_GO_ARGS="--job 1:128:128:256 --job 16:128:128:256"`):
#         the m64n64 default in generation.
#      4. m128n64 at 65..256 tokens (built, 0 spills in the M256 class with and without
#         ROW_PART, CPU plans and checks pass with it; not GPU-run): `MK_STEPS=od64
#         MK_OD64_TILES=O_PROJ@256=m128n64,DOWN@256=m128n64 MK_OD64_M=128,256 MK_OD64_ODD=200
#         MK_OD64_LENS=60,30,10,20 MK_OD64_BATCH=96,128,192,256`. At 96 / 128 tokens O_PROJ /
#         DOWN become 128 whole tiles (64 split in two now) and the RMSNORM phases leave the plan
#         (ROW_PART), as m64n64 did up to 64; at 192 / 256 they are 256 tiles (two waves) where
#         m128n128 makes 128: if it loses there, split the class (64 < M <= 128) rather than drop
#         it.
#      5. 000035's 3 (the attention skeleton), not run.
#   000035. Session 63 (`*_s63_h200*` at d1e93f3, `*_9507500_2026-12-07_s63_h100*`): run ahead's
#      first run failed the HF parity test (a launch record made in inference mode, copied into
#      outside it; fixed in 1eef68b), then on the H100 passed it and gave 0.798 / 0.804 / 0.878 /
#      0.939 of one step at a time's wall on four jobs (planned ahead 0.815 / 0.828 / 0.913 /
#      0.972), tokens equal; issue 6's ratios as session 57's (B=1 .. 1024, mixed 0.997); the
#      prompt-attention split: a third of a case is left with no math, no loads, no stores. In
#      order:
#      1. `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify` (the two-layer
#         checks and racecheck with device_stream; not run since session 60's change), then
#         `pytest -m gpu tests/test_megakernel_gpu.py` (the lost switches' removal kept the
#         default PTX byte-identical: a check, not a change).
#      2. Issue 5's table (`MK_STEPS=gemm`); e2e B=4096 (`MK_E2E_BATCH=4096 MK_E2E_MIXED=none`),
#         so that issue 6's every point has been measured at one commit (1..1024 and mixed in
#         session 63: all below 1; on an H200, the issue's GPU, if one comes: all points, in two
#         calls).
#      3. The attention skeleton: bench/attention.py's all-off variant (noload+nomath+nostore,
#         ~3.5 us an instruction of nothing) journaled, to see which waits hold it; not built.
#         A candidate from the code (not measured): every K / V page goes consumers `done` ->
#         storer (waits it, in ring order) -> `empty` -> loader -> `full`, a relay through three
#         warps per page; consumers that free K / V pages themselves would cut the storer out
#         (the page-protocol model first: tests/test_page_protocol.py).
#   000034. Session 62 ran 000033's 1 on one H100 (`*_0c74c71_2026-12-07_s62_h100*`): the step
#      tests passed at the attn_lpt=2 default (19); a launch's host time alone is 48 us (median;
#      marshalling 17, the stub 33), so session 61's 0.34 ms a launch inside the job is not the
#      launch's own cost. Built instead (000033's 3): run ahead (mk.engine, Megakernel.launch(
#      record=True) / finish_launch, MegakernelStepBackend.run_step(ahead=, late=), page-locked
#      uploads: mk.plan.to_device). In order:
#      1. One call: `MK_STEPS="stepgpu genoverlap"` (the step tests with run ahead forced and
#         natural, the recorded-launch test; then two jobs, three modes). If run ahead is not
#         faster than planned ahead, find what still waits for the device in run_step (a
#         pageable copy, a page-locked allocation, an index tensor made on the device).
#      2. 000033's 2.
#   000033. Session 61 ran 000032's 1 on one H100 (`*_efa18e2_2026-12-07_s61_h100*`): the
#      whole-step GPU tests all passed (19, the overlapped generation test among them); the
#      generation job overlapped takes 0.793 of one step at a time's wall time (3.388 against
#      4.273 s, tokens equal), 1.16 ms a step left outside the megakernel (8.9 one at a time), of
#      which 0.34 ms is host time inside Megakernel.launch. Also: planpair attn_lpt=2 (the
#      default now), clocks nob1 (the step hangs: timing-only experiment, not usable in a step)
#      / warp, the mixed step's e2e 0.998. In order:
#      1. `MK_STEPS="launchhost stepgpu"`: where the launch's host time goes, then the step
#         tests at the attn_lpt=2 default. If the marshalling or the stub is most of it,
#         marshal once per upload (Megakernel._args' cache) and launch with
#         run_compiled_program; then genoverlap again.
#      2. Plan 000031's 1 (verify with device_stream, the megakernel GPU tests), 4 (e2e B=1 ..
#         256, issue 5's table), 5 (attnexp).
#      3. Not built: the rest of the 1.16 ms (finish's wait and state read, the sampling and
#         token copy, the pageable stream / metadata uploads, the launch) leaves the critical
#         path only if step n + 1 is enqueued before step n ends: two metadata buffers and two
#         held streams (a fast-path rewrite is absolute, so either copy takes it), page-locked
#         staging, the decode tokens scattered into the metadata on the device from step n's
#         sampled tensor, step n checked at the next finish. Worth it where 1.16 ms is a large
#         share: decode at small batch (~8.8 ms steps: up to ~13%, not measured there).
#   000032. Session 60 had no device (every ask refused; the one machine that came was taken
#      back mid-call): plan 000031 was not run, and session 60's overlapped generation loop
#      (mk.engine._GenerationRun: step n + 1 planned while step n runs; MegakernelStepBackend.
#      plan_step / run_step / finish) and Megakernel._args' cached DLPack views are CPU-tested
#      only. In order:
#      1. One call: `MK_STEPS="stepgpu genoverlap"` (the whole-step GPU tests, ~5 min: the
#         new test_overlapped_generation_equals_one_step_at_a_time, and every generate-based
#         test now runs overlapped; then ~4 min of bench/
#         generate_overlap.py: a 256-prompt job on the 70B TP8 rank, one step at a time vs
#         overlapped, wall time, host shares, tokens equal). If the overlap gains less than the
#         host_plan_ms share suggests (E2E_NOTES session 60), the critical path left is the
#         rewrite / upload + metadata copy after finish(): stage them in page-locked memory and
#         enqueue them non-blocking from plan_step (stream-ordered after step n), and patch the
#         decode tokens on the device from the sampled tensor, so that run_step only launches.
#      2. Plan 000031's 1 to 5 (the two-layer checks and racecheck with device_stream, the
#         megakernel GPU tests, clocks variants, planpair, e2e, attnexp).
#   000031. Session 59 ran 000030's 1 (clocks at the prompt point, backoff) and 2 on one H100
#      (`*_s59_h100*`): attn_chunk_reduce=1 is the default (4096 prompt -2.0%, 256 + 2048 -1.0%,
#      the 256 + 1024 control unchanged; its check and racecheck clean); attn_lpt=2 stays off.
#      Under load at the 691 W cap the megakernel's SMs ran 1500 MHz, the peer's 1590: the
#      megakernel draws more power per unit of work. MK_BACKOFF_NS is no lever. In order:
#      1. The GPU test files at the attn_chunk_reduce default and with StepPlan.device_stream
#         (new: a step the fast path cannot take uploads the prelude, three layers and the final
#         rows and builds the other layers on the device; CPU-checked equal to the stream):
#         `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify` (~8 min), then
#         `python -m pytest -m gpu tests/test_megakernel_gpu.py` (~5 min). Any bench JSON of
#         the megakernel now has host_full_step_ms (plan + check + device_stream + metadata)
#         beside host_full_step_whole_upload_ms (the whole stream uploaded, as before): the
#         host time per prefill / mixed step a generation loop pays, the upload's share of it.
#      2. What draws the power: `MK_CL_POINTS=prompt MK_CL_VARIANTS="nob1:MK_GEMM_EXPERIMENT=nob1
#         warp:MK_HANDOFF=warp" MK_STEPS=clocks` (~6 min; nob1: a third fewer operand bytes per
#         GEMM K step, as a 1 x 2 multicast cluster would pull, wrong results, timing only;
#         warp: one `done` arrival per consumer warp). If a variant's under-load clock rises
#         toward the peer's 1590 MHz and its time falls by more than session 22's cold-L2 -1 to
#         -4%, that part's energy is the lever: multicast pairs (nob1) or the warp hand-off
#         (its racecheck: session 21 kept `thread` because racecheck models it).
#      3. attn_lpt=2 at the control, interleaved with the default rep by rep on one kernel
#         (`planpair`, new: launch/bench.py --plan-ab; its first GPU run, so also the variant
#         the default already is as a sanity pair): `MK_PP="l2:attn_lpt=2 cr0:attn_chunk_reduce=0"
#         MK_PP_MIXED=256:1024:1024 MK_STEPS=planpair`, then MK_PP_MIXED=0:1:4096 and
#         256:1024:2048 (~2 min each on a warm machine); attn_lpt=2 the default if no loss at the
#         control (the 4096 prompt: -1.4% in session 59's separate runs); cr0 should come out
#         ~+2% / ~+1% / 0 as session 59's separate runs had it.
#      4. 000030's 3 (e2e B=1 .. 256; issue 6's large points) and 4 (issue 5's table).
#      5. Prompt attention (~10% of a 4096-token step's SM time at ~2.5 us a 128-row x 64-key
#         block, ~22% of the tensor rate; bench/ATTENTION_NOTES.md session 59): where a block's
#         time goes, `MK_ATTN_EXP_CASES=prefill-chunks,prefill-1k-at-3k MK_STEPS=attnexp`.
#   000030. Session 58 ran 000029's 2 on one H100 (`*_s58_h100*`): attn_chunk_splits=1 is the
#      default (DEFAULT_PLAN; a 4096-token prompt step -3.6%, 256 decodes + a 2048-token prompt
#      -13.7%; the GPU test files, checks and racecheck clean with it); a prompt-only 4096-token
#      step is 1.09 of the peer (142.53 vs 130.34 ms: the M = 4096 GEMMs' issue-5 gap). The
#      timed step runs 4-8% over its journaled span, more the busier the SMs. In order:
#      1. `MK_CL_POINTS=prompt MK_CL_GAP_MS=1000 MK_STEPS=clocks` (~5 min: four bench
#         processes, each with its compile), then `MK_CL_POINTS="mixed 4096:256" MK_STEPS=clocks`
#         on the warm machine: the SM clock and power under each system's timed reps, back to
#         back and with 1 s idle before each rep. If the megakernel's reps from a rested GPU come
#         near its journaled span (prompt 131.5, mixed ~41.3 ms) while the peer's move less, the
#         step is power-bound: the megakernel's energy per step (its role warps' polling, the
#         consumers' ~2x issued instructions) is then the lever for the compute-bound points
#         (prompt, mixed, B=4096), not its schedule; first knobs to time there:
#         MK_BACKOFF_NS (the controllers' counter polls, 200 ns: `MK_BO_VALUES="200 1000 200"
#         MK_BO_BATCH=none MK_BO_MIXED=0:1:4096 MK_STEPS=backoff`) and MK_WAIT_HINT_NS (the
#         role page waits' try_wait suspend hint, 20000).
#      2. Two plan changes built in session 58 (CPU-checked: VM parity TP 1 / 2 in random
#         order, mk.verify clean; schedsim calibrated on session 58's journals, which it now
#         reproduces within 1-3%): PlanConfig.attn_chunk_reduce=1 (one ATTN_REDUCE per chunk
#         of a split prompt segment, over that chunk's splits; the partial rows chunk by chunk:
#         the GPU body is unchanged, its reduces are 16 rows instead of 128) and attn_lpt=2
#         (the prompt chunks in block order, the decode units longest first). schedsim: 256
#         decodes + a 2048-token prompt -6.1% / -5.3% / both -6.8%; a 4096-token prompt -1.3%
#         / -0.6% / -1.3%; the 256 + 1024 mixed step unchanged. `MK_PLANAB="cr:attn_chunk_reduce=1
#         l2cr:attn_lpt=2,attn_chunk_reduce=1" MK_PLANAB_CHECK="--prompt-lens 500,500,130,13,1"
#         MK_PLANAB_RACE=1 MK_PLANAB_BATCH=none MK_PLANAB_MIXED=256:1024:2048 MK_STEPS=planab`
#         (~6 min: the 1144-token check at kv_split 64 plans chunk reduces of 16 rows), then the
#         timings of `MK_PLANAB_MIXED=0:1:4096 MK_PLANAB_NOCHECK=1` and of 256:1024:1024 (a
#         control: its plans are unchanged by attn_chunk_reduce, by attn_lpt=2 in queue order
#         only); if a variant wins, DEFAULT_PLAN and the GPU test files with it.
#      3. `MK_STEPS=e2e` (B=1 .. 256) and `MK_E2E_BATCH=1024,4096 MK_E2E_MIXED=256:1024:1024
#         MK_STEPS=e2e`: issue 6's table at the attn_chunk_splits default (its plans there are
#         unchanged; a check of the table on the day's card).
#      4. Issue 5's table (`MK_STEPS=gemm`; last: session 55).
#   000029. Session 57 ran 000028 on two H100s (`*_s57_h100*`, `_b`: the second): issue 6's
#      B=1024 / 4096 / mixed rows with the peer 0.99 / 0.99 / 1.006 (the mixed step at parity,
#      not ~0.98); the step GPU tests (18), the megakernel GPU tests (35), the checks and
#      racecheck passed at the attn_lpt default; raster_blocks 4 / 2 lost (B=1024 -0.5% / +3.3%,
#      mixed +1.6% / +6.2%: fewer idle SMs, as schedsim said, but slower tiles from the
#      weights' lost L2 reuse). In order:
#      1. `MK_STEPS=clocks` (~6 min): the SM clock and power of the megakernel's timed reps
#         against the peer's at B=4096 and the mixed step. The journal's span of the mixed step
#         is 41.3 ms against 44.8 event-timed (B=1024: 44.9 / 45.6): a lone launch runs at boost
#         clocks, the timed reps under the power cap. If the megakernel's clock is lower than
#         the peer's at the same point, its power (the role warps' polling, the consumers' ~2x
#         issued instructions) is a lever for the compute-bound points, which are the ones at
#         parity (B=4096, mixed).
#      2. A prompt-only step against the peer: `MK_E2E_BATCH=none MK_E2E_MIXED=0:1:4096
#         MK_STEPS=e2e` (one 4096-token prompt), then `MK_SH_BATCH=none MK_SH_MIXED=0:1:4096
#         MK_STEPS=shares`. Not in issue 6's table, but what throughput jobs over many prompts
#         run: a prompt chunk's attention runs ~4 us a 64-key block of a 128-row tile
#         (attention.est_cost_ns; FA3 ~1 us), ~8.3k blocks a layer at 4096 tokens: ~0.27 ms a
#         layer against ~1.4 ms of GEMMs, where the peer runs causal SDPA (flash). If the
#         megakernel loses there, the prefill body (QK^T, softmax, PV in series per block: an
#         FA3-style overlap of one block's softmax with the next block's QK^T) is the next
#         attention work.
#         Then PlanConfig.attn_chunk_splits (built this session, off): a prompt segment split
#         over KV (context over kv_split) cut into row chunks too. Today a 128-token block of a
#         4096-token prompt is 4 split instructions of 8 M tiles x up to 16 key blocks (~485 us
#         each on one SM); chunked, at most ~61 us. schedsim (the mixed journal's GEMM times,
#         ATTENTION by est_cost_ns): the 4096-token prompt step 143.8 -> 127.5 ms (-11%; SMs
#         busy 88% -> 99%), 256 decodes + a 2048-token prompt 101.0 -> 72.5 ms (-28%).
#         `MK_PLANAB="cs:attn_chunk_splits=1" MK_PLANAB_CHECK="--prompt-lens
#         500,500,130,13,1" MK_PLANAB_RACE=1 MK_PLANAB_BATCH=none MK_PLANAB_MIXED=0:1:4096
#         MK_STEPS=planab` (the check's kv_split 64 splits and now chunks every prompt; a chunk
#         with no key of its split writes o = 0, lse = -inf, which the body's unit_range
#         allows), then the same timings for `MK_PLANAB_MIXED=256:1024:2048 MK_PLANAB_NOCHECK=1`;
#         if it wins, the default, and the GPU test files with it.
#      3. `MK_STEPS=e2e` (B=1 .. 256) with the peer: the other half of issue 6's table.
#      4. Issue 5's table (`MK_STEPS=gemm`) at the current default (last: session 55).
#   000028. Session 56 ran 000027 on one H100 (`*_s56_h100*`): attn_overlap lost (removed);
#      the shares journals explain QKV_ROPE's mixed-step epilogue (a ROW_PART wait of q tiles
#      that start early) and the mixed step's idle SMs (decode pairs ahead of the long prompt
#      chunks in the queue); attn_lpt=1 (the chunks first, each kind longest first) passed its
#      two-layer checks and won the mixed step 46.275 / 46.460 -> 45.282 ms: the default since
#      e826dd0; sticket and backoff no gain. In order:
#      1. `MK_VERIFY_FILES=tests/test_megakernel_gpu.py MK_STEPS=verify`, then
#         `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify` (the new default's
#         mixed steps through the GPU tests, the two-layer checks, racecheck).
#      2. `MK_E2E_BATCH=1024,4096 MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e` (issue 6's table
#         with the peer in the same run: the mixed step was 1.016 of torch.compile + CUDA graph
#         in session 55; -2.3% should make it ~0.99), then `MK_STEPS=e2e` (B=1 .. 256).
#      3. `MK_SH_BATCH=4096 MK_STEPS=shares` at the new default: what is left on the mixed
#         step's critical path (screen plan ideas with `python bench/schedsim.py --predict
#         <its JSON> --plans ...` before GPU time: attn_chunk_rows, attn_pair for steps with
#         prompts).
#      4. The mixed step's token-block runs (schedsim, no L2 in it: raster_blocks 4 -3.3% with
#         attn_lpt, 2 -3.5%, 10 +18.8%): `MK_PLANAB="r4:raster_blocks=4 r2:raster_blocks=2"
#         MK_PLANAB_MIXED=256:1024:1024 MK_PLANAB_BATCH=1024 MK_STEPS=planab`; if a value wins
#         there and not at B=1024 / 4096, a per-step rule (prompt steps only) rather than a new
#         raster_blocks.
#   000027. Session 55 ran 000026 on two H100s (`*_s55_h100*`): the waited-page release
#      verified (53 GPU tests, checks, racecheck / synccheck / memcheck clean) and free (waitslim);
#      slim's mixed step ended with either release; issue 6: B=1 0.89 .. 1024 0.98, 4096 0.998,
#      mixed 1.016; ppbound: ping-pong dropped; issue 5's table rerun. In order:
#      1. `MK_SH_BATCH=4096 MK_STEPS=shares` (~2 min; with MK_SH_PLAN=attn_overlap=8 after
#         item 2, ~4 min: attention's own time beside the QKV / O_PROJ tiles): the new table by
#         kind of instruction (mk.trace.variant_names: QKV_ROPE by section, ATTENTION by mode, the
#         mixed step's tiles by decode / prompt rows): where QKV_ROPE's mixed-step epilogue (7.9
#         us a tile against 2.7 at B=4096) goes, and the prompt chunks' ATTENTION against the
#         decode pairs (the mixed step's ATTENTION consumers 53.4 us median against 11.7 at
#         B=4096). Build on what it names.
#      2. `MK_STEPS=attnov` (~8 min): PlanConfig.attn_overlap (a plan change: QKV, attention
#         and O_PROJ pipelined over token blocks, a block's attention beside later blocks' QKV
#         and O_PROJ tiles instead of all SMs at HBM's rate at once; B=4096 is SM-time bound,
#         its ATTENTION 13.7% of the SMs' time): the checks of the reordered streams, then
#         B=4096 and the mixed step, default / 4 / 8 / 13 / default. If one wins, make it the
#         default (mk/megakernel_step.DEFAULT_PLAN; maybe per step size) after `verify`.
#      3. `MK_STEPS=sticket` (~7 min, built in session 28, never timed): the first ticket
#         without the queue's atomic (~1 us a launch: issue 5's M = 64 rows are 1-4 us over).
#      4. `MK_STEPS=backoff` (000025's 2).
#   000026. Session 54 ran 000025's 0 on one H100 (`*_s54_h100*`): the hang guard's report hung
#      (its page-locked buffer made after the launch; fixed in 6956b9f: the hang test raised
#      MegakernelHang after 5.0 s); synccheck and memcheck of the watchdog default clean; 12 of
#      the 18 step GPU tests run (passed). In order:
#      0. A page several warps wait on is now released only after each of their waits
#         (MK_WAITED_FREE=all, the default since this session: the storer's two warps on the
#         pages they only wait on, warpgroup 1's rows_skip walk on a rows body's pages; lead =
#         sessions 1-53, bench/E2E_NOTES.md session 54), compile-checked only. The two files'
#         53 tests and the checks do not fit one call (session 54: 31, then 12 in 265 s), so
#         `MK_VERIFY_FILES=tests/test_megakernel_gpu.py MK_STEPS=verify` (35 tests, the
#         two-layer checks, racecheck; the hang test now checks hang_report's text), then
#         `MK_VERIFY_FILES=tests/test_megakernel_step_gpu.py MK_STEPS=verify` (18 tests), then
#         `MK_STEPS="synccheck memcheck"` (~3 min).
#      0b. `MK_SLH_RUNS="slimall slimlead" MK_SLH_TIMEOUT=150 MK_STEPS=slimhang` (~5 min):
#         slim's mixed-step hang with the new free (does it end?) and with lead (the control:
#         hung in sessions 52-53; now MegakernelHang after 60 s with the state words). Then
#         `MK_WS_RUNS="default lead default2" MK_WS_MIXED=256:1024:1024 MK_STEPS=waitslim`:
#         what the new free costs (two arrivals and a warp sync per waited page).
#      1. 000025's 1: `MK_STEPS=e2e`, then `MK_E2E_BATCH=1024,4096 MK_E2E_MIXED=256:1024:1024
#         MK_STEPS=e2e`: issue 6's table at the watchdog default (never timed in e2e).
#      2. `MK_STEPS=ppbound` (~6 min): the ping-pong bound (bench/GEMM_NOTES.md session 54); then
#         000025's 2 (backoff, shares at the nf4 default, `MK_STEPS=gemm`).
#   000025. Session 53 ran 000024's 0 and 1 at cd120bc on one H100 (`*_s53_h100*`): the
#      watchdog B=1 -2.3% / -2.0%, B=1024 -1.0%, mixed +0.4% against the bounded inline waits;
#      verify with it clean but racecheck (the controller's lanes read lane 0's tick write:
#      fixed in c96a9b9, racecheck 0 hazards); made the default (MK_WAIT_WATCHDOG=0: the old
#      waits). Slim's hang needs page waits 2, 3, 4 and iready (8) all unbounded. In order:
#      0. `MK_STEPS=verify` (~9 min cold): the default is now the watchdog (verified at cd120bc
#         with MK_WAIT_WATCHDOG=1; since then c96a9b9's racecheck fix, and launch(check=True)
#         waits through Megakernel.wait: the new test_a_hang_is_reported_not_waited_on), then
#         `MK_STEPS="memcheck synccheck"` (~6 min): the watchdog's hinted try_waits and bare
#         slot waits under memcheck / synccheck (never run with them).
#      1. `MK_STEPS=e2e` then `MK_E2E_BATCH=1024,4096 MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e`
#         (~8 min each): issue 6's table at the new default (B=4096 never ran with the
#         watchdog; a stall there is now a record naming the ticket, not a hang: read it in
#         the plan). Issue 6 stood at B=1 0.91, 16 0.94, 64 0.99, 256 0.96, 1024 0.97, 4096
#         1.01, mixed 1.02.
#      2. 000024's 2 (`MK_STEPS=backoff`; ccheck16 with a verify) and 3 (shares at the nf4
#         default; issue 5's table, `MK_STEPS=gemm`, not rerun since session 38).
#      3. (optional, the slim hang) `MK_SLH_RUNS=but5 MK_SLH_TIMEOUT=150 MK_STEPS=slimhang`:
#         the mixed step's first launch goes through launch(check=True), which now raises
#         MegakernelHang after 60 s with the state words; a counter-wait record another CTA wrote
#         meanwhile names the instruction whose signal never came (the JSON's error text).
#   000024. Session 52 ran 000023's 0 and 1 at 3b8b700 / 1fae3cf on H100s (`*_s52_h100*`;
#      four refused starts cost ~400 s): MK_WAIT_CHECK_EVERY=16 gains nothing (+0.6% / +1.0%
#      at B=1 / 1024: slim's gain is the bound's code, not its work per poll);
#      MK_COUNTER_CHECK_EVERY=16 -0.5% at B=1 (two calls), -0.1% at 1024, mixed +0.4%; slim
#      hangs only at the mixed step and only with page and slot waits both unbounded. In order:
#      0. `MK_SLH_RUNS="but2 but3 but4 but5 but8" MK_SLH_TIMEOUT=70 MK_STEPS=slimhang` (~5 min):
#         a run that ends in a record names the wait that starves (kind, ticket, phase: read the
#         ticket's instruction in the mixed step's plan). A protocol race that faster waits
#         expose is a correctness bug of the default build too: fix it first.
#      1. `MK_STEPS=waitslim` (~6 min; the runs are now default / MK_PAGE_ABORT_POLL=0 /
#         MK_WAIT_WATCHED=1 / MK_WAIT_WATCHDOG=1 / slim / default): how much of slim's gain
#         smaller waits take (SASS of the M64 class: noabort -4.4%, hint -10.9%, watchdog
#         -10.4%, slim -15.3%). The watchdog is the shippable one (bounded: the controller's
#         waits for a slot's roles name the stalled ticket; built in session 52, compiled only):
#         if it wins, `MK_WAIT_WATCHDOG=1 MK_STEPS=verify` (the starved-wait GPU test has a
#         watchdog case: the record must name ticket 3 as a stalled instruction), its mixed
#         step (does slim's hang show up there, now named?), then the default and e2e.
#         noabort alone is safe as it is (a starved wait still times out, only later).
#      2. `MK_STEPS=backoff` (~5 min): the counter waits' nanosleep cap 200 / 100 / 50 / 400 ns at
#         B=1, 16 (never timed in the step; at B=1 every hand-off waits up to the cap). With
#         ccheck16 (-0.5% at B=1): a winner of either as the default after `MK_STEPS=verify`
#         with it (the starved counter-wait GPU test).
#      3. 000022's 2 (shares at the nf4 default) and 3 (issue 5's table, `MK_STEPS=gemm`).
#   000023. Session 51 ran 000022's 0 and 1 at e9f60fd on an H100 (`*_s51_h100*`): verify clean
#      (51 GPU tests, the 1144-token check, racecheck); bench.py's megakernel-vs-eager check
#      0.0348 / 0.0333 (= the peer's); issue 6 B=4096 1.01, mixed 1.02; QKV_ROPE@max=m128n256
#      mixed +4.5% (dropped); MK_WAIT_SLIM B=1 -3.0%, B=1024 -1.8%, its mixed step never
#      finished. In order:
#      0. `MK_STEPS=waitslim` (~8 min): default / MK_WAIT_CHECK_EVERY=16 /
#         MK_COUNTER_CHECK_EVERY=16 / slim / default at B=1, 1024. A gate that wins (check16
#         near slim's 2-3%; ccheck16 is a lever slim does not measure): its checks
#         (`MK_WAIT_CHECK_EVERY=16 MK_STEPS=verify`: the starved-wait GPU test times the
#         abort's spread), then the default (_rows_kernel's knob) and e2e at 4096 / mixed. If
#         check16 does not, the cost is the waits' code itself (~25 instructions a site, ~170
#         sites): a smaller bound is the lever (the called slow path spills).
#      1. Slim's mixed step: `MK_WS_BATCH=1 MK_WS_MIXED=256:1024:1024 MK_STEPS=waitslim` with
#         MK_WS_TIMEOUT=150 (a bounded variant that ends in a timeout record names the wait);
#         else MK_WAIT_SLIM=1 --batch 1 --mixed 256:1024:1024 with timeout 300: does it
#         finish at all? A hang that the bounded build escapes would be a protocol race that
#         the slower waits hide (the bounded build's mixed step passes its logits check).
#      2. 000022's 2 (shares at the nf4 default) and 3 (issue 5's table).
#   000022. Session 50 ran 000021's 0 at 7290ff4 on an H100 (`*_s50_h100*`): norm_fold=4 is the
#      default (verify clean); issue 6 mk / peer B=1 0.91, 16 0.94, 64 0.99, 256 0.96, 1024 0.97,
#      4096 0.99, mixed 1.01 / 1.02; raster_blocks 4 / 2 lose to 8. In order:
#      0. `MK_STEPS=verify` (~8 min): the step GPU tests now hold test_check_max_class and the
#         checks a 1144-token step, the M > 1024 class's variant, never checked against mk.vm
#         before (B=4096 and the mixed step run it). If it fails, that is the first bug to fix.
#      1. `MK_STEPS=tilemax` (~6 min): QKV_ROPE@max=m128n256 at B=4096 and the mixed
#         step (SM-time bound: 97% of the SMs busy; QKV_ROPE 11% of it at 470 TFLOP/s a tile).
#         GATE_UP@max=gu_m128n112 was timed at the mixed step in session 50: -0.1%, noise. A
#         tile that wins both, checks clean: into TILE_TABLE's max column.
#      2. `MK_STEPS=shares` at the nf4 default (mixed, 1024, 4096): where the SM time goes now
#         (session 49's nf4 removed the norms' ~4.9% of SM time at the mixed step but gained
#         only ~0.5%: the journal says where it went).
#      3. Issue 5's table (`MK_STEPS=gemm`, not rerun since session 38).
#   000021. Session 49 ran 000020's 0 late on an H100 (`*_s49_h100*`): norm_fold=4 passes its
#      checks (after the "N"-mode writers' fix) and times B=4096 -3.3% / -2.8% (vs the peer
#      1.00), 1024 -0.8% / -1.0%, mixed -0.2 / -0.5 / -0.8%, B=256 +0.8% / +0.2%. In order:
#      0. Commit DEFAULT_PLAN's norm_fold = 4 (mk/megakernel_step.py), then `MK_STEPS=verify`
#         over two calls (MK_VERIFY_FILES): if the GPU suite, the two-layer checks and racecheck
#         pass, keep it as the default (or apply it above 256 tokens only: B=256 is its one
#         loss), else revert; then run
#         `MK_E2E_BATCH=64,256,1024,4096 MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e` for issue 6.
#      1. 000020's 1 (000019's normbatch on whatever norms remain, gathercons, planab).
#   000020. Session 49 had no device (loans paused); built on the CPU: PlanConfig.norm_fold=4
#      (the rows' statistic from h's writers: no norm before unsplit QKV / gate-up GEMMs; the
#      schedule model puts it at B=1024 -3.1%, 4096 -4.3%, mixed -3.2%) and the consumers'
#      gather mended (LM_NORM through RMSNORM's body; no spill left). In order:
#      0. `MK_STEPS=nf4` (~9 min; set MK_NF4_BATCH=4096 with MK_NF4_MIXED if the call runs short):
#         the nf4 step GPU tests, three two-layer checks, racecheck, then default / norm_fold=4
#         at B=256 / 1024 / 4096 + mixed. If it wins at 4096 / mixed and loses nowhere: the
#         backend's default (mk/megakernel_step.py DEFAULT_PLAN norm_fold=4), after
#         `MK_STEPS=verify` with it, then e2e at B=4096 / mixed against the peer.
#      1. 000019's 0 (normbatch / normbatchtime: under norm_fold=4 only the norms before split
#         GEMMs and layer 0's remain, so time them on whichever default stands), then 000019's 1
#         (gathercons / gatherconstime; the 4096 spill is mended), 2 (planab raster_blocks) and 3.
#   000019. Session 48 ran 000018's 0, 1, 1b at 3474b9c on an H100 (`*_s48_h100*`): issue 6 on
#      the H100: B=64 0.99, 256 0.97, 1024 0.99, 4096 1.02, mixed 1.03; MK_ATTN_SWAP_DOUBLE: no
#      gain and a fault at B=1024 (removed); shares: B=4096's row-scale norm bodies are 9.5% of
#      its critical path (12.6 of 133 ms; 16 round trips of 2 rows a 32-row norm). In order:
#      0. `MK_STEPS=normbatch` then `MK_STEPS=normbatchtime` (~7 min each):
#         MK_NORM_ROW_BATCH_BIG 4 / 8 (the classes above M64; checks with 32-row norms,
#         racecheck; then B=1024 / 4096 / mixed against 2). If one wins at 4096 / mixed and loses
#         nowhere, make it MK_NORM_ROW_BATCH_BIG's default after `verify`; then
#         `MK_NB_ROWS=16 MK_NB_BATCH=2048 MK_STEPS=normbig` and 64-row norms at 4096 again
#         (faster bodies may move the best norm size).
#      1. `MK_STEPS=gathercons` then `gatherconstime` (~6 min each): EMBED / LM_NORM on the
#         consumers (built, off; session 49: LM_NORM through RMSNORM's body, no spill left).
#      2. `MK_PLANAB="rb4:raster_blocks=4 rb2:raster_blocks=2" MK_PLANAB_BATCH=1024
#         MK_PLANAB_MIXED=256:1024:1024 MK_STEPS=planab` (~7 min): the schedule model
#         (bench/schedsim.py on session 48's journal) puts raster_blocks 4 / 2 at -3.1% / -3.7%
#         at B=1024 and -1.6% at the mixed step (about nothing at 4096), but it has no L2 and
#         also favours 1, which lost 0.5% at B=1024 in session 17: only the GPU can tell.
#      3. `MK_E2E_BATCH=4096 MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e` after a new default; then
#         000018's 2 / 3 (the big-norm threshold at 2048, l2hint / qkv256 / gu256, issue 5's gemm
#         table).
#   000018. Session 47 ran 000017's 0 and 1 at 3b66e1b on an H100 (the H200 kind refused twice,
#      then locked; `*_s47_h100*`): norm_fold=3 is correct (three two-layer checks, racecheck 0)
#      but slower (B=256 +9.1%, 1024 +4.2%, 4096 -0.3%, mixed +6.1%; QKV unsplit at 1024
#      +7.9%): not the default. normbig: 32-row norms win at B=4096 only (-1.9%, -2.2% in a
#      second run; 64 rows +0.5%; B=1024 +2.9%, B=256 +14%, mixed +0.3%), now the default
#      from 2048 tokens (PlanConfig.big_norm_rows / big_norm_min_tokens: ceil(tokens / 132)
#      rows, 16 at 2048, 32 at 4096). In this order:
#      0. `MK_E2E_BATCH=4096 MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e` (the point the new default
#         moved, against the peer on the card of the day; with budget `MK_E2E_BATCH=64,256,1024`).
#      1. (session 48: no gain, removed) `MK_STEPS=swapdouble`, then `swapdoubletime`: the swapped
#         decode chain two key blocks a step (MK_ATTN_SWAP_DOUBLE=1, built this session; 4
#         harness tests and two two-layer checks passed on an H100, not timed): B=64 (1.02, ATTENTION ~20 us of its ~106 us layer path) is the
#         point it is for; if it wins there and loses nowhere, `MK_ATTN_SWAP_DOUBLE=1
#         MK_STEPS=pairrace` (racecheck of unequal pairs), then the default, after `verify`.
#      1b. `MK_STEPS=shares` (~4 min, 000017's 3): where B=4096's / the mixed step's SM time goes
#         now; ATTENTION's per-instruction own time at ctx 256 (session 38: ~6 us of fixed cost
#         in a 15 us pair of 256-key units, 13% of the SM time) says whether more decode units
#         an instruction is worth building.
#      2. `MK_NB_ROWS=16 MK_NB_BATCH=2048 MK_STEPS=normbig` with the default timed beside it: the
#         big-norm threshold between 1280 (neutral) and 4096 (-2%) is not measured.
#      3. 000017's 2 / 2b (l2hint, qkv256, gu256; issue 5's gemm table).
#   000017. Session 46 ran 000016 at a9ee1a2: the GPU suite clean at the compact + twin default
#      (43 + 68 GPU tests, the two-layer checks, racecheck / synccheck / memcheck 0); e2e in the
#      same run mk / torch.compile + graph: B=1 0.89, 16 0.90, 64 1.02, 256 1.01, 1024 0.99,
#      4096 1.06, mixed 1.04; ktbisect: the build costs a GEMM tile ~2% now (GATE_UP 94.0 alone
#      through the step's kernel vs 92.1 lean), unbounded waits ~1.7% of the B=1024 step. The
#      misses are compute-bound (B=4096, mixed) or within 2% (B=64, 256). In this order:
#      0. `MK_STEPS=nself` (~7 min): PlanConfig.norm_fold=3 (built this session, CPU-checked:
#         interpreter bitwise equal to norm_fold=2, verifier, host check, 0 spills): the norms
#         before unsplit GEMMs are gone (B=4096: both; B=256 / 1024: the MLP norm), each unsplit
#         QKV / gate-up tile sums its rows' squares from its A pages while its wgmmas run. If
#         its checks and racecheck pass and it wins, make it the backend's default
#         (DEFAULT_PLAN) after the whole suite with it (`MK_STEPS=verify` runs its GPU test).
#      1. `MK_STEPS=normbig` (~8 min): under norm_fold=2 the row-scale norms run beside the GEMM
#         mainloops, 8 rows an instruction (norm_fill's one-per-SM rule from when they were on
#         the path): ~3.7% of the SMs' busy time at B=1024 (session 46's journal, 2 layers:
#         256 RMSNORMs a layer at 7.7 us). 32 / 64 rows an instruction (a plan change): checks,
#         then B=256 / 1024 / 4096 and the mixed step against the default. If one wins, make it
#         the default (norm_rows and norm_fill_max_tokens; LM_NORM shares norm_rows and sits on
#         the step's tail: split the knob if the tail grows) and run the e2e large points.
#      2. `MK_L2_VALUES="weights,kv kv,acts" MK_L2_BATCH=1024,4096 MK_STEPS=l2hint` (the
#         weights' evict-first hint was only ever timed at B <= 256), then `qkv256` (B=1024 /
#         4096), `gu256` (B=256 at 1.01).
#      2b. `MK_STEPS=gemm` (~6 min): issue 5's table has not run since session 27 (6595874);
#         the GEMM changes since (LM_HEAD's m128n256 tiles from 65 sequences, the compact
#         waits, the class split code) are in the megakernel it times.
#      3. `MK_STEPS=shares` (~4 min): journaled 80-layer steps at B=1024 / 4096 and the mixed
#         step, the SM-time shares at today's default (session 21's are the last at B=4096:
#         GATE_UP 41%, DOWN 22, ATTENTION 13, QKV 10, O_PROJ 8, RMSNORM 5). If ATTENTION's
#         instructions at ctx 256 are mostly their fixed cost (~4 us of protocol against ~5 us
#         of K/V bytes for a pair of sequences), more decode units an instruction is the lever.
#      The device refuses a carried tree over 64 MiB: .gpu/ holds the slim DSL archive (above)
#      and the prelude only (the project is 10 MB tracked; nvshmem4py is not needed single-GPU).
#   000016. Session 45 had no device time: every start was refused (H200 and H100 kinds, 60-90
#      s of the budget each, then 10 min locked). 000015 stands as written but for its step 1,
#      which does not fit one call (the 43 step tests took 265 s in session 44, the split-K
#      file ~150 s more, the checks and racecheck ~160 s): call 1 `MK_CHECK_PYTEST_S=330
#      MK_STEPS=verify` (the step tests, checks, racecheck), call 2 `MK_VERIFY_FILES=
#      tests/test_splitk_gpu.py MK_CHECK_PYTEST_S=300 MK_STEPS=verify` (the checks again),
#      call 3 `MK_STEPS="synccheck memcheck"`. With little budget left after refusals,
#      000015's 2 first (`MK_E2E_BATCH=64,256,1024 MK_STEPS=e2e`: the points the new default
#      moved), then the rest of it.
#   000015. Session 44 ran 000014's 1 and 3 at 74c1763 (verify: 43 passed, both two-layer checks,
#      racecheck clean; twin: the two-layer checks at 208 / 478 tokens and racecheck clean, its
#      pytest cut at 240 s after ~75 passed; twintime: compact + twin -4.2% at B=64, -1.9 / -2.4%
#      at 256, -1.0% at 1024; ktncu: the GATE_UP loop ~1120 cycles a K step in the step's build
#      and in lean alike, the step's build 6% longer in the consumers' once-per-tile code, 70%
#      of it no_inst). MK_WAIT_COMPACT=1 and MK_GEMM_TWIN=1 are the default now (=0: the
#      build before). In this order:
#      1. `MK_VERIFY_EXTRA=tests/test_splitk_gpu.py MK_CHECK_PYTEST_S=540 MK_STEPS=verify`
#         (~9 min): the whole suite at the new default (the twin's split-K tests were cut off),
#         then `MK_STEPS="synccheck memcheck"` (~8 min; twin ran racecheck only). A failure
#         that is the twin's or the compact waits': MK_GEMM_TWIN=0 / MK_WAIT_COMPACT=0 build
#         the session-43 default.
#      2. `MK_STEPS=e2e` (B=1 / 16 / 64 / 256) and `MK_E2E_BATCH=1024,4096
#         MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e`: issue 6's ratios at the new default.
#      3. Without the K-step trace the loop is not slow (ktncu; bench/results/
#         ktncu_loop_diff_2026-12-05_s44.md): the per-tile cold code is;
#         `MK_STEPS=ktbisect` (~8 min: lean / gemms / families / slim / old; now without the
#         K-step trace, whose build is the suspect for sessions 41 / 42's 1520-cycle K step):
#         the tiles' journal times per build, i.e. what the per-tile code costs.
#   000014. Session 43 had no device. The default build changed: each M class's variant compiles
#      split-K code only for the opcodes its plans may split (mk.megakernel_step.class_split_ops:
#      M1024 QKV_ROPE only, the max class none: 33.1k -> 29.8k SASS at M1024). Built, off:
#      MK_WAIT_COMPACT's wait loop without its jump table (-17% with the record: 24.6k at M1024)
#      and MK_GEMM_TWIN (DOWN through O_PROJ's bodies: 22.3k with both). In this order:
#      1. `MK_STEPS=verify` (~470 s): the default build's suite (class_split_ops is new in it:
#         the 512-token parity test runs the M1024 variant with QKV_ROPE's split code only) and
#         000013's never-run tests (test_starved_page_wait_names_its_instruction[1] is the
#         compact record's). If a failure is the class split code's, MK_CLASS_SPLIT_OPS=0 builds
#         every opcode's split code in every class again (the build before).
#      2. `MK_STEPS=ktbisect` (~8 min): the K step through lean / gemms / families / slim /
#         compact / compact + twin builds: is it code size?
#      3. If it is: `MK_STEPS=twin` (~6 min) checks compact + twin; if they pass,
#         `MK_STEPS=twintime` (~6 min) times decode default / compact / compact + twin at
#         B=256 / 1024; make the winners the default (compact first: its bound is the default's).
#         If it is not: `MK_STEPS=ktncu` (~5 min), stall reasons in the loop.
#      4. e2e small points (B=1 / 16 / 64 / 256), waitslim, 000012's 4.
#   000013. Session 42 ran 000012's 1-3 at 48fb53c (verify: one parity test parted on a 4-way
#      near-tie of the float32 reference at norm_fold=2, the rule widened to the tie set; ktsplit:
#      the lean build runs GATE_UP / DOWN K steps in ~1190 / 1225 cycles on the step's data, the
#      step's build ~1520 / 1505: the build; e2e B=1024 1.00, 4096 1.06, mixed 1.06). In this order:
#      1. `MK_STEPS=verify`: the parity test with the widened near-tie rule, and the GPU tests
#         never run yet: test_engine_folds_its_own_weights_in_place,
#         test_starved_page_wait_names_its_instruction[0 / 1] (an mbarrier wait's timeout
#         record, write_error's and MK_WAIT_COMPACT's, via MK_TEST_STARVE_TICKET).
#      2. `MK_STEPS="ktbisect"` (~7 min), then `MK_STEPS=waitslim` (~6 min), then
#         `MK_STEPS=ktncu` (~4 min): which part of the build; whether the waits' inline slow
#         paths are it (MK_WAIT_SLIM's unbounded waits, -33% SASS; MK_WAIT_COMPACT's bounded
#         ones with a one-CAS record, -11%: if compact keeps slim's gain, make it the default
#         after the GPU suite and a forced-timeout test pass with it); whether warps wait for
#         instructions in the loop.
#      3. e2e small points (B=1 / 16 / 64 / 256) at the new default, then 000012's 4.
#   000012. Session 41 ran 000011's 1-3 at f700093 (ccombine: correct, no gain, removed; nf2: -3.1% /
#      -2.2% at B=256 / 1024, made the backend's default at 50867f3; ktrace: the step's build
#      runs a GEMM K step ~25% slower than the harness's). In this order:
#      1. `MK_STEPS=verify` (~470 s): the whole GPU suite at the new default (norm_fold=2: the
#         parity tests now run it; test_engine_folds_its_own_weights_in_place is new). If a
#         parity test fails, `--plan norm_fold=0` / DEFAULT_PLAN back to 0 and say why.
#      2. `MK_STEPS=e2e` (B=1 / 16 / 64 / 256), then `MK_E2E_BATCH=1024,4096
#         MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e`: issue 6's table at the new default (B=4096
#         and the mixed step have not run norm_fold=2 yet).
#      3. `MK_STEPS=ktsplit` (~7 min): build or data for the slow K step (bench/GEMM_NOTES.md
#         session 41): --layers 2 / 20 / 80 isolated, at 80 also --isolated-lean (the
#         harness's build on the step's data), ncu no_inst samples in the loop.
#      4. 000011's leftovers: `MK_L2_VALUES="weights,kv kv,acts" MK_L2_BATCH=1024,4096
#         MK_STEPS=l2hint`, `MK_STEPS=qkv256`, then 000010's 4.
#   000011. Session 40 had no device time either (none lent): plan 000010 below still holds,
#      with this session's two additions placed in it. In this order:
#      1. `MK_STEPS=ktrace` (000010's 1), then 000010's 1b (`l2hint` at B=1024 / 4096).
#      2. `MK_STEPS=nf2` (000010's 2).
#      3. `MK_STEPS="ccombine ccombinetime"` (~10 min; if the second would pass the deadline it
#         is skipped: then, the checks clean, `MK_CC_CHECKED=1 MK_STEPS=ccombinetime` in a call
#         of its own): the last-split attention combine in the consumers (MK_ATTN_COMBINE=1): GPU
#         tests, racecheck, then B=1 / 16 / 64 and B=64 with kv_spread_min_splits=2 (off, spread
#         alone, spread + combine), and the last journaled. If it wins, the e2e
#         small points with it (`MK_E2E_BATCH=1,16,64 MK_E2E_ARGS=... MK_STEPS=e2e`), then weigh
#         it and kv_spread_min_splits=2 at B=64 as defaults (bench/ATTENTION_NOTES.md session 40).
#      4. 000010's 3 and 4.
#   000010. Session 39 had no device time (its one call died; then none was lent): plan
#      00000f's calls are still to run, and this session's builds. In this order:
#      1. `MK_STEPS=ktrace` (~5 min): the GEMM K-step trace, standalone (GATE_UP / DOWN at M =
#         1024 / 4096, GATE_UP 1024 with the step's 80 / 208 register split) and in the B=1024
#         step with each GEMM's middle layer isolated, nvidia-smi's clock / power meanwhile.
#         Read ktrace_summary.log against bench/GEMM_NOTES.md session 39 (which column says
#         what). Then, in a call of its own, `MK_KT_JOBS=0 MK_KT_BATCH=4096 MK_STEPS=ktrace`.
#      1b. `MK_L2_VALUES="weights,kv kv,acts" MK_L2_BATCH=1024,4096 MK_STEPS=l2hint` (~7 min:
#         no hints, the default, and the weights unhinted with the activation (A) loads
#         evict-last: MK_L2_HINTS part "acts", new in session 40): the GEMM weights' evict-first
#         hint (default since session 11, timed at B <= 256 only) where a
#         weight tile is read again by 8 / 32 M tiles (B=1024 / 4096): session 21's B=4096
#         journal had the consumers waiting for operands 33% of a GATE_UP tile in the step.
#         The journal's cons_wait column with and without the hint says whether it is L2.
#      2. `MK_STEPS=nf2` (~7 min): PlanConfig.norm_fold=2's GPU tests, checks, racecheck, then
#         B=256 / 1024 default / norm_fold=1 / 2. If it holds and wins, time it at 64 / 4096 and
#         the mixed step, then weigh the default (the folded weight copy, session 38).
#      3. `MK_STEPS=qkv256` (~7 min): QKV_ROPE on m128n256 above 256 tokens, in the steps where
#         SM time, not waves, counts (B=1024 / 4096).
#      4. `MK_STEPS=gu256`, then `MK_NF_ON=norm_fold=1 MK_NF_BATCH=1,16,64,256 MK_STEPS=normfold`,
#         then `MK_ATTN_SWAP_SPLIT=1 MK_STEPS=pairrace` (plan 00000f's 1-3 below).
#   00000f. Session 38 (plan 00000e's calls): e2e at 4eee517 0.92 / 0.94 / 1.04 / 1.06 / 1.01 /
#      1.09 (B=1 / 16 / 64 / 256 / 1024 / 4096), mixed 1.10; SWAP_SPLIT's pairs still 1 racecheck
#      hazard (stays off); a test_wait is no synccheck observation (consumer_test removed).
#      PlanConfig.norm_fold built and GPU-verified at 0c857b2 (`normfold`): B=256 -1.0%; at B=64
#      only with the reduce folds off / O_PROJ + DOWN unsplit, which lose 12-13%, so a norm that
#      finishes a split reduce now stays a full RMSNORM (ab8ec34, not GPU-run: at B <= 128 that
#      plan is the default's with unit norm weights). Next, in this order:
#      1. `MK_STEPS=gu256` (~6 min): GATE_UP@256 on gu_m128n112 split in 2, with and without
#         norm_fold, checks then B=192 / 256 timing; if it wins, make the tile the 256 class's
#         (mk.tiles) and time `--plan norm_fold=1` at B=256 / 512 / 1024 (`MK_NF_BATCH`).
#      2. `MK_NF_ON=norm_fold=1 MK_NF_BATCH=1,16,64,256 MK_STEPS=normfold` (~8 min; the reduce
#         folds on: at B <= 128 the default plan with unit norm weights, expect level); if
#         norm_fold holds level there and wins above, make it the default (the backend folds
#         its own copy of the weights; weigh folding in place).
#      3. `MK_ATTN_SWAP_SPLIT=1 MK_STEPS=pairrace` at cefd879 or later (~4 min; the pairs now
#         sync both warpgroups' barriers alike: bench/ATTENTION_NOTES.md session 38); clean ->
#         verify with it, then flip its default. Also the default build's pairrace again.
#      4. `MK_REPEAT_N=4 MK_STEPS=repeat` (timeout 600) when a call has room.
#   00000e. Session 37 (plan 00000d's calls): MK_OWN_PHASE_SEEN=early lost (B=256 +5.7% vs "0";
#      removed); consumer ran 13.844-13.886 ms at B=256 in four reruns, but one earlier run of it
#      died at B=256 with "unspecified launch failure" (not reproduced: `repeat` step).
#      MK_ATTN_SWAP_SPLIT=1 (46d1fe2's min-4 build): verify clean (38 tests, checks, racecheck 0),
#      pairrace racecheck 1 hazard (RMSNORM's partials; default build's pairrace clean), now
#      fixed on the CPU side (no idle-barrier stand-ins in a pair). Built: MK_OWN_PHASE_SEEN=
#      consumer_test (and the synccheck probe's selftest / constest). Next, in this order:
#      1. One call: `MK_ATTN_SWAP_SPLIT=1 MK_SYNC_PROBE=1 MK_SYNC_PROBE_VARIANTS="stagefull
#         selftest constest" MK_STEPS="pairrace synccheck"` (~6 min): pairrace clean -> flip
#         SWAP_SPLIT_VALUE's default to "1" (verify at ff4c9e8 was clean with it); the probe says
#         whether a test_wait not waited for counts as the observation (constest clean).
#      2. `MK_OWN_MODES="0 consumer consumer_test" MK_OWN_BATCH=256 MK_STEPS=ownphase` (~4 min);
#         if consumer_test is faster and constest was clean: `MK_OWN_PHASE_SEEN=consumer_test
#         MK_STEPS=synccheck`, then verify, then make it the default.
#      3. The e2e table (two calls, below), issue 5's `gemm` table.
#      4. `MK_REPEAT_N=4 MK_STEPS=repeat` whenever a call has room (the launch failure's core
#         dump; every timed variant now leaves one too).
#      The structural lever after these (bench/E2E_NOTES.md session 37): the RMSNORM phases
#      (11.9 of B=64's 114.7 us a layer), folded into the next GEMM (numerics checked on the CPU).
#   00000d. Session 36: MK_ATTN_SWAP_SPLIT=1 checked clean at cdd60c1 (split of every unit) and
#      timed at 46d1fe2 (units of >= 4 blocks): B=1/16/64/128 +0.3/+0.4/-0.7/-0.8%. Consumer's
#      B-phase waits (default) cost 2.4% at B=256 vs none. Built: MK_OWN_PHASE_SEEN=early. Next:
#      1. `MK_OWN_MODES="0 consumer early" MK_OWN_BATCH=64,256 MK_STEPS=ownphase` (~7 min).
#      2. Both candidates through the checks in one build: `export MK_ATTN_SWAP_SPLIT=1
#         MK_OWN_PHASE_SEEN=early` (or consumer if early did not win), then `MK_STEPS=verify`
#         and `MK_STEPS=synccheck` (two calls); if clean, flip both defaults in a commit.
#      3. The e2e table (two calls, below) and issue 5's `gemm` table at the new defaults.
#      4. `MK_STEPS=pairrace` (the swapped chain's pairs under racecheck / synccheck).
#   00000c. Session 35: MK_OWN_PHASE_SEEN=consumer is the default (consumer thread 0 observes the
#      B pages' own `full` phases; the loader's wait, "inline", cost 10.4% at B=256 against
#      none); verify + synccheck at 049a5d9 clean (38 tests, checks, racecheck 0, synccheck 0).
#      Not timed yet. First: `MK_OWN_BATCH=64,256 MK_STEPS=ownphase` alone (~5-6 min: 0 /
#      consumer / inline at B=64 and 256); then the e2e table (`MK_E2E_BATCH=1,16,64,256 MK_STEPS=e2e`, then
#      `MK_E2E_BATCH=1024,4096 MK_E2E_MIXED=256:1024:1024 MK_STEPS=e2e`) and issue 5's GEMM table
#      (`gemm`). Steps now run in MK_STEPS's order (verify takes ~460 s on a fresh machine).
#      Also built (off): MK_ATTN_SWAP_SPLIT=1, a lone decode unit's key blocks over both
#      warpgroups (B=64's ATTENTION: 22 of 115 us per layer, one warpgroup idle): `swapsplit`
#      (checks, racecheck, synccheck; a call of its own), then `swapsplittime` (B=1,16,64).
#   00000b. Session 34 made MK_SIGNAL_FENCE=red the default (the storer's signal with
#      red.release alone: B=1 / 64 -3.4% / -3.2%; checks + racecheck 0 with it), re-applied
#      s33-spillfree, and verified HEAD b046fa4 (`verify synccheck`: 38 tests, checks, racecheck 0,
#      synccheck 0 errors). e2e (b046fa4): 0.94 / 0.96 / 1.07 / 1.13 / 1.12 / 1.15, mixed 1.14.
#      The large batches lost ~8-12% since session 32's table: session 32's synccheck fix (the
#      loader's own_phase_seen after each B page arrival) costs 8.0% at B=256 (MK_OWN_PHASE_SEEN=0:
#      14.786 -> 13.599 ms; ATTENTION and GATE_UP both faster without it). Next, first:
#      `MK_STEPS=ownphase` (~5 min: B=256 with MK_OWN_PHASE_SEEN 0 / after / test / inline:
#      "after" the same waits once the stage's B loads are issued, "test" a test_wait that
#      nothing branches on), then `MK_OWN_PHASE_SEEN=<the fastest of after / test>
#      MK_STEPS="verify synccheck"` (~7 min); if clean, make it the default and rerun the e2e
#      table (1024 / 4096 / mixed especially), then issue 5's GEMM table (bench/gemm.py: session
#      27's predates the wait). Then `MK_OWN_PHASE_SEEN=<winner> MK_STEPS=stagefree` (~4 min:
#      MK_STAGE_EMPTY=stage, the loader's stage of empty waits as back-to-back tests) and, if it
#      wins, `MK_STAGE_EMPTY=stage MK_OWN_PHASE_SEEN=<winner> MK_STEPS="verify synccheck"`.
#   00000a. Session 33: verify at 368d703 passed (synccheck 0 errors); MK_SPLITS_IN_FLIGHT=4 +
#      the folded norm's h in registers (B=1 / 64 / 256 -0.4% / -0.7% / +0.4%) and GRANT_EARLY
#      (B=1 / 64 -0.5% / -0.5%) are default, both verified (38 tests, checks, racecheck). Next:
#      `MK_STEPS=sigfence` (a call of its own, ~9 min: MK_SIGNAL_FENCE red / fence, the
#      signal with one MEMBAR; SPLITK_REDUCE's signal is 2.7-3.0 us at B=64), then
#      `MK_STEPS="verify synccheck"` at HEAD if sigfence's winner becomes the default, then the
#      e2e table at every point (`e2e` with MK_E2E_BATCH=1,16,64,256 and a second call
#      1024,4096 + mixed). Also ready, not on main: branch s33-spillfree (7f476b8: attention's
#      S / P zero-filled on every path, so no register tensor is carried undefined across the
#      consumer loop; every variant 0 spills, LOOP_SPILL gone, 54 compile tests pass): merge it
#      after `verify` passes with it (reverted on main in fdb9ce4 only for want of a GPU run).
#   0000. Session 32 made session 31's swapped decode chain the default (racecheck clean with the
#      idle warpgroup's mirrored barriers; B=1 / 64 / 256 -2.1% / -4.1% / -1.5%; e2e at every
#      point: 1.00 / 0.97 / 1.11 / 1.06 / 1.02 / 1.09, mixed 1.08) and removed `split`
#      (racecheck: 100 hazards). synccheck stops the two-layer step with 8 "Missing wait" errors
#      on the loader's `full` arrivals, default build too (bench/E2E_NOTES.md session 32).
#      The loader now waits on those phases (own_phase_seen): at 5708f5e the two-layer step is
#      clean under synccheck / racecheck / memcheck. Next: `MK_STEPS="verify synccheck"` at HEAD
#      (the pytest GPU tests with the chain in the default build were run at c92c04c with the
#      switch on; not at HEAD), then the e2e table at every point.
#   00000. Session 31 built the swapped decode chain behind MK_ATTN_SWAPPED (then off).
#   000. Session 30 ran `rfused` (MK_ATTN_REDUCE_FUSED=1: correct, no gain, removed), the e2e
#      table at every point in one process (213 s: `python launch/bench.py --batch
#      1,16,64,256,1024,4096 --mixed 256:1024:1024`; 0.99 / 0.98 / 1.12 / 1.09 / 1.04 / 1.10,
#      mixed 1.07) and `verify` (passed). Of session 29's 11 leftover GEMM tests, 8 passed; the
#      last three (`-k "tmastoref32 and (M200 or M1024 or M1100)"`, an off switch) were cut by
#      the call's cap. Next (bench/E2E_NOTES.md session 30): the decode unit's swapped
#      formulation (S^T = K Q^T, keys on M; bench/ATTENTION_NOTES.md session 30): first step
#      `swapped` (~3 min: bench/probes/swapped_decode_probe.py, compiled on the CPU only, vs
#      torch, its ns per key block beside the harness's decode unit with / without its math),
#      then in the attention harness (`python bench/attention.py`, its GPU tests), then the
#      megakernel, B=64 / 256 / 1024 timed with the journal; or the small instructions' protocol
#      (RMSNORM writing global memory and signalling from its consumers, no staging page, no
#      storer hop) measured at B=64. `sticket` (~7 min) is still untimed (a launch's ~1 us).
#   00. Session 29 built an ATTN_REDUCE run by the storer of the last split (no ticket): correct
#      on the GPU, but B=1 +5.0%, B=16 +3.1% (the storer's two warps, ~32 dependent round trips);
#      removed (it lives at b09cdba; bench/E2E_NOTES.md session 29).
#   0. Session 28 made MK_GEMM_CHAIN_HANDOFF=1 the default (O_PROJ -2.5% / -1.8% at M = 1024 /
#      4096, B=1024 step -0.2%; its checks and racecheck passed), removed the lost switches
#      (RESIDUAL_L2: O_PROJ +16%; EPI_EARLY, RESIDUAL_REDUCE, STORE_UNROLL) and measured a
#      launch: 5.4 us, of which an empty kernel of its shape is 3.49 and the prologue + first
#      ticket ~1.3 (`launchcost` step). First call: `timeout 560 python -m pytest -m gpu -q
#      tests/test_gemm_gpu.py` alone (the whole GEMM GPU file has not run as pytest since session
#      26; with verify's files it passes the 420 s cap), then `MK_STEPS=verify`, then the e2e
#      table at every point in two calls (`python launch/bench.py --batch B --mixed none` for
#      B = 1, 16, 64, 256, 1024, 4096 at ctx 256, and B=512 with `--mixed 256:1024:1024`, not
#      run since session 20). Levers, by expected gain: (a) B=64's decode attention (26.6 us per
#      layer on the path, 64 one-row units on 132 SMs): two KV splits per unit cut it to ~20.9
#      but the ATTN_REDUCE hop adds ~5.3 (session 18); the combine done by the last split to
#      arrive was built and lost in session 29 (its storer is too slow; 00 above): the faster
#      reduce ticket (`rfused`) ran in session 30: no gain (000 above); what is left of this
#      lever is the unit's own block chain (the swapped formulation); (b) the first ticket without the contended atomic (CTA b takes ticket
#      b; ~1 us of each launch: issue 5's M = 64 / 256 misses) changes the queue's contract (a
#      CTA that never starts would hold a ticket): built off (MK_STATIC_FIRST_TICKET=1, step
#      `sticket`, ~7 min), time it, then weigh the contract; (c) QKV_ROPE at M=4096, a
#      split of the last partial wave's tiles (planner; ~17% of its mainloop span by arithmetic,
#      ~1.6% of the B=4096 step)
#   0b. GEMM per-tile cost, the rest (issue 5; a tile costs a + b x K steps, mk a = 4.2 us against
#      CUTLASS's 1.8): the consumers' epilogue code (GATE_UP's SiLU 3.7 us, DOWN's residual
#      add 2.8 us at B=1024: stmatrix / ldmatrix would cut the per-pair instructions), then
#      ping-pong consumers; `python bench/cutlass_peer.py --example <CUTLASS's
#      dense_gemm_persistent.py, carried in .gpu/>` is the peer of the mainloop itself;
#      tests/test_page_protocol.py models any page-protocol change first
#   1. B=64 / 256 (1.15 / 1.10 in session 24): the ATTN combine as its own hop ("sp2:kv_spread_min_splits=2"
#      cut ATTENTION on the B=64 path 27.4 -> 20.9 us per layer, ATTN_REDUCE added 5.3); a
#      combine by the last split to finish lost in session 29 (the storer's registers hold too
#      few loads in flight); SPLITK_REDUCE (17.1 us of B=128's 138.6 per layer on the path) the
#      same way would need its combine staged through shared memory
#   2. O_PROJ / DOWN on m128n128 in the 1024 class gained at B=384 (-2.6%) and lost at 512
#      (+0.8%) (planab_od1k_2026-12-01_s19): a token cap inside the class (a tile override by
#      tokens) would take the 384 gain only
#   3. "pairwarp" (memcheck + repeat timing)
# The GEMM tiles' epilogue (issue 5): session 21 measured the register-direct epilogue (session
# 20's MK_GEMM_DIRECT_EPI, removed since; bench/GEMM_NOTES.md session 21) slower than the staged
# one (RESIDUAL 2.1x at M=1024, SILU_MUL +2% at M >= 1024): without staging pages the
# consumers' own scattered stores took the time the staged copy took. Overlapping a tile's
# epilogue with the next tile's mainloop likely needs two accumulator sets (ping-pong consumer
# warpgroups, as CUTLASS's sm90 ping-pong kernels), not yet built
# MK_DEADLINE_S skips a step whose STEP_S estimate does not fit: give the step's own limits
# (MK_AB_TIMEOUT) and a deadline past its estimate, or it is skipped at 0 s (session 13 lost a
# B=4096 timing that way).
# Where the time goes (session 14's critical paths, bench/E2E_NOTES.md): at B <= 64 the small
# instructions' fixed costs (SPLITK_REDUCE hops, 28 of 136 us per layer at B=64, 20 with
# O_PROJ's folded; ATTENTION / ATTN_REDUCE of a few keys); at B=256 GATE_UP (107 of 270 us) and
# DOWN (50); at B=1024 (802 us per layer): GATE_UP 319, QKV_ROPE 179, ATTENTION 115, DOWN 107,
# RMSNORM 37 (68 before the 2-row groups), O_PROJ 35, with ATTENTION 35% of the SMs' busy time.
# After a call: copy the logs / JSON into bench/results with the session's tag and summarise
# each A/B with `python bench/ab_summary.py "NAME=off.json,on.json" ... --out ... [--append]`.
# Every journaled timing now prints the step's critical path per layer (mk.trace.critical_path):
# read it before choosing the next lever (split-K reduce hops, attention, norms).
# treeab's base tree: `git archive --format=tar.gz <base> mk launch bench/_jobs.py pyproject.toml
# -o .gpu/old.tgz` here, `mkdir -p /tmp/oldtree && tar -C /tmp/oldtree -xzf .gpu/old.tgz` there.
# A machine that starts cold loses ~60 s of the first call.
# The device tool brings back 8 files: end the call's command with
#   tar -C $OUT -czf $OUT/all.tgz g0 g1 && rm -rf $OUT/g0 $OUT/g1
# so that every log and JSON comes back (session 7 lost JSONs and a log to the limit).
# Two jobs side by side share the host's cores: the checks run the interpreter (mk.vm) on the CPU,
# and two torch processes with a thread per core each slowed the step tests 3-5x (session 6: the
# pytest of both GPU files did not finish in 420 s; with OMP_NUM_THREADS=16 each, 137 s), so each
# job gets half the cores unless OMP_NUM_THREADS is set. A step whose usual duration (STEP_S
# below) would pass MK_DEADLINE_S (default 570 s from the script's start) is skipped and says so.
# Steps run in MK_STEPS's order (the script runs itself once per step; until session 35 they ran
# in this file's order, and a verify listed last took a call's time first); verify takes ~460 s on
# a fresh machine (its pytest compiles ~240 s).
set -u
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
OUTDIR=${1:-${OUT:-bench/results}}
mkdir -p "$OUTDIR"
# scratch logs of this run alone: two runs side by side (one per GPU) must not share them
TMPD=$(mktemp -d /tmp/gpu_next.XXXXXX)
mkdir -p "$TMPD/core"
export PYTHONUNBUFFERED=1
STEPS=${MK_STEPS:-"attnexp base"}
# every requested step must be one block of this file: a typo would run nothing, and a second
# block of one name would run both (session 28 lost a call to a new step named as an old one)
for s in $STEPS; do
  n=$(grep -c "^if has $s; then" "$0")
  if [ "$n" != 1 ]; then
    echo "gpu_next.sh: step '$s' has $n blocks in $0 (expected 1)" >&2
    exit 2
  fi
done
if [ -z "${MK_GPU_NEXT_ONE:-}" ] && [ "$(echo $STEPS | wc -w)" -gt 1 ]; then
  # one run of this script per step, in MK_STEPS's order, each with the deadline's remainder
  DEADLINE=${MK_DEADLINE_S:-570}
  rc=0
  for s in $STEPS; do
    MK_GPU_NEXT_ONE=1 MK_STEPS=$s MK_DEADLINE_S=$((DEADLINE - SECONDS)) bash "$0" "$OUTDIR" || rc=1
  done
  rm -rf "$TMPD"
  exit $rc
fi
B="python launch/bench.py --systems megakernel --skip-check --mixed none --reps 10 --warmup 3 --no-png"
# the M <= 256 class on the 64-row tiles (the default before session 7)
# (MK_TILES classes by their upper bound: since session 65 "256" is 129..256 and "128" is 65..128;
# the steps below that name @256 for 65..256 tokens were written before that split)
M64_AT_256="QKV_ROPE@256=m64n256,O_PROJ@256=m64n256,GATE_UP@256=gu_m64,DOWN@256=m64n256"
rc=0
# A step runs only if its usual duration still fits before MK_DEADLINE_S seconds from the start
# (default 570: a device call ends at 600 s, and a call cut off mid-step returns half a log)
DEADLINE=${MK_DEADLINE_S:-570}
declare -A STEP_S=([verify]=470 [attnexp]=150 [base]=180 [l2pf]=300
                   [wgsplit]=540 [split]=360 [rwide]=420 [tiles]=300 [e2e]=480 [ncu]=300
                   [storecheck]=300 [storetime]=360 [wgrace]=240 [splitk256]=150 [wgtime]=300 [treeab]=420 [opsplit]=330 [tiles256]=480 [attnstep]=300
                   [opcombo]=330 [caps512]=300 [page64]=240 [gemm]=420 [rslice]=240 [l2hint]=420 [gemmold]=300 [normrows]=420 [stab]=420 [planab]=300 [islots]=480 [claim]=480 [fold]=420 [normbatch]=420 [normbatchtime]=420 [nf4]=540 [gathercons]=420 [gatherconstime]=420 [pair]=480 [gutiles]=540 [l2skip]=300 [fill]=420 [wide]=480 [widetime]=360 [lm256]=300 [lmverify]=150 [floor]=300 [launchcost]=200 [swapped]=420 [synccheck]=240 [swapsplit]=450 [swapsplittime]=330 [pairrace]=240 [repeat]=400 [normfold]=480 [gu64]=420 [ktrace]=330 [clocks]=420 [nf2]=480 [qkv256]=420 [ktsplit]=450 [ktbisect]=520 [waitslim]=540
                   [ktncu]=300 [twin]=400 [twintime]=420 [memcheck]=270 [normbig]=480 [shares]=240
                   [nself]=480 [attnlpt]=240 [planpair]=300 [genoverlap]=200 [stepgpu]=360
                   [launchhost]=120 [od64]=480 [cls128]=300 [gemmncu]=200 [wave]=480 [gemmsrc]=240
                   [gemmab]=560 [decab]=420 [gemmtc]=560)
has() {
  case " $STEPS " in *" $1 "*) ;; *) return 1 ;; esac
  if [ $((SECONDS + ${STEP_S[$1]:-0})) -gt "$DEADLINE" ]; then
    echo "== $1 skipped: ~${STEP_S[$1]:-0} s would pass MK_DEADLINE_S=$DEADLINE (at ${SECONDS} s)"
    rc=1; return 1
  fi
  return 0
}
table() { grep -v "^\[mk\." "$1" | grep -E "^decode|^ *mixed |^[A-Z_]+([.][a-z]+)?(/[a-z]+)? +[0-9]|^step span|^opcode|^critical path"; }
# the environment words of a bench run NAME that leaves a lightweight CUDA core dump under
# $TMPD/core on a kernel exception, and its traceback (session 37: a timing run of the default
# build died once with "unspecified launch failure" and left nothing to read)
core_env() { echo "MK_BENCH_TRACEBACK=1 CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_ENABLE_LIGHTWEIGHT_COREDUMP=1 CUDA_COREDUMP_FILE=$TMPD/core/$1.%p"; }
# NAME's core dumps (core_env), read with cuda-gdb where the machine has it, into LOG
#   report_cores NAME LOG
report_cores() {
  local f
  for f in "$TMPD"/core/"$1".*; do
    [ -e "$f" ] || continue
    echo "core dump $f ($(stat -c %s "$f") bytes)" | tee -a "$2"
    if command -v cuda-gdb > /dev/null; then
      timeout 120 cuda-gdb -batch -ex "target cudacore $f" -ex "info cuda kernels" \
          -ex "info cuda warps" -ex "x/4i \$pc" 2>&1 | tail -60 | tee -a "$2"
    else
      echo "no cuda-gdb on this machine" | tee -a "$2"
    fi
  done
}
# bench/gemm_profile.py's jobs (comma-separated) within LIMIT s: NAME.json, NAME.log and a table
# of its job lines: job, median us (time) or ok + rel_err (check), error
run_profile() {
  local name=$1 jobs=$2 lim=$3
  timeout "$lim" python bench/gemm_profile.py --jobs "$jobs" --reps 15 --timeout $((lim - 10)) \
      --out "$OUTDIR/$name.json" > "$OUTDIR/$name.log" 2>&1 || rc=1
  echo "== $name: bench/gemm_profile.py (check: ok rel_err; time: median us)"
  python - "$OUTDIR/$name.log" <<'PYEOF'
import json, sys
for ln in open(sys.argv[1]):
    if not ln.startswith("{"):
        continue
    r = json.loads(ln)
    v = r.get("mk_us", r.get("ok"))
    print(f"{r.get('job', '?'):40s} {v} {r.get('rel_err', '')} {r.get('error', '')[-300:]}")
PYEOF
}
# the journal jobs of run_profile NAME (journal flags noop / first): where a short launch's time
# goes, appended to NAME_summary.log
launch_journal() {
  python - "$OUTDIR/$1.log" <<'PYEOF' | tee -a "$OUTDIR/$1_summary.log"
import json, sys
for ln in open(sys.argv[1]):
    if ln.startswith("{") and '"journal"' in ln:
        r = json.loads(ln)
        print(r.get("job"), {k: r.get(k) for k in ("cta_start_spread_ns", "first_fetch_ns",
              "first_ready_ns", "first_end_ns", "teardown_ns", "kernel_ns")})
PYEOF
}
# the correctness checks of a variant (its environment already exported): pytest files, the
# two-layer step vs mk.vm (split-K never / auto), racecheck of that step; "FAILED" on any failure
# (no pytest files: none run; MK_CHECK_EXTRA: more arguments of the two-layer checks)
checks() {
  if [ $# -gt 0 ]; then
    timeout ${MK_CHECK_PYTEST_S:-420} python -m pytest -m gpu -q -rfE --tb=line -p no:cacheprovider "$@" 2>&1 \
        | grep -v "^\[mk" | tail -25
  fi
  # the third: a 1144-token first step, the M > 1024 class's variant (B=4096's, the mixed step's)
  for a in "--layers 2 --split-k 1" "--layers 2 --split-k 0" \
      "--layers 2 --split-k 0 --prompt-lens 500,500,130,13,1"; do
    echo "== check $a ${MK_CHECK_EXTRA:-}"
    timeout 100 python -m mk.megakernel_step check $a ${MK_CHECK_EXTRA:-} 2>&1 | grep -v "^\[mk" \
        | tail -1 | cut -c1-300
  done
  echo "== racecheck, two-layer step, split-K auto (hazards with source lines: racecheck_full.log)"
  CUTE_DSL_LINEINFO=1 timeout 150 compute-sanitizer --tool racecheck python -m mk.megakernel_step \
      check --layers 2 --decode-steps 1 --split-k 0 ${MK_CHECK_EXTRA:-} > "$OUTDIR/racecheck_full.log" 2>&1
  grep -E "SUMMARY|passed" "$OUTDIR/racecheck_full.log" | cut -c1-200
}
check_to() {   # the two-layer check with these arguments (the environment as it is), into log $1
  local log=$1; shift
  local shown="$*"
  echo "== check ${MK_CHECK_TAG:-}--layers 2 ${shown:0:80}" | tee -a "$log"
  timeout 120 python -m mk.megakernel_step check --layers 2 "$@" 2>&1 | grep -v "^\[mk" \
      | tail -1 | cut -c1-300 | tee -a "$log"
}
# the two-layer checks of a plan change (208 tokens split-K never / auto, 478 tokens: the 1024
# class) with --plan PLAN, appended to LOG; true if all three passed
#   fold_checks LOG PLAN
fold_checks() {
  local log=$1 plan=$2 before
  before=$(grep -c '"passed": true' "$log")
  check_to "$log" --split-k 1 --plan "$plan"
  check_to "$log" --split-k 0 --plan "$plan"
  check_to "$log" --split-k 0 --prompt-lens 1,13,64,130,200,70 --plan "$plan"
  [ $(( $(grep -c '"passed": true' "$log") - before )) -eq 3 ]
}
passed() {   # the checks' log: pytest all passed (MK_NO_PYTEST=1: none ran), the three checks and
             # racecheck run passed, 0 hazards
  { [ "${MK_NO_PYTEST:-0}" = 1 ] || grep -qE "^[0-9]+ passed" "$1"; } \
      && ! grep -qE "(^| )[1-9][0-9]* (failed|errors?)( |,|$)" "$1" \
      && ! grep -q '"passed": false' "$1" && grep -q "RACECHECK SUMMARY: 0 hazards" "$1" \
      && [ "$(grep -c '"passed": true' "$1")" -ge 4 ]
}
# LOG's checks tagged TAG (check_to / racecheck_to under MK_CHECK_TAG=TAG) passed: 4 two-layer
# checks passed, none failed, racecheck 0 hazards
#   rb_checks_passed LOG TAG
rb_checks_passed() {
  local part
  part=$(awk -v t="== check $2" -v r="== racecheck $2" '
      index($0, "== ") == 1 { on = (index($0, t) == 1 || index($0, r) == 1) } on' "$1")
  [ "$(grep -c '"passed": true' <<< "$part")" -ge 4 ] && ! grep -q '"passed": false' <<< "$part" \
      && grep -q "RACECHECK SUMMARY: 0 hazards" <<< "$part"
}
# the two-layer check with a 478-token first step (the 1024 class; split-K auto) and a memcheck
# of the two-layer step (memcheck_full.log), for a variant whose environment is exported
check478_memcheck() {
  echo "== check --layers 2 --split-k 0 --prompt-lens 1,13,64,130,200,70"
  timeout 120 python -m mk.megakernel_step check --layers 2 --split-k 0 \
      --prompt-lens 1,13,64,130,200,70 2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
  echo "== memcheck, two-layer step, split-K auto"
  timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python -m mk.megakernel_step \
      check --layers 2 --decode-steps 1 --split-k 0 > "$OUTDIR/memcheck_full.log" 2>&1
  grep -E "ERROR SUMMARY|passed" "$OUTDIR/memcheck_full.log" | cut -c1-200
}
# the attention harness's split-decode cases (its reduce) with a compile-time switch VAR=VALUE:
# its checks and cold times, NAME_harness_VALUE.{json,log}
#   reduce_harness NAME VAR VALUE
reduce_harness() {
  local name=$1 var=$2 val=$3
  env "$var=$val" timeout 150 python bench/attention.py --quick \
      --cases decode-ctx8192-b32,decode-varlen \
      --out "$OUTDIR/${name}_harness_$val.json" > "$OUTDIR/${name}_harness_$val.log" 2>&1 || rc=1
  echo "== attention harness, $var=$val"
  grep -E "FAIL|Error|^\[attention\] (ok|passed)" "$OUTDIR/${name}_harness_$val.log" | cut -c1-200
  python - "$OUTDIR/${name}_harness_$val.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1]))["timing"]:
    print(" ", r["case"], {k: round(v, 1) for k, v in r.items() if k.endswith("cold_us")})
PY
}
if has verify; then
  checks ${MK_VERIFY_FILES:-tests/test_megakernel_gpu.py tests/test_megakernel_step_gpu.py} \
      ${MK_VERIFY_EXTRA:-} \
      > "$OUTDIR/verify.log" 2>&1
  # the build is the default's but for the compile-time switches exported (MK_* here)
  echo "== verify ($(env | grep -E '^MK_(ATTN|GEMM|OWN|ROWS|WAIT|CLASS)[A-Z_]*=' | sort | tr '\n' ' ' \
      | sed 's/ $//' | grep . || echo default build))"; cat "$OUTDIR/verify.log"
  passed "$OUTDIR/verify.log" && echo "== verify: all passed" || { echo "== verify: FAILED"; rc=1; }
fi
if has stepgpu; then
  timeout 390 python -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
      tests/test_megakernel_step_gpu.py \
      "tests/test_megakernel_gpu.py::test_recorded_launches_finish_apart" \
      2>&1 | grep -v "^\[mk" > "$OUTDIR/stepgpu.log"
  tail -15 "$OUTDIR/stepgpu.log"
  grep -qE "^[0-9]+ passed" "$OUTDIR/stepgpu.log" \
      && ! grep -qE "(^| )[1-9][0-9]* (failed|errors?)( |,|$)" "$OUTDIR/stepgpu.log" \
      && echo "== stepgpu: all passed" || { echo "== stepgpu: FAILED"; rc=1; }
fi
if has synccheck; then
  # synccheck of the two-layer step (split-K auto): every mbarrier phase must be observed by a
  # successful wait before the next arrival (PTX ISA; "Missing wait" stops the kernel: session
  # 32); with MK_SYNC_PROBE=1 also bench/probes/synccheck_mbarrier_probe.py's variants, one
  # process each (ring / twice / selfwait / conswait clean; skipwait / double / stagefull flagged;
  # selftest / constest not run yet), or those in MK_SYNC_PROBE_VARIANTS
  { echo "== synccheck, two-layer step, split-K auto (first 150 lines: synccheck_full.log)"
    CUTE_DSL_LINEINFO=1 timeout 200 compute-sanitizer --tool synccheck python -m mk.megakernel_step \
        check --layers 2 --decode-steps 1 --split-k 0 > "$TMPD/synccheck.log" 2>&1 || rc=1
    grep -v "^\[mk" "$TMPD/synccheck.log" | head -150 > "$OUTDIR/synccheck_full.log"
    grep -E "ERROR SUMMARY|passed" "$TMPD/synccheck.log" | cut -c1-200
    grep -A1 "Barrier error" "$TMPD/synccheck.log" | grep -oE "[a-z_]+\.py:[0-9]+" | sort | uniq -c
    if [ "${MK_SYNC_PROBE:-0}" = 1 ]; then
      for v in ${MK_SYNC_PROBE_VARIANTS:-ring skipwait double twice stagefull selfwait conswait selftest constest}; do
        echo "== probe $v: $(CUTE_DSL_LINEINFO=1 timeout 60 compute-sanitizer --tool synccheck \
            python bench/probes/synccheck_mbarrier_probe.py $v 2>&1 | grep -c 'Missing wait') Missing wait"
      done
    fi
  } > "$OUTDIR/synccheck.log" 2>&1
  cat "$OUTDIR/synccheck.log"
fi
if has memcheck; then
  # the default build under compute-sanitizer memcheck: the two-layer check with a 478-token first
  # step (the 1024 class, split-K auto), then memcheck of the two-layer step (split-K auto):
  # memcheck.log, memcheck_full.log (~4 min; session 44 made the twin slots and compact waits
  # the default after racecheck only)
  check478_memcheck > "$OUTDIR/memcheck.log" 2>&1
  cat "$OUTDIR/memcheck.log"
  grep -q "ERROR SUMMARY: 0 errors" "$OUTDIR/memcheck.log" && [ "$(grep -c '"passed": true' \
      "$OUTDIR/memcheck.log")" -ge 2 ] && echo "== memcheck: all passed" \
    || { echo "== memcheck: FAILED"; rc=1; }
fi
if has pairrace; then
  # racecheck and synccheck of the two-layer step with every decode paired (attn_pair=2, kv_split
  # 1024: pairs of unequal block counts, 2 / 14, 65 / 71, 131 / 201 keys), in the environment as
  # it is: the swapped chain's pairs (the default since session 32) have not been through
  # either since (the default checks' steps form no pair: attn_pair auto pairs only past num_sms
  # instructions), and their warpgroups sync their barriers 5 / 6 unequally often when the units' block
  # counts differ (session 31's racecheck signature): pairrace.log, pairrace_{racecheck,
  # synccheck}.log (~4 min)
  PAIR="--layers 2 --decode-steps 1 --split-k 0 --plan attn_pair=2 --kv-split 1024"
  PAIR="$PAIR --prompt-lens 1,13,64,130,200,70"
  for tool in racecheck synccheck; do
    echo "== $tool, $PAIR" | tee -a "$OUTDIR/pairrace.log"
    # shellcheck disable=SC2086  # $PAIR: the arguments, split
    CUTE_DSL_LINEINFO=1 timeout 200 compute-sanitizer --tool $tool python -m mk.megakernel_step \
        check $PAIR > "$TMPD/pairrace_$tool.log" 2>&1 || rc=1
    grep -v "^\[mk" "$TMPD/pairrace_$tool.log" | head -150 > "$OUTDIR/pairrace_$tool.log"
    grep -E "SUMMARY|passed" "$TMPD/pairrace_$tool.log" | cut -c1-200 | tee -a "$OUTDIR/pairrace.log"
  done
fi
if has swapped; then
  { for nb in 16 1; do
      timeout 120 python bench/probes/swapped_decode_probe.py --blocks $nb > "$TMPD/swapped_$nb.log" 2>&1 \
          || rc=1
      tail -3 "$TMPD/swapped_$nb.log"
    done
    timeout 280 python bench/attention.py --experiments none,nomath --cases decode-ctx1024-b1 \
        --exp-timeout 260 --out "$OUTDIR/swapped_harness.json" > "$TMPD/swapped_harness.log" 2>&1 || rc=1
    grep -E "^\[attention\] (exp|experiments|FAIL|experiment .* FAILED)" "$TMPD/swapped_harness.log" \
        || tail -20 "$TMPD/swapped_harness.log"
  } > "$OUTDIR/swapped.log" 2>&1
  echo "== swapped"; cat "$OUTDIR/swapped.log"
fi
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
# A/B timing of a variant: off = the default build and plan, on = the environment assignment
# ON_ENV ("" for none) and the bench arguments ON_ARGS; COMMON_ARGS go to both
#   time_ab NAME LABEL BATCHES ON_ENV ON_ARGS [COMMON_ARGS]  -> NAME_{on,off}.json, NAME.log
time_ab() {
  local name=$1 label=$2 batches=$3 on_env=$4 on_args=$5 common=${6:-} v e a
  for v in off on; do
    e=""; a=$common
    [ $v = on ] && { e=$on_env; a="$common $on_args"; }
    env $e timeout ${MK_AB_TIMEOUT:-200} $B --batch "$batches" $a --out "$OUTDIR/${name}_$v.json" \
        > "$TMPD/${name}_$v.log" 2>&1 || rc=1
    echo "== $label $v" | tee -a "$OUTDIR/$name.log"
    { table "$TMPD/${name}_$v.log" | grep -E "^decode|^ATTN|^opcode"; grep Error "$TMPD/${name}_$v.log"; } \
        | tee -a "$OUTDIR/$name.log"
    rm -f "$OUTDIR"/"${name}_$v"_*_journal.pt "$OUTDIR"/"${name}_$v"_*_timeline.png
  done
}
# one journaled timing of a variant, its table rows appended to NAME.log:
#   time_variant NAME V LABEL BATCHES ENV ARGS  -> NAME_V.json ("" ENV / ARGS: none)
# the opcodes whose rows of a journal's per-opcode table time_variant keeps
JOURNAL_OPS="QKV_ROPE|O_PROJ|GATE_UP|DOWN|SPLITK_REDUCE|ATTENTION|ATTN_REDUCE|RMSNORM|LM_NORM"
JOURNAL_OPS+="|LM_HEAD|EMBED"
time_variant() {
  local name=$1 v=$2 label=$3 batches=$4 e=$5 a=$6
  # shellcheck disable=SC2046  # core_env: VAR=VALUE words
  env $e $(core_env "${name}_$v") timeout ${MK_AB_TIMEOUT:-200} $B --batch "$batches" $a \
      --journal --out "$OUTDIR/${name}_$v.json" > "$TMPD/${name}_$v.log" 2>&1 || rc=1
  echo "== $label" | tee -a "$OUTDIR/$name.log"
  { table "$TMPD/${name}_$v.log" | grep -E "^ *(decode|mixed) |^opcode|^($JOURNAL_OPS)[ ./]"
    grep -E -A12 "Error|^error|Traceback" "$TMPD/${name}_$v.log" | tail -30; } | tee -a "$OUTDIR/$name.log"
  report_cores "${name}_$v" "$OUTDIR/$name.log"
  rm -f "$OUTDIR"/"${name}_$v"_*_journal.pt "$OUTDIR"/"${name}_$v"_*_timeline.png
}
# megakernel-only runs without the journal, each RUN "V|ENV|ARGS|BATCHES" (ENV: VAR=VALUE words,
# ENV / ARGS may be empty), their decode rows (and any error, core dump) appended to NAME.log,
# each capped at UNTRACED_TIMEOUT seconds (150):
#   untraced_runs NAME RUN...  -> NAME_V.json
untraced_runs() {
  local name=$1 run v e a bt
  shift
  for run in "$@"; do
    IFS="|" read -r v e a bt <<< "$run"
    # shellcheck disable=SC2046,SC2086  # VAR=VALUE words; $a: the arguments, split
    env $e $(core_env "${name}_$v") timeout ${UNTRACED_TIMEOUT:-150} $B --batch "$bt" $a \
        --out "$OUTDIR/${name}_$v.json" > "$TMPD/${name}_$v.log" 2>&1 || rc=1
    echo "== $v ${e:-} ${a:-(default)}" | tee -a "$OUTDIR/$name.log"
    { table "$TMPD/${name}_$v.log" | grep -E "^ *(decode|mixed) "
      grep -E -A12 "Error|^error|Traceback" "$TMPD/${name}_$v.log" | tail -30; } \
        | tee -a "$OUTDIR/$name.log"
    report_cores "${name}_$v" "$OUTDIR/$name.log"
  done
}
# racecheck of the two-layer step (--layers 2 --decode-steps 1 and ARGS; the environment as it
# is) into racecheck_full.log, its summary appended to LOG
#   racecheck_to LOG ARGS...
racecheck_to() {
  local log=$1; shift
  echo "== racecheck ${MK_CHECK_TAG:-}$*" | tee -a "$log"
  CUTE_DSL_LINEINFO=1 timeout ${MK_RACE_TIMEOUT:-150} compute-sanitizer --tool racecheck \
      python -m mk.megakernel_step check --layers 2 --decode-steps 1 "$@" \
      > "$OUTDIR/racecheck_full.log" 2>&1
  grep -E "SUMMARY|passed" "$OUTDIR/racecheck_full.log" | cut -c1-200 | tee -a "$log"
}
# LOG's checks passed: its GPU tests (where it ran some: a "== GPU tests" line) passed, no
# pytest failure or error, at least N two-layer checks passed and none failed, racecheck 0
# hazards
#   checks_clean LOG N
checks_clean() {
  { ! grep -q "^== GPU tests" "$1" || grep -qE "^[0-9]+ passed" "$1"; } \
      && ! grep -qE "(^| )[1-9][0-9]* (failed|errors?)( |,|$)|\"passed\": false" "$1" \
      && grep -q "RACECHECK SUMMARY: 0 hazards" "$1" \
      && [ "$(grep -c '"passed": true' "$1")" -ge "$2" ]
}
# untraced_runs NAME RUN... if NAME.log's checks are clean (checks_clean NAME.log N)
#   checked_runs NAME N RUN...
checked_runs() {
  local name=$1 n=$2
  shift 2
  if checks_clean "$OUTDIR/$name.log" "$n"; then
    untraced_runs "$name" "$@"
  else
    echo "== $name: checks did not pass, not timed" | tee -a "$OUTDIR/$name.log"; rc=1
  fi
}
# one run of $B and ARGS in the source tree DIR, with a kernel cache of its own (suffix V): NAME.json,
# its decode rows appended to LOG under LABEL (treeab, stab)
#   bench_in_tree NAME V DIR LOG LABEL ARGS...
bench_in_tree() {
  local name=$1 v=$2 d=$3 log=$4 label=$5
  shift 5
  ( cd "$d" && PYTHONPATH="$d:${PYTHONPATH:-}" MK_CACHE_DIR="${MK_CACHE_DIR:-/tmp/mk-cache}_$v" \
      timeout ${MK_AB_TIMEOUT:-270} $B "$@" --out "$OUTDIR/$name.json" ) > "$TMPD/$name.log" 2>&1 || rc=1
  echo "== $label: $d" | tee -a "$log"
  { table "$TMPD/$name.log" | grep -E "^decode"; grep Error "$TMPD/$name.log"; } | tee -a "$log"
  rm -f "$OUTDIR"/"$name"_*_journal.pt "$OUTDIR"/"$name"_*_timeline.png
}
# time_ab, only when the variant's checks' log NAME.log passed
timed_ab() {
  if passed "$OUTDIR/$1.log"; then
    time_ab "$@"
  else
    echo "== checks did not pass: not timed" | tee -a "$OUTDIR/$1.log"; rc=1
  fi
}
# A/B of one environment variable (default when unset = off), its checks first:
#   ab NAME VAR ON-VALUE BATCHES PYTEST-FILES...  -> NAME.log, NAME_{on,off}.json
ab() {
  local name=$1 var=$2 on=$3 batches=$4
  shift 4
  ( export "$var=$on"; echo "== $var=$on"; checks "$@" ) > "$OUTDIR/$name.log" 2>&1
  cat "$OUTDIR/$name.log"
  timed_ab "$name" "$var" "$batches" "$var=$on" ""
}
if has normfold; then
  # PlanConfig.norm_fold (session 38): the attention / MLP norms folded into the split QKV /
  # gate-up GEMMs (row-scale RMSNORM + scaled SPLITK_REDUCE). Checks: the GPU tests of the two
  # new modes (-k row_scale), the two-layer step vs mk.vm with norm_fold=1 and the O_PROJ / DOWN
  # reduce folds on / off, split-K auto and forced 2 (the 478-token first step), racecheck of
  # the auto one; then, only if all passed, decode MK_NF_BATCH (64,256), no journal: the
  # default against norm_fold=1 with those folds off, and at B=64 norm_fold=1 with O_PROJ / DOWN
  # unsplit: normfold.log, normfold_{off,on,unsplit}.json
  NF_ON=${MK_NF_ON:-norm_fold=1,fold_o_reduce=0,fold_down_reduce=0}   # the "on" run's --plan
  : > "$OUTDIR/normfold.log"
  { echo "== GPU tests -k row_scale"
    timeout 200 python -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider -k row_scale \
        tests/test_megakernel_ops_gpu.py tests/test_splitk_gpu.py 2>&1 | grep -v "^\[mk" | tail -15
  } | tee -a "$OUTDIR/normfold.log"
  check_to "$OUTDIR/normfold.log" --split-k 0 --plan norm_fold=1
  check_to "$OUTDIR/normfold.log" --split-k 0 --plan "$NF_ON"
  check_to "$OUTDIR/normfold.log" --split-k 2 --plan "$NF_ON" --prompt-lens 1,13,64,130,200,70
  racecheck_to "$OUTDIR/normfold.log" --split-k 0 --plan "$NF_ON"
  # unsplit: O_PROJ / DOWN unsplit at B=64 (their cap, splitk_max_tokens, under 64), so no
  # reduce phase is left between them and the folded GEMMs
  checked_runs normfold 4 "off||--plan norm_fold=0|${MK_NF_BATCH:-64,256}" "on||--plan $NF_ON|${MK_NF_BATCH:-64,256}" \
      "unsplit||--plan norm_fold=1,splitk_max_tokens=32|64"
fi
if has nf2; then
  # PlanConfig.norm_fold=2 (built in session 39, not GPU-run): unsplit QKV_ROPE / GATE_UP tiles
  # read h and scale their rows by ROW_SCALE after an epilogue wait for the row-scale norm
  # (the loader's counter wait before the epilogue pages), so the norm runs beside their
  # mainloops. Checks: its GPU tests (row-scaled tiles of GATE_UP / QKV_ROPE at M 1 / 64 / 200 /
  # 1024 vs the faces; two layers vs mk.vm, split-K never / auto), the two-layer
  # checks with split-K never (every QKV / gate-up tile row-scaled) and auto (478 tokens: split
  # and unsplit tiles side by side), racecheck of the never one; then, only if all passed,
  # decode MK_NF2_BATCH (256,1024), megakernel only, no journal: default / norm_fold=1 /
  # norm_fold=2 (both with the O_PROJ / DOWN reduce folds as they are): nf2.log,
  # nf2_{off,nf1,nf2}.json (~7 min)
  : > "$OUTDIR/nf2.log"
  { echo "== GPU tests -k 'norm_fold_unsplit or epilogue_scaled'"
    timeout 240 python -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
        -k "norm_fold_unsplit or epilogue_scaled" tests/test_megakernel_step_gpu.py \
        tests/test_splitk_gpu.py 2>&1 | grep -v "^\[mk" | tail -15
  } | tee -a "$OUTDIR/nf2.log"
  check_to "$OUTDIR/nf2.log" --split-k 1 --plan norm_fold=2
  check_to "$OUTDIR/nf2.log" --split-k 0 --plan norm_fold=2 --prompt-lens 1,13,64,130,200,70
  racecheck_to "$OUTDIR/nf2.log" --split-k 1 --plan norm_fold=2
  bt=${MK_NF2_BATCH:-256,1024}
  checked_runs nf2 2 "off||--plan norm_fold=0|$bt" "nf1||--plan norm_fold=1|$bt" "nf2||--plan norm_fold=2|$bt"
  if checks_clean "$OUTDIR/nf2.log" 2; then
    # where a row-scaled tile waits: GATE_UP's epi_wait column (the consumers' wait for the
    # epilogue pages, which the loader grants once the row-scale norm's counter is met)
    timeout 150 $B --batch 256 --plan norm_fold=2 --journal > "$TMPD/nf2_journal.log" 2>&1 || rc=1
    { echo "== nf2 B=256 journal"; table "$TMPD/nf2_journal.log"; } | tee -a "$OUTDIR/nf2.log"
  fi
fi
if has qkv256; then
  # QKV_ROPE on two-head m128n256 tiles above 256 tokens (MK_TILES): standalone it lost at
  # M=4096 (211 against 184 us, session 27: 160 tiles are 1.2 waves), but the B=1024 / 4096
  # steps are throughput-bound (the instructions' own times fill 95-100% of the SMs, session
  # 21's journal; QKV_ROPE 7-10% of it), so what counts there is a head's SM time, and the
  # 128 x 256 tile pulls a quarter fewer operand bytes per flop (~100 us for two heads against
  # ~64 for one). The max class with it spills 16 bytes (the consumers' loop state around the
  # page waits' slow path), the 1024 class none. Checks (two-layer, split-K never / auto over
  # the 478-token step of the 1024 class), racecheck, then decode B=1024 and 4096 (ctx 256)
  # default / the tile, no journal: qkv256.log, qkv256_*.json (~7 min)
  : > "$OUTDIR/qkv256.log"
  QT="QKV_ROPE@1024=m128n256,QKV_ROPE@max=m128n256"
  export MK_TILES=$QT MK_CHECK_TAG="MK_TILES=$QT "
  check_to "$OUTDIR/qkv256.log" --split-k 1 --prompt-lens 1,13,64,130,200,70
  check_to "$OUTDIR/qkv256.log" --split-k 0 --prompt-lens 1,13,64,130,200,70
  racecheck_to "$OUTDIR/qkv256.log" --split-k 1 --prompt-lens 1,13,64,130,200,70
  unset MK_TILES MK_CHECK_TAG
  checked_runs qkv256 2 "off1024|||1024" "tile1024|MK_TILES=$QT||1024" "off4096|||4096" \
      "tile4096|MK_TILES=$QT||4096"
fi
if has gu64; then
  # GATE_UP at <= 64 tokens on gu_m128n56 with 32-row reduce slices (the default since session
  # 71, plan 000044): the two-layer checks of 64-token steps, split-K auto (64 one-token prompts
  # then decode steps of 64 rows; a mixed 64-token step), racecheck of the first, bench/gemm.py
  # GATE_UP at M = 64 / 13 (poisoned checks, timing); if all passed, decode MK_GU64_BATCH
  # (1,16,64,96,128: at 65..96 tokens GATE_UP's 32-row slices make 192 reduces, not 256),
  # megakernel only, no journal: default / session 70's default (gu_m64n112,
  # 16-row slices) / default: gu64.log, gu64_{def,s70,def2}.json (~7 min)
  : > "$OUTDIR/gu64.log"
  ones=$(python -c "print(','.join(['1'] * 64))")
  check_to "$OUTDIR/gu64.log" --split-k 0 --prompt-lens "$ones"
  check_to "$OUTDIR/gu64.log" --split-k 0 --prompt-lens 1,13,20,30
  racecheck_to "$OUTDIR/gu64.log" --split-k 0 --prompt-lens "$ones"
  echo "== bench/gemm.py GATE_UP M=64 (checks at 64 / 13)" | tee -a "$OUTDIR/gu64.log"
  timeout 150 python bench/gemm.py --suite --no-compile --ops GATE_UP --m 64 --odd-m 13 \
      --reps 15 --out "$OUTDIR/gu64_gemm.json" 2>&1 | grep -E "PASS|FAIL|^GATE_UP|Error" \
      | tee -a "$OUTDIR/gu64.log"
  # (a failed matrix check stops the timing too: checks_clean reads this marker)
  grep -qE "FAIL|Error" "$OUTDIR/gu64.log" && echo '== gemm checks "passed": false' \
      | tee -a "$OUTDIR/gu64.log"
  bt=${MK_GU64_BATCH:-1,16,64,96,128}
  checked_runs gu64 2 "def|||$bt" \
      "s70|MK_TILES=GATE_UP@64=gu_m64n112|--plan gate_up_reduce_rows=16|$bt" "def2|||$bt"
fi
# nvidia-smi's SM clock, power and throttle reasons every 100 ms into LOG while the rest of the
# step runs: smi_start LOG; ...; smi_stop (a long kernel runs under the power cap, a short launch
# at boost clocks: session 21's journal had GATE_UP / DOWN tiles ~15% slower in the B=4096 step
# than standalone)
smi_start() {
  SMI_PID=""
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
        --format=csv -lms 100 > "$1" 2>&1 &
    SMI_PID=$!
  fi
}
smi_stop() { [ -n "$SMI_PID" ] && kill "$SMI_PID" 2> /dev/null; wait "$SMI_PID" 2> /dev/null; true; }
# the SM clock and power of smi_start's LOG while the GPU was busy (samples above 1 GHz; with
# FROM / TO, HH:MM:SS of the samples' clock, only the samples between): one line
smi_summary() {
  python - "$@" <<'PYEOF'
import sys
rows = [ln.split(", ") for ln in open(sys.argv[1]) if ln[:1].isdigit()]
lo, hi = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("", "~")
busy = sorted((int(r[1].split()[0]), float(r[2].split()[0]), r[3].strip()) for r in rows
              if len(r) > 3 and r[1].split()[0].isdigit() and int(r[1].split()[0]) > 1000
              and lo <= r[0].split()[-1][:8] <= hi)
if busy:
    mhz = [b[0] for b in busy]
    print(f"nvidia-smi while busy: {len(busy)} samples, SM MHz p10 {mhz[len(mhz) // 10]} "
          f"p50 {mhz[len(mhz) // 2]} p90 {mhz[9 * len(mhz) // 10]}, power W p50 "
          f"{sorted(b[1] for b in busy)[len(busy) // 2]}, throttle reasons "
          f"{sorted(set(b[2] for b in busy))}")
    # a compile or a host pause idles at boost clocks too: the timed reps are the samples near
    # the window's peak power (session 59: the megakernel 1500 MHz at 691 W, the peer 1590)
    peak = max(b[1] for b in busy)
    load = sorted(b for b in busy if b[1] >= 0.6 * peak)
    mhz, watts = [b[0] for b in load], sorted(b[1] for b in load)
    print(f"  under load (power >= 0.6 x peak {peak:.0f} W): {len(load)} samples, SM MHz p10 "
          f"{mhz[len(mhz) // 10]} p50 {mhz[len(mhz) // 2]} p90 {mhz[9 * len(mhz) // 10]}, "
          f"power W p50 {watts[len(watts) // 2]}, power-capped (0x4) in "
          f"{sum(int(b[2], 16) & 4 != 0 for b in load) / len(load):.0%}")
else:
    print("nvidia-smi: no busy sample")
PYEOF
}
if has ktrace; then
  smi_start "$OUTDIR/ktrace_smi.csv"
  # the GEMM K-step trace (MK_GEMM_KTRACE, bench/GEMM_NOTES.md session 39): per K step of every
  # tile, when the loader issued the stage, when the consumers wanted / got it, when the stage
  # before retired (mk.trace.gemm_ktrace). Standalone journal jobs of GATE_UP / DOWN at M = 1024
  # and 4096 (128 K steps traced), GATE_UP 4096 without the trace (what the stamps cost: its
  # tile interval), then the decode step at MK_KT_BATCH (1024: the same tiles as the 1024 jobs)
  # with the first 64 K steps traced, and each GEMM's tiles of its middle layer alone through
  # the step's kernel (--journal-isolated: the variant without the step's context). Why in the
  # step too: at B=4096 (session 21's journal) the
  # SMs are ~100% busy with the instructions' own time, and GATE_UP / DOWN tiles took ~15% longer
  # there than the same build's standalone tile interval (111.4 / 51.5 us against 96.2 / 44.6):
  # ~12 ms of the step, the gap to the peer. nvidia-smi samples the SM clock / power meanwhile.
  # MK_KT_JOBS=0 skips the standalone jobs (e.g. MK_KT_BATCH=4096 in a call of its own).
  # ktrace.log / .json / _summary.log / _smi.csv, ktrace_step.log / .json (~5 min)
  J="GATE_UP:1024:journal:ktrace=128,DOWN:1024:journal:ktrace=128,GATE_UP:4096:journal:ktrace=128"
  J="$J,DOWN:4096:journal:ktrace=128,GATE_UP:4096:journal:"
  # ... and GATE_UP 1024 with the step's setmaxnreg split (80 / 208: its variant has QKV_ROPE)
  J="$J,GATE_UP:1024:journal:ktrace=128+reglow=80+reghigh=208"
  [ "${MK_KT_JOBS:-1}" = 0 ] || run_profile ktrace "$J" 240
  touch "$OUTDIR/ktrace.log"
  python - "$OUTDIR/ktrace.log" <<'PYEOF' | tee "$OUTDIR/ktrace_summary.log"
import json, sys
import mk.trace as tr
for ln in open(sys.argv[1]):
    if ln.startswith("{"):
        r = json.loads(ln)
        print(f"== {r.get('job')}: tile interval ns {r.get('tile_interval_ns')}")
        if r.get("ktrace"):
            print(tr.format_gemm_ktrace(r["ktrace"]))
PYEOF
  # ... and each GEMM's tiles of the middle layer alone through the step's kernel (waits and
  # signals cleared): the same variant without the step around it (launch/bench.py
  # --journal-isolated)
  MK_GEMM_KTRACE=64 timeout 260 $B --batch ${MK_KT_BATCH:-1024} --reps 5 --warmup 2 --journal \
      --journal-isolated GATE_UP,DOWN,O_PROJ,QKV_ROPE \
      --out "$OUTDIR/ktrace_step.json" > "$OUTDIR/ktrace_step.log" 2>&1 || rc=1
  rm -f "$OUTDIR"/ktrace_step_*_journal.pt "$OUTDIR"/ktrace_step_*_timeline.png
  grep -E -A8 "GEMM K steps|\] isolated" "$OUTDIR/ktrace_step.log" | grep -v "^\[mk\." \
      | tee -a "$OUTDIR/ktrace_summary.log"
  smi_stop
  smi_summary "$OUTDIR/ktrace_smi.csv" | tee -a "$OUTDIR/ktrace_summary.log"
fi
if has clocks; then
  # the SM clock and power under each system's timed reps (session 57: the journal's span of
  # the mixed step was 41.3 ms against 44.8 event-timed, B=1024 44.9 against 45.6: a lone
  # launch after a compile's pause runs at boost clocks, the timed reps under the power cap).
  # Does the megakernel run at a lower clock than torch.compile + CUDA graph at the same point
  # (its role warps' polling and ~2x cuBLAS's issued instructions draw power), i.e. is energy
  # per step a lever? Per point of MK_CL_POINTS ("4096:256 mixed": BATCH:CONTEXT, mixed, or
  # prompt: one 4096-token prompt alone), megakernel then compile, 60 reps each, nvidia-smi
  # every 100 ms: clocks.log, clocks.csv, clocks_<point>_<system>.json (~6 min). MK_CL_GAP_MS
  # (session 58: the timed step ran 4-8% over its journaled span, more the busier the SMs):
  # each system also timed with --rep-gap-ms that long before each of 20 reps (a rested GPU,
  # as a lone journaled launch): clocks_<point>_<system>_gap.json (+~1 min a point).
  # MK_CL_VARIANTS (session 59: under load the megakernel's SMs ran 1500 MHz at 691 W, the
  # peer's 1590; which of its parts draws the power?): space-separated NAME:VAR=VALUE[/VAR=...],
  # megakernel builds timed between the two systems, e.g. "nob1:MK_GEMM_EXPERIMENT=nob1" (a
  # third fewer operand bytes from L2 per GEMM K step: a cluster multicast's; wrong results,
  # timing only) "warp:MK_HANDOFF=warp": clocks_<point>_<NAME>.json
  smi_start "$OUTDIR/clocks.csv"
  : > "$OUTDIR/clocks.log"
  for pt in ${MK_CL_POINTS:-4096:256 mixed}; do
    if [ "$pt" = mixed ]; then
      a="--batch none --mixed 256:1024:1024"; tag=mixed
    elif [ "$pt" = prompt ]; then
      a="--batch none --mixed 0:1:4096"; tag=prompt
    else
      a="--batch ${pt%%:*} --context ${pt#*:} --mixed none"; tag=b${pt%%:*}
    fi
    for v in megakernel: ${MK_CL_VARIANTS:-} compile:; do
      name=${v%%:*}; venv=${v#*:}; sys=megakernel
      [ "$name" = compile ] && sys=compile
      for gap in 0 ${MK_CL_GAP_MS:-}; do
        reps=60; sfx=""
        [ "$gap" != 0 ] && { reps=20; sfx=_gap; }
        t0=$(date +%H:%M:%S)     # nvidia-smi stamps local time
        # shellcheck disable=SC2086  # $a: the arguments, ${venv//\// }: the assignments, split
        env ${venv//\// } timeout 240 python launch/bench.py --systems $sys --skip-check \
            --reps $reps --warmup 10 --rep-gap-ms "$gap" --no-png $a \
            --out "$OUTDIR/clocks_${tag}_$name$sfx.json" > "$TMPD/clocks_${tag}_$name$sfx.log" \
            2>&1 || rc=1
        t1=$(date +%H:%M:%S)
        { echo "== $tag $name${venv:+ ($venv)}, $gap ms idle before each rep ($t0 .. $t1)"
          table "$TMPD/clocks_${tag}_$name$sfx.log" | grep -E "^ *(decode|mixed) "
          grep -E -A8 "Error|^error|Traceback" "$TMPD/clocks_${tag}_$name$sfx.log" | tail -12
          smi_summary "$OUTDIR/clocks.csv" "$t0" "$t1"; } | tee -a "$OUTDIR/clocks.log"
      done
    done
  done
  smi_stop
fi
if has repeat; then
  # the same decode run MK_REPEAT_N (3) times, each its own process, environment MK_REPEAT_ENV
  # (none: the default build), decode MK_REPEAT_BATCH (64,256), journal on: does an intermittent
  # failure come back (session 37: one "unspecified launch failure" at B=256 in the default
  # build, in 1 of 5 same-shaped runs)? time_variant leaves a core dump on a kernel exception
  # and reads it: repeat.log, repeat_<i>.json
  : > "$OUTDIR/repeat.log"
  for i in $(seq 1 "${MK_REPEAT_N:-3}"); do
    time_variant repeat "$i" "run $i (${MK_REPEAT_ENV:-default build}), from ${SECONDS} s" \
        "${MK_REPEAT_BATCH:-64,256}" "${MK_REPEAT_ENV:-}" ""
  done
fi
# An attention compile switch's checks, the switch exported: the attention harness's GPU tests;
# the two-layer step vs mk.vm with decode units of 1..4 key blocks (--kv-split 1024: odd and even
# counts; 478 prompt tokens, prefill beside them), with the default 64-key splits (one block) and
# with every decode paired (attn_pair=2); racecheck and synccheck of the first
# (NAME_{racecheck,synccheck}.log): NAME.log
#   attn_switch_checks NAME VAR=VALUE
attn_switch_checks() {
  local name=$1 setting=$2 lens="--prompt-lens 1,13,64,130,200,70"
  # shellcheck disable=SC2163  # VAR=VALUE
  export "$setting"
  export MK_CHECK_TAG="$setting "
  { echo "== attention harness GPU tests, $setting"
    timeout 240 python -m pytest -m gpu -q tests/test_attention_gpu.py 2>&1 | tail -3
  } | tee "$OUTDIR/$name.log"
  # shellcheck disable=SC2086  # $lens: the arguments, split
  check_to "$OUTDIR/$name.log" --kv-split 1024 --split-k 0 $lens
  # shellcheck disable=SC2086
  check_to "$OUTDIR/$name.log" --split-k 0 $lens
  # every decode paired (pairs of unequal block counts; pairrace races them)
  # shellcheck disable=SC2086
  check_to "$OUTDIR/$name.log" --kv-split 1024 --split-k 0 --plan attn_pair=2 $lens
  for tool in racecheck synccheck; do
    echo "== $tool, $setting, --kv-split 1024" | tee -a "$OUTDIR/$name.log"
    # shellcheck disable=SC2086
    CUTE_DSL_LINEINFO=1 timeout 200 compute-sanitizer --tool $tool python -m mk.megakernel_step \
        check --layers 2 --decode-steps 1 --split-k 0 --kv-split 1024 $lens \
        > "$TMPD/${name}_$tool.log" 2>&1 || rc=1
    grep -v "^\[mk" "$TMPD/${name}_$tool.log" | head -150 > "$OUTDIR/${name}_$tool.log"
    grep -E "SUMMARY|passed" "$TMPD/${name}_$tool.log" | cut -c1-200 | tee -a "$OUTDIR/$name.log"
  done
  unset "${setting%%=*}" MK_CHECK_TAG
}
if has swapsplit; then
  # MK_ATTN_SWAP_SPLIT=1 (session 35, ak.SWAP_SPLIT): a lone decode unit's key blocks over both
  # warpgroups, merged at the end: swapsplit.log (~7 min; its timing is the step swapsplittime)
  attn_switch_checks swapsplit MK_ATTN_SWAP_SPLIT=1
fi
if has decab; then
  # a compile-time switch against the default in the decode step: MK_AB_ENV (VAR=VALUE words)
  # and / or MK_AB_ARGS (launch/bench.py arguments, e.g. "--plan splitk_reduce_rows=32"),
  # default / switch / default again (alternated: the clock drifts within a call), decode
  # MK_DECAB_BATCH (64,256,1024), no journal; no checks here (gemmab / swapsplit / tiles run
  # them); MK_AB2_ENV / MK_AB2_ARGS: a second variant timed after the first: decab.log,
  # decab_{def,ab[,ab2],def2}.json (~6 min, ~8 with a second variant)
  if [ -z "${MK_AB_ENV:-}${MK_AB_ARGS:-}" ]; then
    echo "== decab: set MK_AB_ENV (the switch to time, VAR=VALUE words) or MK_AB_ARGS"; rc=1
  else
    : > "$OUTDIR/decab.log"
    bt=${MK_DECAB_BATCH:-64,256,1024}
    variants=("def|||$bt" "ab|${MK_AB_ENV:-}|${MK_AB_ARGS:-}|$bt")
    if [ -n "${MK_AB2_ENV:-}${MK_AB2_ARGS:-}" ]; then
      variants+=("ab2|${MK_AB2_ENV:-}|${MK_AB2_ARGS:-}|$bt")
    fi
    untraced_runs decab "${variants[@]}" "def2|||$bt"
  fi
fi
if has swapsplittime; then
  # MK_ATTN_SWAP_SPLIT off / on, timed only: decode MK_SWAPSPLIT_BATCH (1,16,64,128), journal on:
  # swapsplittime.log, swapsplittime_{off,on}.json (~5 min). (Session 36 removed the variant with
  # kv_split_min=128: B=1 7.714 ms, B=16 8.033 against on's 7.747 / 8.036, off's 7.704 / 7.997.)
  : > "$OUTDIR/swapsplittime.log"
  time_variant swapsplittime off "MK_ATTN_SWAP_SPLIT=0" ${MK_SWAPSPLIT_BATCH:-1,16,64,128} "" ""
  time_variant swapsplittime on "MK_ATTN_SWAP_SPLIT=1" ${MK_SWAPSPLIT_BATCH:-1,16,64,128} \
      "MK_ATTN_SWAP_SPLIT=1" ""
fi
if has rslice; then
  for r in ${MK_RSLICE_CHECK:-16 4}; do
    # every step sliced (the default slices only steps of <= 64 tokens)
    x="splitk_reduce_rows=$r,splitk_reduce_max_tokens=4096"
    echo "== check --layers 2 --split-k 0 --plan $x"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 --plan $x \
        2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
  done > "$OUTDIR/rslice.log" 2>&1
  cat "$OUTDIR/rslice.log"
  time_variant rslice 0 "SPLITK_REDUCE whole tiles" ${MK_RSLICE_BATCH:-64,256} "" \
      "--plan splitk_reduce_rows=0"
  for r in ${MK_RSLICE_ROWS:-16}; do
    time_variant rslice $r "SPLITK_REDUCE rows $r${MK_RSLICE_EXTRA:-}" ${MK_RSLICE_BATCH:-64,256} \
        "" "--plan splitk_reduce_rows=$r${MK_RSLICE_EXTRA:-}"
  done
fi
if has l2pf; then
  ( export MK_CHECK_EXTRA="--l2-prefetch-mib 1"; echo "== l2_prefetch_mib checks"; checks ) \
      > "$OUTDIR/l2pf.log" 2>&1
  cat "$OUTDIR/l2pf.log"
  MK_NO_PYTEST=1 timed_ab l2pf l2_prefetch ${MK_L2PF_BATCH:-1,16,64} "" \
      "--plan l2_prefetch_mib=${MK_L2PF_MIB:-40}"
fi
if has l2skip; then
  ( export MK_CHECK_EXTRA="--plan l2_prefetch_mib=1,l2_prefetch_skip=64,l2_prefetch_o_proj=0"
    MK_NO_PYTEST=1; echo "== l2 prefetch past the ring: checks"; checks ) > "$OUTDIR/l2skip_check.log" 2>&1
  cat "$OUTDIR/l2skip_check.log"
  : > "$OUTDIR/l2skip.log"
  time_variant l2skip base "no L2 prefetch (the default)" ${MK_L2SKIP_BATCH:-1,64} "" ""
  for m in ${MK_L2SKIP_MIB:-40 24}; do
    x="l2_prefetch_mib=$m,l2_prefetch_skip=256,l2_prefetch_o_proj=0"
    time_variant l2skip $m "--plan $x" ${MK_L2SKIP_BATCH:-1,64} "" "--plan $x"
  done
fi
if has wgsplit; then
  ab wgsplit MK_ATTN_WG_SPLIT 1 ${MK_WGSPLIT_BATCH:-1,64,256} tests/test_attention_gpu.py \
      tests/test_megakernel_step_gpu.py
fi
if has split; then
  # decode attention spread over the SMs (PlanConfig.kv_split_min): lost in session 4 (B=1 14.38
  # vs 13.94 ms), but early weight loads now fetch a split's earlier-step K/V during its waits,
  # which is most of a one-block split's work; the two-layer check with it, then the journal
  for m in ${MK_SPLIT_MIN:-64}; do
    echo "== check --kv-split-min $m"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 --kv-split 256 --kv-split-min $m \
        2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
  done > "$OUTDIR/split.log" 2>&1
  cat "$OUTDIR/split.log"
  for m in 0 ${MK_SPLIT_MIN:-64}; do
    x=""; [ $m = 0 ] || x=${MK_SPLIT_EXTRA:-}
    timeout 200 $B --batch ${MK_SPLIT_BATCH:-1,16,64} --plan kv_split_min=$m$x --journal \
        --out "$OUTDIR/split_$m.json" > "$TMPD/split_$m.log" 2>&1 || rc=1
    rm -f "$OUTDIR"/split_"$m"_*_journal.pt "$OUTDIR"/split_"$m"_*_timeline.png
    echo "== kv_split_min=$m" | tee -a "$OUTDIR/split.log"
    table "$TMPD/split_$m.log" | grep -E "^decode|^ATTN|^opcode|^step" | tee -a "$OUTDIR/split.log"
  done
fi
if has rwide; then
  for w in 0 1; do reduce_harness rwide MK_ATTN_REDUCE_WIDE $w; done
  ( export MK_ATTN_REDUCE_WIDE=1 MK_CHECK_EXTRA="--kv-split 256 --kv-split-min 64"
    echo "== MK_ATTN_REDUCE_WIDE=1 (checks also with --kv-split 64: many splits)"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 2>&1 | grep -v "^\[mk" \
        | tail -1 | cut -c1-300
    checks ) > "$OUTDIR/rwide.log" 2>&1
  cat "$OUTDIR/rwide.log"
  # timed in session 9 under the default spread splits: B=1 -3.0%, B=16 -0.7% (both GPUs;
  # bench/results/rwide_g*_2026-11-30_s9.json); MK_RWIDE_TIME=1 times it again
  if [ "${MK_RWIDE_TIME:-0}" = 1 ]; then
    MK_NO_PYTEST=1 timed_ab rwide MK_ATTN_REDUCE_WIDE=1 ${MK_RWIDE_BATCH:-1,16} \
        "MK_ATTN_REDUCE_WIDE=1" "" "--journal"
  fi
fi
if has caps512; then
  # QKV_ROPE's split-K cap over 256 (session 9, caps = B: B=384 -1.8%, B=512 -4.9%; GATE_UP does
  # not split there, too many tiles): the two-layer check with a 430-token first step (the
  # M <= 512 class's split tiles) with and without the cap, then decode MK_C512_BATCH with it
  for a in "--split-k 1" "--split-k 0 --plan splitk_qkv_max_tokens=512"; do
    echo "== check --prompt-lens 100,200,130 $a"
    timeout 120 python -m mk.megakernel_step check --layers 2 --prompt-lens 100,200,130 $a 2>&1 \
        | grep -v "^\[mk" | tail -1 | cut -c1-300
  done > "$OUTDIR/caps512.log" 2>&1
  cat "$OUTDIR/caps512.log"
  time_variant caps512 none "QKV split-K cap as it is (256)" ${MK_C512_BATCH:-384,512} "" ""
  time_variant caps512 qkv "QKV split-K cap 512" ${MK_C512_BATCH:-384,512} "" \
      "--plan splitk_qkv_max_tokens=512"
fi
if has tiles; then
  ab tiles MK_TILES "${MK_TILES_VALUE:-$M64_AT_256}" ${MK_TILES_BATCH:-128,256} tests/test_splitk_gpu.py
fi
STORE=${MK_STORE:-loop}
if has storecheck; then
  ( export MK_ATTN_STORE=$STORE; echo "== MK_ATTN_STORE=$STORE checks"
    echo "== check --kv-split 256 --kv-split-min 64 (mode 1 pages, ATTN_REDUCE)"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 --kv-split 256 \
        --kv-split-min 64 2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
    checks tests/test_attention_gpu.py ) > "$OUTDIR/storecheck_$STORE.log" 2>&1
  cat "$OUTDIR/storecheck_$STORE.log"
  passed "$OUTDIR/storecheck_$STORE.log" && echo "== storecheck $STORE: all passed" \
      || { echo "== storecheck $STORE: FAILED"; rc=1; }
fi
if has storetime; then
  : > "$OUTDIR/storetime_$STORE.log"
  MK_AB_TIMEOUT=270 time_ab "storetime_$STORE" "MK_ATTN_STORE=$STORE" ${MK_STORE_BATCH:-1,64,256} \
      "MK_ATTN_STORE=$STORE" "" "--journal"
fi
if has splitk256; then
  : > "$OUTDIR/splitk256.log"
  time_ab splitk256 "--split-k 1" ${MK_SK_BATCH:-256} "" "--split-k 1"
fi
if has wgrace; then
  ( export MK_ATTN_WG_SPLIT=1; echo "== MK_ATTN_WG_SPLIT=1 checks (no pytest)"; checks ) \
      > "$OUTDIR/wgrace.log" 2>&1
  cat "$OUTDIR/wgrace.log"
  { echo "== racecheck hazards (first 40 lines)"
    grep -A3 "Race reported\|Error: Race\|hazard" "$OUTDIR/racecheck_full.log" | head -40; } \
      >> "$OUTDIR/wgrace.log"
fi
if has l2hint; then
  : > "$OUTDIR/l2hint.log"
  for h in ${MK_L2_VALUES:-weights,kv weights}; do
    echo "== check MK_L2_HINTS=$h --layers 2 --split-k 0" | tee -a "$OUTDIR/l2hint.log"
    MK_L2_HINTS=$h timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 2>&1 \
        | grep -v "^\[mk" | tail -1 | cut -c1-300 | tee -a "$OUTDIR/l2hint.log"
  done
  time_variant l2hint none "no L2 hints" ${MK_L2_BATCH:-1,64,256} "MK_L2_HINTS=none" ""
  for h in ${MK_L2_VALUES:-weights,kv weights}; do
    time_variant l2hint "${h//,/_}" "MK_L2_HINTS=$h" ${MK_L2_BATCH:-1,64,256} "MK_L2_HINTS=$h" ""
  done
fi
if has normrows; then
  # a plan change only (the kernel is the same): the two-layer step vs mk.vm with each value first
  # (small_norm_max_tokens=0: the same norm_rows in every step; the default since session 12 is
  # one-row norms in steps of <= 64 tokens, 8 rows above)
  for r in ${MK_NORMROWS_VALUES:-4 2 1}; do
    echo "== check --layers 2 --split-k 0 --plan norm_rows=$r,small_norm_max_tokens=0"
    timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 \
        --plan norm_rows=$r,small_norm_max_tokens=0 2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
  done > "$OUTDIR/normrows.log" 2>&1
  cat "$OUTDIR/normrows.log"
  time_variant normrows 8 "norm_rows 8 in every step" ${MK_NORMROWS_BATCH:-16,64,256} "" \
      "--plan small_norm_max_tokens=0"
  for r in ${MK_NORMROWS_VALUES:-4 2 1}; do
    time_variant normrows $r "norm_rows $r in every step" ${MK_NORMROWS_BATCH:-16,64,256} "" \
        "--plan norm_rows=$r,small_norm_max_tokens=0"
  done
fi
if has fold; then
  : > "$OUTDIR/fold.log"
  FOLD="--plan ${MK_FOLD_PLAN:-fold_o_reduce=1}"
  MK_CHECK_EXTRA="$FOLD" MK_NO_PYTEST=1 checks > "$OUTDIR/fold_check.log" 2>&1
  echo "== memcheck, two-layer step, split-K auto, $FOLD" >> "$OUTDIR/fold_check.log"
  # --report-api-errors no, as scripts/gpu_tests.sh: the CUDA API errors of the process's own
  # probing are not the kernel's (session 14's first fold memcheck counted 34 without it); the
  # full report is kept in memcheck_full.log
  timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python -m mk.megakernel_step \
      check --layers 2 --decode-steps 1 --split-k 0 $FOLD > "$OUTDIR/memcheck_full.log" 2>&1
  grep -E "ERROR SUMMARY|passed" "$OUTDIR/memcheck_full.log" | cut -c1-200 >> "$OUTDIR/fold_check.log"
  echo "== checks $FOLD" | tee -a "$OUTDIR/fold.log"
  cat "$OUTDIR/fold_check.log" | tee -a "$OUTDIR/fold.log"
  if MK_NO_PYTEST=1 passed "$OUTDIR/fold_check.log" \
      && grep -q "ERROR SUMMARY: 0 errors" "$OUTDIR/fold_check.log"; then
    echo "== fold: checks passed" | tee -a "$OUTDIR/fold.log"
    time_variant fold off "O_PROJ's reduce as its own instruction" ${MK_FOLD_BATCH:-1,16,64} "" ""
    time_variant fold on "$FOLD" ${MK_FOLD_BATCH:-1,16,64} "" "$FOLD"
  else
    echo "== fold: checks FAILED, not timed" | tee -a "$OUTDIR/fold.log"; rc=1
  fi
fi
if has pair; then
  # PlanConfig.attn_pair (two decode units per ATTENTION instruction, one per consumer
  # warpgroup; MODE_PAIR): the two-layer checks, racecheck and memcheck with every decode paired
  # (MK_PAIR, default 2) on prompts whose decodes stay direct (kv_split 1024) and pair units of
  # unequal block counts (contexts 2 / 14, 65 / 71, 131 / 201), one more check on the default
  # prompts (kv_split 64: one pair of ctx 2 / 14 beside split decodes); then decode
  # MK_PAIR_BATCH (256,1024) without pairs (attn_pair=0) and with attn_pair=MK_PAIR_TIMED (1,
  # the default since session 15: auto), journal on
  : > "$OUTDIR/pair.log"
  PAIR="--plan attn_pair=${MK_PAIR:-2}"
  MK_CHECK_EXTRA="$PAIR --kv-split 1024 --prompt-lens 1,13,64,130,200,70" MK_NO_PYTEST=1 checks \
      > "$OUTDIR/pair_check.log" 2>&1
  echo "== check --layers 2 --split-k 0 $PAIR (default prompts)" >> "$OUTDIR/pair_check.log"
  timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 $PAIR 2>&1 \
      | grep -v "^\[mk" | tail -1 | cut -c1-300 >> "$OUTDIR/pair_check.log"
  echo "== memcheck, two-layer step, split-K auto, $PAIR" >> "$OUTDIR/pair_check.log"
  timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python -m mk.megakernel_step \
      check --layers 2 --decode-steps 1 --split-k 0 $PAIR --kv-split 1024 \
      --prompt-lens 1,13,64,130,200,70 > "$OUTDIR/memcheck_full.log" 2>&1
  grep -E "ERROR SUMMARY|passed" "$OUTDIR/memcheck_full.log" | cut -c1-200 >> "$OUTDIR/pair_check.log"
  cat "$OUTDIR/pair_check.log" | tee -a "$OUTDIR/pair.log"
  if MK_NO_PYTEST=1 passed "$OUTDIR/pair_check.log" \
      && grep -q "ERROR SUMMARY: 0 errors" "$OUTDIR/pair_check.log"; then
    echo "== pair: checks passed" | tee -a "$OUTDIR/pair.log"
    time_variant pair off "single decode units" ${MK_PAIR_BATCH:-256,1024} "" "--plan attn_pair=0"
    time_variant pair on "attn_pair=${MK_PAIR_TIMED:-1}" ${MK_PAIR_BATCH:-256,1024} "" \
        "--plan attn_pair=${MK_PAIR_TIMED:-1}"
  else
    echo "== pair: checks FAILED, not timed" | tee -a "$OUTDIR/pair.log"; rc=1
  fi
fi
if has fill; then
  ( export MK_CHECK_EXTRA="--plan split_fill_max_tokens=4096 --num-sms 40"; MK_NO_PYTEST=1
    echo "== fill split factors in every step: checks"; checks
    echo "== memcheck, two-layer step, split-K auto, $MK_CHECK_EXTRA"
    timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python -m mk.megakernel_step \
        check --layers 2 --decode-steps 1 --split-k 0 $MK_CHECK_EXTRA > "$OUTDIR/memcheck_full.log" 2>&1
    grep -E "ERROR SUMMARY|passed" "$OUTDIR/memcheck_full.log" | cut -c1-200
  ) > "$OUTDIR/fill_check.log" 2>&1
  cat "$OUTDIR/fill_check.log"
  : > "$OUTDIR/fill.log"
  time_variant fill base "the default (fill factors up to 64 tokens)" ${MK_FILL_BATCH:-1,16,64} "" ""
  time_variant fill off "--plan split_fill_max_tokens=0" ${MK_FILL_BATCH:-1,16,64} "" \
      "--plan split_fill_max_tokens=0"
fi
if has gutiles; then
  GU=""; for c in ${MK_GU_CLASSES:-256 1024}; do GU="$GU${GU:+,}GATE_UP@$c=${MK_GU_TILE:-gu_m128}"; done
  GU=${MK_GU_TILES:-$GU}      # the whole MK_TILES value (a tile per class)
  [ "${MK_GU_NOCHECK:-0}" = 1 ] || ( export MK_TILES=$GU; echo "== MK_TILES=$GU"
    checks tests/test_splitk_gpu.py \
        ${MK_GU_TESTS:-tests/test_gemm_gpu.py::test_two_page_gate_up_tile_at_256_matches_torch_face}
    check478_memcheck
  ) > "$OUTDIR/gutiles_check.log" 2>&1
  [ "${MK_GU_NOCHECK:-0}" = 1 ] || cat "$OUTDIR/gutiles_check.log"
  : > "$OUTDIR/gutiles.log"
  time_ab gutiles "GATE_UP tiles ($GU)" ${MK_GU_BATCH:-128,192,512,1024} "MK_TILES=$GU" ""
fi
if has normbatch; then
  # MK_NORM_ROW_BATCH_BIG (mk/instructions/_rows_kernel.py: rows of an RMSNORM whose loads are
  # in flight together, the classes above M64): compile-time, each value its own build; the
  # two-layer checks' decode steps (M64) keep 2. Session 48's journal of B=4096
  # (bench/results/shares_3474b9c_*_s48_h100.json): the 32-row norms' bodies (~35 us: 16 groups
  # of 2 rows, one L2 round trip each) are ~9.5% of the step's critical path. Since session 53
  # (the watchdog the default) 8 spills 12 / 68 bytes in the 1024 class (0 in 256; 4 clean).
  : > "$OUTDIR/normbatch.log"
  for n in ${MK_RB_VALUES:-4 8}; do
    export MK_NORM_ROW_BATCH_BIG=$n MK_CHECK_TAG="MK_NORM_ROW_BATCH_BIG=$n "
    fold_checks "$OUTDIR/normbatch.log" \
        "norm_rows=32,norm_fill_max_tokens=0,small_norm_max_tokens=0" || rc=1
    check_to "$OUTDIR/normbatch.log" --split-k 0 --prompt-lens 1,13,64,130,200,70
    racecheck_to "$OUTDIR/normbatch.log" --split-k 1 \
        --plan norm_rows=32,norm_fill_max_tokens=0,small_norm_max_tokens=0
    unset MK_NORM_ROW_BATCH_BIG MK_CHECK_TAG
  done
fi
if has normbatchtime; then
  # the values normbatch passed in this call (4 checks and 0 hazards each), else all of
  # MK_RB_VALUES, timed against the default build (2), megakernel only, no journal
  : > "$OUTDIR/normbatchtime.log"
  rb_runs=("default||--mixed ${MK_RB_MIXED:-256:1024:1024}|${MK_RB_BATCH:-1024,4096}")
  for n in ${MK_RB_VALUES:-4 8}; do
    if [ -f "$OUTDIR/normbatch.log" ] \
        && ! rb_checks_passed "$OUTDIR/normbatch.log" "MK_NORM_ROW_BATCH_BIG=$n "; then
      echo "== MK_NORM_ROW_BATCH_BIG=$n: normbatch's checks did not pass, not timed" \
          | tee -a "$OUTDIR/normbatchtime.log"
      rc=1
      continue
    fi
    rb_runs+=("rb$n|MK_NORM_ROW_BATCH_BIG=$n|${rb_runs[0]#default||}")
  done
  UNTRACED_TIMEOUT=${MK_RB_TIMEOUT:-200} untraced_runs normbatchtime "${rb_runs[@]}"
fi
if has gathercons; then
  # MK_GATHER_ROLE=consumers (mk/instructions/_gather_kernel.py GATHER_ROLE; session 48): the
  # gather bodies' GPU tests (test_megakernel_ops_gpu: EMBED + LM_NORM against their faces, the
  # one-layer step), the step tests, the two-layer checks, racecheck
  : > "$OUTDIR/gathercons.log"
  export MK_GATHER_ROLE=consumers MK_CHECK_TAG="MK_GATHER_ROLE=consumers "
  { echo "== GPU tests (MK_GATHER_ROLE=consumers)"
    timeout 300 python -m pytest -m gpu -q -rfE --tb=line -p no:cacheprovider \
        tests/test_megakernel_ops_gpu.py tests/test_megakernel_step_gpu.py 2>&1 \
        | grep -v "^\[mk" | tail -12; } | tee -a "$OUTDIR/gathercons.log"
  check_to "$OUTDIR/gathercons.log" --split-k 1
  check_to "$OUTDIR/gathercons.log" --split-k 0
  check_to "$OUTDIR/gathercons.log" --split-k 0 --prompt-lens 1,13,64,130,200,70
  racecheck_to "$OUTDIR/gathercons.log" --split-k 1
  unset MK_GATHER_ROLE MK_CHECK_TAG
  checks_clean "$OUTDIR/gathercons.log" 3 \
      && echo "== gathercons: all passed" | tee -a "$OUTDIR/gathercons.log" \
      || { echo "== gathercons: FAILED" | tee -a "$OUTDIR/gathercons.log"; rc=1; }
fi
if has gatherconstime; then
  : > "$OUTDIR/gatherconstime.log"
  if [ -f "$OUTDIR/gathercons.log" ] && ! checks_clean "$OUTDIR/gathercons.log" 3; then
    echo "== gathercons' checks did not pass, not timed" | tee -a "$OUTDIR/gatherconstime.log"
    rc=1
  else
    gc_args="--mixed ${MK_GC_MIXED:-256:1024:1024}"
    UNTRACED_TIMEOUT=${MK_GC_TIMEOUT:-200} untraced_runs gatherconstime \
        "storer|MK_GATHER_ROLE=storer|$gc_args|${MK_GC_BATCH:-1024,4096}" \
        "consumers|MK_GATHER_ROLE=consumers|$gc_args|${MK_GC_BATCH:-1024,4096}"
  fi
fi
if has claim; then
  : > "$OUTDIR/claim.log"
  if [ "${MK_CLAIM_CHECK:-1}" = 1 ]; then
    MK_CLAIM_AFTER_LOADS=1 MK_NO_PYTEST=1 checks > "$OUTDIR/claim_check.log" 2>&1
    echo "== checks MK_CLAIM_AFTER_LOADS=1" | tee -a "$OUTDIR/claim.log"
    cat "$OUTDIR/claim_check.log" | tee -a "$OUTDIR/claim.log"
    MK_NO_PYTEST=1 passed "$OUTDIR/claim_check.log" && echo "== claim: checks passed" \
        | tee -a "$OUTDIR/claim.log" || { echo "== claim: checks FAILED" | tee -a "$OUTDIR/claim.log"; rc=1; }
  fi
  time_variant claim off "claim when a slot frees (MK_CLAIM_AFTER_LOADS=0)" \
      ${MK_CLAIM_BATCH:-64,192,256} "MK_CLAIM_AFTER_LOADS=0" ""
  time_variant claim on "claim after loads (${MK_CLAIM_ON_ENV-MK_CLAIM_AFTER_LOADS=1})" \
      ${MK_CLAIM_BATCH:-64,192,256} "${MK_CLAIM_ON_ENV-MK_CLAIM_AFTER_LOADS=1}" ""
fi
if has islots; then
  # a compile-time depth (mk/megakernel.py NISLOTS): each value is its own build; the checks
  # first (no pytest: the ring depth changes no instruction body, only how far ahead the
  # controller claims), then the timings
  : > "$OUTDIR/islots.log"
  for n in ${MK_ISLOTS_CHECK-2}; do
    MK_NISLOTS=$n MK_NO_PYTEST=1 checks > "$OUTDIR/islots_check_$n.log" 2>&1
    echo "== checks MK_NISLOTS=$n" | tee -a "$OUTDIR/islots.log"
    cat "$OUTDIR/islots_check_$n.log" | tee -a "$OUTDIR/islots.log"
    MK_NO_PYTEST=1 passed "$OUTDIR/islots_check_$n.log" && echo "== MK_NISLOTS=$n: checks passed" \
        | tee -a "$OUTDIR/islots.log" || { echo "== MK_NISLOTS=$n: checks FAILED" | tee -a "$OUTDIR/islots.log"; rc=1; }
  done
  for n in ${MK_ISLOTS_VALUES:-4 3 2}; do
    time_variant islots $n "MK_NISLOTS=$n" ${MK_ISLOTS_BATCH:-64,192,256} "MK_NISLOTS=$n" ""
  done
fi
if has planab; then
  # O_PROJ / DOWN split in two at B <= 64 costs a SPLITK_REDUCE hop each per layer on the path
  # (bench/E2E_NOTES.md session 12: four reduce hops, 28 of 134 us at B=64), while bench/gemm.py
  # timed them unsplit no slower at M=64 (O 17.6 vs 20.2 us, DOWN 29.9 vs 29.8)
  PLANS=${MK_PLANAB:-"od1:splitk_o_max_tokens=1,splitk_down_max_tokens=1"}
  : > "$OUTDIR/planab.log"
  # an entry NAME:PLAN|VAR=VALUE also sets one environment variable (MK_TILES, a kernel knob):
  # its check and timing run with it; PLAN may be empty ("od:|MK_TILES=DOWN@256=m128n128")
  plan_of() { local p=${1#*:}; echo "${p%%|*}"; }
  env_of() { case $1 in *"|"*) echo "${1#*|}";; *) echo "";; esac; }
  for e in $PLANS; do
    [ "${MK_PLANAB_NOCHECK:-0}" = 1 ] && break
    pl=$(plan_of "$e"); ev=$(env_of "$e")
    echo "== check --layers 2 --split-k 0 --plan ${pl:-(none)} ${MK_PLANAB_CHECK:-} ${ev}" | tee -a "$OUTDIR/planab.log"
    env $ev timeout 120 python -m mk.megakernel_step check --layers 2 --split-k 0 ${pl:+--plan "$pl"} \
        ${MK_PLANAB_CHECK:-} 2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300 | tee -a "$OUTDIR/planab.log"
    if [ "${MK_PLANAB_RACE:-0}" = 1 ]; then
      echo "== racecheck, the same check, one decode step" | tee -a "$OUTDIR/planab.log"
      env $ev CUTE_DSL_LINEINFO=1 timeout 200 compute-sanitizer --tool racecheck python -m mk.megakernel_step \
          check --layers 2 --decode-steps 1 --split-k 0 ${pl:+--plan "$pl"} ${MK_PLANAB_CHECK:-} \
          > "$OUTDIR/racecheck_full.log" 2>&1
      grep -E "SUMMARY|passed" "$OUTDIR/racecheck_full.log" | cut -c1-200 | tee -a "$OUTDIR/planab.log"
    fi
  done
  # MK_PLANAB_MIXED=D:C:P: the mixed step (D decodes at context C + a P-token prefill) too
  mx=${MK_PLANAB_MIXED:+--mixed $MK_PLANAB_MIXED}
  time_variant planab base "the default plan" ${MK_PLANAB_BATCH:-16,64} "" "$mx"
  for e in $PLANS; do
    pl=$(plan_of "$e"); ev=$(env_of "$e")
    time_variant planab "${e%%:*}" "--plan ${pl:-(none)} $ev" ${MK_PLANAB_BATCH:-16,64} "$ev" \
        "$mx ${pl:+--plan $pl}"
  done
fi
if has cls128; then
  : > "$OUTDIR/cls128.log"
  check_to "$OUTDIR/cls128.log" --split-k 0 --prompt-lens 60,30,10,20
  check_to "$OUTDIR/cls128.log" --split-k 1 --prompt-lens 1,13,64,22
  racecheck_to "$OUTDIR/cls128.log" --split-k 0 --prompt-lens 60,30,10,20
  if ! grep -q '"passed": false' "$OUTDIR/cls128.log" \
      && [ "$(grep -c '"passed": true' "$OUTDIR/cls128.log")" -ge 3 ] \
      && grep -q "RACECHECK SUMMARY: 0 hazards" "$OUTDIR/cls128.log"; then
    untraced_runs cls128 "on|||${MK_C128_BATCH:-96,128}"
  else
    echo "== cls128: a check or racecheck failed, not timed" | tee -a "$OUTDIR/cls128.log"
    rc=1
  fi
fi
if has od64; then
  # session 64: O_PROJ / DOWN at M <= 64 on m64n64 (64-row B pages, m64n32 per warpgroup, 128
  # whole tiles of 8192 columns) instead of m64n128 split in two: no split-K reduce, and with
  # unsplit writers norm_fold=4's ROW_PART replaces the RMSNORM phases at B <= 64 (an m64n64
  # tile's warpgroups join their 32-column halves of a 64-column part in shared memory).
  # bench/gemm.py at M = 64 (and 40: a rows tail) default / tiles, the two-layer checks with the
  # tiles (decode steps of 4 tokens: the M64 class; split-K never: every O_PROJ / DOWN tile
  # unsplit, writing ROW_PART; auto: the tiny model's 8 tiles split; a 41-token first step),
  # racecheck of the split-K-never step, then decode MK_OD64_BATCH (1,16,64) default / tiles,
  # megakernel only, no journal: od64.log, od64_gemm_{off,on}.json, od64_{off,on}.json (~8 min)
  # ("on" is m64n128, the tile before session 64, since m64n64 became the default). Another
  # class: MK_OD64_TILES="O_PROJ@256=m128n64,DOWN@256=m128n64" MK_OD64_M=128,256
  # MK_OD64_ODD=200 MK_OD64_LENS=60,30,10,20 MK_OD64_BATCH=96,128,192,256 (m128n64 at 65..256
  # tokens: 128 whole tiles a row block, ROW_PART at 65..128 tokens; session 64's candidate)
  od_env="MK_TILES=${MK_OD64_TILES:-O_PROJ@64=m64n128,DOWN@64=m64n128}"
  : > "$OUTDIR/od64.log"
  for v in off on; do
    e=""; [ $v = on ] && e=$od_env
    echo "== bench/gemm.py M=${MK_OD64_M:-64} ($v: ${e:-default})" | tee -a "$OUTDIR/od64.log"
    env $e timeout 200 python bench/gemm.py --suite --no-compile --ops O_PROJ,DOWN \
        --m "${MK_OD64_M:-64}" --odd-m "${MK_OD64_ODD:-40}" --reps 30 --split-k auto \
        --out "$OUTDIR/od64_gemm_$v.json" \
        > "$TMPD/od64_gemm_$v.log" 2>&1 || rc=1
    grep -vE "^\[mk" "$TMPD/od64_gemm_$v.log" | grep -E "^(O_PROJ|DOWN) |PASS|FAIL|Error" \
        | tee -a "$OUTDIR/od64.log"
  done
  export MK_TILES=${od_env#MK_TILES=}
  MK_CHECK_TAG="$MK_TILES " check_to "$OUTDIR/od64.log" --split-k 1
  MK_CHECK_TAG="$MK_TILES " check_to "$OUTDIR/od64.log" --split-k 0
  MK_CHECK_TAG="$MK_TILES " check_to "$OUTDIR/od64.log" --split-k 1 \
      --prompt-lens "${MK_OD64_LENS:-13,20,1,7}"
  MK_CHECK_TAG="$MK_TILES " racecheck_to "$OUTDIR/od64.log" --split-k 1
  unset MK_TILES
  if ! grep -q '"passed": false' "$OUTDIR/od64.log" \
      && [ "$(grep -c '"passed": true' "$OUTDIR/od64.log")" -ge 4 ] \
      && grep -q "RACECHECK SUMMARY: 0 hazards" "$OUTDIR/od64.log"; then
    untraced_runs od64 "off|||${MK_OD64_BATCH:-1,16,64}" "on|$od_env||${MK_OD64_BATCH:-1,16,64}"
  else
    echo "== $od_env: a check or racecheck failed, not timed" | tee -a "$OUTDIR/od64.log"
    rc=1
  fi
fi
if has planpair; then
  # plan variants on one compiled kernel, their reps interleaved with the default plan's in one
  # process (launch/bench.py --plan-ab: per variant its median and the median of its per-rep
  # ratios to the base's): no compile per variant, and no drift between the runs (session 59:
  # the GEMM tiles' own times 2% apart in two runs of one plan in one call)
  mx=${MK_PP_MIXED:-0:1:4096}
  : > "$OUTDIR/planpair.log"
  timeout 400 python launch/bench.py --systems megakernel --skip-check --no-png \
      --batch "${MK_PP_BATCH:-none}" --mixed "$mx" --reps "${MK_PP_REPS:-20}" --warmup 3 \
      --plan-ab "${MK_PP:-l1:attn_lpt=1}" --out "$OUTDIR/planpair.json" \
      > "$TMPD/planpair.log" 2>&1 || rc=1
  { table "$TMPD/planpair.log" | grep -E "^ *(decode|mixed) "
    grep -E "plan-ab" "$TMPD/planpair.log"
    grep -E -A12 "Error|^error|Traceback" "$TMPD/planpair.log" | tail -30; } \
      | tee -a "$OUTDIR/planpair.log"
fi
if has launchhost; then
  # the host's time in one megakernel launch, by part (session 61)
  timeout 240 python bench/launch_host.py --out "$OUTDIR/launchhost.json" \
      > "$OUTDIR/launchhost.log" 2>&1 || rc=1
  grep -vE "^\[mk" "$OUTDIR/launchhost.log" | tail -24
fi
if has genoverlap; then
  # the engine's generation loop with the host planning overlapped or not (session 60)
  timeout 420 python bench/generate_overlap.py \
      ${MK_GO_ARGS:---job 256:256:64:1024 --job 16:128:128:256} \
      --out "$OUTDIR/genoverlap.json" \
      > "$OUTDIR/genoverlap.log" 2>&1 || rc=1
  grep -E "^round|^median|error|Error|Traceback" "$OUTDIR/genoverlap.log" | tail -20
fi
if has wgtime; then
  # timing only (the checks are wgsplit's / wgrace's): where ATTENTION is most of the step
  # (B=256: 46% of the busy time in session 8) the halved serial chain of key blocks may pay more
  : > "$OUTDIR/wgtime.log"
  time_ab wgtime "MK_ATTN_WG_SPLIT=1" ${MK_WGSPLIT_BATCH:-1,64,256} "MK_ATTN_WG_SPLIT=1" "" "--journal"
fi
if has opsplit; then
  # each token GEMM's split-K alone at B=256 (PlanConfig.splitk_<op>_max_tokens): every one is a
  # single wave of too few tiles there (QKV_ROPE 20 of ~65 us, O_PROJ / DOWN 64, GATE_UP 56;
  # session 8 journal); splitting all of them at once lost 3.7% (session 7)
  : > "$OUTDIR/opsplit.log"
  for v in none qkv o gate_up down; do
    a=""; [ $v = none ] || a="--plan splitk_${v}_max_tokens=256"
    time_variant opsplit $v "split-K of $v alone ($a)" ${MK_OS_BATCH:-256} "" "$a"
  done
fi
if has opcombo; then
  # the token GEMMs' split-K caps together (session 9's opsplit alone at B=256: QKV -11.2%,
  # GATE_UP -6.4%, DOWN 0, O +2.8%): the two-layer check with all three caps (its 208-token step
  # then splits QKV / GATE_UP / DOWN), then decode MK_OC_BATCH with none, QKV + GATE_UP, and DOWN too
  QG="splitk_qkv_max_tokens=256,splitk_gate_up_max_tokens=256"
  echo "== check --split-k 0 --plan $QG,splitk_down_max_tokens=256" > "$OUTDIR/opcombo.log"
  timeout 100 python -m mk.megakernel_step check --layers 2 --split-k 0 \
      --plan "$QG,splitk_down_max_tokens=256" 2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300 \
      | tee -a "$OUTDIR/opcombo.log"
  time_variant opcombo none "split-K caps as they are" ${MK_OC_BATCH:-192,256} "" ""
  time_variant opcombo qg "QKV + GATE_UP (--plan $QG)" ${MK_OC_BATCH:-192,256} "" "--plan $QG"
  time_variant opcombo qgd "QKV + GATE_UP + DOWN" ${MK_OC_BATCH:-192,256} "" \
      "--plan $QG,splitk_down_max_tokens=256"
fi
if has gemm; then
  # issue 5's table (each token GEMM through the megakernel over a whole matrix vs cuBLAS and
  # cuBLAS + the unfused epilogue, cold L2), split along K as the step's planner splits at each M
  # (MK_GEMM_SPLIT: auto by default since session 11; "none" = whole tiles, session 11's table)
  timeout 540 python bench/gemm.py --suite --no-compile --m ${MK_GEMM_M:-64,256,1024,4096} \
      --odd-m 0 --reps 15 --split-k ${MK_GEMM_SPLIT:-auto} \
      --out "$OUTDIR/gemm.json" > "$OUTDIR/gemm.log" 2>&1 || rc=1
  grep -vE "^\[mk\." "$OUTDIR/gemm.log" | tail -30
fi
if has gemmtc; then
  # issue 5's table with its third peer, torch.compile of the matmul + the epilogue (Inductor
  # fuses the epilogue; its output is checked against eager torch's before it is timed, and a
  # mismatch is recorded instead of a time): MK_TC_OPS (O_PROJ,GATE_UP,DOWN; QKV_ROPE,LM_HEAD in
  # a second call) at M = MK_TC_M (64,256,1024,4096), the checks first as in `gemm`:
  # gemmtc.log, gemmtc.json, gemmtc.png (~9 min: each op's process compiles its four shapes)
  timeout 560 python bench/gemm.py --suite --ops ${MK_TC_OPS:-O_PROJ,GATE_UP,DOWN} \
      --m ${MK_TC_M:-64,256,1024,4096} --odd-m 0 --reps 15 --bench-timeout 240 \
      --out "$OUTDIR/gemmtc.json" > "$OUTDIR/gemmtc.log" 2>&1 || rc=1
  grep -vE "^\[mk\." "$OUTDIR/gemmtc.log" | tail -30
fi
if has ppbound; then
  pm=${MK_PPB_M:-4096}
  j=""
  for op in O_PROJ DOWN; do
    for e in "" noepi+nostore tile=m128n128 tile=m128n128+noepi+nostore \
        tile=m64n256+noepi+nostore; do j="$j,$op:$pm:time:$e"; done
  done
  for e in "" noepi+nostore tile=gu_m128n64 tile=gu_m128n64+noepi+nostore; do
    j="$j,GATE_UP:$pm:time:$e"
  done
  j="$j,DOWN:1024:time:,DOWN:1024:time:noepi+nostore,DOWN:1024:time:tile=m128n128+noepi+nostore"
  run_profile ppbound "${j#,}" 420
fi
if has gemmold; then
  # the large-M GEMMs against an older tree's (MK_AB_TREE, e.g. 935cf2f, which made
  # gemm_2026-11-29.json: the tiles in the standalone harness, not in mk.megakernel; its
  # bench/gemm.py has no --split-k): session 11's table put every op at M=4096 ~8% over that
  # one's (same tiles; cuBLAS unchanged): what the megakernel's environment costs a tile
  for v in off on; do
    d=$PWD; x="--split-k none"; [ $v = off ] && { d=$MK_AB_TREE; x=""; }
    ( cd "$d" && PYTHONPATH="$d:$PYTHONPATH" timeout 200 python bench/gemm.py --no-compile \
        --ops ${MK_GEMMOLD_OPS:-GATE_UP,O_PROJ} --m ${MK_GEMMOLD_M:-4096} --odd-m 0 --reps 15 $x \
        --out "$OUTDIR/gemmold_$v.json" ) > "$TMPD/gemmold_$v.log" 2>&1 || rc=1
    echo "== gemm tree $v: $d" | tee -a "$OUTDIR/gemmold.log"
    grep -E "^(QKV_ROPE|O_PROJ|GATE_UP|DOWN|LM_HEAD) " "$TMPD/gemmold_$v.log" | tee -a "$OUTDIR/gemmold.log"
  done
fi
if has page64; then
  # KV pages of 64 tokens (one TMA box per K / V block instead of four 16-row ones): is the
  # page-16 gather what holds a decode ATTENTION instruction at ~14 GB/s per SM
  # (bench/ATTENTION_NOTES.md, suspect (a))? Decode MK_P64_BATCH, journal on (the ATTENTION row)
  : > "$OUTDIR/page64.log"
  time_variant page64 p16 "KV page 16 (the default)" ${MK_P64_BATCH:-64,256} "" ""
  time_variant page64 p64 "KV page 64" ${MK_P64_BATCH:-64,256} "" "--page-size 64"
fi
if has tiles256; then
  # B=256's one-wave GEMMs on other tiles (MK_TILES): O_PROJ / DOWN on m128n128 (128 tiles each
  # instead of 64), GATE_UP on gu_m128 (two B pages: 56 tiles instead of gu_m128n64's 112, the
  # table's tile until session 16, when this step measured gu_m128n64 -7.0% at B=256; its GPU
  # tests run first and gate its timing)
  : > "$OUTDIR/tiles256.log"
  timeout 240 python -m pytest -q -m gpu tests/test_gemm_gpu.py -k two_page_gate_up \
      > "$TMPD/tiles256_check.log" 2>&1
  tail -3 "$TMPD/tiles256_check.log" | tee -a "$OUTDIR/tiles256.log"
  gu_ok=0; grep -q "2 passed" "$TMPD/tiles256_check.log" && gu_ok=1
  OD="O_PROJ@256=m128n128,DOWN@256=m128n128"; GU="GATE_UP@256=gu_m128"
  for v in ${MK_T256_VARIANTS:-none od gu both}; do
    case $v in none) t="";; od) t=$OD;; gu) t=$GU;; both) t="$OD,$GU";; esac
    if [ $gu_ok = 0 ] && { [ $v = gu ] || [ $v = both ]; }; then
      echo "== tiles $v: not timed (the two-page gate/up tile's GPU tests did not pass)" \
          | tee -a "$OUTDIR/tiles256.log"; rc=1; continue
    fi
    time_variant tiles256 $v "tiles $v (MK_TILES=$t)" ${MK_T256_BATCH:-128,256} "MK_TILES=$t" ""
  done
fi
if has attnstep; then
  # leave-one-out of ATTENTION inside the step (MK_ATTN_EXPERIMENT; outputs garbage, timing only):
  # at B=256 ATTENTION is 46% of the busy time, and splitting its key blocks between the two
  # warpgroups gained only 1% (session 8), so is it the math, the loads or neither?
  : > "$OUTDIR/attnstep.log"
  for e in ${MK_ATTNSTEP_EXP:-nomath noload}; do
    time_ab "attnstep_$e" "MK_ATTN_EXPERIMENT=$e" ${MK_ATTNSTEP_BATCH:-256} \
        "MK_ATTN_EXPERIMENT=$e" "" "--journal"
    cat "$OUTDIR/attnstep_$e.log" >> "$OUTDIR/attnstep.log"
  done
fi
if has stab; then
  # is a step time stable across processes: MK_STAB_RUNS (2) processes of each tree (MK_AB_TREE
  # "off" when given, this one "on"), 30 reps after 5 warm-up, no journal, in turn off / on;
  # session 12's B=256 read 25.2-25.4 ms in three 10-rep runs and 21.4-22.0 ms otherwise
  : > "$OUTDIR/stab.log"
  trees="on"; [ -d "${MK_AB_TREE:-}" ] && trees="off on"
  for i in $(seq ${MK_STAB_RUNS:-2}); do
    for v in $trees; do
      d=$PWD; [ $v = off ] && d=$MK_AB_TREE
      bench_in_tree "stab_${v}_$i" $v "$d" "$OUTDIR/stab.log" "tree $v, process $i" \
          --reps 30 --warmup 5 --batch ${MK_STAB_BATCH:-192,256}
    done
  done
fi
if has treeab; then
  # A/B of two source trees (a change with no switch of its own): "off" = the tree at MK_AB_TREE
  # (e.g. `git archive <base> | tar -x -C DIR`, carried in .gpu/), "on" = MK_AB_TREE_ON (default
  # this one); each with a kernel cache of its own
  : > "$OUTDIR/treeab.log"
  if [ -d "${MK_AB_TREE:-}" ]; then
    for v in off on; do
      d=${MK_AB_TREE_ON:-$PWD}; [ $v = off ] && d=$MK_AB_TREE
      bench_in_tree "treeab_$v" $v "$d" "$OUTDIR/treeab.log" "tree $v" \
          --batch ${MK_TREEAB_BATCH:-1,64,256} --journal
    done
  else
    echo "== treeab: MK_AB_TREE (${MK_AB_TREE:-unset}) is not a directory" | tee -a "$OUTDIR/treeab.log"
    rc=1
  fi
fi
if has wide; then
  # MK_GEMM_WIDE=1 (session 23: one wgmma chain of N = 256 over both B pages of the m128n256 /
  # gu_m128 tiles, the 1024 and max classes' O_PROJ / DOWN and the max class's GATE_UP; A read
  # from shared memory once per k-block instead of twice): bench/gemm.py's poisoned checks and
  # timings with 0 and 1 in one call (O_PROJ / DOWN / GATE_UP at MK_WIDE_M), and with 1 and
  # MK_WIDE_TILES (two-B-page tiles where the table has one: GATE_UP gu_m128 in the 1024 class,
  # QKV_ROPE on two-head m128n256 tiles) for MK_WIDE_TOPS; then the two-layer checks of the 1024
  # and max classes (478 and 1078 tokens), racecheck and memcheck with it: wide.log,
  # wide_check.log, wide_gemm_{0,1,tiles}.json (~8 min)
  : > "$OUTDIR/wide.log"
  WT=${MK_WIDE_TILES:-GATE_UP@1024=gu_m128,QKV_ROPE@1024=m128n256,QKV_ROPE@max=m128n256}
  for v in 0 1 tiles; do
    e="MK_GEMM_WIDE=$v"; o=${MK_WIDE_OPS:-O_PROJ,DOWN,GATE_UP}
    [ $v = tiles ] && { e="MK_GEMM_WIDE=1 MK_TILES=$WT"; o=${MK_WIDE_TOPS:-GATE_UP,QKV_ROPE}; }
    env $e timeout 240 python bench/gemm.py --no-compile --ops $o --m ${MK_WIDE_M:-1024,4096} \
        --odd-m ${MK_WIDE_ODD:-1100} --reps 15 --out "$OUTDIR/wide_gemm_$v.json" \
        > "$TMPD/wide_gemm_$v.log" 2>&1 || rc=1
    echo "== bench/gemm.py $e" | tee -a "$OUTDIR/wide.log"
    grep -vE "^\[mk\.(plan|compile)" "$TMPD/wide_gemm_$v.log" | tail -${MK_WIDE_TAIL:-24} \
        | tee -a "$OUTDIR/wide.log"
  done
  ( export MK_GEMM_WIDE=1; echo "== MK_GEMM_WIDE=1 checks"
    MK_CHECK_EXTRA="--prompt-lens 1,13,64,130,200,70" checks
    echo "== check --layers 2 --split-k 0 --prompt-lens 1,13,64,130,200,70,600 (the max class)"
    timeout 150 python -m mk.megakernel_step check --layers 2 --split-k 0 \
        --prompt-lens 1,13,64,130,200,70,600 2>&1 | grep -v "^\[mk" | tail -1 | cut -c1-300
    echo "== memcheck, two-layer step, 478 tokens"
    timeout 150 compute-sanitizer --tool memcheck --report-api-errors no python -m mk.megakernel_step \
        check --layers 2 --decode-steps 1 --split-k 0 --prompt-lens 1,13,64,130,200,70 \
        > "$OUTDIR/memcheck_full.log" 2>&1
    grep -E "ERROR SUMMARY|passed" "$OUTDIR/memcheck_full.log" | cut -c1-200
  ) > "$OUTDIR/wide_check.log" 2>&1
  cat "$OUTDIR/wide_check.log" | tee -a "$OUTDIR/wide.log"
  MK_NO_PYTEST=1 passed "$OUTDIR/wide_check.log" && grep -q "ERROR SUMMARY: 0 errors" \
      "$OUTDIR/wide_check.log" && echo "== wide: checks passed" || { echo "== wide: checks FAILED"; rc=1; }
fi
if has widetime; then
  # decode MK_WIDE_BATCH (1024,4096) of the default build and with MK_WIDE_ON_ENV
  # ("MK_GEMM_WIDE=1"; e.g. "MK_GEMM_WIDE=1 MK_TILES=GATE_UP@1024=gu_m128"), no journal:
  # widetime.log, widetime_{off,on}.json (~3 min per batch)
  : > "$OUTDIR/widetime.log"
  MK_AB_TIMEOUT=${MK_AB_TIMEOUT:-280} time_ab widetime "${MK_WIDE_ON_ENV:-MK_GEMM_WIDE=1}" \
      ${MK_WIDE_BATCH:-1024,4096} "${MK_WIDE_ON_ENV:-MK_GEMM_WIDE=1}" ""
fi
if has lm256; then
  # session 26: LM_HEAD on m128n256 in the 1024 / max classes (the default since then; the
  # f32store step timed it alone: -10.5% / -8.7% at M = 1024 / 4096). The 256 class too (126
  # tiles at M = 256 for 132 SMs where m128n128 makes 252), and QKV_ROPE's two-head tile at M =
  # 1024 / 4096 (bench/gemm_profile.py times QKV_ROPE since session 26); then the two-layer
  # checks of a 478-token first step (the 1024 class: LM_HEAD m128n256, six sequences)
  J="LM_HEAD:200:check:tile=m128n256,LM_HEAD:256:check:tile=m128n256"
  J="$J,QKV_ROPE:1024:check:tile=m128n256"
  for e in "" tile=m128n256; do J="$J,LM_HEAD:256:time:$e"; done
  for m in 1024 4096; do J="$J,QKV_ROPE:$m:time:,QKV_ROPE:$m:time:tile=m128n256"; done
  run_profile lm256 "$J" 240 | tee "$OUTDIR/lm256_summary.log"
  for sk in 0 1; do
    check_to "$OUTDIR/lm256_summary.log" --split-k $sk --prompt-lens 1,13,64,130,200,70
  done
fi
if has launchcost; then
  # where a short launch's time goes (issue 5's misses at M = 64 / 256): the empty kernel of the
  # megakernel's grid, block and shared memory (kind empty: the GPU's own launch floor), one NOOP
  # (kind launch) and the journal of one NOOP / the first tile (journal flags noop / first:
  # cta_start_spread_ns, first_fetch / ready / end_ns, teardown_ns), MK_LC_OP at M=64 (default
  # O_PROJ): launchcost.log, launchcost.json, launchcost_summary.log (~1.5 min). Session 28:
  # empty 3.49 us, NOOP 5.41, the NOOP's first fetch 1.31 us after the first CTA started
  op=${MK_LC_OP:-O_PROJ}
  J="$op:64:empty:,$op:64:launch:,$op:64:journal:noop,$op:64:journal:first,$op:64:time:"
  run_profile launchcost "$J" 200 | tee "$OUTDIR/launchcost_summary.log"
  launch_journal launchcost
fi
if has floor; then
  # what a whole-matrix launch pays before its tiles (issue 5's misses at M = 64 / 256, session
  # 20's table: O_PROJ 64 1.50, DOWN 64 1.21 of cuBLAS + epilogue): each op's first tile alone
  # in a launch (bench/gemm_profile.py kind floor) next to its whole matrix at the same M, and
  # (since session 27) a launch of the same variant running one NOOP (kind launch): floor -
  # launch is one tile's latency. Session 27 (floor alone): O_PROJ 64 floor 12.4 us, whole
  # (unsplit) 14.5, cuBLAS + epilogue 12.4
  J=""
  for op in QKV_ROPE O_PROJ GATE_UP DOWN LM_HEAD; do
    for m in ${MK_FLOOR_M:-64 256}; do J="$J,$op:$m:launch:,$op:$m:floor:,$op:$m:time:"; done
  done
  run_profile floor "${J#,}" 300 | tee "$OUTDIR/floor_summary.log"
fi
if has lmverify; then
  # the default (LM_HEAD on m128n256 in the 1024 / max classes since session 26) in the step: the
  # two-layer checks of a 512-token first step (whole tiles) and of the 478-token one (partial)
  check_to "$OUTDIR/lmverify.log" --split-k 0 --prompt-lens 256,256
  for sk in 0 1; do
    check_to "$OUTDIR/lmverify.log" --split-k $sk --prompt-lens 1,13,64,130,200,70
  done
fi
if has ktsplit; then
  # plan 000012 (bench/GEMM_NOTES.md session 41): the step's build runs a GEMM K step ~25% slower
  # than the harness's (1517 vs 1210 cycles), also with its tiles alone, at the same clock, and its
  # SASS loop is the harness's instruction for instruction (6x the code around it). Build or
  # data? (1) GATE_UP / DOWN of the middle layer alone through the step's kernel with the K-step
  # trace at --layers 2 / 20 / 80 (the weights' and KV cache's footprint: 0.4 / 4.4 / 17.6 GB of
  # weights), at 80 also through a kernel with only that opcode compiled in (--isolated-builds lean:
  # the harness's build on the step's data); (2) warp-stall sampling of the GATE_UP consumer loop (HGMMA.64x112x16) in the
  # harness's build and in the step's (B=1024, 2 layers): bench/ncu_loop_stalls.py side by side
  # (no_inst = the instruction cache). ktsplit.log, ktsplit_l*.json, ncu_kts_*_source.csv.gz
  # (~5 min)
  for L in ${MK_KTS_LAYERS:-2 20 80}; do
    # at 80 layers also through a kernel with only that opcode compiled in (--isolated-builds lean),
    # with the step's setmaxnreg split forced on both (80 / 208: the step's has QKV_ROPE)
    lean=""; [ "$L" = 80 ] && lean="--isolated-builds lean"
    MK_REG_LOW=80 MK_REG_HIGH=208 MK_GEMM_KTRACE=64 timeout 240 $B --batch ${MK_KTS_BATCH:-1024} --layers $L --reps 3 \
        --warmup 1 --journal --journal-isolated GATE_UP,DOWN $lean \
        --out "$OUTDIR/ktsplit_l$L.json" > "$TMPD/ktsplit_l$L.log" 2>&1 || rc=1
    rm -f "$OUTDIR"/ktsplit_l${L}_*_journal.pt "$OUTDIR"/ktsplit_l${L}_*_timeline.png
    { echo "== layers $L"; grep -E -A3 "GEMM K steps|\] isolated" "$TMPD/ktsplit_l$L.log" \
        | grep -v "^\[mk\." | grep -E "isolated|^GATE_UP|^DOWN|^opcode"; } | tee -a "$OUTDIR/ktsplit.log"
  done
  # (its ncu part, session 42, profiled the first Megakernel launch, an M64 kernel: ktncu)
fi
if has ktbisect; then
  # plan 000013 (bench/GEMM_NOTES.md session 42): with only its GEMM slot compiled in ("lean"), a
  # GATE_UP / DOWN K step takes ~1190 / 1225 SM cycles on the step's data, in the step's build
  # ~1520 / 1505: the build, not the data. Which part of it? GATE_UP / DOWN of the middle layer
  # alone (B=1024, 2 layers, the 80 / 208 split forced) through the step's kernel and three
  # builds (launch/bench.py --isolated-builds: lean, gemms = every GEMM slot without attention /
  # gather, families = the one slot with attention and gather), then the step's kernel and lean
  # with MK_WAIT_SLIM=1 (the mbarrier waits without their inline deadline / error code: -33% of
  # the SASS), then the step's kernel with compact waits but no twin (MK_GEMM_TWIN=0) and as
  # session 43's default built it (MK_WAIT_COMPACT=0 MK_GEMM_TWIN=0). M1024 SASS (session 43,
  # bench/GEMM_NOTES.md): step (compact + twin, the default since session 44) 22.3k, lean 7.5k,
  # slim 18.9k, compact 24.6k, old 29.8k. Session 44's ncu reading: without the K-step trace
  # the step's K loop runs as fast as the lean build's, so the builds are now compared by their
  # tiles' journal times without it (MK_KTB_KTRACE=64: with the trace, as sessions 41 / 42).
  # ktbisect.log, ktbisect{,_slim,_compact,_old}.json (~8 min)
  : > "$OUTDIR/ktbisect.log"
  for v in default slim compact old; do
    case $v in
      default) e=""; builds="--isolated-builds lean,gemms,families"; sfx="" ;;
      slim) e="MK_WAIT_SLIM=1"; builds="--isolated-builds lean"; sfx=_slim ;;
      compact) e="MK_WAIT_COMPACT=1 MK_GEMM_TWIN=0"; builds=""; sfx=_compact ;;
      old) e="MK_WAIT_COMPACT=0 MK_GEMM_TWIN=0"; builds=""; sfx=_old ;;
    esac
    # shellcheck disable=SC2086  # $e: VAR=VALUE words or none; $builds: the arguments, split
    env $e MK_REG_LOW=80 MK_REG_HIGH=208 MK_GEMM_KTRACE=${MK_KTB_KTRACE:-0} timeout 200 $B \
        --batch 1024 --layers 2 \
        --reps 3 --warmup 1 --journal --journal-isolated GATE_UP,DOWN $builds \
        --out "$OUTDIR/ktbisect$sfx.json" > "$TMPD/ktbisect$sfx.log" 2>&1 || rc=1
    rm -f "$OUTDIR"/ktbisect${sfx}_*_journal.pt "$OUTDIR"/ktbisect${sfx}_*_timeline.png
    { echo "== $v (${builds:-the step kernel only}) ${e:-}"
      grep -E -A3 "\] isolated" "$TMPD/ktbisect$sfx.log" | grep -v "^\[mk\." \
          | grep -E "isolated|^GATE_UP|^DOWN|^opcode"
      grep -E -A12 "Error|^error|Traceback" "$TMPD/ktbisect$sfx.log" | tail -20; } \
        | tee -a "$OUTDIR/ktbisect.log"
  done
fi
if has waitslim; then
  # the waits' code in the whole step: decode B=256 / 1024 of the 70B TP8 rank, megakernel only,
  # no journal, the default (compact waits: bounded, the timeout record one 64-bit CAS) against
  # MK_WAIT_COMPACT=0 (write_error's record inline at every wait) and MK_WAIT_SLIM=1 (a probe:
  # unbounded), in the same call: what the waits' slow paths cost the step. waitslim.log,
  # waitslim_{default,inline,slim}.json (~6 min)
  # Session 51 (one run each, an H100): slim took B=1 9.044 -> 8.773 ms (-3.0%) and B=1024
  # 46.20 / 46.38 -> 45.45 (-1.8%); its mixed step did not finish in 80 s or 130 s (twice), so
  # slim runs the decode points only. Since session 51 it times, beside the default and slim,
  # the mbarrier waits' clock, deadline and abort word (an L2 load past 2 us in the hot page
  # waits, rk.bar_wait) on every 16th failed try_wait only (MK_WAIT_CHECK_EVERY=16: is it the
  # work per failed poll that slim removes, or its code?), and the counter waits' abort word
  # and clock on every 16th failed poll only (MK_COUNTER_CHECK_EVERY=16: slim leaves them as
  # they are; each failed poll now pays a second L2 round trip). MK_ABORT_POLL_EVERY=16 (the
  # abort word alone) is the follow-up if check16 wins.
  # waitslim_{default,check16,ccheck16,slim,default2}.json
  # (~8 min: a run of two points ~100 s, so the mixed step only through MK_WS_MIXED, then in a
  # call of its own: if slim's hang there is a race that faster waits expose, a bounded
  # variant's ends in a timeout record that names the starved instruction and wait)
  : > "$OUTDIR/waitslim.log"
  ws_b=${MK_WS_BATCH:-1,1024}
  ws_mixed="--mixed ${MK_WS_MIXED:-none}"
  # Session 52 (`waitslim*_s52_h100*`): check16 +0.6% / +1.0% (the cost is the code),
  # ccheck16 -0.5% / -0.1%, slim -3.4% / -1.5%. Session 53 (`waitslim*_cd120bc_*_s53_h100*`),
  # decode B=1 / 1024 ms: bounded 9.064 / 46.408, MK_PAGE_ABORT_POLL=0 8.947 / 46.556,
  # MK_WAIT_WATCHED=1 8.844 / 46.035, watchdog 8.851 / 45.918, slim 8.771 / 45.620, bounded
  # 9.049 / 46.400: the watchdog became the default, noabort and hint were removed. MK_WS_RUNS
  # picks the runs (default "default bounded slim default2"): default = the watchdog,
  # bounded = MK_WAIT_WATCHDOG=0 (the inline bounded waits of sessions 1-52), ccheck16 =
  # MK_COUNTER_CHECK_EVERY=16 on request. The mixed step (MK_WS_MIXED) is run by every build
  # but slim.
  ws_runs=()
  for r in ${MK_WS_RUNS:-default bounded slim default2}; do
    case $r in
      default|default2) ws_runs+=("$r||$ws_mixed|$ws_b") ;;
      bounded) ws_runs+=("bounded|MK_WAIT_WATCHDOG=0|$ws_mixed|$ws_b") ;;
      ccheck16) ws_runs+=("ccheck16|MK_COUNTER_CHECK_EVERY=16|$ws_mixed|$ws_b") ;;
      lead) ws_runs+=("lead|MK_WAITED_FREE=lead|$ws_mixed|$ws_b") ;;
      slim) ws_runs+=("slim|MK_WAIT_SLIM=1||$ws_b") ;;
      *) echo "MK_WS_RUNS: unknown run $r" >&2; exit 2 ;;
    esac
  done
  UNTRACED_TIMEOUT=${MK_WS_TIMEOUT:-200} untraced_runs waitslim "${ws_runs[@]}"
fi
if has backoff; then
  # the counter waits' nanosleep cap (mk.megakernel.DEFAULT_BACKOFF_NS, 200 ns since session 1,
  # never timed in the whole step; MK_BACKOFF_NS): a waiter polls again at most this long after
  # a counter lands, and at B=1 the step is a chain of ~46k such hand-offs in 9 ms. Decode
  # MK_BO_BATCH (1,16) with each of MK_BO_VALUES ("200 100 50 400 200": the default first and
  # last), megakernel only, no journal: backoff.log, backoff_<i>_<ns>.json (~5 min)
  : > "$OUTDIR/backoff.log"
  bo_runs=()
  bo_i=0
  for ns in ${MK_BO_VALUES:-200 100 50 400 200}; do
    bo_i=$((bo_i + 1))
    bo_runs+=("${bo_i}_$ns|MK_BACKOFF_NS=$ns|--mixed ${MK_BO_MIXED:-none}|${MK_BO_BATCH:-1,16}")
  done
  UNTRACED_TIMEOUT=${MK_BO_TIMEOUT:-150} untraced_runs backoff "${bo_runs[@]}"
fi
if has slimhang; then
  # session 52: MK_WAIT_SLIM=1's mixed step hangs in its first launch (GPU busy at ~130 W for
  # 170 s: spinning) where the bounded build runs it and checks clean. Where: slim at B=4096 and
  # a prompt-only 1200-token step (the same M > 1024 class: its GEMMs / the prefill
  # attention?), then the mixed step with only the page waits (MK_WAIT_SLIM_KINDS=2,3,4) or only
  # the instruction-slot waits (5,8) unbounded: a bounded wait that starves writes its record,
  # and the error names the instruction and the wait. slimhang.log, slimhang_*.json (~6 min)
  : > "$OUTDIR/slimhang.log"
  # Session 52 (an H100, `slimhang_*_1fae3cf_*`): pages alone and slots alone unbounded both
  # run B=4096 and the mixed step; full slim runs B=4096 (136.3 ms) and the 1200-token prompt
  # alone (50.8 ms) but hangs at the mixed step (256 decodes at ctx 1024 + a 1024-token prompt)
  # with the same compiled variant. Next: MK_SLH_RUNS="but2 but3 but4 but5 but8" (every kind
  # unbounded but one, ERR_* numbers: 2 page empty, 3 page full, 4 page done, 5 instruction
  # slot, 8 instruction ready): a run that ends in a record names the starved wait, its ticket
  # and phase.
  # (MK_SLH_RUNS: a subset of "slim pages slots but2 ... but8"; MK_SLH_BATCH: the other runs'
  # decode points, 4096 by default: the mixed step's M class, one compile)
  sl_mixed="--mixed ${MK_SLH_MIXED:-256:1024:1024}"
  sl_b=${MK_SLH_BATCH:-4096}
  sl_runs=()
  for r in ${MK_SLH_RUNS:-slim pages slots}; do
    case $r in
      slim) sl_runs+=("slim4096p|MK_WAIT_SLIM=1|--mixed 0:1024:1200|4096") ;;
      # session 54: full slim with the mixed step, a waited page released after every waiting
      # warp's own wait (MK_WAITED_FREE=all, the default now) / by thread 0 alone (lead,
      # sessions 1-53: slim hung there in sessions 52-53)
      slimall) sl_runs+=("slimall|MK_WAIT_SLIM=1|$sl_mixed|$sl_b") ;;
      slimlead) sl_runs+=("slimlead|MK_WAIT_SLIM=1 MK_WAITED_FREE=lead|$sl_mixed|$sl_b") ;;
      pages) sl_runs+=("pages|MK_WAIT_SLIM_KINDS=2,3,4|$sl_mixed|$sl_b") ;;
      slots) sl_runs+=("slots|MK_WAIT_SLIM_KINDS=5,8|$sl_mixed|$sl_b") ;;
      but[2-58])   # every kind unbounded but one: where that one starves, its record names it
        sl_runs+=("$r|MK_WAIT_SLIM_KINDS=$(echo 2,3,4,5,8 | sed "s/${r#but}//; s/,,/,/; s/^,//;
                   s/,$//")|$sl_mixed|$sl_b") ;;
      *) echo "MK_SLH_RUNS: unknown run $r (slim, pages, slots, but2..but8, slimall," \
              "slimlead)" >&2; exit 2 ;;
    esac
  done
  UNTRACED_TIMEOUT=${MK_SLH_TIMEOUT:-110} untraced_runs slimhang "${sl_runs[@]}"
fi
if has nself; then
  # plan 000017: norm_fold=3 against the default's norm_fold=2 (a plan value; the backend builds
  # the variant with the self-scale code, Megakernel(self_scale=True))
  : > "$OUTDIR/nself.log"
  ns_ok=0
  fold_checks "$OUTDIR/nself.log" norm_fold=3 && ns_ok=1
  racecheck_to "$OUTDIR/nself.log" --split-k 1 --plan norm_fold=3
  if [ $ns_ok = 1 ] && grep -q "RACECHECK SUMMARY: 0 hazards" "$OUTDIR/nself.log"; then
    ns_mixed="--mixed ${MK_NS_MIXED:-256:1024:1024}"
    UNTRACED_TIMEOUT=${MK_NS_TIMEOUT:-200} untraced_runs nself \
        "default||$ns_mixed|${MK_NS_BATCH:-256,1024,4096}" \
        "nf3||--plan norm_fold=3 $ns_mixed|${MK_NS_BATCH:-256,1024,4096}" \
        "nf3q512||--plan norm_fold=3,splitk_qkv_max_tokens=512|1024"
  else
    echo "== norm_fold=3: a check or racecheck failed, not timed" | tee -a "$OUTDIR/nself.log"
    rc=1
  fi
fi
if has nf4; then
  # plan 000020: norm_fold=4 against norm_fold=2 (the default's before session 50; plan values:
  # the backend builds the variant with the ROW_PART code, Megakernel(row_parts=True)): its step
  # GPU tests, the two-layer checks, racecheck, then the timed runs
  : > "$OUTDIR/nf4.log"
  nf4_ok=0
  { echo "== GPU tests (norm_fold=4)"
    timeout 300 python -m pytest -m gpu -q -rfE --tb=line -p no:cacheprovider \
        tests/test_megakernel_step_gpu.py -k "nf4" 2>&1 | grep -v "^\[mk" | tail -8; } \
      | tee -a "$OUTDIR/nf4.log"
  fold_checks "$OUTDIR/nf4.log" norm_fold=4 && grep -qE "^[0-9]+ passed" "$OUTDIR/nf4.log" \
      && ! grep -qE "(^| )[1-9][0-9]* (failed|errors?)( |,|$)" "$OUTDIR/nf4.log" && nf4_ok=1
  racecheck_to "$OUTDIR/nf4.log" --split-k 1 --plan norm_fold=4
  if [ $nf4_ok = 1 ] && grep -q "RACECHECK SUMMARY: 0 hazards" "$OUTDIR/nf4.log"; then
    nf4_mixed="--mixed ${MK_NF4_MIXED:-256:1024:1024}"
    UNTRACED_TIMEOUT=${MK_NF4_TIMEOUT:-200} untraced_runs nf4 \
        "nf2||--plan norm_fold=2 $nf4_mixed|${MK_NF4_BATCH:-256,1024,4096}" \
        "nf4||--plan norm_fold=4 $nf4_mixed|${MK_NF4_BATCH:-256,1024,4096}"
  else
    echo "== norm_fold=4: a check or racecheck failed, not timed" | tee -a "$OUTDIR/nf4.log"
    rc=1
  fi
fi
if has tilemax; then
  # session 50: the mixed step (1280 tokens) keeps 97% of the SMs busy (session 48's journal),
  # GATE_UP 42% of that time on gu_m128 tiles (0.85 us a column there against gu_m128n112's
  # 0.80 at B=1024), QKV_ROPE 11% on m128n128 (470 TFLOP/s a tile); the class's tiles were
  # chosen at B=4096 or not timed there (mk/tiles.py TILE_TABLE)
  : > "$OUTDIR/tilemax.log"
  tm_args="--mixed ${MK_TM_MIXED:-256:1024:1024}"
  tm_b=${MK_TM_BATCH:-4096}
  runs=("base||$tm_args|$tm_b")
  # the default build's own racecheck of the 1144-token step (the class's first; not counted in
  # the entries' clean checks below)
  MK_RACE_TIMEOUT=${MK_TM_RACE_TIMEOUT:-300} racecheck_to "$OUTDIR/tilemax.log" --split-k 0 \
      --prompt-lens 500,500,130,13,1
  i=0
  for t in ${MK_TM_TILES:-QKV_ROPE@max=m128n256}; do
    i=$((i + 1))
    export MK_TILES=$t MK_CHECK_TAG="MK_TILES=$t "
    check_to "$OUTDIR/tilemax.log" --split-k 1 --prompt-lens 500,500,130,13,1
    check_to "$OUTDIR/tilemax.log" --split-k 0 --prompt-lens 500,500,130,13,1
    MK_RACE_TIMEOUT=${MK_TM_RACE_TIMEOUT:-300} racecheck_to "$OUTDIR/tilemax.log" --split-k 0 \
        --prompt-lens 500,500,130,13,1
    unset MK_TILES MK_CHECK_TAG
    runs+=("t$i|MK_TILES=$t|$tm_args|$tm_b")
  done
  runs+=("base2||$tm_args|$tm_b")
  # every entry's two checks and its racecheck's own "passed" line
  UNTRACED_TIMEOUT=${MK_TM_TIMEOUT:-150} checked_runs tilemax $((3 * i)) "${runs[@]}"
fi
if has shares; then
  # plan 000017's 3: where an 80-layer step's SM time goes at today's default (the last such
  # journal at B=4096 is session 21's)
  : > "$OUTDIR/shares.log"
  MK_AB_TIMEOUT=${MK_SH_TIMEOUT:-300} time_variant shares default "the build as it is, journal on" \
      "${MK_SH_BATCH:-1024,4096}" "" "--mixed ${MK_SH_MIXED:-256:1024:1024}"
  if [ -n "${MK_SH_PLAN:-}" ]; then
    # the same journals with a plan change (e.g. MK_SH_PLAN=attn_lpt=0): shares_plan.json
    MK_AB_TIMEOUT=${MK_SH_TIMEOUT:-300} time_variant shares plan "--plan $MK_SH_PLAN, journal on" \
        "${MK_SH_BATCH:-1024,4096}" "" "--plan $MK_SH_PLAN --mixed ${MK_SH_MIXED:-256:1024:1024}"
  fi
fi
if has attnlpt; then
  # PlanConfig.attn_lpt (session 56; mk/plan.py: a plan change, the kernel as it is): the checks
  # of the reordered streams first, then, if both passed, the timed runs
  : > "$OUTDIR/attnlpt.log"
  check_to "$OUTDIR/attnlpt.log" --split-k 0 --prompt-lens 500,500,130,13,1 --plan attn_lpt=1
  check_to "$OUTDIR/attnlpt.log" --split-k 0 --prompt-lens 1,13,64,130,200,70 --plan attn_lpt=1
  al="--mixed ${MK_AL_MIXED:-256:1024:1024} --context 256"
  al_batch=${MK_AL_BATCH:-1280}
  if grep -q '"passed": false' "$OUTDIR/attnlpt.log" \
      || [ "$(grep -c '"passed": true' "$OUTDIR/attnlpt.log")" -ne 2 ]; then
    echo "== attn_lpt: a check failed, not timed" | tee -a "$OUTDIR/attnlpt.log"
    rc=1
  else
    UNTRACED_TIMEOUT=${MK_AL_TIMEOUT:-150} untraced_runs attnlpt "default||$al|$al_batch" \
        "lpt||--plan attn_lpt=1 $al|$al_batch" "default2||$al|$al_batch"
  fi
fi
if has normbig; then
  # plan 000017: fewer, bigger row-scale norms (a plan change, the kernel as it is). Each value's
  # two-layer checks first (every norm of the step cut into that many rows:
  # small_norm_max_tokens=0 norm_fill_max_tokens=0), then the timed runs of the values whose
  # checks passed, with norm_fill_max_tokens=0 only (the small steps keep their one-row norms)
  # and big_norm_min_tokens=0 (since session 47 the default's big steps take ceil(tokens / 132)
  # rows up to 32: the values are timed as they are named)
  : > "$OUTDIR/normbig.log"
  nb_mixed="--mixed ${MK_NB_MIXED:-256:1024:1024}"
  nb_batch=${MK_NB_BATCH:-256,1024,4096}
  NB_RUNS=("default||$nb_mixed|$nb_batch")
  for r in ${MK_NB_ROWS:-32 64}; do
    if fold_checks "$OUTDIR/normbig.log" \
        "norm_rows=$r,norm_fill_max_tokens=0,small_norm_max_tokens=0"; then
      NB_RUNS+=("r$r||--plan norm_rows=$r,norm_fill_max_tokens=0,big_norm_min_tokens=0 \
$nb_mixed|$nb_batch")
    else
      echo "== norm_rows=$r: a check failed, not timed" | tee -a "$OUTDIR/normbig.log"
      rc=1
    fi
  done
  UNTRACED_TIMEOUT=${MK_NB_TIMEOUT:-200} untraced_runs normbig "${NB_RUNS[@]}"
fi
if has twin; then
  # plan 000014: MK_GEMM_TWIN=1 (DOWN's tiles run through O_PROJ's compiled loader / consumer /
  # storer, the loader issuing DOWN's own x / w loads: gk.TwinSource) with MK_WAIT_COMPACT=1 (the
  # waits' smaller slow path): -7.5k of the M1024 class's 29.8k SASS instructions together.
  # Checks: the step and split-K GPU tests, the two-layer step vs mk.vm (208 tokens split-K
  # never / auto: DOWN split and unsplit, the 256 class; 478 tokens auto: the 1024 class),
  # racecheck: twin.log (~6 min; then `twintime` in a call of its own)
  : > "$OUTDIR/twin.log"
  export MK_GEMM_TWIN=1 MK_WAIT_COMPACT=1 MK_CHECK_TAG="MK_GEMM_TWIN=1 MK_WAIT_COMPACT=1 "
  { echo "== GPU tests (MK_GEMM_TWIN=1 MK_WAIT_COMPACT=1)"
    timeout ${MK_TWIN_PYTEST_S:-400} python -m pytest -m gpu -q -rfE --tb=line \
        -p no:cacheprovider tests/test_megakernel_step_gpu.py tests/test_splitk_gpu.py 2>&1 \
        | grep -v "^\[mk" | tail -12; } | tee -a "$OUTDIR/twin.log"
  check_to "$OUTDIR/twin.log" --split-k 1
  check_to "$OUTDIR/twin.log" --split-k 0
  check_to "$OUTDIR/twin.log" --split-k 0 --prompt-lens 1,13,64,130,200,70
  racecheck_to "$OUTDIR/twin.log" --split-k 0
  unset MK_GEMM_TWIN MK_WAIT_COMPACT MK_CHECK_TAG
  checks_clean "$OUTDIR/twin.log" 3 && echo "== twin: all passed" | tee -a "$OUTDIR/twin.log" \
    || { echo "== twin: FAILED" | tee -a "$OUTDIR/twin.log"; rc=1; }
fi
if has twintime; then
  # decode MK_TWIN_BATCH (256,1024) of the 70B TP8 rank, megakernel only, no journal, session 43's
  # default (MK_GEMM_TWIN=0 MK_WAIT_COMPACT=0) / compact waits only / twin + compact (the default
  # since session 44; M1024 SASS 29.8k / 24.6k / 22.3k): twintime.log,
  # twintime_{old,compact,twin}.json (~6 min; session 44: bench/results/twintime_*_s44*)
  : > "$OUTDIR/twintime.log"
  bt=${MK_TWIN_BATCH:-256,1024}
  UNTRACED_TIMEOUT=170 untraced_runs twintime "old|MK_GEMM_TWIN=0 MK_WAIT_COMPACT=0||$bt" \
      "compact|MK_GEMM_TWIN=0 MK_WAIT_COMPACT=1||$bt" "twin|MK_GEMM_TWIN=1 MK_WAIT_COMPACT=1||$bt"
fi
if has ktncu; then
  # ncu warp-stall samples of the GATE_UP consumer loop (HGMMA.64x112x16) of the middle layer's
  # isolated tiles (B=1024, 2 layers) in the step's build and in the lean build on the same data
  # (launch/bench.py --profile-isolated: only that launch between cudaProfilerStart / Stop;
  # session 42's ktsplit profiled the first Megakernel launch, an M64 kernel), side by side by
  # bench/ncu_loop_stalls.py: no_inst samples in the loop = waits for instructions.
  # ktncu.log, ncu_ktncu_{full,lean}_source.csv.gz (~4 min)
  : > "$OUTDIR/ktncu.log"
  for w in full lean; do
    builds=""; [ $w = lean ] && builds="--isolated-builds lean"   # the full run needs no other build
    # shellcheck disable=SC2086  # $builds: the arguments, split
    timeout 200 ncu --clock-control none --profile-from-start off -c 1 \
        --section SourceCounters --section WarpStateStats -f -o "$TMPD/ncu_ktncu_$w" \
        $B --batch 1024 --layers 2 --reps 1 --warmup 1 --journal --journal-isolated GATE_UP \
        $builds --profile-isolated $w:GATE_UP --out "$TMPD/ktncu_$w.json" \
        > "$TMPD/ktncu_$w.log" 2>&1 || { rc=1; tail -5 "$TMPD/ktncu_$w.log"; }
    ncu -i "$TMPD/ncu_ktncu_$w.ncu-rep" --page source --csv --print-source sass \
        > "$OUTDIR/ncu_ktncu_${w}_source.csv" 2> "$TMPD/ncu_ktncu_src.err" \
      || { rc=1; tail -5 "$TMPD/ncu_ktncu_src.err"; }
  done
  { echo "== GATE_UP consumer loop (HGMMA.64x112x16): the step's build, lean"
    python bench/ncu_loop_stalls.py --hgmma 64x112x16 "$OUTDIR/ncu_ktncu_full_source.csv" \
        "$OUTDIR/ncu_ktncu_lean_source.csv"; } 2>&1 | tee -a "$OUTDIR/ktncu.log" || rc=1
  gzip -f "$OUTDIR"/ncu_ktncu_*_source.csv
fi
if has e2e; then
  # MK_E2E_ARGS: more launch/bench.py arguments (e.g. --plan FIELD=VALUE); MK_E2E_TIMEOUT its cap (560 s)
  timeout ${MK_E2E_TIMEOUT:-560} python launch/bench.py --batch ${MK_E2E_BATCH:-1,16,64,256} \
      --mixed ${MK_E2E_MIXED:-none} ${MK_E2E_ARGS:-} --out "$OUTDIR/e2e.json" > "$OUTDIR/e2e.log" 2>&1 || rc=1
  grep -vE "^\[mk\.(plan|compile)" "$OUTDIR/e2e.log" | tail -25
fi
if has wave; then
  # wave quantization in the 257..1024 class: O_PROJ / DOWN on m128n256 and GATE_UP on
  # gu_m128n112 make 32 tiles a 128-row block, so 96 / 160 / 192 / 224 tiles at 384 / 640 / 768
  # / 896 tokens (0.73 / 1.21 / 1.45 / 1.70 waves of 132 SMs). Half-width tiles (m128n128,
  # gu_m128n56) take 1.5 waves' time where the wide ones take 2 at 640 / 768, at ~6% more time a
  # tile (session 55). Per variant (MK_WAVE_VARIANTS: od128 gu56 both, or NAME=MK_TILES-value)
  # the two-layer check of a 478-token first step (the 1024 class), then decode MK_WAVE_BATCH
  # (320,384,640,768) default / each checked variant, megakernel only: wave.log, wave_*.json
  wv_b=${MK_WAVE_BATCH:-320,384,640,768}
  wv_runs=("base|||$wv_b")
  : > "$OUTDIR/wave.log"
  for v in ${MK_WAVE_VARIANTS:-od128 gu56 both}; do
    case $v in
      od128) t="O_PROJ@1024=m128n128,DOWN@1024=m128n128" ;;
      gu56) t="GATE_UP@1024=gu_m128n56" ;;
      both) t="O_PROJ@1024=m128n128,DOWN@1024=m128n128,GATE_UP@1024=gu_m128n56" ;;
      *=*) t=${v#*=}; v=${v%%=*} ;;
      *) echo "== wave: unknown variant $v" | tee -a "$OUTDIR/wave.log"; rc=1; continue ;;
    esac
    n0=$(grep -c '"passed": true' "$OUTDIR/wave.log")
    MK_TILES=$t MK_CHECK_TAG="$t " check_to "$OUTDIR/wave.log" --split-k 0 \
        --prompt-lens 1,13,64,130,200,70
    if [ "$(grep -c '"passed": true' "$OUTDIR/wave.log")" -gt "$n0" ]; then
      wv_runs+=("$v|MK_TILES=$t||$wv_b")
    else
      echo "== wave: $v ($t) failed its check, not timed" | tee -a "$OUTDIR/wave.log"; rc=1
    fi
  done
  untraced_runs wave "${wv_runs[@]}"
fi
if has gemmncu; then
  # issue 5's last point over cuBLAS + epilogue (DOWN 1024): mk's whole-matrix launch and
  # cuBLAS's kernel under Nsight Compute (bench/gemm_ncu.py; one replayed launch each): the
  # tensor pipe's active share, L2 -> SM traffic, the schedulers' issue slots and what the warps
  # wait on, side by side. gemmncu.log (the summary), gemmncu_details.csv.gz, gemmncu_raw.csv.gz
  gn_ops=${MK_GN_OPS:-DOWN}; gn_m=${MK_GN_M:-1024}
  timeout 260 ncu --profile-from-start off --clock-control none --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
      --section LaunchStats -f -o "$TMPD/gemmncu" \
      python bench/gemm_ncu.py --ops "$gn_ops" --m "$gn_m" > "$TMPD/gemmncu_run.log" 2>&1 || rc=1
  grep -vE "^\[mk" "$TMPD/gemmncu_run.log" | grep -vE "^==PROF==" | tail -8 > "$OUTDIR/gemmncu.log"
  ncu -i "$TMPD/gemmncu.ncu-rep" --page details --csv > "$OUTDIR/gemmncu_details.csv" 2>&1 || rc=1
  ncu -i "$TMPD/gemmncu.ncu-rep" --page raw --csv > "$OUTDIR/gemmncu_raw.csv" 2>&1 || rc=1
  python bench/gemm_ncu.py --summary "$OUTDIR/gemmncu_details.csv" --raw "$OUTDIR/gemmncu_raw.csv" \
      >> "$OUTDIR/gemmncu.log" 2>&1 || rc=1
  gzip -f "$OUTDIR/gemmncu_details.csv" "$OUTDIR/gemmncu_raw.csv"
  echo "== gemmncu $gn_ops M=$gn_m"; cat "$OUTDIR/gemmncu.log"
fi
if has gemmab; then
  # A GEMM switch against the default: MK_AB_ENV (VAR=VALUE words, e.g.
  # "MK_TILES=GATE_UP@64=gu_m128n56") through every GEMM GPU test (every tile mode), the two-layer
  # checks (208 tokens never / auto, 1144 tokens) and racecheck; then, if all passed,
  # bench/gemm.py at M = MK_AB_M (1024,4096) for MK_AB_OPS (O_PROJ,GATE_UP,DOWN) default /
  # switch / default again (alternated: the clock drifts within a call): gemmab.log,
  # gemmab_checks.log, gemmab_{def,ab,def2}.json (~9 min; 240 s of pytest cut session 68's
  # GEMM tests at 26 of 27, hence 330). MK_AB_CHECKS=0: timing only (~2 min; bench/gemm.py's
  # own poisoned checks of each timed matrix still run), for a first look before the checks
  if [ -z "${MK_AB_ENV:-}" ]; then
    echo "== gemmab: set MK_AB_ENV (the switch to test, VAR=VALUE words)"; rc=1
  else
    if [ "${MK_AB_CHECKS:-1}" = 0 ]; then
      echo "== checks skipped (MK_AB_CHECKS=0): timing only" > "$OUTDIR/gemmab_checks.log"
    else
      # shellcheck disable=SC2086  # VAR=VALUE words
      ( export $MK_AB_ENV
        MK_CHECK_PYTEST_S=330 checks tests/test_gemm_gpu.py ) > "$OUTDIR/gemmab_checks.log" 2>&1
    fi
    { echo "== gemmab $MK_AB_ENV"; cat "$OUTDIR/gemmab_checks.log"; } | tee "$OUTDIR/gemmab.log"
    if [ "${MK_AB_CHECKS:-1}" = 0 ] || passed "$OUTDIR/gemmab_checks.log"; then
      for v in def ab def2; do
        e=""; [ $v = ab ] && e="$MK_AB_ENV"
        echo "== gemm ${e:-default} ($v)" | tee -a "$OUTDIR/gemmab.log"
        # shellcheck disable=SC2086  # $e: VAR=VALUE words
        env $e timeout 150 python bench/gemm.py --suite --no-compile \
            --ops ${MK_AB_OPS:-O_PROJ,GATE_UP,DOWN} --m ${MK_AB_M:-1024,4096} --odd-m 0 \
            --reps 15 --out "$OUTDIR/gemmab_$v.json" > "$TMPD/gemmab_$v.log" 2>&1 || rc=1
        grep -E "^[A-Z_]+ +[0-9]+ " "$TMPD/gemmab_$v.log" | tee -a "$OUTDIR/gemmab.log"
      done
    else
      echo "== gemmab: checks failed, not timed" | tee -a "$OUTDIR/gemmab.log"; rc=1
    fi
  fi
fi
if has gemmsrc; then
  # gemmncu's "the tensor pipe idles" instruction by instruction: warp-stall sampling of mk's
  # whole-matrix launch of MK_GN_OPS (DOWN) at MK_GN_M (1024), then of cuBLAS's kernel (one ncu
  # run each, -k picks the kernel). The mk variant is compiled once (the first run stores it in
  # MK_COMPILE_CACHE, the second loads it). bench/ncu_loop_stalls.py: the consumer loop's share
  # of the samples and its stall reasons; bench/gemm_ncu_summary.py: the 40 SASS lines with the
  # most samples and their neighbourhoods (the loop, the waits, the epilogue). gemmsrc.log,
  # ncu_gs_{mk,cublas}.source.csv.gz (~3 min)
  gn_ops=${MK_GN_OPS:-DOWN}; gn_m=${MK_GN_M:-1024}
  : > "$OUTDIR/gemmsrc.log"
  for k in "mk|regex:Megakernel" "cublas|regex:nvjet|sm90_xmma|cutlass3x"; do
    n=${k%%|*}
    MK_COMPILE_CACHE=${MK_COMPILE_CACHE:-$TMPD/kernels} timeout 220 ncu --profile-from-start off \
        --clock-control none -k "${k#*|}" -c 1 --section SourceCounters --section WarpStateStats \
        -f -o "$TMPD/gs_$n" python bench/gemm_ncu.py --ops "$gn_ops" --m "$gn_m" \
        > "$TMPD/gs_$n.log" 2>&1 \
      || { rc=1; tail -5 "$TMPD/gs_$n.log" | tee -a "$OUTDIR/gemmsrc.log"; }
    grep -E "loaded from|compiled variant" "$TMPD/gs_$n.log" | sed -E 's/gemm=.* in / ... in /' \
        | cut -c1-160 | tee -a "$OUTDIR/gemmsrc.log"
    ncu -i "$TMPD/gs_$n.ncu-rep" --page source --csv --print-source sass \
        > "$OUTDIR/ncu_gs_$n.source.csv" 2> "$TMPD/gs_src.err" \
      || { rc=1; tail -5 "$TMPD/gs_src.err" | tee -a "$OUTDIR/gemmsrc.log"; }
  done
  { echo "== $gn_ops M=$gn_m consumer loops: mk (HGMMA ${MK_GS_MK_HGMMA:-64x256x16}), cuBLAS"
    python bench/ncu_loop_stalls.py --hgmma ${MK_GS_MK_HGMMA:-64x256x16} \
        "$OUTDIR/ncu_gs_mk.source.csv"
    python bench/ncu_loop_stalls.py --hgmma ${MK_GS_CUBLAS_HGMMA:-64x128x16} \
        "$OUTDIR/ncu_gs_cublas.source.csv"
    python bench/gemm_ncu_summary.py "$OUTDIR"; } >> "$OUTDIR/gemmsrc.log" 2>&1 || rc=1
  gzip -f "$OUTDIR"/ncu_gs_*.source.csv
  echo "== gemmsrc $gn_ops M=$gn_m"; grep -B1 -A3 "^file" "$OUTDIR/gemmsrc.log" | cut -c1-160
fi
if has ncu; then
  # where the warps of the step wait, per source line (CUTE_DSL_LINEINFO: the Python lines of the
  # instruction bodies): Nsight Compute's warp-stall sampling of one megakernel launch, 4 layers
  for b in ${MK_NCU_BATCH:-1 256}; do
    CUTE_DSL_LINEINFO=1 timeout 240 ncu --clock-control none -k regex:Megakernel -c 1 \
        --section SourceCounters --section WarpStateStats --section SpeedOfLight \
        -f -o "$OUTDIR/ncu_b$b" $B --batch $b --layers 4 --reps 1 --warmup 1 \
        --out $TMPD/ncu_b$b.json > $TMPD/ncu_b$b.log 2>&1 || { rc=1; tail -20 $TMPD/ncu_b$b.log; }
    ncu -i "$OUTDIR/ncu_b$b.ncu-rep" --page source --csv --print-source cuda,sass \
        > "$OUTDIR/ncu_b${b}_source.csv" 2> $TMPD/ncu_src.err \
      || ncu -i "$OUTDIR/ncu_b$b.ncu-rep" --page source --csv --print-source sass \
        > "$OUTDIR/ncu_b${b}_source.csv" 2>> $TMPD/ncu_src.err || cat $TMPD/ncu_src.err
    ncu -i "$OUTDIR/ncu_b$b.ncu-rep" --page details --csv >> "$OUTDIR/ncu_details.csv" 2>&1
    echo "== ncu batch $b"; ls -la "$OUTDIR"/ncu_b$b*; head -c 600 "$OUTDIR/ncu_b${b}_source.csv"; echo
  done
  gzip -f "$OUTDIR"/ncu_b*_source.csv
fi
exit $rc
