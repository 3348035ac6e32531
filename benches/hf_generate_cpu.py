"""Issue 34's CPU row, PyTorch's side (benches/generate_cpu.rs is kiln's):
GPT2LMHeadModel with GPT-2 small's shapes (random weights, f32), eager,
Hugging Face's dynamic cache, on this machine's CPU with every core
PyTorch sees, batch 1, a 16-token prompt: (T(16 + 33) - T(16 + 1)) / 32
per token, medians of 3 generations (greedy, min_new_tokens so no stop
token ends a run early).

    python3 benches/hf_generate_cpu.py
"""
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)).eval()
ids = torch.tensor([[(i * 7919) % 50257 for i in range(16)]])


def gen(n):
    with torch.no_grad():
        m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)


gen(3)


def timed(n):
    t = []
    for _ in range(3):
        s = time.perf_counter()
        gen(n)
        t.append(time.perf_counter() - s)
    return statistics.median(t)


short, long = timed(1), timed(33)
print(f"torch eager cpu f32 decode: {(long - short) / 32 * 1e3:.1f} ms/token; prefill 16 + 1 token {short * 1e3:.1f} ms ({torch.get_num_threads()} threads)")
