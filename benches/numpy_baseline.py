"""numpy baselines for benches/cpu.rs, same sizes and the same chain.

Run in the same session as `cargo bench --bench cpu` and compare medians.
"""
import statistics
import time

import numpy as np


def median_seconds(f, reps):
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


rng = np.random.default_rng(1)
a = rng.standard_normal((1024, 1024), dtype=np.float32)
b = rng.standard_normal((1024, 1024), dtype=np.float32)
x = rng.standard_normal(1 << 24, dtype=np.float32)

mm = median_seconds(lambda: a @ b, 20)
# mul, add, abs, neg, exp, mul, sub, tanh: the chain in benches/cpu.rs
ch = median_seconds(lambda: np.tanh(np.exp(-np.abs(x * 2.0 + 1.0)) * x - 0.5), 10)
print(f"numpy {np.__version__}: matmul_1024_f32 median {mm * 1e3:.2f} ms")
print(f"numpy {np.__version__}: chain8_2^24_f32 median {ch * 1e3:.2f} ms")
