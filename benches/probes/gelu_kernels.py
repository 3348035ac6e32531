"""GPT-2 small's GELU kernels timed alone on the GPU (CuPy, NVRTC with
kiln's options, CUDA events over 20 back-to-back launches, median of 30):
the forward `gelu_tanh(x + b)` and the backward that also recomputes the
forward's output for the weight gradient, over [4096, 3072] bf16.

    python3 benches/probes/gelu_kernels.py [K ...]   # from the checkout, on the GPU machine;
                                                     # K: only variant K (and the first, the reference)

Each variant is kernel text codegen emits, or would emit; see
benches/RESULTS.md for what was kept.
"""
import sys
import cupy as cp
import numpy as np

R, C = 4096, 3072
N = R * C
OPTS = ["--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550", "-Ikernels",
        "--gpu-architecture=sm_90"]
K, CC = "0.7978846f", "0.044715f"

def loop(body, outs, ins, per=4):
    """A grid-stride loop of `per` elements a thread, as elementwise.rs writes it."""
    sig = ", ".join([f"kiln::bf16* __restrict__ out{i}" for i in range(outs)] +
                    [f"const kiln::bf16* __restrict__ in{i}" for i in range(ins)])
    loads = "\n".join(f"    const kiln::vec4<kiln::bf16> d{i}_{h} = kiln::load4(in{i} + base + {4 * h});"
                      for i in (0, 2) if i < ins for h in range(per // 4))
    decl = "\n".join(f"    kiln::vec4<kiln::bf16> o{o}_{h};" for o in range(outs) for h in range(per // 4))
    stores = "\n".join(f"    kiln::store4(out{o} + base + {4 * h}, o{o}_{h});" for o in range(outs) for h in range(per // 4))
    inner = ""
    for h in range(per // 4):
        b = body.replace("D0", f"d0_{h}").replace("D2", f"d2_{h}").replace("O0", f"o0_{h}").replace("O1", f"o1_{h}")
        inner += f"""#pragma unroll
    for (int j = 0; j < 4; ++j) {{
      const I i = base + {4 * h} + j;
{b}
    }}
"""
    return f"""#include "kiln.cuh"
extern "C" __global__ void k({sig}) {{
  typedef int I;
  const I n = {N};
  for (I base = ((I)blockIdx.x * blockDim.x + threadIdx.x) * {per}; base < n; base += (I)gridDim.x * blockDim.x * {per}) {{
{loads}
{decl}
{inner}{stores}
  }}
}}
"""

GEN_BWD = f"""      const float v8 = kiln::rnd_bf16((kiln::to_float(D0.v[j]) + kiln::to_float(in1[(i % {C})])));
      const float v11 = kiln::rnd_bf16(kiln::gelu_tanh_grad(v8, kiln::to_float(D2.v[j]), {K}, {CC}));
      const float v4 = kiln::rnd_bf16((kiln::to_float(D0.v[j]) + kiln::to_float(in1[(i % {C})])));
      const float v5 = kiln::rnd_bf16((0.5f * v4 * (1.0f + tanhf({K} * (v4 + {CC} * v4 * v4 * v4)))));
      O0.v[j] = kiln::bf16_from(v11);
      O1.v[j] = kiln::bf16_from(v5);"""
# the gradient written out with the forward's tanh argument (same association), so one tanh serves both
SHARED_BWD = f"""      const float x = kiln::rnd_bf16((kiln::to_float(D0.v[j]) + kiln::to_float(in1[(i % {C})])));
      const float t = tanhf({K} * (x + {CC} * x * x * x));
      const float g = kiln::to_float(D2.v[j]);
      const float dx = g * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * ({K} * (1.0f + 3.0f * {CC} * (x * x))));
      O0.v[j] = kiln::bf16_from(dx);
      O1.v[j] = kiln::bf16_from(0.5f * x * (1.0f + t));"""
# as generated, with the gradient's tanh argument associated as the forward's
# (`x + c * x * x * x`): the compiler then computes one tanh for both
ASSOC_BWD = GEN_BWD.replace(f"kiln::gelu_tanh_grad(v8, kiln::to_float(D2.v[j]), {K}, {CC})",
    f"(kiln::to_float(D2.v[j]) * (0.5f * (1.0f + tanhf({K} * (v8 + {CC} * v8 * v8 * v8))) + 0.5f * v8 * "
    f"(1.0f - tanhf({K} * (v8 + {CC} * v8 * v8 * v8)) * tanhf({K} * (v8 + {CC} * v8 * v8 * v8))) * "
    f"({K} * (1.0f + 3.0f * {CC} * (v8 * v8)))))")
# kiln.cuh's gradient with the forward's association, as a template
GRAD_FN = """template <typename T> __device__ __forceinline__ T gelu_tanh_grad_f(T x, T g, T k, T c) {
  const T t = tanh(k * (x + c * x * x * x));
  const T left = T(0.5) * x, right = T(1) + t;
  const T left_derivative = T(0.5) * right;
  const T tanh_derivative = T(1) - t * t;
  const T inner_derivative = k * (T(1) + T(3) * c * (x * x));
  return g * (left_derivative + left * tanh_derivative * inner_derivative);
}
"""
FN_BWD = GEN_BWD.replace("kiln::gelu_tanh_grad(", "gelu_tanh_grad_f(")
# the same with the column computed once per 4 (the row is 3072 wide: base % 3072 + j)
SHARED_COL_BWD = SHARED_BWD.replace(f"in1[(i % {C})]", "in1[col0 + j]")
GEN_FWD = f"""      const float v4 = kiln::rnd_bf16((kiln::to_float(D0.v[j]) + kiln::to_float(in1[(i % {C})])));
      const float v5 = kiln::rnd_bf16((0.5f * v4 * (1.0f + tanhf({K} * (v4 + {CC} * v4 * v4 * v4)))));
      O0.v[j] = kiln::bf16_from(v5);"""
COPY = """      O0.v[j] = D0.v[j];
      O1.v[j] = D2.v[j];"""

def with_col(src):
    return src.replace("#pragma unroll\n    for (int j", f"    const I col0 = (base) % {C};\n#pragma unroll\n    for (int j", 1)

VARIANTS = [
    ("backward as generated", loop(GEN_BWD, 2, 3), 3, OPTS),
    ("backward as generated, --fmad=true", loop(GEN_BWD, 2, 3), 3, [o for o in OPTS if o != "--fmad=false"]),
    ("backward as generated, forward's association", loop(ASSOC_BWD, 2, 3), 3, OPTS),
    ("backward, kiln.cuh's gradient in the forward's association", loop(FN_BWD, 2, 3).replace('extern "C"', GRAD_FN + 'extern "C"'), 3, OPTS),
    ("backward, one tanh", loop(SHARED_BWD, 2, 3), 3, OPTS),
    ("backward, one tanh, column once per 4", with_col(loop(SHARED_COL_BWD, 2, 3)), 3, OPTS),
    ("backward, one tanh, 8 a thread", loop(SHARED_BWD, 2, 3, 8), 3, OPTS),
    ("copy 2 in 2 out (bandwidth)", loop(COPY, 2, 3), 3, OPTS),
    ("forward as generated", loop(GEN_FWD, 1, 2), 2, OPTS),
    ("forward, --fmad=true", loop(GEN_FWD, 1, 2), 2, [o for o in OPTS if o != "--fmad=false"]),
]

def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def main():
    rng = np.random.default_rng(3)
    x = cp.asarray(bf16(rng.standard_normal((R, C), dtype=np.float32) * 2))
    b = cp.asarray(bf16(rng.standard_normal(C, dtype=np.float32) * 0.1))
    g = cp.asarray(bf16(rng.standard_normal((R, C), dtype=np.float32)))
    print(f"GELU kernels over [{R}, {C}] bf16, 256 threads a block:")
    ref = {}
    only = sys.argv[1:]
    for n, (name, src, ins, opts) in enumerate(VARIANTS):
        if only and str(n) not in only and n != 0:
            continue
        try:
            fn = cp.RawKernel(src, "k", options=tuple(opts))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"  {name:<44} failed: {str(e)[:400]}")
            continue
        outs = [cp.zeros((R, C), dtype=cp.uint16) for _ in range(1 if name.startswith("forward") else 2)]
        per = 8 if "8 a thread" in name else 4
        grid = (min((N // per + 255) // 256, 65536),)
        args = tuple(outs) + (x, b, g)[:ins]
        fn(grid, (256,), args)
        cp.cuda.Device().synchronize()
        s, e = cp.cuda.Event(), cp.cuda.Event()
        ts = []
        for _ in range(30):
            s.record()
            for _ in range(20):
                fn(grid, (256,), args)
            e.record()
            e.synchronize()
            ts.append(cp.cuda.get_elapsed_time(s, e) / 20)
        us = float(np.median(ts)) * 1000
        kind = "forward" if name.startswith("forward") else "backward"
        got = [cp.asnumpy(o) for o in outs]
        note = ""
        if kind in ref and "copy" not in name:
            diff = [float((a != r).mean()) for a, r in zip(got, ref[kind])]
            note = "  bits differing " + ", ".join(f"{d:.4f}" for d in diff)
        elif "copy" not in name:
            ref[kind] = got
        print(f"  {name:<44} {us:7.2f} us{note}")

if __name__ == "__main__":
    main()
