"""PyTorch's side of benches/minilm_cpu.rs: the same encoder (the nn.Module
of torch_transformer.py) at 8 x 128, f32, on the CPU, eager under
inference_mode: median of 20 calls after 3 warm-ups.

    python3 benches/torch_minilm_cpu.py
"""
import statistics
import time

import torch

import torch_transformer as tt

# kiln's side runs rayon on this machine's 2 cores; pin PyTorch's intra-op
# pool to the same count (its default follows the cores too, but a
# container's cgroup can change what it sees).
torch.set_num_threads(2)
torch.manual_seed(1)
model = tt.Encoder(6, 384, 12, 1536).eval().requires_grad_(False)
ids = torch.randint(0, 30522, (8, 128))
mask = torch.ones(8, 128, dtype=torch.int64)
with torch.inference_mode():
    t0 = time.perf_counter()
    model(ids, mask)
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(3):
        model(ids, mask)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        model(ids, mask)
        times.append((time.perf_counter() - t) * 1e3)
print(f"torch {torch.__version__} eager MiniLM-L6 encoder 8x128 f32 (CPU, {torch.get_num_threads()} threads): "
      f"first {first:.1f} ms, median {statistics.median(times):.2f} ms, min {min(times):.2f} ms")
