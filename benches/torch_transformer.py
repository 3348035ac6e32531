"""PyTorch's side of issue 20's GPU table (benches/gpu_transformer.rs is
kiln's side; `gpu_session.sh transformer` runs both in one device call).

- attention [32, 12, 512, 64] and [8, 16, 2048, 128]: F.scaled_dot_product_attention pinned to
  one backend: FLASH_ATTENTION for f16/bf16, EFFICIENT_ATTENTION and MATH
  for f32 (flash takes no f32), with and without is_causal;
- attention forward and backward, the same shapes, f16 and bf16: SDPA's
  flash forward, then `out.backward(g)` (the flash backward), eager and
  with the attention compiled (its backward AOTAutograd's graph;
  reduce-overhead replays both as CUDA graphs); gradients set to None
  before each call, as an optimizer's zero_grad does;
- a BERT encoder as an nn.Module (the same post-norm layers as kiln's
  nn::bert, attention through F.scaled_dot_product_attention with a bool
  key-padding mask), random weights: MiniLM-L6 at 64x128 (f32, bf16) and
  BERT-base at 32x128 (bf16).

Each as eager, torch.compile and torch.compile(mode="reduce-overhead"):
first-call wall time, 5 warm-up calls, median of 50 calls timed with CUDA
events. TF32 off. Inference: no gradients.

    python3 benches/torch_transformer.py [kiln.jsonl] [--markdown table.md] [--only substring]
        [--modes eager,compile,reduce-overhead] [--kernel-table N]

`--kernel-table N` also prints, after each row, the N kernels with the most
device time per call (torch.profiler's self CUDA time over 3 calls, divided
by 3), to read next to kiln's ncu table (`benches/ncu_table.py`).
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
# Attention's [batch, heads, seq, head dim]: BERT-base's and GPT-2's, and a
# long-sequence one with Llama's head dim (kiln's gpu_transformer.rs SHAPES).
SHAPES = [(32, 12, 512, 64), (8, 16, 2048, 128)]
NAMES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


class Attention(torch.nn.Module):
    def __init__(self, causal, backend):
        super().__init__()
        self.causal, self.backend = causal, backend

    def forward(self, q, k, v):
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class AttentionTrain:
    """Forward and backward of flash attention with the seed `g`; the
    gradients land in q.grad, k.grad, v.grad."""

    def __init__(self, causal, attend=None):
        self.causal = causal
        self.attend = attend or self.flash

    def flash(self, q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def compiled(self, **options):
        """The same step with the attention compiled (its backward is
        AOTAutograd's compiled graph; reduce-overhead replays both as CUDA
        graphs)."""
        return AttentionTrain(self.causal, torch.compile(self.flash, **options))

    def __call__(self, q, k, v, g):
        for x in (q, k, v):
            x.grad = None
        out = self.attend(q, k, v)
        out.backward(g)


class Layer(torch.nn.Module):
    def __init__(self, w, heads, ff, eps):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(w, w) for _ in range(4))
        self.ln1, self.ln2 = torch.nn.LayerNorm(w, eps=eps), torch.nn.LayerNorm(w, eps=eps)
        self.up, self.down = torch.nn.Linear(w, ff), torch.nn.Linear(ff, w)

    def forward(self, x, keep):
        b, s, w = x.shape
        split = lambda t: t.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=keep)
        a = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, s, w)))
        return self.ln2(a + self.down(F.gelu(self.up(a))))


class Encoder(torch.nn.Module):
    def __init__(self, layers, w, heads, ff, vocab=30522, positions=512, eps=1e-12):
        super().__init__()
        self.word = torch.nn.Embedding(vocab, w)
        self.pos = torch.nn.Embedding(positions, w)
        self.typ = torch.nn.Embedding(2, w)
        self.ln = torch.nn.LayerNorm(w, eps=eps)
        self.layers = torch.nn.ModuleList(Layer(w, heads, ff, eps) for _ in range(layers))

    def forward(self, ids, mask):
        s = ids.shape[1]
        x = self.ln(self.word(ids) + self.pos.weight[:s] + self.typ.weight[:1])
        keep = (mask != 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, keep)
        return x


class Autocast(torch.nn.Module):
    """An f32 module run under torch.autocast, as mixed-precision inference is written."""

    def __init__(self, inner, dtype):
        super().__init__()
        self.inner, self.dtype = inner, dtype

    def forward(self, *args):
        with torch.autocast("cuda", dtype=self.dtype):
            return self.inner(*args)


def workloads():
    g = torch.Generator(device=dev).manual_seed(1)
    out = []
    for b, h, s, d in SHAPES:
        shape = f"[{b},{h},{s},{d}]"
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            qkv = [torch.randn(b, h, s, d, device=dev, dtype=dtype, generator=g) for _ in range(3)]
            for causal in (False, True):
                name = f"attention {shape} {NAMES[dtype]}{' causal' if causal else ''}"
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                backends = [("flash", SDPBackend.FLASH_ATTENTION)] if dtype != torch.float32 else [
                    ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
                for label, backend in backends:
                    out.append((name, label, flops, Attention(causal, backend), qkv))
        for dtype in (torch.float16, torch.bfloat16):
            qkv = [torch.randn(b, h, s, d, device=dev, dtype=dtype, generator=g).requires_grad_() for _ in range(3)]
            seed = torch.randn(b, h, s, d, device=dev, dtype=dtype, generator=g)
            for causal in (False, True):
                name = f"attention fwd+bwd {shape} {NAMES[dtype]}{' causal' if causal else ''}"
                flops = 3.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                out.append((name, "flash", flops, AttentionTrain(causal), qkv + [seed]))
    for label, (layers, w, heads, ff), batch, dtype, low in [
        ("MiniLM-L6", (6, 384, 12, 1536), 64, torch.float32, None),
        ("MiniLM-L6", (6, 384, 12, 1536), 64, torch.bfloat16, None),
        ("BERT-base", (12, 768, 12, 3072), 32, torch.bfloat16, None),
        ("BERT-base", (12, 768, 12, 3072), 32, torch.float32, torch.bfloat16),
    ]:
        seq = 128
        model = Encoder(layers, w, heads, ff).to(dev, dtype).eval().requires_grad_(False)
        name = f"{label} encoder {batch}x{seq} {NAMES[dtype]}"
        if low is not None:
            model, name = Autocast(model, low), f"{name} autocast {NAMES[low]}"
        ids = torch.randint(0, 30522, (batch, seq), device=dev, generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64, device=dev)
        tokens = batch * seq
        flops = layers * (2 * tokens * (4 * w * w + 2 * w * ff) + 4 * batch * seq * seq * w)
        out.append((name, "sdpa", flops, model, (ids, mask)))
    return out


PROFILED = 3


def kernel_table(fn, args, limit):
    """The `limit` kernels with the most self device time, ms per call."""
    from torch.profiler import ProfilerActivity, profile
    grad = isinstance(fn, AttentionTrain)
    with torch.enable_grad() if grad else torch.inference_mode():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(PROFILED):
                fn(*args)
            torch.cuda.synchronize()
    us = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    rows = sorted(((e.key, e.count / PROFILED, us(e) / 1e3 / PROFILED) for e in prof.key_averages() if us(e) > 0),
                  key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    lines = [f"  kernels: {total:.3f} ms of device time per call"]
    lines += [f"  {ms:8.4f} ms {calls:6.1f}x  {name[:110]}" for name, calls, ms in rows[:limit]]
    return "\n".join(lines)


def measure(fn, args):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    grad = isinstance(fn, AttentionTrain)
    with torch.enable_grad() if grad else torch.inference_mode():
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        first = (time.perf_counter() - t0) * 1e3
        for _ in range(5):
            fn(*args)
        times = []
        for _ in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn(*args)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
    return first, statistics.median(times), torch.cuda.max_memory_allocated() / 2 ** 20


def main():
    args = sys.argv[1:]
    md = None
    if "--markdown" in args:
        i = args.index("--markdown")
        md = args[i + 1]
        del args[i:i + 2]
    wanted = ["eager", "torch.compile", "torch.compile reduce-overhead"]
    if "--modes" in args:  # e.g. --modes eager,reduce-overhead
        i = args.index("--modes")
        short = {"eager": "eager", "compile": "torch.compile", "reduce-overhead": "torch.compile reduce-overhead"}
        wanted = [short[m] for m in args[i + 1].split(",")]
        del args[i:i + 2]
    table = 0
    if "--kernel-table" in args:
        i = args.index("--kernel-table")
        table = int(args[i + 1])
        del args[i:i + 2]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    rows = []
    if args:
        rows += [json.loads(l) for l in open(args[0]) if l.strip()]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, backend, flops, module, inputs in workloads():
        if only and only not in name:
            continue
        modes = [("eager", module)]
        if isinstance(module, AttentionTrain):
            modes += [("torch.compile", module.compiled()),
                      ("torch.compile reduce-overhead", module.compiled(mode="reduce-overhead"))]
        else:
            modes += [("torch.compile", torch.compile(module)),
                      ("torch.compile reduce-overhead", torch.compile(module, mode="reduce-overhead"))]
        modes = [(m, f) for m, f in modes if m in wanted]
        for mode, f in modes:
            impl = f"torch {mode} ({backend})"
            try:
                first, ms, peak = measure(f, inputs)
            except Exception as e:  # a failed mode is a row with its reason
                print(f"{impl} on {name}: {type(e).__name__}: {e}", file=sys.stderr)
                rows.append({"impl": impl, "workload": name, "error": type(e).__name__})
                continue
            print(f"{name:<44} {impl:<44} first {first:9.1f} ms  median {ms:8.3f} ms  {flops / (ms * 1e-3) / 1e12:6.1f} TFLOP/s")
            if table:
                print(kernel_table(f, inputs, table), flush=True)
            rows.append({"impl": impl, "workload": name, "first_ms": first, "median_ms": ms, "peak_mib": peak,
                         "tflops": flops / (ms * 1e-3) / 1e12})
        torch._dynamo.reset()
    lines = ["| workload | implementation | first call ms | median ms | peak MiB | TFLOP/s | kiln / this |",
             "|---|---|---|---|---|---|---|"]
    names = []
    for r in rows:
        if r["workload"] not in names:
            names.append(r["workload"])
    for n in names:
        kiln = next((r["median_ms"] for r in rows if r["workload"] == n and r["impl"] == "kiln"), None)
        for r in [r for r in rows if r["workload"] == n]:
            if "error" in r:
                lines.append(f"| {n} | {r['impl']} | failed: {r['error']} | | | | |")
                continue
            ratio = f"{kiln / r['median_ms']:.2f}x" if kiln and r["impl"] != "kiln" else ""
            lines.append(f"| {n} | {r['impl']} | {r['first_ms']:.1f} | {r['median_ms']:.3f} | {r['peak_mib']:.0f} | {r['tflops']:.1f} | {ratio} |")
    text = "\n".join(lines)
    print(text)
    if md:
        open(md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
