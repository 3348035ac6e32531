"""Sums ncu's gpu__time_duration per kernel over the profiled calls (3)."""
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]
k, m, v = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
tot = collections.defaultdict(lambda: [0, 0.0])
for r in rows[hdr + 1:]:
    if len(r) > v and r[m] == "gpu__time_duration.sum":
        name = r[k].split("(")[0][:60]
        val = float(r[v].replace(",", ""))
        tot[name][0] += 1
        tot[name][1] += val
calls = 3
allns = sum(t for _, t in tot.values())
n = sum(c for c, _ in tot.values())
print(f"{sys.argv[2]}: {n / calls:.0f} kernels per call, {allns / calls / 1e3:.1f} us of kernels per call")
for name, (c, t) in sorted(tot.items(), key=lambda x: -x[1][1])[:10]:
    print(f"  {name:<60} {c / calls:6.1f} x {t / c / 1e3:7.2f} us = {t / calls / 1e3:8.1f} us")
