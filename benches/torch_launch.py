"""PyTorch's side of benches/gpu_launch.rs (the launch-bound rows), written
as PyTorch users write them: models are nn.Modules with parameters (so
reduce-overhead's CUDA graphs keep them in place instead of copying them
every call), inputs are call arguments, the optimizer is torch.optim with
its default implementation, TF32 off. Each workload in eager,
torch.compile and torch.compile(mode="reduce-overhead").

    python3 benches/torch_launch.py [kiln_launch.jsonl] [--markdown table.md]

Rows: an N-op chain on f32[1] one call at a time (wall time per call +
.item()); the 16 LN-MLP blocks inference (CUDA events); the MLP AdamW
step at batch 512 and the 16 blocks' SGD step (forward, backward, step,
zero_grad, .item() of the loss; CUDA events). Medians of 50 after warm-up.
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


def chain(x, n):
    y = x
    for i in range(n):
        k = i % 4
        y = y * 1.0001 if k == 0 else y + 0.001 if k == 1 else torch.sin(y) if k == 2 else y - 0.0005
    return y


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))


def blocks():
    return nn.Sequential(*[Block() for _ in range(BLOCKS)]).to(dev)


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)


def wall(f, n=50):
    for _ in range(5):
        f()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def events(f, n=50):
    for _ in range(5):
        f()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


MODES = [("torch eager", lambda f: f), ("torch.compile", lambda f: torch.compile(f)),
         ("torch.compile reduce-overhead", lambda f: torch.compile(f, mode="reduce-overhead"))]


def run(rows):
    for n in [4, 40, 400, 4000]:
        name = f"chain of {n} elementwise ops on f32[1], one call at a time"
        x = torch.tensor([0.5], device=dev)
        for impl, wrap in MODES:
            if n == 4000 and impl != "torch eager":
                rows.append({"impl": impl, "workload": name, "error": "not run (compile of 4000 ops takes minutes)"})
                continue
            try:
                f = wrap(lambda x: chain(x, n))
                ms = wall(lambda: f(x).item())
                rows.append({"impl": impl, "workload": name, "median_ms": ms})
            except Exception as e:
                rows.append({"impl": impl, "workload": name, "error": type(e).__name__})
            torch._dynamo.reset()
        print(rows[-1], flush=True)
    name = "16 blocks x + fc2(gelu(fc1(layer_norm(x)))), d=256, hidden 1024, x f32[64,256]"
    torch.manual_seed(1)
    model = blocks()
    x = torch.randn(64, D, device=dev)
    with torch.no_grad():
        for impl, wrap in MODES:
            f = wrap(model)
            rows.append({"impl": impl, "workload": name, "median_ms": events(lambda: f(x))})
            torch._dynamo.reset()
    print(rows[-3:], flush=True)
    x = torch.randn(512, 784, device=dev)
    y = torch.tensor([(i * 7) % 10 for i in range(512)], device=dev)
    t = torch.randn(64, D, device=dev)
    xb = torch.randn(64, D, device=dev)
    cases = [("train step: MLP 784-1024x3-10, AdamW, cross-entropy, batch 512", mlp,
              lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), nn.functional.cross_entropy, x, y),
             ("train step: 16 blocks x + fc2(gelu(fc1(layer_norm(x)))), SGD, MSE, x f32[64,256]", blocks,
              lambda m: torch.optim.SGD(m.parameters(), lr=1e-3), nn.functional.mse_loss, xb, t)]
    for name, make, make_opt, loss_fn, inp, tgt in cases:
        for impl, wrap in MODES:
            torch.manual_seed(1)
            m = make()
            opt = make_opt(m)
            fwd = wrap(lambda a, b: loss_fn(m(a), b))

            def step():
                loss = fwd(inp, tgt)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.item()
            try:
                rows.append({"impl": impl, "workload": name, "median_ms": events(step)})
            except Exception as e:
                rows.append({"impl": impl, "workload": name, "error": f"{type(e).__name__}: {e}"[:200]})
            torch._dynamo.reset()
        print(rows[-3:], flush=True)
    copies(rows)


def copies(rows):
    """Host time of moving an f32[512,784] batch to the GPU while a ~5 ms
    plan runs, the ways PyTorch users write it: `.to("cuda")` from pageable
    memory, and `.to("cuda", non_blocking=True)` from pinned memory (what a
    DataLoader with pin_memory=True hands over)."""
    name = "upload f32[512,784] from host memory while a 5 ms plan runs: host time of the call"
    a = torch.randn(2048, 2048, device=dev)

    def long():
        h = a
        for _ in range(16):
            h = (h @ a) * 1e-3
        return h
    long()
    torch.cuda.synchronize()
    pageable = torch.full((512, 784), 0.25)
    pinned = pageable.pin_memory()
    for impl, src, nb in [("torch eager .to(cuda)", pageable, False),
                          ("torch eager pinned .to(cuda, non_blocking)", pinned, True)]:
        idle = wall(lambda: src.to(dev, non_blocking=nb))
        torch.cuda.synchronize()
        ts = []
        for _ in range(50):
            h = long()
            t = time.perf_counter()
            x = src.to(dev, non_blocking=nb)
            ts.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
            del x, h
        rows.append({"impl": impl, "workload": name, "median_ms": statistics.median(ts),
                     "note": f"idle device {idle:.4f} ms"})
    print(rows[-2:], flush=True)


def main():
    args = sys.argv[1:]
    md = None
    if "--markdown" in args:
        i = args.index("--markdown")
        md = args[i + 1]
        del args[i:i + 2]
    rows = []
    if args:
        rows += [json.loads(l) for l in open(args[0]) if l.strip()]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    run(rows)
    names = []
    for r in rows:
        if r["workload"] not in names:
            names.append(r["workload"])
    lines = ["| workload | implementation | median ms | note |", "|---|---|---|---|"]
    for n in names:
        for r in rows:
            if r["workload"] == n:
                if "error" in r:
                    lines.append(f"| {n} | {r['impl']} | - | {r['error']} |")
                else:
                    lines.append(f"| {n} | {r['impl']} | {r['median_ms']:.4f} | {r.get('note', '')} |")
    text = "\n".join(lines)
    print(text)
    if md:
        open(md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
