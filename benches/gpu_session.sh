#!/usr/bin/env bash
# One call on the GPU machine (see README, "On a GPU"): run the bundled CUDA
# binaries (built here with ../shared/tools/gpu-bundle into .gpu/) in stages.
#   bash benches/gpu_session.sh tests        # ops, cuda, plan_props on CUDA
#   bash benches/gpu_session.sh quickstart   # the README's example via Context::best
#   bash benches/gpu_session.sh digits       # examples/digits.rs, MLP and --conv
#   bash benches/gpu_session.sh memcheck     # the CUDA tests under compute-sanitizer
#   bash benches/gpu_session.sh racecheck
#   bash benches/gpu_session.sh bench        # benches/gpu.rs + torch_baseline.py, one table
#   bash benches/gpu_session.sh launch       # benches/gpu_launch.rs + torch_launch.py (issue 18)
#   bash benches/gpu_session.sh transformer  # benches/gpu_transformer.rs + torch_transformer.py (issue 20)
#   bash benches/gpu_session.sh minilm       # examples/embed.rs and tests-nn (bert) on the real weights,
#                                            # from the model folder in $KILN_MODEL_DIR (see benches/minilm_halves.py)
# Several stages in one call: bash benches/gpu_session.sh tests quickstart
# Full logs go to $OUT (the device tool brings them back).
set -uo pipefail
OUT=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
for d in $(python3 -c 'import nvidia,os;print(" ".join(os.path.join(p,"lib") for p in [os.path.join(nvidia.__path__[0],x) for x in os.listdir(nvidia.__path__[0])]))' 2>/dev/null); do
  LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$PWD/.kcache}
export INSTA_WORKSPACE_ROOT=$PWD INSTA_UPDATE=no KILN_REQUIRE_CUDA=1
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
    quickstart)
      timeout 120 $bin/examples-quickstart > "$OUT/quickstart.log" 2>&1 || status=1
      head -3 "$OUT/quickstart.log"; tail -4 "$OUT/quickstart.log" ;;
    digits)
      for a in "" --conv; do
        timeout 240 $bin/examples-digits $a --out "$OUT/digits$a" > "$OUT/digits$a.log" 2>&1 || status=1
        echo "-- digits $a"; tail -6 "$OUT/digits$a.log"
      done ;;
    memcheck|racecheck)
      timeout ${SAN_TIMEOUT:-240} compute-sanitizer --tool $stage --report-api-errors no --print-limit 20 $bin/tests-cuda --test-threads=1 > "$OUT/$stage.log" 2>&1 || status=1
      summary "$OUT/$stage.log"; tail -3 "$OUT/$stage.log" ;;
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
    transformer)
      KILN_BENCH_OUT=$OUT/kiln_transformer.jsonl timeout 400 $bin/benches-gpu_transformer > "$OUT/transformer-kiln.log" 2>&1 || status=1
      cat "$OUT/transformer-kiln.log"
      PYTHONUNBUFFERED=1 timeout ${TORCH_TIMEOUT:-500} python3 benches/torch_transformer.py "$OUT/kiln_transformer.jsonl" --markdown "$OUT/transformer.md" > "$OUT/transformer-torch.log" 2>&1 || status=1
      tail -50 "$OUT/transformer-torch.log" ;;
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
