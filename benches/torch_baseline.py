"""PyTorch's side of the GPU table (benches/gpu.rs is kiln's side).

The same workloads as benches/gpu.rs, each as PyTorch eager, torch.compile
and torch.compile(mode="reduce-overhead"): first-call wall time (compile
included), then 5 warm-up calls, then the median of 50 calls timed with CUDA
events, the peak of allocated device memory, and GB/s (or TFLOP/s) against
the device's measured copy ceiling (a 1 GiB device-to-device copy, bytes
read plus written). TF32 is off, as in kiln.

    python3 benches/torch_baseline.py [kiln.jsonl] [--markdown table.md]

With kiln's JSON lines (KILN_BENCH_OUT of benches/gpu.rs) it prints one
table of all four implementations.
"""
import json
import statistics
import sys
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"


def copy_ceiling():
    x = torch.empty(1 << 28, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    ms = statistics.median(times)
    return 2 * x.numel() * 4 / (ms * 1e-3) / 1e9


N, ROWS, COLS, D, HIDDEN, BLOCKS = 1 << 26, 8192, 4096, 256, 1024, 16


def workloads():
    g = torch.Generator(device=dev).manual_seed(1)
    rn = lambda *s, dtype=torch.float32: torch.randn(*s, device=dev, dtype=dtype, generator=g)
    out = []
    x = rn(N)
    out.append(("elementwise tanh(x*1.5+0.5)*sigmoid(x)+x*x, f32[2^26]", 2 * 4 * N, 0,
                lambda x: torch.tanh(x * 1.5 + 0.5) * torch.sigmoid(x) + x * x, (x,)))
    x = rn(ROWS, COLS)
    out.append(("softmax, last dim of f32[8192,4096]", 2 * 4 * ROWS * COLS, 0, lambda x: torch.softmax(x, 1), (x,)))
    w, b = rn(COLS), rn(COLS)
    out.append(("layer norm (weight, bias), f32[8192,4096]", 2 * 4 * ROWS * COLS, 0,
                lambda x, w, b: torch.nn.functional.layer_norm(x, (COLS,), w, b, 1e-5), (x, w, b)))
    # As users write it: the blocks are an nn.Module whose weights are
    # parameters (inference: no gradients), only x is an argument. With the
    # 96 weights as call arguments, reduce-overhead copies all of them into
    # its graph's static inputs every call (0.652 ms instead of 0.498 ms).
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(D)
            self.fc1, self.fc2 = torch.nn.Linear(D, HIDDEN), torch.nn.Linear(HIDDEN, D)

        def forward(self, x):
            return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))

    blocks = torch.nn.Sequential(*[Block() for _ in range(BLOCKS)]).to(dev).requires_grad_(False)
    out.append(("16 blocks x + fc2(gelu(fc1(layer_norm(x)))), d=256, hidden 1024, x f32[64,256]",
                4 * (BLOCKS * (2 * D * HIDDEN + HIDDEN + 3 * D) + 2 * 64 * D), 0, blocks, (rn(64, D),)))
    cx, w1, w2 = rn(32, 64, 56, 56), rn(64, 64, 3, 3) * 0.05, rn(64, 64, 3, 3) * 0.05
    conv = lambda x, a, b: torch.relu(x + torch.nn.functional.conv2d(torch.relu(torch.nn.functional.conv2d(x, a, padding=1)), b, padding=1))
    out.append(("conv block relu(x + conv2(relu(conv1(x)))), 3x3, 64 ch, x f32[32,64,56,56]",
                4 * (2 * 32 * 64 * 56 * 56 + 2 * 64 * 64 * 9), 0, conv, (cx, w1, w2)))
    a, bb = rn(8192, 8192, dtype=torch.bfloat16), rn(8192, 8192, dtype=torch.bfloat16)
    out.append(("matmul 8192^3 bf16", 0, 2 * 8192 ** 3, lambda a, b: a @ b, (a, bb)))
    return out


def measure(fn, args):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
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
    rows = []
    if args:
        for line in open(args[0]):
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    ceiling = copy_ceiling()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, copy ceiling {ceiling:.0f} GB/s")
    for name, nbytes, flops, fn, inputs in workloads():
        for impl, f in [("torch eager", fn), ("torch.compile", torch.compile(fn)),
                        ("torch.compile reduce-overhead", torch.compile(fn, mode="reduce-overhead"))]:
            try:
                first, ms, peak = measure(f, inputs)
            except Exception as e:  # a failed mode is a row with its reason
                print(f"{impl} on {name}: {type(e).__name__}: {e}", file=sys.stderr)
                rows.append({"impl": impl, "workload": name, "error": type(e).__name__})
                continue
            rows.append({"impl": impl, "workload": name, "first_ms": first, "median_ms": ms, "peak_mib": peak,
                         "gbs": nbytes / (ms * 1e-3) / 1e9 if nbytes else 0,
                         "tflops": flops / (ms * 1e-3) / 1e12 if flops else 0})
        torch._dynamo.reset()
    lines = [f"copy ceiling (device-to-device, read+write): {ceiling:.0f} GB/s", "",
             "| workload | implementation | first call ms | median ms | peak MiB | GB/s (% of copy) | TFLOP/s |",
             "|---|---|---|---|---|---|---|"]
    order = ["kiln", "torch eager", "torch.compile", "torch.compile reduce-overhead"]
    names = []
    for r in rows:
        if r["workload"] not in names:
            names.append(r["workload"])
    for n in names:
        for impl in order:
            for r in rows:
                if r["workload"] == n and r["impl"] == impl:
                    if "error" in r:
                        lines.append(f"| {n} | {impl} | failed: {r['error']} | | | | |")
                        continue
                    gb = f"{r['gbs']:.0f} ({100 * r['gbs'] / ceiling:.0f}%)" if r["gbs"] else "-"
                    tf = f"{r['tflops']:.0f}" if r["tflops"] else "-"
                    lines.append(f"| {n} | {impl} | {r['first_ms']:.1f} | {r['median_ms']:.3f} | {r['peak_mib']:.0f} | {gb} | {tf} |")
    text = "\n".join(lines)
    print(text)
    if md:
        open(md, "w").write(text + "\n")


if __name__ == "__main__":
    main()
