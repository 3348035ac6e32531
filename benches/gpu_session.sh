#!/usr/bin/env bash
# One call on the GPU machine (see README, "On a GPU"): run the bundled CUDA
# binaries (built here with ../shared/tools/gpu-bundle into .gpu/) in stages.
#   bash benches/gpu_session.sh tests        # ops, cuda, plan_props on CUDA
#   bash benches/gpu_session.sh other-gemms  # the op suite with cuBLASLt's last-ranked algorithms (KILN_GEMM_TUNE=last)
#   bash benches/gpu_session.sh quickstart   # the README's example via Context::best
#   bash benches/gpu_session.sh digits       # examples/digits.rs, MLP and --conv
#   bash benches/gpu_session.sh memcheck     # the CUDA tests under compute-sanitizer
#   bash benches/gpu_session.sh racecheck    # (SAN_TESTS="cuda runtime": which binaries)
#   bash benches/gpu_session.sh bench        # benches/gpu.rs + torch_baseline.py, one table
#   bash benches/gpu_session.sh launch       # benches/gpu_launch.rs + torch_launch.py (issue 18)
#   bash benches/gpu_session.sh ncu          # the launch-bound rows' kernels under ncu, summed
#   bash benches/gpu_session.sh coldstart    # first calls, empty kernel cache: a plan as one program vs parts on threads, then warm
#   bash benches/gpu_session.sh amp          # benches/gpu_amp.rs + torch_amp.py: mixed precision (issue 22);
#                                            # AMP_ARGS=--all adds the CNN and 16-block rows, AMP_ONLY=<substring>
#                                            # and AMP_MODES=eager,compile,reduce-overhead pick rows and torch modes
#   bash benches/gpu_session.sh ddp          # benches/gpu_ddp.rs + torch_ddp.py: data parallel on every GPU (issue 24),
#                                            # f32 then bf16 autocast; needs nvidia-h200-x2 (or more GPUs)
#   bash benches/gpu_session.sh ddp-gpt      # benches/gpu_ddp_gpt.rs + torch_ddp.py --gpt: GPT-2 small data parallel,
#                                            # 8 sequences a GPU (issue 37); DDP_GPT_ARGS (e.g. --buckets 4,25,100)
#   bash benches/gpu_session.sh dist         # tests-dist on every GPU (the NCCL tests need 2: a kind with
#                                            # several GPUs), then its gpu:: tests under memcheck
#   bash benches/gpu_session.sh digits-amp   # examples/digits.rs MLP and --conv under --autocast bf16 (and f32)
#   bash benches/gpu_session.sh transformer  # benches/gpu_transformer.rs + torch_transformer.py (issue 20);
#                                            # TRANSFORMER_ARGS (e.g. "encoder --captured --host") for kiln's side
#   bash benches/gpu_session.sh train-gpt    # benches/gpu_train_gpt.rs + torch_train_gpt.py: GPT-style decoder training
#                                            # (issue 35); TRAIN_ARGS (kiln) and TORCH_TRAIN_ARGS (--only, --modes, ...) pick rows
#   bash benches/gpu_session.sh generate     # benches/gpu_generate.rs + hf_generate.py: GPT-2 small decode and
#                                            # prefill, kiln then Hugging Face's generate modes (issue 34)
#   bash benches/gpu_session.sh minilm       # examples/embed.rs and tests-nn (bert) on the real weights,
#                                            # from the model folder in $KILN_MODEL_DIR (see benches/minilm_halves.py)
# Several stages in one call: bash benches/gpu_session.sh tests quickstart
# Full logs go to $OUT (the device tool brings them back).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
bin=.gpu/bin
status=0
summary() { grep -E "test result|FAILED|panicked|failure is on|ERROR SUMMARY|error:" "$1" | head -40; }
for stage in "$@"; do
  echo "=== $stage ($(date +%T))"
  case $stage in
    tests)
      for t in ${TESTS:-ops cuda plan_props}; do
        # --nocapture for cuda: its tests print the figures the notes quote
        args=(); [[ $t == cuda ]] && args=(--nocapture)
        timeout 400 $bin/tests-$t "${args[@]}" > "$OUT/$t.log" 2>&1 || status=1
        echo "-- $t"; summary "$OUT/$t.log"
      done ;;
    other-gemms)
      KILN_GEMM_TUNE=last timeout 400 $bin/tests-ops > "$OUT/ops-other-gemms.log" 2>&1 || status=1
      echo "-- ops, KILN_GEMM_TUNE=last"; summary "$OUT/ops-other-gemms.log" ;;
    quickstart)
      timeout 120 $bin/examples-quickstart > "$OUT/quickstart.log" 2>&1 || status=1
      head -3 "$OUT/quickstart.log"; tail -4 "$OUT/quickstart.log" ;;
    digits)
      for a in "" --conv; do
        timeout 240 $bin/examples-digits $a --out "$OUT/digits$a" > "$OUT/digits$a.log" 2>&1 || status=1
        echo "-- digits $a"; tail -6 "$OUT/digits$a.log"
      done ;;
    memcheck|racecheck)
      for t in ${SAN_TESTS:-cuda}; do
        # The long-plan copy test runs hundreds of cuBLAS GEMMs: minutes
        # under racecheck, which checks shared memory only (not copies).
        skip=(); [[ $stage == racecheck && $t == runtime ]] && skip=(--skip copies::an_upload)
        timeout ${SAN_TIMEOUT:-240} compute-sanitizer --tool $stage --report-api-errors no --print-limit 20 $bin/tests-$t --test-threads=1 "${skip[@]}" > "$OUT/$stage-$t.log" 2>&1 || status=1
        echo "-- $stage $t"; summary "$OUT/$stage-$t.log"; tail -3 "$OUT/$stage-$t.log"
      done ;;
    memcheck-ops)
      timeout 500 compute-sanitizer --tool memcheck --print-limit 20 $bin/tests-ops --test-threads=1 > "$OUT/memcheck-ops.log" 2>&1 || status=1
      summary "$OUT/memcheck-ops.log"; tail -3 "$OUT/memcheck-ops.log" ;;
    bench)
      KILN_BENCH_OUT=$OUT/kiln.jsonl timeout 300 $bin/benches-gpu > "$OUT/bench-kiln.log" 2>&1 || status=1
      cat "$OUT/bench-kiln.log"
      PYTHONUNBUFFERED=1 timeout 400 python3 benches/torch_baseline.py "$OUT/kiln.jsonl" --markdown "$OUT/table.md" > "$OUT/bench-torch.log" 2>&1 || status=1
      tail -30 "$OUT/bench-torch.log" ;;
    launch)
      KILN_BENCH_OUT=$OUT/kiln_launch.jsonl timeout 300 $bin/benches-gpu_launch > "$OUT/launch-kiln.log" 2>&1 || status=1
      cat "$OUT/launch-kiln.log"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-400} python3 benches/torch_launch.py "$OUT/kiln_launch.jsonl" --markdown "$OUT/launch.md" > "$OUT/launch-torch.log" 2>&1 || status=1
      tail -40 "$OUT/launch-torch.log" ;;
    ncu)
      # Every kernel of 3 calls of each launch-bound row, recorded and
      # captured, summed per kernel (benches/ncu_sum.py).
      for w in "d=256, hidden" "AdamW, cross-entropy" "SGD, MSE"; do
        for m in plain captured; do
          timeout 150 ncu --profile-from-start off --clock-control none --cache-control none \
            --metrics gpu__time_duration.sum --csv --print-units base \
            $bin/benches-gpu_launch --ncu $m "$w" > "$OUT/ncu.csv" 2> "$OUT/ncu.err" || status=1
          python3 benches/ncu_sum.py "$OUT/ncu.csv" "$w $m" || { status=1; tail -5 "$OUT/ncu.err"; }
        done
      done ;;
    coldstart)
      # First calls with an empty kernel cache: a plan's kernels as one
      # NVRTC program (KILN_COMPILE_THREADS=1, issue 19's first step) and
      # as a few programs on threads (the default), then a second process
      # on the threaded run's cache.
      for mode in one-program threads warm; do
        [[ $mode != warm ]] && cache=$(mktemp -d)
        threads=; [[ $mode == one-program ]] && threads=1
        KILN_CACHE_DIR=$cache KILN_COMPILE_THREADS=$threads KILN_BENCH_OUT=$OUT/cold-$mode.jsonl \
          timeout 300 $bin/benches-gpu > "$OUT/cold-$mode.log" 2>&1 || status=1
        echo "-- benches/gpu.rs, kernels compiled: $mode"
        python3 -c "import json,sys;[print(' ',r['workload'][:60],'| first',r['first_ms'],'| median',r['median_ms'],'| compiles',r.get('compiles'),'| kernels',r.get('kernels'),'| compile ms',r.get('compile_ms'),'| nvrtc ms',r.get('nvrtc_ms')) for r in map(json.loads,open(sys.argv[1]))]" "$OUT/cold-$mode.jsonl"
      done
      for mode in one-program threads; do
        cache=$(mktemp -d); threads=; [[ $mode == one-program ]] && threads=1
        for a in "" --conv; do
          KILN_CACHE_DIR=$cache KILN_COMPILE_THREADS=$threads timeout 240 $bin/examples-digits $a --out "$OUT/cold-digits" > "$OUT/cold-digits$a-$mode.log" 2>&1 || status=1
          echo "-- digits $a, kernels compiled: $mode"; grep -E "per epoch|accuracy|epoch 1" "$OUT/cold-digits$a-$mode.log" | head -4
        done
      done ;;
    amp)
      KILN_BENCH_OUT=$OUT/kiln_amp.jsonl timeout ${KILN_TIMEOUT:-180} $bin/benches-gpu_amp ${AMP_ARGS:-} ${AMP_ONLY:+"$AMP_ONLY"} > "$OUT/amp-kiln.log" 2>&1 || status=1
      cat "$OUT/amp-kiln.log"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-400} python3 benches/torch_amp.py "$OUT/kiln_amp.jsonl" --markdown "$OUT/amp.md" \
        ${AMP_ARGS:-} ${AMP_ONLY:+--only "$AMP_ONLY"} --modes ${AMP_MODES:-eager,compile,reduce-overhead} > "$OUT/amp-torch.log" 2>&1 || status=1
      tail -60 "$OUT/amp-torch.log" ;;
    ddp)
      for a in "" --bf16; do
        timeout ${KILN_TIMEOUT:-300} $bin/benches-gpu_ddp $a > "$OUT/ddp-kiln$a.log" 2>&1 || status=1
        cat "$OUT/ddp-kiln$a.log"
        PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-300} python3 benches/torch_ddp.py $a > "$OUT/ddp-torch$a.log" 2>&1 || status=1
        tail -5 "$OUT/ddp-torch$a.log"
      done ;;
    ddp-gpt)
      for a in "" --bf16; do
        timeout ${KILN_TIMEOUT:-300} $bin/benches-gpu_ddp_gpt $a ${DDP_GPT_ARGS:-} > "$OUT/ddp-gpt-kiln$a.log" 2>&1 || status=1
        grep -E "^kiln|rror" "$OUT/ddp-gpt-kiln$a.log"
        PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-300} python3 benches/torch_ddp.py --gpt $a > "$OUT/ddp-gpt-torch$a.log" 2>&1 || status=1
        grep -E "^torch|rror" "$OUT/ddp-gpt-torch$a.log"
      done ;;
    dist)
      export KILN_REQUIRE_GPUS=${KILN_REQUIRE_GPUS:-2}
      timeout 400 $bin/tests-dist --test-threads=1 --nocapture > "$OUT/dist.log" 2>&1 || status=1
      echo "-- dist"; summary "$OUT/dist.log"; grep -E "^rank [01] at iteration" "$OUT/dist.log"
      timeout ${SAN_TIMEOUT:-400} compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 $bin/tests-dist gpu:: --test-threads=1 > "$OUT/memcheck-dist.log" 2>&1 || status=1
      echo "-- memcheck dist gpu::"; summary "$OUT/memcheck-dist.log"; tail -3 "$OUT/memcheck-dist.log" ;;
    digits-amp)
      for a in "" "--autocast bf16" --conv "--conv --autocast bf16"; do
        f=digits$(echo "$a" | tr -d ' -')
        timeout 240 $bin/examples-digits $a --out "$OUT/$f" > "$OUT/$f.log" 2>&1 || status=1
        echo "-- digits $a"; tail -4 "$OUT/$f.log"
      done ;;
    transformer)
      KILN_BENCH_OUT=$OUT/kiln_transformer.jsonl timeout 400 $bin/benches-gpu_transformer ${TRANSFORMER_ARGS:-} > "$OUT/transformer-kiln.log" 2>&1 || status=1
      cat "$OUT/transformer-kiln.log"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-500} python3 benches/torch_transformer.py "$OUT/kiln_transformer.jsonl" --markdown "$OUT/transformer.md" > "$OUT/transformer-torch.log" 2>&1 || status=1
      tail -50 "$OUT/transformer-torch.log" ;;
    train-gpt)
      KILN_BENCH_OUT=$OUT/kiln_train_gpt.jsonl timeout 300 $bin/benches-gpu_train_gpt ${TRAIN_ARGS:-} > "$OUT/train-gpt-kiln.log" 2>&1 || status=1
      cat "$OUT/train-gpt-kiln.log"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-500} python3 benches/torch_train_gpt.py "$OUT/kiln_train_gpt.jsonl" --markdown "$OUT/train-gpt.md" ${TORCH_TRAIN_ARGS:-} > "$OUT/train-gpt-torch.log" 2>&1 || status=1
      cat "$OUT/train-gpt.md" ;;
    generate)
      timeout 400 $bin/benches-gpu_generate > "$OUT/generate-kiln.log" 2>&1 || status=1
      cat "$OUT/generate-kiln.log"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-500} python3 benches/hf_generate.py --markdown "$OUT/generate-hf.md" > "$OUT/generate-hf.log" 2>&1 || status=1
      tail -20 "$OUT/generate-hf.log" ;;
    minilm)
      # The real weights: the f32 checkpoint travels as two safetensors
      # halves of disjoint tensors (benches/minilm_halves.py), which the
      # test and the example read as one checkpoint.
      dir=${KILN_MODEL_DIR:-.cache/models/all-minilm-l6-v2}
      export KILN_MODEL_DIR=$dir KILN_REQUIRE_MODEL=1
      timeout 120 $bin/examples-embed "$dir" "a cat sits" "a dog sits" "tax law" > "$OUT/embed.log" 2>&1 || status=1
      timeout 120 $bin/examples-embed --dtype bf16 "$dir" "a cat sits" "a dog sits" "tax law" >> "$OUT/embed.log" 2>&1 || status=1
      cat "$OUT/embed.log"
      timeout 300 $bin/tests-nn bert --nocapture > "$OUT/nn-bert.log" 2>&1 || status=1
      summary "$OUT/nn-bert.log"; grep "largest" "$OUT/nn-bert.log" ;;
    *) echo "unknown stage $stage"; status=1 ;;
  esac
done
exit $status
