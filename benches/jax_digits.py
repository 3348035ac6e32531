"""`cargo run --release --example digits` in JAX, for the end-to-end
comparison: the same data (examples/data/digits.csv.gz, pixels / 16), the
same 80/20 split and epoch orders (SplitMix64 and Fisher-Yates as
kiln::data::Rng, seeds 2024 and 1), the same models (MLP 64-256-10 or,
with --conv, the small CNN), dropout 0.2 before the last layer, label
smoothing 0.1, AdamW (lr 2e-3, PyTorch's other defaults), batches of 32
(the last partial batch dropped), 30 epochs, and the test accuracy of an
average of the weights (decay 0.99). The initial weights are drawn by JAX
(PyTorch's uniform bounds), so they differ from kiln's.

The train step (forward, backward, AdamW, EMA) is one jax.jit function;
the reported wall time runs from after `import jax` to the printed
accuracy, so it includes tracing and compiling (and is printed
separately); the import is timed too.

    python3 benches/jax_digits.py [--conv]
"""
import argparse
import gzip
import os
import time

T_START = time.perf_counter()
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

T_IMPORTED = time.perf_counter()
M64 = (1 << 64) - 1
HERE = os.path.dirname(os.path.abspath(__file__))


class Rng:
    """kiln::data::Rng: SplitMix64, below(n) = (x * n) >> 64, Fisher-Yates from the back."""

    def __init__(self, seed):
        self.s = seed

    def next_u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & M64
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def permutation(self, n):
        p = list(range(n))
        for i in range(n - 1, 0, -1):
            j = (self.next_u64() * (i + 1)) >> 64
            p[i], p[j] = p[j], p[i]
        return p


def uniform(key, shape, fan_in):
    b = 1.0 / fan_in**0.5
    return jax.random.uniform(key, shape, jnp.float32, -b, b)


def init_mlp(key):
    k = jax.random.split(key, 4)
    return {"w0": uniform(k[0], (256, 64), 64), "b0": uniform(k[1], (256,), 64),
            "w3": uniform(k[2], (10, 256), 256), "b3": uniform(k[3], (10,), 256)}


def mlp(p, x, key, train):
    h = jax.nn.relu(x @ p["w0"].T + p["b0"])
    h = dropout(h, key, train)
    return h @ p["w3"].T + p["b3"]


def init_cnn(key):
    k = jax.random.split(key, 6)
    return {"c0": uniform(k[0], (16, 1, 3, 3), 9), "cb0": uniform(k[1], (16,), 9),
            "c3": uniform(k[2], (32, 16, 3, 3), 144), "cb3": uniform(k[3], (32,), 144),
            "w8": uniform(k[4], (10, 128), 128), "b8": uniform(k[5], (10,), 128)}


def conv(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + b[None, :, None, None]


def pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def cnn(p, x, key, train):
    h = pool(jax.nn.relu(conv(x.reshape(-1, 1, 8, 8), p["c0"], p["cb0"])))
    h = pool(jax.nn.relu(conv(h, p["c3"], p["cb3"])))
    h = dropout(h.reshape(h.shape[0], -1), key, train)
    return h @ p["w8"].T + p["b8"]


def dropout(h, key, train, rate=0.2):
    if not train:
        return h
    keep = jax.random.uniform(key, h.shape) >= rate
    return jnp.where(keep, h / (1 - rate), 0.0)


def smoothed_ce(logits, y, eps=0.1):
    logp = jax.nn.log_softmax(logits, axis=1)
    nll = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    return (1 - eps) * nll + eps * -jnp.mean(logp)


LR, B1, B2, EPS, WD, DECAY = 2e-3, 0.9, 0.999, 1e-8, 0.01, 0.99


def make_step(model):
    def step(state, x, y, key):
        p, m, v, t, ema = state
        loss, g = jax.value_and_grad(lambda p: smoothed_ce(model(p, x, key, True), y))(p)
        t = t + 1
        bc1, bc2 = 1 - B1**t, 1 - B2**t
        m = jax.tree_util.tree_map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
        p = jax.tree_util.tree_map(
            lambda p, m, v: p * (1 - LR * WD) - (LR / bc1) * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + EPS), p, m, v)
        ema = jax.tree_util.tree_map(lambda e, p: e * DECAY + p * (1 - DECAY), ema, p)
        return (p, m, v, t, ema), loss
    return jax.jit(step, donate_argnums=(0,))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conv", action="store_true")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    t0 = time.perf_counter()
    with gzip.open(os.path.join(HERE, "..", "examples", "data", "digits.csv.gz"), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x_all, y_all = table[:, :64] / 16.0, table[:, 64].astype(np.int32)
    order = Rng(2024).permutation(len(y_all))
    cut = round(len(y_all) * 0.8)
    train, test = order[:cut], order[cut:]
    model, init = (cnn, init_cnn) if args.conv else (mlp, init_mlp)
    p = init(jax.random.PRNGKey(0))
    zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, p)
    state = (p, zeros(), zeros(), jnp.zeros((), jnp.float32), jax.tree_util.tree_map(jnp.copy, p))
    step = make_step(model)
    rng = Rng(1)
    key = jax.random.PRNGKey(1)
    batch = 32
    first = None
    epoch_times = []
    for epoch in range(args.epochs):
        te = time.perf_counter()
        perm = [train[i] for i in rng.permutation(len(train))]
        for b in range(len(perm) // batch):
            idx = perm[b * batch:(b + 1) * batch]
            key, sub = jax.random.split(key)
            state, loss = step(state, jnp.asarray(x_all[idx]), jnp.asarray(y_all[idx]), sub)
            if first is None:
                loss.block_until_ready()
                first = time.perf_counter() - te
        loss.block_until_ready()
        epoch_times.append(time.perf_counter() - te)
    ema = state[4]
    predict = jax.jit(lambda p, x: jnp.argmax(model(p, x, None, False), axis=1))
    acc = float(jnp.mean(predict(ema, jnp.asarray(x_all[test])) == jnp.asarray(y_all[test])))
    end = time.perf_counter()
    print(f"jax {jax.__version__} ({jax.devices()[0].platform}), {'cnn' if args.conv else 'mlp'}: "
          f"test accuracy {100 * acc:.2f}% ({len(test)} images)")
    print(f"wall time {end - t0:.2f} s after import (import {T_IMPORTED - T_START:.2f} s); first step (trace + compile) "
          f"{first * 1e3:.0f} ms; {1e3 * sum(epoch_times) / len(epoch_times):.1f} ms per epoch "
          f"(mean of the rest {1e3 * sum(epoch_times[1:]) / max(1, len(epoch_times) - 1):.1f} ms)")


if __name__ == "__main__":
    main()
