"""Three linear layers that read the same input (an encoder's q, k and v
projections) as three cuBLAS GEMMs against one over the weights side by
side, timed alone on the GPU with PyTorch (CUDA events over 50
back-to-back repetitions, median of 30 such samples; TF32 off). Sizes
are BERT-base 32x128 bf16 and MiniLM-L6 64x128 f32 and bf16; the
backward's GEMMs (the input gradient and the weight gradient) too.

    python3 benches/probes/sibling_gemm.py   # on the GPU machine
"""
import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def timed(fn, reps=50, samples=30):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    times.sort()
    return times[len(times) // 2]


def case(name, rows, width, dtype):
    x = torch.randn(rows, width, device="cuda", dtype=dtype)
    ws = [torch.randn(width, width, device="cuda", dtype=dtype) * 0.02 for _ in range(3)]
    bs = [torch.randn(width, device="cuda", dtype=dtype) for _ in range(3)]
    w = torch.cat(ws, 0)
    b = torch.cat(bs, 0)
    g = torch.randn(rows, 3 * width, device="cuda", dtype=dtype)
    gs = [gi.contiguous() for gi in g.split(width, 1)]
    rounds = []
    for _ in range(2):
        three = timed(lambda: [F.linear(x, wi, bi) for wi, bi in zip(ws, bs)])
        one = timed(lambda: F.linear(x, w, b))
        cat = timed(lambda: torch.cat(ws, 0))
        dx3 = timed(lambda: sum(gi @ wi for gi, wi in zip(gs, ws)))
        dx1 = timed(lambda: g @ w)
        dw3 = timed(lambda: [gi.t() @ x for gi in gs])
        dw1 = timed(lambda: g.t() @ x)
        rounds.append((three, one, cat, dx3, dx1, dw3, dw1))
    for three, one, cat, dx3, dx1, dw3, dw1 in rounds:
        print(f"{name}: forward three {three:.2f} us, one {one:.2f} ({one / three:.2f}x), "
              f"weights concatenated {cat:.2f}; input gradient three (+ adds) {dx3:.2f}, one {dx1:.2f}; "
              f"weight gradient three {dw3:.2f}, one {dw1:.2f}")


case("BERT-base [4096, 768] bf16", 4096, 768, torch.bfloat16)
case("MiniLM-L6 [8192, 384] bf16", 8192, 384, torch.bfloat16)
case("MiniLM-L6 [8192, 384] f32", 8192, 384, torch.float32)
