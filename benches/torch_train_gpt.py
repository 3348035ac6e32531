"""PyTorch's side of benches/gpu_train_gpt.rs: a GPT-2 style decoder's
training step, written as PyTorch users (nanoGPT) write it. The model is an
nn.Module matching kiln's nn::gpt2::Gpt2: token and position embeddings
(N(0, 0.02)), pre-LN blocks x + attn(ln_1(x)), x + mlp(ln_2(x)) with fused
c_attn, head dim 64, F.scaled_dot_product_attention(is_causal=True), a
tanh-GELU MLP of width 4d, Linear weights N(0, 0.02) and zero biases, no
dropout, ln_f and an LM head tied to wte; forward(ids, targets) returns the
cross-entropy loss. Data: one fixed int64 [B, T] batch of ids and targets
(torch.randint, generator seeded 0), on the device once.

Precisions: f32; bf16 = f32 parameters with forward + loss under
torch.autocast(dtype=torch.bfloat16), no GradScaler. TF32 off, as in kiln.
Optimizer torch.optim.AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight_decay 0.01), default (foreach) or fused=True. Modes: eager,
torch.compile(model), torch.compile(model, mode="reduce-overhead") (which
calls torch.compiler.cudagraph_mark_step_begin() at the start of each step);
backward, opt.step() and opt.zero_grad(set_to_none=True) run as PyTorch
runs them. Each row is a fresh model and optimizer seeded with
torch.manual_seed(0).

One step = forward + loss, backward, step, zero_grad, loss.item(). Per row:
5 warm-up steps (the first, which includes compilation, is "first ms"),
then --steps timed steps: wall time (time.perf_counter) around each whole
step, median; the loss of the first and last timed step; peak MiB =
torch.cuda.max_memory_allocated() over the timed steps after a reset
(parameters, grads, optimizer state, activations) plus the segments of the
CUDA graph pools the row created (while graphs replay, their memory is not
counted as allocated). Then 3 steps under torch.profiler (CUDA activity):
device kernel events (not memcpy, memset or GPU user annotations) / 3. For
reduce-overhead the note says how much of the peak is graph pools, how many
graphs are launched per step and whether the profiler reported the kernels
inside them (judged against the torch.compile row's count).

Inductor's caches are left on, as users have them: a compiled row's first
ms includes compiling only the graphs not compiled earlier in this run (or
an earlier run on the machine); TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 makes
every row compile cold.

    python3 benches/torch_train_gpt.py [kiln_train_gpt.jsonl] [--markdown table.md]
        [--only SUBSTRING] [--precisions f32,bf16] [--modes eager,compile,reduce-overhead]
        [--optimizers default,fused] [--steps 30] [--device cuda|cpu] [--kernel-table N]

--kernel-table N also prints, per row, the N kernels with the most device
time per step (torch.profiler's self CUDA time over 3 steps, divided by 3):
where PyTorch's step goes, to set next to kiln's `--profile`. Run it with
--modes compile: the reduce-overhead row's kernels are the same, but the
profiler may not see inside its CUDA graphs.

With kiln's JSON lines (KILN_BENCH_OUT of benches/gpu_train_gpt.rs) it
prints one table per configuration and precision with every implementation,
and kiln's ratios to the best torch row. --device cpu is a smoke test
(no memory or kernel counts).
"""
import argparse
import gc
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

# name: (layers, d, T, B, V); heads = d / 64
CONFIGS = {"L2 d128 T64 B32 V8192": (2, 128, 64, 32, 8192),
           "L4 d256 T128 B16 V8192": (4, 256, 128, 16, 8192),
           "L12 d768 T512 B8 V50257": (12, 768, 512, 8, 50257)}
