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
  (`torch.compile(mode="reduce-overhead")`, HF's documented fast path);
- the same compiled in torch.compile's default mode (no CUDA graphs):
  with transformers' newer static cache, reduce-overhead fails ("accessing
  tensor output of CUDAGraphs that has been overwritten"), and this mode
  is then HF's compiled number.

Each compiled mode starts from `torch._dynamo.reset()`, so one mode's
recompiles do not count against the next one's limit.

f32 and bf16, TF32 off. Each mode: 2 warm-up generations (the compiled
mode compiles in them), then the median of 7 timed generations (CUDA
synchronized wall time) divided by the new tokens. Also:

- a batch of 8 prompts of lengths 5 to 200 (left-padded, with their
  attention mask), 64 new tokens each, in the same three modes: tokens/s
  (median of 3 after 2 warm-ups);
- the prefill of a 512-token prompt: one forward that keeps the last
  position's logits (`logits_to_keep=1`, as `generate`'s prefill does),
  eager and compiled (`torch.compile`, default mode), median of 20 after
  warm-up, CUDA events.

    python3 benches/hf_generate.py [--markdown table.md] [--json out.jsonl] [--only decode|batch|prefill]
    python3 benches/hf_generate.py --profile-prefill [f32|bf16]
    python3 benches/hf_generate.py --gemms

`--profile-prefill` prints where the compiled 512-token prefill's device
time goes instead: torch.profiler's CUDA kernels of 5 forwards, summed by
kernel name, per forward (next to kiln's `gpu_generate --profile-prefill`).
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


MODES = ["dynamic", "static", "static-compiled", "static-compiled-default"]


def compile_forward(m, mode):
    if mode.startswith("static-compiled"):
        torch._dynamo.reset()
        kw = dict(mode="reduce-overhead") if mode == "static-compiled" else {}
        m.forward = torch.compile(m.forward, fullgraph=True, **kw)


def decode(m, mode):
    ids = torch.randint(0, 50257, (1, PROMPT), device=dev, generator=torch.Generator(dev).manual_seed(1))
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    if mode != "dynamic":
        kw["cache_implementation"] = "static"
    compile_forward(m, mode)

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


def batch(m, mode, rows=8, new=64):
    lens = [5 + i * 195 // 7 for i in range(rows)]
    width = max(lens)
    g = torch.Generator(dev).manual_seed(3)
    ids = torch.zeros((rows, width), dtype=torch.long, device=dev)
    mask = torch.zeros((rows, width), dtype=torch.long, device=dev)
    for r, n in enumerate(lens):
        ids[r, width - n:] = torch.randint(1, 50257, (n,), device=dev, generator=g)
        mask[r, width - n:] = 1
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, attention_mask=mask)
    if mode != "dynamic":
        kw["cache_implementation"] = "static"
    compile_forward(m, mode)

    def run():
        with torch.no_grad():
            out = m.generate(ids, **kw)
        assert out.shape == (rows, width + new), out.shape

    run()
    run()
    return rows * new / timed(run, 3)


def prefill(m, compiled, n=512):
    if dev != "cuda":
        return float("nan")
    ids = torch.randint(0, 50257, (1, n), device=dev, generator=torch.Generator(dev).manual_seed(2))
    if compiled:
        torch._dynamo.reset()
    f = torch.compile(m) if compiled else m
    kw = dict(use_cache=False, logits_to_keep=1)
    with torch.no_grad():
        try:
            f(ids, **kw)
        except TypeError:  # an older transformers: every position's logits
            kw.pop("logits_to_keep")
        for _ in range(3):
            f(ids, **kw)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(20):
            start.record()
            f(ids, **kw)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_prefill(dtype, n=512, reps=5):
    from torch.profiler import ProfilerActivity, profile

    m = model(dtype)
    ids = torch.randint(0, 50257, (1, n), device=dev, generator=torch.Generator(dev).manual_seed(2))
    f = torch.compile(m)
    kw = dict(use_cache=False, logits_to_keep=1)
    with torch.no_grad():
        for _ in range(3):
            f(ids, **kw)
        sync()
        if "--ncu" in sys.argv:  # 3 forwards for `ncu --profile-from-start off`
            torch.cuda.profiler.start()
            for _ in range(3):
                f(ids, **kw)
            sync()
            torch.cuda.profiler.stop()
            return
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                f(ids, **kw)
            sync()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows) / reps
    print(f"HF compiled prefill {n}, {dtype}: {total / 1e3:.3f} ms of kernels per forward")
    for e in rows[:16]:
        print(f"  {e.key[:70]:<70} {e.count / reps:5.1f} x {e.device_time_total / e.count:8.1f} us = {e.device_time_total / reps / 1e3:7.3f} ms")


