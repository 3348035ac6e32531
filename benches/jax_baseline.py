"""jax.jit (XLA:CPU) and numpy baselines for benches/overhead.rs and benches/cpu.rs.

Same sizes, same ops, same dtypes (f32). Each case is compiled once (a
warm-up call), then timed as a cached call that waits for its result
(`block_until_ready`), median of many calls, as criterion times kiln.

    python3 benches/jax_baseline.py [group ...]

Groups: overhead, rows, matmul, mlp, chain (all when none is given).
`benches/side_by_side.sh` alternates them with the kiln benches in one
run. numpy's matmul runs with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
unset, as benches/numpy_baseline.py documents (the side-by-side script
unsets them).
"""
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def median_seconds(f, min_reps=10, budget=2.0):
    """Median of timed calls: at least `min_reps`, more while under `budget` s."""
    f()
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget and len(times) < 100000):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def report(name, seconds):
    if seconds < 1e-3:
        print(f"jax {jax.__version__}: {name} median {seconds * 1e6:.2f} us", flush=True)
    else:
        print(f"jax {jax.__version__}: {name} median {seconds * 1e3:.3f} ms", flush=True)


def timed(name, fn, *args, budget=2.0):
    jitted = jax.jit(fn)
    jitted(*args).block_until_ready()
    report(name, median_seconds(lambda: jitted(*args).block_until_ready(), budget=budget))


def overhead():
    # The chain of benches/overhead.rs: y*x, tanh, y+x, sigmoid, repeated.
    x = jnp.asarray(np.array([0.25], dtype=np.float32))
    for n in (4, 40, 400, 4000):
        def chain(x, n=n):
            y = x
            for i in range(n):
                y = (y * x, jnp.tanh(y), y + x, jax.nn.sigmoid(y))[i % 4]
            return y
        timed(f"cached_call/{n}", chain, x)


def rows():
    rng = np.random.default_rng(3)
    for r, c in ((2048, 1024), (8192, 4096)):
        x = jnp.asarray(rng.standard_normal((r, c), dtype=np.float32))
        w = jnp.asarray(rng.standard_normal(c, dtype=np.float32))
        b = jnp.asarray(rng.standard_normal(c, dtype=np.float32))

        def layer_norm(x, w, b):
            mean = jnp.mean(x, axis=-1, keepdims=True)
            centered = x - mean
            var = jnp.mean(centered * centered, axis=-1, keepdims=True)
            return centered * jax.lax.rsqrt(var + 1e-5) * w + b

        timed(f"softmax_{r}x{c}_f32", lambda x: jax.nn.softmax(x, axis=-1), x)
        timed(f"layer_norm_{r}x{c}_f32", layer_norm, x, w, b)


def matmul():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1024, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    timed("matmul_1024_f32", jnp.matmul, jnp.asarray(a), jnp.asarray(b))
    mm = median_seconds(lambda: a @ b)
    print(f"numpy {np.__version__}: matmul_1024_f32 median {mm * 1e3:.3f} ms", flush=True)


def mlp():
    # 784-1024-1024-1024-10, batch 128, relu after each hidden layer.
    rng = np.random.default_rng(4)
    sizes = (784, 1024, 1024, 1024, 10)
    params = []
    for i, o in zip(sizes, sizes[1:]):
        w = rng.standard_normal((i, o), dtype=np.float32) * np.float32(1.0 / np.sqrt(i))
        b = rng.standard_normal(o, dtype=np.float32) * np.float32(0.1)
        params.append((jnp.asarray(w), jnp.asarray(b)))
    x = jnp.asarray(rng.standard_normal((128, 784), dtype=np.float32))

    def forward(x, params):
        h = x
        for k, (w, b) in enumerate(params):
            h = h @ w + b
            if k + 1 < len(params):
                h = jax.nn.relu(h)
        return h

    timed("mlp_forward_b128", forward, x, params)


def chain():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(1 << 24, dtype=np.float32))
    timed("chain8_2^24_f32", lambda x: jnp.tanh(jnp.exp(-jnp.abs(x * 2.0 + 1.0)) * x - 0.5), x)
    timed("chain_tanh_sigmoid_2^24_f32", lambda x: jnp.tanh(x * 1.5 + 0.5) * jax.nn.sigmoid(x) + x * x, x)


GROUPS = {"overhead": overhead, "rows": rows, "matmul": matmul, "mlp": mlp, "chain": chain}

if __name__ == "__main__":
    print(f"jax {jax.__version__} on {jax.devices()}, numpy {np.__version__}", flush=True)
    for g in sys.argv[1:] or list(GROUPS):
        GROUPS[g]()
