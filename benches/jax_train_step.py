"""The issue-10 training step under jax.jit, to compare with
`cargo bench --bench train -- train_step_mlp_784_1024x3_10_adamw`:
an MLP 784-1024-1024-1024-10 (ReLU), batch 128, cross-entropy on integer
labels, AdamW (PyTorch's defaults: lr 1e-3, betas 0.9/0.999, eps 1e-8,
weight decay 0.01, bias-corrected), f32, on the CPU. Each step takes the
next of POOL fixed random batches (normal inputs, uniformly random labels),
as benches/train.rs does: one batch reused every step is memorized (loss 0
within 20 steps), after which kiln measured subnormal arithmetic and XLA,
which flushes subnormals, measured something else. Parameters and
optimizer state are donated to the step, as a training loop does.
Prints the median of the timed steps (after warm-up and the compile,
which is reported separately).

    pip install jax            # CPU wheel
    python3 benches/jax_train_step.py [--steps N]
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp

SIZES = [784, 1024, 1024, 1024, 10]
BATCH = 128
POOL = 64
LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01


def init(key):
    params = []
    for n_in, n_out in zip(SIZES[:-1], SIZES[1:]):
        key, kw, kb = jax.random.split(key, 3)
        bound = 1.0 / n_in**0.5
        params.append((jax.random.uniform(kw, (n_out, n_in), jnp.float32, -bound, bound),
                       jax.random.uniform(kb, (n_out,), jnp.float32, -bound, bound)))
    return params


def loss_fn(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w.T + b
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h, axis=1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def step(params, m, v, t, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    t = t + 1
    bc1 = 1 - B1**t
    bc2 = 1 - B2**t
    leaves, tree = jax.tree_util.tree_flatten(params)
    new_p, new_m, new_v = [], [], []
    for p, g, mi, vi in zip(leaves, jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(m),
                            jax.tree_util.tree_leaves(v)):
        p = p * (1 - LR * WD)
        mi = B1 * mi + (1 - B1) * g
        vi = B2 * vi + (1 - B2) * g * g
        p = p - (LR / bc1) * mi / (jnp.sqrt(vi) / jnp.sqrt(bc2) + EPS)
        new_p.append(p)
        new_m.append(mi)
        new_v.append(vi)
    unflat = lambda xs: jax.tree_util.tree_unflatten(tree, xs)
    return unflat(new_p), unflat(new_m), unflat(new_v), t, loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    key = jax.random.PRNGKey(0)
    params = init(key)
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    t = jnp.zeros((), jnp.float32)
    kx, ky = jax.random.split(jax.random.PRNGKey(1))
    xs = list(jax.random.normal(kx, (POOL, BATCH, SIZES[0]), jnp.float32))
    ys = list(jax.random.randint(ky, (POOL, BATCH), 0, 10, jnp.int32))
    jax.block_until_ready((xs, ys))
    batches = iter(range(10**9))

    def batch():
        i = next(batches) % POOL
        return xs[i], ys[i]
    jstep = jax.jit(step, donate_argnums=(0, 1, 2, 3))
    t0 = time.perf_counter()
    params, m, v, t, loss = jstep(params, m, v, t, *batch())
    loss.block_until_ready()
    compile_s = time.perf_counter() - t0
    for _ in range(10):
        params, m, v, t, loss = jstep(params, m, v, t, *batch())
    loss.block_until_ready()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        params, m, v, t, loss = jstep(params, m, v, t, *batch())
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}: first call (trace + compile + run) {compile_s * 1e3:.0f} ms")
    print(f"train_step_mlp_784_1024x3_10_adamw (jax.jit): median {statistics.median(times) * 1e3:.2f} ms "
          f"over {args.steps} steps (min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}); loss {float(loss):.4f}")


if __name__ == "__main__":
    main()