def gemms(m=512, d=768, reps=30):
    """The prefill's four GEMM shapes as HF's Conv1D runs them
    (`addmm(b, x, w)`, w `[in, out]`) and as nn.Linear does (`linear(x, w,
    b)`, w `[out, in]`), f32: median CUDA-event time of `reps` calls."""
    g = torch.Generator(dev).manual_seed(4)
    for what, k, n in [("qkv", d, 3 * d), ("proj", d, d), ("up", d, 4 * d), ("down", 4 * d, d)]:
        x = torch.randn(m, k, device=dev, generator=g)
        b = torch.randn(n, device=dev, generator=g)
        for layout, w, f in [
            ("x·w+b", torch.randn(k, n, device=dev, generator=g), lambda w: torch.addmm(b, x, w)),
            ("x·wT+b", torch.randn(n, k, device=dev, generator=g), lambda w: torch.nn.functional.linear(x, w, b)),
        ]:
            for _ in range(3):
                f(w)
            times = []
            for _ in range(reps):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                f(w)
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            ms = statistics.median(times)
            print(f"torch gemm {what:<5} {m}x{k}x{n} {layout:<7} {ms * 1e3:7.1f} us  {2 * m * k * n / ms / 1e9:5.1f} TFLOP/s")


args = sys.argv[1:]
if "--gemms" in args:
    gemms()
    sys.exit(0)
if "--profile-prefill" in args:
    i = args.index("--profile-prefill")
    profile_prefill(torch.bfloat16 if args[i + 1:i + 2] == ["bf16"] else torch.float32)
    sys.exit(0)
# `--only decode|batch|prefill`: one kind of row (a shorter call).
only = args[args.index("--only") + 1] if "--only" in args else None
rows = []
for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
    for mode in MODES if only in (None, "decode") else []:
        try:
            ms, first = decode(model(dtype), mode)
        except Exception as e:  # a mode this transformers/torch pair cannot run: say so, go on
            print(f"{name} {mode}: failed: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
            continue
        rows.append(dict(what=f"decode ms/token {name}", mode=mode, ms=ms, first_s=first))
        print(json.dumps(rows[-1]), flush=True)
    for mode in MODES if only in (None, "batch") else []:
        try:
            tps = batch(model(dtype), mode)
        except Exception as e:
            print(f"{name} batch {mode}: failed: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
            continue
        rows.append(dict(what=f"batch 8 tokens/s {name}", mode=mode, ms=tps))
        print(json.dumps(rows[-1]), flush=True)
    for compiled in [False, True] if only in (None, "prefill") else []:
        try:
            ms = prefill(model(dtype), compiled)
        except Exception as e:
            print(f"{name} prefill compiled={compiled}: failed: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
            continue
        rows.append(dict(what=f"prefill 512 ms {name}", mode="compiled" if compiled else "eager", ms=ms))
        print(json.dumps(rows[-1]), flush=True)

if "--json" in args:
    with open(args[args.index("--json") + 1], "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
if "--markdown" in args:
    with open(args[args.index("--markdown") + 1], "w") as f:
        f.write(f"| what | HF mode | ms (tokens/s for batch rows) | first call s |\n|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['what']} | {r['mode']} | {r['ms']:.3f} | {r.get('first_s', float('nan')):.2f} |\n")
