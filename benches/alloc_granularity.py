"""How much device memory cuMemAlloc really takes for blocks of a given
size: allocates N blocks of each size and reads cuMemGetInfo before and
after (the driver's own sub-allocation and page rounding, which kiln's
caching allocator's size classes sit on top of).

    python3 benches/alloc_granularity.py
"""
import ctypes

cuda = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


check(cuda.cuInit(0), "cuInit")
dev = ctypes.c_int()
check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
check(cuda.cuCtxSetCurrent(ctx), "set current")


def used():
    free, total = u64(), u64()
    check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return total.value - free.value


N = 64
for size in [512 << 10, 1 << 20, (1 << 20) + 4096, 1_179_648, 2_359_296, 3 << 20, 7_077_888, 9_437_184]:
    before = used()
    ptrs = []
    for _ in range(N):
        p = u64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)), "cuMemAlloc")
        ptrs.append(p)
    after = used()
    for p in ptrs:
        check(cuda.cuMemFree_v2(p), "cuMemFree")
    per = (after - before) / N
    print(f"block {size:>10} B: {per:>12.0f} B of device memory each ({per / size:.3f}x)")
