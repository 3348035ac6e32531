"""PyTorch's side of benches/gpu_amp.rs (issue 22, mixed precision), written
as PyTorch users write AMP: the model is an nn.Module with f32 parameters,
the forward pass and the loss run under torch.autocast(device_type="cuda",
dtype=...), f16 steps go through torch.amp.GradScaler (scale, backward,
step, update), bf16 steps without it, the optimizer is torch.optim.AdamW
(SGD for the 16 blocks) with its default implementation. f32 rows are the
same step without autocast. TF32 off, as in kiln.

Each in eager, torch.compile and torch.compile(mode="reduce-overhead");
the compiled function is the forward pass and loss (what users wrap), the
backward pass, the scaler and the optimizer step run as PyTorch runs them.
One call = the whole step including reading the loss with .item(); CUDA
events around each call, median of 50 after 5 warm-ups; peak allocated
device memory over the row (torch.cuda.max_memory_allocated after a
reset), which like kiln's peak includes parameters, optimizer state and
the step's temporaries.

    python3 benches/torch_amp.py [kiln_amp.jsonl] [--markdown table.md] [--all] [--only SUBSTRING] [--modes eager,compile,reduce-overhead]

With kiln's JSON lines (KILN_BENCH_OUT of benches/gpu_amp.rs) it prints one
table of every implementation.
"""
import json
import statistics
import sys
import time

import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
D, HIDDEN, BLOCKS = 256, 1024, 16


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)


def cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(128, 10)).to(dev)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))


def blocks():
    return nn.Sequential(*[Block() for _ in range(BLOCKS)]).to(dev)


def labels(n):
    return torch.tensor([(i * 7) % 10 for i in range(n)], device=dev)


def workloads(all_rows):
    rows = []
    for batch in (512, 4096):
        rows.append((f"train step: MLP 784-1024x3-10, AdamW, cross-entropy, batch {batch}", mlp,
                     lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), nn.functional.cross_entropy,
                     lambda b=batch: (torch.randn(b, 784, device=dev), labels(b))))
    if all_rows:
        rows.append(("train step: digits CNN (conv16-conv32-linear), AdamW, cross-entropy, batch 256", cnn,
                     lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), nn.functional.cross_entropy,
                     lambda: (torch.randn(256, 1, 8, 8, device=dev), labels(256))))
        rows.append(("train step: 16 blocks x + fc2(gelu(fc1(layer_norm(x)))), SGD, MSE, x f32[64,256]", blocks,
                     lambda m: torch.optim.SGD(m.parameters(), lr=1e-3), nn.functional.mse_loss,
                     lambda: (torch.randn(64, D, device=dev), torch.randn(64, D, device=dev))))
    return rows


PRECISIONS = [("f32", None), ("bf16 autocast", torch.bfloat16), ("f16 autocast + GradScaler", torch.float16)]
MODES = {"eager": ("torch eager", lambda f: f),
         "compile": ("torch.compile", lambda f: torch.compile(f)),
         "reduce-overhead": ("torch.compile reduce-overhead", lambda f: torch.compile(f, mode="reduce-overhead"))}


def make_step(make, make_opt, loss_fn, data, dtype, wrap):
    torch.manual_seed(1)
    m = make()
    opt = make_opt(m)
    inp, tgt = data()
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None

    def forward(a, b):
        if dtype is None:
            return loss_fn(m(a), b)
        with torch.autocast(device_type="cuda", dtype=dtype):
            return loss_fn(m(a), b)

    fwd = wrap(forward)

    def step():
        loss = fwd(inp, tgt)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def measure(step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    first_loss = step()
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(5):
        step()
    times = []
    last = None
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        last = step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return first, statistics.median(times), torch.cuda.max_memory_allocated() / 2 ** 20, first_loss, last


def main():
    args = sys.argv[1:]

    def option(name):
        if name in args:
            i = args.index(name)
            v = args[i + 1]
            del args[i:i + 2]
            return v
        return None
    md = option("--markdown")
    only = option("--only")
    modes = (option("--modes") or "eager,compile,reduce-overhead").split(",")
    all_rows = "--all" in args
    if all_rows:
        args.remove("--all")
    rows = []
    if args:
        rows += [json.loads(l) for l in open(args[0]) if l.strip()]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name, make, make_opt, loss_fn, data in workloads(all_rows):
        if only and only not in name:
            continue
        for pname, dtype in PRECISIONS:
            for mode in modes:
                label, wrap = MODES[mode]
                imp = f"{label} {pname}"
                try:
                    first, ms, peak, l0, l1 = measure(make_step(make, make_opt, loss_fn, data, dtype, wrap))
                    rows.append({"impl": imp, "workload": name, "first_ms": first, "median_ms": ms,
                                 "peak_mib": peak, "loss_first": l0, "loss_last": l1})
                except Exception as e:  # a failed mode is a row with its reason
                    rows.append({"impl": imp, "workload": name, "error": f"{type(e).__name__}: {e}"[:200]})
                torch._dynamo.reset()
                print(rows[-1], flush=True)
    names = []
    for r in rows:
        if r["workload"] not in names:
            names.append(r["workload"])
    lines = ["| workload | implementation | median ms | peak MiB | first call ms | loss first -> last |",
             "|---|---|---|---|---|---|"]
    for n in names:
        for r in rows:
            if r["workload"] != n:
                continue
            if "error" in r:
                lines.append(f"| {n} | {r['impl']} | - | - | - | failed: {r['error']} |")
            else:
                loss = lambda v: "nan" if v is None or v != v else f"{v:.4f}"
                lines.append(f"| {n} | {r['impl']} | {r['median_ms']:.4f} | {r['peak_mib']:.0f} | "
                             f"{r.get('first_ms', 0):.1f} | {loss(r.get('loss_first'))} -> {loss(r.get('loss_last'))} |")
    text = "\n".join(lines)
    print(text)
    if md:
        open(md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