MODES = {"eager": "torch eager", "compile": "torch.compile", "reduce-overhead": "reduce-overhead"}
OPTIMIZERS = {"default": "AdamW", "fused": "AdamW fused"}
WARMUP, PROFILED = 5, 3


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.heads = d // 64
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, 64).transpose(1, 2) for z in self.c_attn(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc, self.gelu, self.c_proj = nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1, self.attn, self.ln_2, self.mlp = nn.LayerNorm(d), Attention(d), nn.LayerNorm(d), Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, layers, d, t, v):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(v, d), nn.Embedding(t, d)
        self.h = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, v, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1), device=ids.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_step(config, precision, mode, optimizer, device):
    layers, d, t, b, v = CONFIGS[config]
    torch.manual_seed(0)
    model = Gpt(layers, d, t, v).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            fused=True if optimizer == "fused" else None)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, v, (b, t), generator=g).to(device)
    targets = torch.randint(0, v, (b, t), generator=g).to(device)
    fwd = model if mode == "eager" else torch.compile(model, mode=None if mode == "compile" else mode)

    def step():
        if mode == "reduce-overhead":
            # a new iteration: the graphs may reuse the previous step's outputs' memory
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = fwd(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def timed(step):
    t0 = time.perf_counter()
    loss = step()
    return (time.perf_counter() - t0) * 1e3, loss


def kernel_counts(step):
    """(device kernels, CUDA graph launches) per step over PROFILED steps."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            step()
    events = prof.events()
    kernels = sum(e.device_type == DeviceType.CUDA and not e.is_user_annotation
                  and not e.name.startswith(("Memcpy", "Memset")) for e in events)
    graphs = sum(e.name.startswith("cudaGraphLaunch") for e in events)
    return kernels / PROFILED, graphs / PROFILED


def graph_pool_bytes():
    """Bytes of the segments of private memory pools: the CUDA graphs'
    memory, which max_memory_allocated does not see while graphs replay."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] != (0, 0))


def self_device_us(event):
    """Self device time in us (`self_cuda_time_total` before torch 2.4)."""
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)


