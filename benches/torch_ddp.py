"""PyTorch DDP baseline for benches/gpu_ddp.rs (issue 24): the MLP
784-1024x3-10 AdamW step (cross-entropy), global batch 8192, one process per
GPU over NCCL (torch.distributed, mp.spawn), TF32 off, the model an
nn.Module with parameters wrapped in DistributedDataParallel (bucketed,
overlapped all-reduce from autograd hooks). Also the one-GPU step at the
whole batch. Median of 30 wall-clock steps after 5 warm-ups, each timed to
the loss's .item(). `--bf16` runs under torch.autocast(bfloat16).

    python3 benches/torch_ddp.py [--bf16]
"""
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

GLOBAL = 8192
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def timed(step):
    for _ in range(5):
        step()
    ts = []
    for _ in range(30):
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


def rank_main(rank, world, bf16, out):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    model = torch.nn.parallel.DistributedDataParallel(mlp().cuda(rank), device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(10 + rank)
    x = torch.randn(GLOBAL // world, 784, device="cuda", generator=g)
    y = torch.randint(0, 10, (GLOBAL // world,), device="cuda", generator=g)
    step = make_step(model, opt, x, y, bf16)
    dist.barrier()
    t = timed(step)
    ts = [None] * world
    dist.all_gather_object(ts, t)
    if rank == 0:
        out.put(max(ts))
    dist.destroy_process_group()


def main():
    bf16 = "--bf16" in sys.argv
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
    mp.spawn(rank_main, args=(world, bf16, q), nprocs=world, join=True)
    tn = q.get()
    print(f"torch {prec} DDP {world} GPUs batch {GLOBAL}: {tn * 1e3:.3f} ms/step, {GLOBAL / tn:.0f} samples/s, {t1 / tn:.2f}x one GPU")


if __name__ == "__main__":
    main()
