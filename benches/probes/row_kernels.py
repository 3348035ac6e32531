"""Variants of two generated kernels timed alone on the GPU (CuPy, NVRTC
with kiln's options, CUDA events, median of 30): GPT-2 small's loss row
kernel over [4096, 50257] bf16 logits (rows 50264 apart, the padded LM
head) and a bias gradient's column sum of [4096, C] bf16 into f32.

    python3 benches/probes/row_kernels.py   # from the checkout, on the GPU machine

Each variant is the kernel text codegen emits, or would emit, for one
loop shape; see benches/RESULTS.md for what was kept.
"""
import sys
import cupy as cp
import numpy as np

R, C, LD = 4096, 50257, 50264
OPTS = ("--fmad=false", "--std=c++17", "-default-device", "--diag-suppress=177,128,550", "-Ikernels",
        "--gpu-architecture=sm_90")
HEAD = '#include "kiln.cuh"\n'
SIG = ("(kiln::bf16* __restrict__ out, float* __restrict__ out1, const kiln::bf16* __restrict__ in0, "
       "const kiln::i64* __restrict__ in1, const kiln::i64* __restrict__ in2, const kiln::bf16* __restrict__ in3)")
PRE = f"""  typedef int I;
  const I R = {R}, C = {C};
  const int lane = threadIdx.x % 1024;
  for (I row = (I)blockIdx.x; row < R; row += (I)gridDim.x) {{
    const I rb0 = row * {LD};
"""
OUT_BODY = """        const float v14 = (x - r8);
        const float v15 = expf(v14);
        const float v17 = (v15 * 0.5f);
        const bool v23 = (in1[row] == in2[col]);
        const float v25 = (v17 - (float)(v23));
        out[row * C + col] = kiln::bf16_from(kiln::rnd_bf16(v25));
"""
TAIL = """    const float r6 = (float)(double)(a6);
    const float r8 = (logf(r6) + r2);
    const float r11 = (r8 - kiln::to_float(in3[row]));
{out_pass}
    if (lane == 0) out1[row] = r11;
  }}
}}
"""
SIMPLE_OUT = """    for (I col = lane; col < C; col += 1024) {
        const float x = kiln::to_float(in0[rb0 + col]);
""" + OUT_BODY + "    }"
CHUNK_OUT = """    for (I c0 = lane; c0 < C; c0 += 8192)
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const I col = c0 + it * 1024;
      if (col < C) {
        const float x = kiln::to_float(in0[rb0 + col]);
""" + OUT_BODY + "      }\n    }"
LOADED_OUT = """    for (I c0 = lane; c0 < C; c0 += {step}) {{
      float xs[{n}];
#pragma unroll
      for (int it = 0; it < {n}; ++it) {{ const I col = c0 + it * 1024; xs[it] = col < C ? kiln::to_float(in0[rb0 + col]) : 0.f; }}
#pragma unroll
      for (int it = 0; it < {n}; ++it) {{
        const I col = c0 + it * 1024;
        if (col < C) {{
        const float x = xs[it];
""" + OUT_BODY.replace("{", "{{").replace("}", "}}") + "        }}\n      }}\n    }}"

def three_pass(out_pass):
    return PRE + """    float a2 = (-kiln::inf_f32());
    for (I col = lane; col < C; col += 1024) a2 = kiln::Max()(a2, kiln::to_float(in0[rb0 + col]));
    a2 = kiln::group_reduce<1024>(a2, kiln::Max());
    const float r2 = a2;
    double a6 = -0.0;
    for (I col = lane; col < C; col += 1024) a6 += (double)expf(kiln::to_float(in0[rb0 + col]) - r2);
    a6 = kiln::group_reduce<1024>(a6, kiln::Sum());
""" + TAIL.format(out_pass=out_pass)

ONLINE_BRANCH = PRE + """    float a2 = (-kiln::inf_f32());
    double a6 = -0.0;
    for (I c0 = lane; c0 < C; c0 += 8192)
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const I col = c0 + it * 1024;
      if (col < C) {
        const float x = kiln::to_float(in0[rb0 + col]), mx = kiln::Max()(a2, x);
        if (mx != a2) { a6 *= (double)expf(a2 - mx); a2 = mx; }
        if (x != (-kiln::inf_f32())) a6 += (double)expf(x - a2);
      }
    }
    const float r2 = kiln::group_reduce<1024>(a2, kiln::Max());
    a6 *= (double)expf(a2 - r2);
    a6 = kiln::group_reduce<1024>(a6, kiln::Sum());
"""

