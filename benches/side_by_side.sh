#!/usr/bin/env bash
# Runs kiln's criterion benches and the jax.jit / numpy baselines
# (benches/jax_baseline.py) alternately, group by group, in one session,
# printing the load average before each half. `ROUNDS` (default 2) repeats
# the whole alternation; `MEASURE` is criterion's measurement time in
# seconds (default 4). `BENCH_GROUPS` picks groups (default
# "overhead rows matmul chain"; "train" adds the AdamW step of
# benches/train.rs against benches/jax_train_step.py). Needs
# `pip install jax` (it brings numpy).
#
#     bash benches/side_by_side.sh 2>&1 | tee side_by_side.log
#
# Quote the medians (the middle number of criterion's `time:` line, and
# the baseline's `median`) next to each other, with the `load average`
# printed just before them.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2}
crit=(--warm-up-time 1 --measurement-time "${MEASURE:-4}")
kiln() {
    echo "== kiln: cargo bench --bench $1 -- $2"
    uptime
    cargo bench -q --bench "$1" -- "${crit[@]}" "$2" 2>&1 | grep -E "^[a-z_0-9^/]+ +time:|^ +time:|^[a-z_0-9^/]+$"
}
baseline() {
    echo "== baseline: benches/jax_baseline.py $*"
    uptime
    # numpy's OpenBLAS picks its own kernel and cache sizes (see numpy_baseline.py).
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 benches/jax_baseline.py "$@"
}
groups=" ${BENCH_GROUPS:-overhead rows matmul chain} "
want() { [[ "$groups" == *" $1 "* ]]; }
cargo bench -q --no-run --bench cpu --bench overhead --bench train
for round in $(seq "$rounds"); do
    echo "#### round $round"
    if want overhead; then
        kiln overhead 'cached_read|record'
        baseline overhead
    fi
    if want rows; then
        kiln cpu '^(softmax|layer_norm)_[0-9x]+_f32$|^copy_'
        baseline rows
    fi
    if want matmul; then
        kiln cpu '^matmul_1024|^mlp'
        baseline matmul mlp
    fi
    if want chain; then
        kiln cpu '^chain8_2\^24_f32/fused$|^chain_tanh'
        baseline chain
    fi
    if want train; then
        kiln train '^train_step_mlp_784_1024x3_10_adamw$'
        echo "== baseline: benches/jax_train_step.py"
        uptime
        python3 benches/jax_train_step.py
    fi
done
