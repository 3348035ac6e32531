#!/usr/bin/env python3
"""Kernel table of an ncu CSV: each kernel (by name and grid) with its
launches, mean and total time, heaviest first, and the total; the same
shape as `torch_train_gpt.py --kernel-table`, so kiln's step and
PyTorch's can be read side by side (benches/RESULTS.md, "Sixteenth
measurement").

Make the CSV with one eager step of the bench (every node launched on
its own, so ncu sees each kernel):

    ncu --clock-control none -c 600 --csv \\
        --metrics gpu__time_duration.sum,launch__registers_per_thread \\
        benches-gpu_train_gpt L12 --precisions bf16 --steps 1 --profile > step.csv
    python3 benches/ncu_table.py step.csv [--first K] [--count N] [--top M]

`--first K --count N` keep the kernels K .. K+N-1 in launch order (one
step of a run that profiled several: find its bounds with `--list`).
ncu runs kernels one at a time with caches flushed between them, so
the times are serialized and a little pessimistic against an in-situ
profiler's.
"""

import argparse
import collections
import csv
import re
import sys


def kernels(path):
    """[(name, grid, {metric: value})] in launch order."""
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if not rows:
        sys.exit(f"{path}: no ncu CSV rows (was ncu run with --csv?)")
    head = rows[0]
    ix = {k: head.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value")}
    out = collections.OrderedDict()
    for r in rows[1:]:
        k = out.setdefault(int(r[ix["ID"]]), (r[ix["Kernel Name"]], r[ix["Grid Size"]], {}))
        k[2][r[ix["Metric Name"]]] = r[ix["Metric Value"]]
    return list(out.values())


def short(name):
    """cuBLAS's long names by their layout and tile; kiln's as they are
    (the hash tells two kernels of one kind apart)."""
    m = re.search(r"(tn|nn|nt)_n_tilesize(\w+?)_stage", name)
    if m:
        return f"xmma_{m.group(1)}_{m.group(2)}"
    m = re.search(r"simt_sgemm_(\w+?)_8x4_(\w\w)", name)
    if m:
        return f"simt_sgemm_{m.group(2)}_{m.group(1)}"
    return name[:90]


def us(metrics):
    return float(metrics.get("gpu__time_duration.sum", "0").replace(",", "")) / 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=None)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--list", action="store_true", help="every kernel in launch order")
    a = p.parse_args()
    ks = kernels(a.csv)[a.first:]
    if a.count is not None:
        ks = ks[: a.count]
    if a.list:
        for i, (name, grid, m) in enumerate(ks):
            print(f"{a.first + i:5d} {us(m):9.2f} us  ({grid})  {short(name)}")
        return
    agg = collections.defaultdict(lambda: [0, 0.0])
    for name, grid, m in ks:
        key = (short(name), grid, m.get("launch__registers_per_thread", ""))
        agg[key][0] += 1
        agg[key][1] += us(m)
    total = sum(t for _, t in agg.values())
    print(f"  kernels: {total / 1e3:.3f} ms over {len(ks)} launches")
    for (name, grid, regs), (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        r = f" regs={regs}" if regs else ""
        print(f"  {t / 1e3:8.4f} ms {n:5d}x {t / n:9.2f} us  ({grid}){r}  {name}")


if __name__ == "__main__":
    main()