def online_loaded(n, out_pass, float_chunk=True):
    acc = "float cs = 0.f;" if float_chunk else "double cs = 0.0;"
    add = "cs += t;" if float_chunk else "cs += (double)t;"
    return PRE + f"""    float a2 = (-kiln::inf_f32());
    double a6 = -0.0;
    for (I c0 = lane; c0 < C; c0 += {n * 1024}) {{
      float xs[{n}];
#pragma unroll
      for (int it = 0; it < {n}; ++it) {{ const I col = c0 + it * 1024; xs[it] = col < C ? kiln::to_float(in0[rb0 + col]) : (-kiln::inf_f32()); }}
      float cm = xs[0];
#pragma unroll
      for (int it = 1; it < {n}; ++it) cm = kiln::Max()(cm, xs[it]);
      const float mx = kiln::Max()(a2, cm);
      a6 *= (double)(mx == a2 ? 1.f : expf(a2 - mx));
      a2 = mx;
      {acc}
#pragma unroll
      for (int it = 0; it < {n}; ++it) {{ const float t = xs[it] == (-kiln::inf_f32()) ? 0.f : expf(xs[it] - mx); {add} }}
      a6 += (double)cs;
    }}
    const float r2 = kiln::group_reduce<1024>(a2, kiln::Max());
    a6 *= (double)(a2 == r2 ? 1.f : expf(a2 - r2));
    a6 = kiln::group_reduce<1024>(a6, kiln::Sum());
""" + TAIL.format(out_pass=out_pass)

LOSS = {
    "3-pass (before)": three_pass(SIMPLE_OUT),
    "online, branch, chunk 8 (call 1)": ONLINE_BRANCH + TAIL.format(out_pass=CHUNK_OUT),
    "online, branch, simple out": ONLINE_BRANCH + TAIL.format(out_pass=SIMPLE_OUT),
    "online loaded 8, loaded out 8": online_loaded(8, LOADED_OUT.format(step=8192, n=8)),
    "online loaded 4, loaded out 4": online_loaded(4, LOADED_OUT.format(step=4096, n=4)),
    "online loaded 8, simple out": online_loaded(8, SIMPLE_OUT),
    "online loaded 8 (double), loaded out 8": online_loaded(8, LOADED_OUT.format(step=8192, n=8), False),
    "online loaded 16, loaded out 8": online_loaded(16, LOADED_OUT.format(step=8192, n=8)),
    "online loaded 8, simple out, arange inline": online_loaded(8, SIMPLE_OUT.replace("in2[col]", "(kiln::i64)col")),
}

def time_kernel(fn, grid, block, args, reps=30):
    fn(grid, block, args)
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps):
        s.record()
        fn(grid, block, args)
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    return float(np.median(ts))

def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

def loss():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((R, LD), dtype=np.float32) * 2
    t = rng.integers(0, C, R)
    d_in0 = cp.asarray(bf16(x))
    d_in1 = cp.asarray(t.astype(np.int64))
    d_in2 = cp.arange(C, dtype=cp.int64)
    d_in3 = cp.asarray(bf16(x[np.arange(R), t]))
    ref = None
    print(f"loss row kernel [{R}, {C}] bf16 (rows {LD} apart), 1024 threads a row:")
    for name, body in LOSS.items():
        src = HEAD + 'extern "C" __global__ void k' + SIG + " {\n" + body
        try:
            fn = cp.RawKernel(src, "k", options=OPTS)
            out = cp.zeros((R, C), dtype=cp.uint16)
            out1 = cp.zeros(R, dtype=cp.float32)
            ms = time_kernel(fn, (R,), (1024,), (out, out1, d_in0, d_in1, d_in2, d_in3))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"  {name:<44} failed: {str(e)[:300]}")
            continue
        o1 = cp.asnumpy(out1)
        if ref is None:
            ref = (o1, cp.asnumpy(out[:4]))
        dl = np.abs(o1 - ref[0]).max()
        dg = (cp.asnumpy(out[:4]) != ref[1]).mean()
        print(f"  {name:<44} {ms * 1000:8.1f} us   loss max diff {dl:.2e}, grad bits differing {dg:.4f}")

