"""PyTorch DDP baseline for benches/gpu_ddp.rs (issue 24): the MLP
784-1024x3-10 AdamW step (cross-entropy), global batch 8192, one process per
GPU over NCCL (torch.distributed, mp.spawn), TF32 off, the model an
nn.Module with parameters wrapped in DistributedDataParallel (bucketed,
overlapped all-reduce from autograd hooks). Also the one-GPU step at the
whole batch. Median of 30 wall-clock steps after 5 warm-ups, each timed to
the loss's .item(). `--bf16` runs under torch.autocast(bfloat16).
The ZeRO row (issue 37, next to kiln's ZeRO-1 row) is the same DDP model
stepped by torch.distributed.optim.ZeroRedundancyOptimizer wrapping AdamW
(each rank owns whole parameters and broadcasts them after its step), as
its documentation writes it; both rows also report rank 0's optimizer
state (the bytes of the tensors in its optimizer's `state`).

    python3 benches/torch_ddp.py [--bf16]
    python3 benches/torch_ddp.py --gpt [--bf16]

--gpt is the other side of benches/gpu_ddp_gpt.rs (issue 37, item 4):
GPT-2 small's training step (benches/torch_train_gpt.py's `Gpt`, L12 d768
T512 V50257, the LM head tied to the embedding), 8 sequences per GPU,
AdamW(fused=True), eager, on one GPU and in DDP (default 25 MiB buckets)
with a process per GPU; median of 20 steps after 5 warm-ups, scaling =
N * t(1) / t(N).
"""
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer

GLOBAL = 8192
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def timed(step, steps=30):
    """The median of `steps` wall-clock step times after 5 warm-ups."""
    for _ in range(5):
        step()
    ts = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]


def make_step(model, opt, x, y, bf16):
    loss_fn = nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def state_bytes(opt):
    """Bytes of the tensors in the (local) optimizer's per-parameter state."""
    local = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    return sum(t.numel() * t.element_size() for st in local.state.values()
               for t in st.values() if torch.is_tensor(t))


def rank_main(rank, world, bf16, out, zero):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = "29534" if zero else "29533"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(mlp().cuda(rank), device_ids=[rank])
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(10 + rank)
    x = torch.randn(GLOBAL // world, 784, device="cuda", generator=g)
    y = torch.randint(0, 10, (GLOBAL // world,), device="cuda", generator=g)
    step = make_step(model, opt, x, y, bf16)
    dist.barrier()
    t = timed(step)
    ts = [None] * world
    dist.all_gather_object(ts, t)
    sizes = [None] * world
    dist.all_gather_object(sizes, state_bytes(opt))
    if rank == 0:
        out.put((max(ts), max(sizes)))
    dist.destroy_process_group()


GPT_BATCH, GPT_SHAPE = 8, (12, 768, 512, 50257)


def gpt_step(device, bf16, seed):
    """GPT-2 small, fused AdamW, a batch of GPT_BATCH random sequences."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_train_gpt import Gpt
    layers, d, t, v = GPT_SHAPE
    torch.manual_seed(0)
    model = Gpt(layers, d, t, v).to(device)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (GPT_BATCH, t), generator=g).to(device)
    targets = torch.randint(0, v, (GPT_BATCH, t), generator=g).to(device)
    return model, ids, targets


def gpt_timed(model, ids, targets, bf16):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = model(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return timed(step, steps=20)


def gpt_rank(rank, world, bf16, out):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = "29535"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    model, ids, targets = gpt_step(f"cuda:{rank}", bf16, 10 + rank)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    dist.barrier()
    t = gpt_timed(model, ids, targets, bf16)
    ts = [None] * world
    dist.all_gather_object(ts, t)
    if rank == 0:
        out.put(max(ts))
    dist.destroy_process_group()


def gpt_main(bf16):
    prec = "bf16" if bf16 else "f32"
    tokens = GPT_BATCH * GPT_SHAPE[2]
    world = torch.cuda.device_count()
    t1 = gpt_timed(*gpt_step("cuda:0", bf16, 10), bf16)
    print(f"torch {prec} GPT-2 small 1 GPU eager: {t1 * 1e3:.3f} ms/step, {tokens / t1:.0f} tokens/s", flush=True)
    torch.cuda.empty_cache()
    if world < 2:
        print(f"torch_ddp: needs 2 GPUs, {world} found")
        return
    q = mp.get_context("spawn").SimpleQueue()
    mp.spawn(gpt_rank, args=(world, bf16, q), nprocs=world, join=True)
    tn = q.get()
    print(f"torch {prec} GPT-2 small DDP {world} GPUs eager: {tn * 1e3:.3f} ms/step, {world * tokens / tn:.0f} tokens/s, scaling {world * t1 / tn:.2f}x")


def main():
    bf16 = "--bf16" in sys.argv
    if "--gpt" in sys.argv:
        return gpt_main(bf16)
    prec = "bf16" if bf16 else "f32"
    world = torch.cuda.device_count()
    model = mlp().cuda(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(GLOBAL, 784, device="cuda:0")
    y = torch.randint(0, 10, (GLOBAL,), device="cuda:0")
    t1 = timed(make_step(model, opt, x, y, bf16))
    print(f"torch {prec} 1 GPU  batch {GLOBAL}: {t1 * 1e3:.3f} ms/step, {GLOBAL / t1:.0f} samples/s")
    if world < 2:
        print(f"torch_ddp: needs 2 GPUs, {world} found")
        return
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(rank_main, args=(world, bf16, q, False), nprocs=world, join=True)
    tn, dp_state = q.get()
    mib = 1 << 20
    print(f"torch {prec} DDP {world} GPUs batch {GLOBAL}: {tn * 1e3:.3f} ms/step, {GLOBAL / tn:.0f} samples/s, {t1 / tn:.2f}x one GPU, optimizer state {dp_state / mib:.2f} MiB/GPU (largest rank)")
    mp.spawn(rank_main, args=(world, bf16, q, True), nprocs=world, join=True)
    tz, zero_state = q.get()
    print(f"torch {prec} DDP {world} GPUs batch {GLOBAL} ZeroRedundancyOptimizer: {tz * 1e3:.3f} ms/step, {GLOBAL / tz:.0f} samples/s, {tz / tn:.2f}x DDP's step time, optimizer state {zero_state / mib:.2f} MiB/GPU (largest rank; {zero_state / dp_state:.3f} of DDP's)")


if __name__ == "__main__":
    main()
