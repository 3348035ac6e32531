"""PyTorch's side of `gpu_train_gpt --gemms`: GPT-2 small's LM-head GEMMs
at the training bench's L12 shapes (4096 rows = batch 8 x 512 tokens,
width 768), bf16, TF32 off, vocabulary 50257 (GPT-2's) and 50304
(nanoGPT's padded one): the logits `x @ w.T` (bf16 out, as autocast's
`nn.Linear` gives them, and widened with `.float()`), the input's gradient
`g @ w` and the weight's `g.T @ x`. Median of 20 CUDA-event timings after
3 warm-ups.

    python3 benches/torch_lm_head_gemms.py
"""
import torch

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
rows, width = 4096, 768


def median_us(f):
    for _ in range(3):
        f()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        f()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


for vocab in (50257, 50304):
    g = torch.Generator(device=dev).manual_seed(3)
    x = torch.randn(rows, width, device=dev, generator=g).bfloat16()
    w = torch.randn(vocab, width, device=dev, generator=g).bfloat16()
    d = torch.randn(rows, vocab, device=dev, generator=g).bfloat16()
    cases = [
        ("logits x·wT -> f32", lambda: (x @ w.T).float()),
        ("logits x·wT bf16", lambda: x @ w.T),
        ("dx g·w", lambda: d @ w),
        ("dw gT·x", lambda: d.T @ x),
    ]
    for what, f in cases:
        us = median_us(f)
        tflops = 2.0 * rows * width * vocab / (us * 1e-6) / 1e12
        print(f"torch V{vocab} {what:<20} {us:8.1f} us {tflops:6.1f} TFLOP/s")