def columns(cols, chunks, warps, unroll, reps=30, vec=1, dtype="bf16", launches=20):
    """One column-sum kernel, timed over `launches` back-to-back launches
    (the launch cost amortized; the kernel resets its counters itself).
    `vec` adjacent columns a lane (one vector load), `unroll` rows loaded
    together (0: one at a time)."""
    span = 32 * vec
    tiles = (cols + span - 1) // span
    per = (R + chunks - 1) // chunks
    ty = "kiln::bf16" if dtype == "bf16" else "float"
    conv = "kiln::to_float" if dtype == "bf16" else ""
    if vec == 1:
        load1 = lambda r: f"(double)({conv}(in0[{r} * {cols} + c]))"
        body = f"acc[0] = acc[0] + {load1('r')};"
    else:
        # a vector of `vec` elements: bf16 x2 = 4 bytes, x4 = 8; f32 x2 = 8, x4 = 16
        nbytes = vec * (2 if dtype == "bf16" else 4)
        vt = {4: "unsigned", 8: "uint2", 16: "uint4"}[nbytes]
        body = f"const {vt} w = *reinterpret_cast<const {vt}*>(&in0[r * {cols} + c]);\n"
        body += f"      const {ty}* e = reinterpret_cast<const {ty}*>(&w);\n"
        for j in range(vec):
            body += f"      acc[{j}] = acc[{j}] + (double)({conv}(e[{j}]));\n"
    if unroll:
        loop = f"""  if (c < {cols}) {{
    for (I r0 = chunk * {per} + warp; r0 < r_end; r0 += {warps * unroll}) {{
      float v[{unroll}];
#pragma unroll
      for (int u = 0; u < {unroll}; ++u) {{ const I r = r0 + u * {warps}; v[u] = r < r_end ? {conv}(in0[r * {cols} + c]) : 0.f; }}
#pragma unroll
      for (int u = 0; u < {unroll}; ++u) if (r0 + u * {warps} < r_end) acc[0] = acc[0] + (double)(v[u]);
    }}
  }}"""
    else:
        loop = f"""  if (c < {cols})
    for (I r = chunk * {per} + warp; r < r_end; r += {warps}) {{
      {body}
    }}"""
    src = HEAD + f"""extern "C" __global__ void k(float* __restrict__ out, double* __restrict__ ws, unsigned* __restrict__ counts, const {ty}* __restrict__ in0) {{
  typedef int I;
  __shared__ double part[{warps}][{span}];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const I tile = (I)blockIdx.x % {tiles}, chunk = (I)blockIdx.x / {tiles};
  const I c = tile * {span} + lane * {vec}, r_end = chunk * {per} + {per} < {R} ? chunk * {per} + {per} : (I){R};
  double acc[{vec}];
  for (int j = 0; j < {vec}; ++j) acc[j] = -0.0;
{loop}
  for (int j = 0; j < {vec}; ++j) part[warp][lane * {vec} + j] = acc[j];
  __syncthreads();
  for (int cc = threadIdx.x; cc < {span}; cc += blockDim.x) {{
    if (tile * {span} + cc >= {cols}) break;
    double t = part[0][cc];
    for (int w = 1; w < {warps}; ++w) t = t + part[w][cc];
    ws[chunk * {cols} + tile * {span} + cc] = t;
  }}
  __threadfence();
  __syncthreads();
  __shared__ unsigned ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(&counts[tile], 1u);
  __syncthreads();
  if (ticket != {chunks - 1}u) return;
  __threadfence();
  for (int cc = threadIdx.x; cc < {span}; cc += blockDim.x) {{
    const I col = tile * {span} + cc;
    if (col >= {cols}) break;
    double t = __ldcg(&ws[col]);
    for (int x = 1; x < {chunks}; ++x) t = t + __ldcg(&ws[x * {cols} + col]);
    out[col] = (float)t;
  }}
  if (threadIdx.x == 0) counts[tile] = 0u;
}}
"""
    fn = cp.RawKernel(src, "k", options=OPTS)
    host = np.random.default_rng(2).standard_normal((R, cols), dtype=np.float32)
    x = cp.asarray(bf16(host)) if dtype == "bf16" else cp.asarray(host)
    out = cp.zeros(cols, dtype=cp.float32)
    ws = cp.zeros(chunks * cols, dtype=cp.float64)
    counts = cp.zeros(tiles, dtype=cp.uint32)
    args = (out, ws, counts, x)
    many = lambda g, b, a: [fn(g, b, a) for _ in range(launches)]
    ms = time_kernel(many, (tiles * chunks,), (warps * 32,), args, reps) / launches
    return ms, cp.asnumpy(out)

def column_sums():
    """The bias and layer-norm parameter gradients of GPT-2 small's step:
    [4096, C] in bf16 and f32, each shape's variants against the first
    (bits must match: the order of additions is the same)."""
    for dtype, shapes in (("f32", (768,)), ("bf16", (768, 2304, 3072))):
        for cols in shapes:
            nbytes = R * cols * (2 if dtype == "bf16" else 4)
            print(f"column sum [{R}, {cols}] {dtype} -> f32 ({nbytes / 1e6:.1f} MB), 20 launches back to back:")
            ref = None
            for vec in (1, 2, 4, 8):
                for chunks in (8, 16, 32, 64, 128):
                    for warps in (4, 8, 16):
                        tiles = (cols + 32 * vec - 1) // (32 * vec)
                        if tiles * chunks > 4096 or vec * (2 if dtype == "bf16" else 4) > 16 or cols % (32 * vec):
                            continue
                        ms, out = columns(cols, chunks, warps, 0, vec=vec, dtype=dtype)
                        ref = out if ref is None else ref
                        diff = float(np.abs(out - ref).max())
                        gbs = nbytes / (ms * 1e-3) / 1e9
                        print(f"  vec {vec} chunks {chunks:>3} ({tiles * chunks:>5} blocks) warps {warps:>2}: {ms * 1000:7.2f} us {gbs:7.0f} GB/s  max diff {diff:.1e}")

if __name__ == "__main__":
    what = sys.argv[1:] or ["loss", "columns"]
    if "loss" in what:
        loss()
    if "columns" in what:
        column_sums()