def kernel_table(step, limit):
    """The `limit` kernels with the most self device time, ms per step."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            step()
    rows = sorted(((e.key, e.count / PROFILED, self_device_us(e) / 1e3 / PROFILED)
                   for e in prof.key_averages() if self_device_us(e) > 0), key=lambda r: -r[2])
    total = sum(r[2] for r in rows)
    lines = [f"  kernels: {total:.3f} ms of device time per step"]
    lines += [f"  {ms:8.4f} ms {calls:6.1f}x  {name[:110]}" for name, calls, ms in rows[:limit]]
    return "\n".join(lines)


def measure(step, steps, cuda, table=0):
    pools = graph_pool_bytes() if cuda else 0
    first, _ = timed(step)
    for _ in range(WARMUP - 1):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, losses = zip(*(timed(step) for _ in range(steps)))
    row = {"median_ms": statistics.median(times), "first_ms": first, "loss_first": losses[0], "loss_last": losses[-1]}
    if cuda:
        row["graph_pool_mib"] = (graph_pool_bytes() - pools) / 2 ** 20
        row["peak_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20 + row["graph_pool_mib"]
        row["kernels_per_step"], row["graph_launches_per_step"] = kernel_counts(step)
        if table:
            print(kernel_table(step, table), flush=True)
    return row


def graph_note(row, compiled):
    """What the profiler's count means for a reduce-overhead row, judged
    against the torch.compile row of the same configuration (`compiled`)."""
    g = row["graph_launches_per_step"]
    if not g:
        return "the profiler saw no CUDA graph launch"
    note = f"peak includes {row['graph_pool_mib']:.0f} MiB of CUDA graph pools; {g:g} graph launches per step"
    if compiled is None or "kernels_per_step" not in compiled:
        return note + ", no torch.compile row to tell whether kernels inside graphs were counted"
    if row["kernels_per_step"] < compiled["kernels_per_step"] / 2:
        return note + (f": the profiler did not report kernels inside graphs (torch.compile: "
                       f"{compiled['kernels_per_step']:g}), the count is kernels outside them")
    return note + ", kernels inside graphs counted"


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def tables(rows):
    keys = list(dict.fromkeys((r["config"], r["precision"]) for r in rows))
    out = []
    for config, precision in keys:
        group = [r for r in rows if (r["config"], r["precision"]) == (config, precision)]
        out += ["", f"### {config}, {precision}", "",
                "| implementation | median ms | first ms | peak MiB | kernels per step | loss first → last | note |",
                "|---|---|---|---|---|---|---|"]
        for r in group:
            if "error" in r:
                out.append(f"| {r['impl']} | - | - | - | - | - | failed: {r['error']} |")
                continue
            kernels = r.get("kernels_per_step", r.get("launches_per_step"))
            note = r.get("note", "")
            if "input_copies_per_step" in r:
                note = f"input copies per step {r['input_copies_per_step']:g} {note}".strip()
            out.append(f"| {r['impl']} | {fmt(r['median_ms'], '.3f')} | {fmt(r.get('first_ms'), '.0f')} | "
                       f"{fmt(r.get('peak_mib'), '.1f')} | {fmt(None if kernels is None else round(kernels, 1), 'g')} | "
                       f"{fmt(r.get('loss_first'), '.4f')} → {fmt(r.get('loss_last'), '.4f')} | {note} |")
        torch_rows = [r for r in group if not r["impl"].startswith("kiln") and "error" not in r]
        fastest = min(torch_rows, key=lambda r: r["median_ms"], default=None)
        smallest = min((r for r in torch_rows if "peak_mib" in r), key=lambda r: r["peak_mib"], default=None)
        for k in (r for r in group if r["impl"].startswith("kiln") and "error" not in r and fastest):
            line = f"{k['impl']} / best torch = {k['median_ms'] / fastest['median_ms']:.2f}x median ms ({fastest['impl']})"
            if smallest and k.get("peak_mib"):
                line += f", {k['peak_mib'] / smallest['peak_mib']:.2f}x peak MiB ({smallest['impl']})"
            out += ["", line]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kiln", nargs="?", help="kiln's JSON lines (may be missing or empty)")
    p.add_argument("--markdown")
    p.add_argument("--only", default="")
    p.add_argument("--precisions", default="f32,bf16")
    p.add_argument("--modes", default="eager,compile,reduce-overhead")
    p.add_argument("--optimizers", default="default,fused")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--kernel-table", type=int, default=0)
    a = p.parse_args()
    rows = []
    if a.kiln and os.path.exists(a.kiln):
        rows += [json.loads(line) for line in open(a.kiln) if line.strip()]
    cuda = a.device == "cuda"
    print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}", flush=True)
    for config in (c for c in CONFIGS if a.only in c):
        for precision in a.precisions.split(","):
            for optimizer in a.optimizers.split(","):
                for mode in a.modes.split(","):
                    row = {"config": config, "precision": precision,
                           "impl": f"{MODES[mode]}, {OPTIMIZERS[optimizer]}"}
                    try:
                        row.update(measure(make_step(config, precision, mode, optimizer, a.device), a.steps, cuda,
                                           a.kernel_table))
                        if cuda and mode == "reduce-overhead":
                            compiled = [r for r in rows if r["impl"] == f"torch.compile, {OPTIMIZERS[optimizer]}"
                                        and (r["config"], r["precision"]) == (config, precision)]
                            row["note"] = graph_note(row, compiled[0] if compiled else None)
                    except Exception as e:  # a failed row is a row with its reason
                        row["error"] = " ".join(f"{type(e).__name__}: {e}".replace("|", "/").split())[:200]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    gc.collect()
                    torch._dynamo.reset()
                    if cuda:
                        torch.cuda.empty_cache()
    text = tables(rows)
    print(text)
    if a.markdown:
        open(a.markdown, "w").write(text.lstrip("\n") + "\n")


if __name__ == "__main__":
    main()
