"""Hugging Face's side of issue 34's generation table (kiln's side is
benches/gpu_generate.rs; `gpu_session.sh generate` runs both in one call).

GPT-2 small's shapes (12 layers, width 768, 12 heads, vocab 50257, 1024
positions) with random weights from a seed, as `GPT2LMHeadModel` (an
nn.Module with its parameters, as its users run it), batch 1, a 16-token
prompt, 112 greedy tokens (min_new_tokens = max_new_tokens, so no stop
token ends a run early), in each of `generate`'s modes:

- eager with the default dynamic cache;
- `cache_implementation="static"`, eager;
- `cache_implementation="static"` with the forward compiled
  (`torch.compile(mode="reduce-overhead")`, HF's documented fast path).

f32 and bf16, TF32 off. Each mode: 2 warm-up generations (the compiled
mode compiles in them), then the median of 7 timed generations (CUDA
synchronized wall time) divided by the new tokens. Also the prefill of a
512-token prompt (one forward, median of 20 after warm-up, CUDA events).

    python3 benches/hf_generate.py [--markdown table.md] [--json out.jsonl]
"""
import json
import statistics
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
# A smoke test of this script without a GPU: HF_SMOKE=1 (CPU, 2 tiny layers).
import os

SMOKE = os.environ.get("HF_SMOKE") == "1"
if SMOKE:
    dev = "cpu"
PROMPT, NEW = 16, 112


def model(dtype):
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    if SMOKE:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=50257, n_positions=1024)
    return GPT2LMHeadModel(cfg).to(dev, dtype).eval()


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def timed(f, reps):
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        f()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def decode(m, mode):
    ids = torch.randint(0, 50257, (1, PROMPT), device=dev, generator=torch.Generator(dev).manual_seed(1))
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    if mode != "dynamic":
        kw["cache_implementation"] = "static"
    if mode == "static-compiled":
        m.forward = torch.compile(m.forward, mode="reduce-overhead", fullgraph=True)

    def run():
        with torch.no_grad():
            out = m.generate(ids, **kw)
        assert out.shape[1] == PROMPT + NEW, out.shape

    first = time.perf_counter()
    run()
    sync()
    first = time.perf_counter() - first
    run()
    return timed(run, 7) / NEW * 1e3, first


def prefill(m, n=512):
    if dev != "cuda":
        return float("nan")
    ids = torch.randint(0, 50257, (1, n), device=dev, generator=torch.Generator(dev).manual_seed(2))
    with torch.no_grad():
        for _ in range(3):
            m(ids, use_cache=False)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            m(ids, use_cache=False)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


rows = []
for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
    for mode in ["dynamic", "static", "static-compiled"]:
        try:
            ms, first = decode(model(dtype), mode)
        except Exception as e:  # a mode this transformers/torch pair cannot run: say so, go on
            print(f"{name} {mode}: failed: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
            continue
        rows.append(dict(what=f"decode ms/token {name}", mode=mode, ms=ms, first_s=first))
        print(json.dumps(rows[-1]), flush=True)
    ms = prefill(model(dtype))
    rows.append(dict(what=f"prefill 512 ms {name}", mode="eager", ms=ms))
    print(json.dumps(rows[-1]), flush=True)

args = sys.argv[1:]
if "--json" in args:
    with open(args[args.index("--json") + 1], "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
if "--markdown" in args:
    with open(args[args.index("--markdown") + 1], "w") as f:
        f.write(f"| what | HF mode | ms | first call s |\n|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['what']} | {r['mode']} | {r['ms']:.3f} | {r.get('first_s', float('nan')):.2f} |\n")
