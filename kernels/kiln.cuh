// kiln.cuh: the CUDA C helpers every generated kernel includes.
//
// Generated kernels (src/backends/cuda/codegen) compute in a wide type and
// store in the node's dtype, exactly as the CPU backend does (src/ir/eval.rs):
// f16/bf16 compute in float and round after every op, integers compute in
// 64 bits and wrap to their dtype, float->int casts truncate and saturate
// (NaN -> 0), comparisons with NaN are false except `ne`, max/min let NaN
// win. One difference: a row kernel adds a thread's float terms in float
// before the threads' sums in double, where the CPU sums in double
// throughout (codegen/reduction/passes.rs, partial_in_float, says what
// that costs). Nothing here includes a CUDA header: NVRTC compiles it as it is, so
// a machine needs only the driver and libnvrtc, not a toolkit.
//
// Sections: storage types and conversions, integer arithmetic, float
// helpers, Philox 4x32-10 (the same counters as src/backends/philox.rs),
// vectorized loads, and warp/block reductions. The tensor-core helpers of
// the attention kernels are in kiln_mma.cuh, compiled right after this.
#pragma once

// A function compiled once and called, never inlined: the members of a
// multi-tensor kernel (codegen/multi.rs), so that a kernel of many members
// compiles a few functions, not a copy of one at every call site. The
// emulator (emulate.h) defines it first, for g++.
#ifndef KILN_NOINLINE
#define KILN_NOINLINE __noinline__
#endif

// Shared memory sized at launch (`Kernel::shared`): the attention tile
// kernels' double-buffered tiles outgrow the 48 KiB a block may declare
// statically at head dim 128. `KILN_DYNAMIC_SHARED(T, name, count)`
// declares `T name[count]` there, 16-byte aligned. The emulator (one block
// at a time, no launch-time size) defines it first as a static array.
#ifndef KILN_DYNAMIC_SHARED
#define KILN_DYNAMIC_SHARED(T, name, count) extern __shared__ __align__(16) T name[]
#endif

namespace kiln {

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

// ---------------------------------------------------------------------------
// f16 and bf16 are stored as 16 bits; arithmetic happens in float.

struct f16 {
  unsigned short bits;
};
struct bf16 {
  unsigned short bits;
};

#ifdef KILN_EMULATE
// The CPU emulator (kernels/emulate.h): GCC's _Float16 converts with one
// correct rounding; bf16 rounds to nearest even on the float's bits.
__device__ __forceinline__ float to_float(f16 h) {
  _Float16 x;
  memcpy(&x, &h.bits, 2);
  return (float)x;
}
__device__ __forceinline__ float to_float(bf16 h) { return __uint_as_float(((u32)h.bits) << 16); }
__device__ __forceinline__ f16 f16_from(float f) {
  _Float16 x = (_Float16)f;
  f16 h;
  memcpy(&h.bits, &x, 2);
  return h;
}
__device__ __forceinline__ f16 f16_from(double d) {
  _Float16 x = (_Float16)d;
  f16 h;
  memcpy(&h.bits, &x, 2);
  return h;
}
__device__ __forceinline__ bf16 bf16_from(float f) {
  u32 u;
  memcpy(&u, &f, 4);
  bf16 h;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    h.bits = (unsigned short)((u >> 16) | 0x40);
  } else {
    h.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return h;
}
__device__ __forceinline__ bf16 bf16_from(double d) { return bf16_from((float)d); }
#else
__device__ __forceinline__ float to_float(f16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16 h) {
  return __uint_as_float(((u32)h.bits) << 16);
}
__device__ __forceinline__ f16 f16_from(float f) {
  f16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ f16 f16_from(double d) {
  f16 h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d));
  return h;
}
__device__ __forceinline__ bf16 bf16_from(float f) {
  bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ bf16 bf16_from(double d) {
  bf16 h;
  asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(h.bits) : "d"(d));
  return h;
}
#endif
// One rounding to the narrow type, kept in float (what an f16 op stores).
__device__ __forceinline__ float rnd_f16(float f) { return to_float(f16_from(f)); }
__device__ __forceinline__ float rnd_bf16(float f) { return to_float(bf16_from(f)); }

// Two roundings at once, `ra = rnd(a)` and `rb = rnd(b)`: on the GPU one
// `cvt.rn.bf16x2.f32` (`f16x2`) for both. Conversions issue at a quarter
// of float arithmetic's rate (16 a cycle per multiprocessor on sm_80 and
// sm_90), and a bf16 chain rounds after every op: BERT-base's residual add
// and layer norm over [4096, 768] bf16 took 9.9 us with one conversion a
// rounding and 8.2 in pairs (7.9 with no rounding at all; H200,
// benches/probes/layer_norm.py). Codegen pairs the roundings of two
// elements a thread computes side by side (codegen/paired.rs).
#ifdef KILN_EMULATE
__device__ __forceinline__ void rnd2_bf16(float a, float b, float& ra, float& rb) {
  ra = rnd_bf16(a);
  rb = rnd_bf16(b);
}
__device__ __forceinline__ void rnd2_f16(float a, float b, float& ra, float& rb) {
  ra = rnd_f16(a);
  rb = rnd_f16(b);
}
#else
__device__ __forceinline__ void rnd2_bf16(float a, float b, float& ra, float& rb) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));  // a in the low half
  ra = __uint_as_float(r << 16);
  rb = __uint_as_float(r & 0xffff0000u);
}
__device__ __forceinline__ void rnd2_f16(float a, float b, float& ra, float& rb) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  f16 lo, hi;
  lo.bits = (unsigned short)(r & 0xffffu);
  hi.bits = (unsigned short)(r >> 16);
  ra = to_float(lo);
  rb = to_float(hi);
}
#endif

// A float that a bf16 holds exactly (a bf16 node's compute value: every
// one is rounded) as its bits, without a conversion: its high half. NaN
// keeps its quiet bit, as the rounding left it. Only for such values: a
// double argument does not compile, so a wide sum cannot slip through.
__device__ __forceinline__ bf16 bf16_exact(float f) {
  bf16 h;
  h.bits = (unsigned short)(__float_as_uint(f) >> 16);
  return h;
}
__device__ bf16 bf16_exact(double) = delete;

__device__ __forceinline__ float nan_f32() { return __int_as_float(0x7fc00000); }
__device__ __forceinline__ double nan_f64() { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ __forceinline__ float inf_f32() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double inf_f64() { return __longlong_as_double(0x7ff0000000000000LL); }

// ---------------------------------------------------------------------------
// Float -> integer, as Rust's `as`: truncate toward zero, saturate, NaN -> 0.

__device__ __forceinline__ i64 f2i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return 9223372036854775807LL;
  if (v <= -9223372036854775808.0) return (i64)(-9223372036854775807LL - 1);
  return (i64)v;
}
__device__ __forceinline__ int f2i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return 2147483647;
  if (v <= -2147483648.0) return (int)(-2147483647 - 1);
  return (int)v;
}
__device__ __forceinline__ u8 f2u8(double v) {
  if (v != v) return 0;
  if (v >= 255.0) return 255;
  if (v <= 0.0) return 0;
  return (u8)v;
}

// ---------------------------------------------------------------------------
// Integer arithmetic in 64 bits that wraps (two's complement), never traps.

__device__ __forceinline__ i64 iadd(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i64 isub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
__device__ __forceinline__ i64 imul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
__device__ __forceinline__ i64 ineg(i64 a) { return (i64)(0ULL - (u64)a); }
__device__ __forceinline__ i64 iabs(i64 a) { return a < 0 ? ineg(a) : a; }
// Truncating division; x / 0 = 0 and MIN / -1 = MIN (wrapping).
__device__ __forceinline__ i64 idiv(i64 a, i64 b) {
  if (b == 0) return 0;
  if (b == -1) return ineg(a);
  return a / b;
}
// Wrapping power; a negative exponent gives 1/a truncated.
__device__ __forceinline__ i64 ipow(i64 a, i64 b) {
  if (b < 0) {
    if (a == 1) return 1;
    if (a == -1) return (b % 2 == 0) ? 1 : -1;
    return 0;
  }
  if (b > 4294967295LL) b = 4294967295LL;
  u64 base = (u64)a, acc = 1;
  u64 e = (u64)b;
  while (e) {
    if (e & 1) acc *= base;
    base *= base;
    e >>= 1;
  }
  return (i64)acc;
}

// ---------------------------------------------------------------------------
// NaN-propagating maximum and minimum (torch.maximum / torch.minimum).

__device__ __forceinline__ float fmaxn(float a, float b) { return (a != a || b != b) ? nan_f32() : (a > b ? a : b); }
__device__ __forceinline__ float fminn(float a, float b) { return (a != a || b != b) ? nan_f32() : (a < b ? a : b); }
__device__ __forceinline__ double fmaxn(double a, double b) { return (a != a || b != b) ? nan_f64() : (a > b ? a : b); }
__device__ __forceinline__ double fminn(double a, double b) { return (a != a || b != b) ? nan_f64() : (a < b ? a : b); }

// ---------------------------------------------------------------------------
// Activation gradients g * f'(x), term for term as PyTorch's GeluBackward
// (tanh and erf) and silu_backward compute them (src/ir/eval.rs is the
// same arithmetic on the CPU). T is float (f16, bf16 and f32 values) or
// double.
//
// One departure: the tanh GELU's gradient takes its tanh of
// `k * (x + c * x * x * x)`, the forward's expression (codegen/expr.rs)
// association and all, where PyTorch multiplies `c * (x * x * x)`. A
// backward kernel that also recomputes the forward's output (GPT-2's
// MLP, for the weight gradient) then asks for the same tanh twice and
// the compiler computes it once: 40.0 -> 31.4 us over [4096, 3072] bf16
// on an H200 (benches/probes/gelu_kernels.py). The value moves by at
// most the rounding of one product.

template <typename T> __device__ __forceinline__ T gelu_tanh_grad(T x, T g, T k, T c) {
  const T x_sq = x * x;
  const T t = tanh(k * (x + c * x * x * x));
  const T left = T(0.5) * x, right = T(1) + t;
  const T left_derivative = T(0.5) * right;
  const T tanh_derivative = T(1) - t * t;
  const T inner_derivative = k * (T(1) + T(3) * c * x_sq);
  return g * (left_derivative + left * tanh_derivative * inner_derivative);
}

// The approximate reciprocal and base-2 exponential, flushing subnormal
// results to zero: on the GPU one MUFU instruction each. `__fdividef` and
// `exp2f` add a range check and a scaling each (five instructions and
// three in SASS) for arguments and results `gelu_erf_half` never needs.
#ifdef KILN_EMULATE
__device__ __forceinline__ float rcp_ftz(float y) { return 1.0f / y; }
__device__ __forceinline__ float ex2_ftz(float a) {
  const float e = exp2f(a);
  return e < 1.17549435e-38f ? 0.0f : e;
}
#else
__device__ __forceinline__ float rcp_ftz(float y) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
}
__device__ __forceinline__ float ex2_ftz(float a) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
#endif

// The exact (erf) GELU of a value that is rounded to f16 or bf16 next:
// x * Phi(x), with Phi's tail Phi(-|x|) = erfc(|x| / sqrt 2) / 2 from
// Numerical Recipes' Chebyshev fit of erfc (`erfcc`: fractional error
// under 1.2e-7 for every z >= 0), t = 1 / (1 + z / 2):
//   erfc(z) = t * exp(-z^2 + P(t)).
// Why this form: the erf form `0.5 x (1 + erf(x / sqrt 2))` (PyTorch's,
// and kiln's f32 one) cancels in the negative tail: for x < -4 its result
// is off by more than one bf16 ulp (182 bf16 inputs, up to 255 ulps; 0
// for x < -5.5, where the exact GELU is a normal number), even with a
// correctly rounded erff.
//
// Written for the fewest instructions (19 an element in SASS, without a
// branch), since it is the heaviest part of a GEMM's GELU epilogue
// (codegen/gemm_wgmma_store.rs):
// - t from |x| directly, `1 + |x| / (2 sqrt 2)`, one FMA;
// - P's coefficients are scaled by log2(e), so the exponent is base 2,
//   and the tail's 1/2 and a factor 2^64 are in its constant: the
//   exponential of the tail's whole range [2^-127, 1] is then a normal
//   number, computed without a range check (`ex2_ftz`), and the 2^-64
//   goes back on t, exactly. The tail product is rounded once, so a
//   subnormal GELU (bf16 inputs near -13.5) is still right;
// - -z^2 log2(e) = x^2 * (-log2(e) / 2), one FMA onto P.
// Phi stays within 1e-5 relatively everywhere (the MUFU reciprocal and
// exponential are 2 ulp; the exponent's absolute error is about 2^-19
// near 64): every f16 and bf16 input gives a result within one ulp of the
// correctly rounded exact value (tests/ops/every_half.rs, on an H200 and
// the emulator). NaN gives NaN, +inf gives +inf and -inf NaN (-inf * 0),
// as the erf form does.
__device__ __forceinline__ float gelu_erf_half(float x) {
  const float t = rcp_ftz(fmaf(fabsf(x), 0.35355338f, 1.0f));
  float p = 0.2465173f;
  p = fmaf(p, t, -1.1861149f);
  p = fmaf(p, t, 2.1474745f);
  p = fmaf(p, t, -1.6377531f);
  p = fmaf(p, t, 0.40232158f);
  p = fmaf(p, t, -0.26875687f);
  p = fmaf(p, t, 0.13963005f);
  p = fmaf(p, t, 0.5397006f);
  p = fmaf(p, t, 1.4427292f);
  // log2(e) P(t) - 1 + 64.
  p = fmaf(p, t, 61.17425f);
  const float tail = (t * 5.421011e-20f) * ex2_ftz(fmaf(x * x, -0.7213475f, p));
  return x * (x >= 0.0f ? 1.0f - tail : tail);
}

template <typename T> __device__ __forceinline__ T gelu_grad(T x, T g, T frac_1_sqrt_2, T beta) {
  const T cdf = T(0.5) * (T(1) + erf(x * frac_1_sqrt_2));
  const T pdf = beta * exp(x * x * T(-0.5));
  return g * (cdf + x * pdf);
}

template <typename T> __device__ __forceinline__ T silu_grad(T x, T g) {
  const T s = T(1) / (T(1) + exp(-x));
  return g * s * (T(1) + x * (T(1) - s));
}

// ---------------------------------------------------------------------------
// Philox 4x32-10, exactly as src/backends/philox.rs defines it: key
// (seed lo, seed hi), counter (index lo, index hi, stream lo, stream hi).

struct u32x4 {
  u32 x, y, z, w;
};

__device__ __forceinline__ u32x4 philox(u64 seed, u64 stream, u64 index) {
  u32 c0 = (u32)index, c1 = (u32)(index >> 32), c2 = (u32)stream, c3 = (u32)(stream >> 32);
  u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    u64 p0 = (u64)0xD2511F53u * c0;
    u64 p1 = (u64)0xCD9E8D57u * c2;
    u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
    u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
    u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  u32x4 r = {c0, c1, c2, c3};
  return r;
}

// 53 random bits from two words, in [0, 1).
__device__ __forceinline__ double uniform53(u32 a, u32 b) {
  return (double)((((u64)a) << 21) ^ (((u64)b) >> 11)) * (1.0 / 9007199254740992.0);
}
__device__ __forceinline__ double uniform(u64 seed, u64 stream, u64 i) {
  u32x4 r = philox(seed, stream, i);
  return uniform53(r.x, r.y);
}
// Box-Muller, cosine branch, in double.
__device__ __forceinline__ double normal(u64 seed, u64 stream, u64 i) {
  u32x4 r = philox(seed, stream, i);
  double u1 = 1.0 - uniform53(r.x, r.y);
  double u2 = uniform53(r.z, r.w);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// ---------------------------------------------------------------------------
// Vectorized access: four consecutive elements in one load or store, for
// pointers aligned to four elements (16 bytes for f32, 8 for f16).

template <class T>
struct __align__(sizeof(T) * 4) vec4 {
  T v[4];
};

template <class T>
__device__ __forceinline__ vec4<T> load4(const T* p) {
  return *reinterpret_cast<const vec4<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store4(T* p, vec4<T> v) {
  *reinterpret_cast<vec4<T>*>(p) = v;
}
// Four copies of one value (a constant part of a `cat`).
template <class T>
__device__ __forceinline__ vec4<T> splat4(T x) {
  vec4<T> q;
  q.v[0] = x;
  q.v[1] = x;
  q.v[2] = x;
  q.v[3] = x;
  return q;
}
// Two adjacent elements in one load or store (a row kernel's runs of two
// columns, codegen/reduction/emit.rs; pointers aligned to 2 elements).
template <class T>
struct __align__(sizeof(T) * 2) vec2 {
  T v[2];
};
template <class T>
__device__ __forceinline__ vec2<T> load2(const T* p) {
  return *reinterpret_cast<const vec2<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store2(T* p, vec2<T> v) {
  *reinterpret_cast<vec2<T>*>(p) = v;
}
// Eight elements in one load or store (16 bytes of 16-bit elements; pointers
// aligned to 8 elements).
template <class T>
struct __align__(sizeof(T) * 8) vec8 {
  T v[8];
};
template <class T>
__device__ __forceinline__ vec8<T> load8(const T* p) {
  return *reinterpret_cast<const vec8<T>*>(p);
}
template <class T>
__device__ __forceinline__ void store8(T* p, vec8<T> v) {
  *reinterpret_cast<vec8<T>*>(p) = v;
}

// ---------------------------------------------------------------------------
// Reductions over a group of GROUP threads: 1 (a thread per row), 32 (a warp
// per row) or the whole block (GROUP == blockDim.x, a multiple of 32). Every
// thread of the group gets the result; the order of combination is fixed, so
// results do not vary from run to run.

struct Sum {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct ISum {
  __device__ __forceinline__ i64 operator()(i64 a, i64 b) const { return iadd(a, b); }
};
// NaN wins; otherwise the larger (smaller) value.
struct Max {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return (a != a) ? a : ((b != b) ? b : (b > a ? b : a)); }
};
struct Min {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return (a != a) ? a : ((b != b) ? b : (b < a ? b : a)); }
};

// A value and its index, for argmax: the first maximum, the first NaN.
template <class T>
struct Arg {
  T v;
  i64 i;
};
struct ArgMax {
  template <class T>
  __device__ __forceinline__ Arg<T> operator()(Arg<T> a, Arg<T> b) const {
    bool an = a.v != a.v, bn = b.v != b.v;
    if (an && bn) return a.i <= b.i ? a : b;
    if (an) return a;
    if (bn) return b;
    if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
    return a;
  }
};

__device__ __forceinline__ double shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ i64 shfl_xor(i64 v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ int shfl_xor(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ bool shfl_xor(bool v, int m) { return __shfl_xor_sync(0xffffffffu, (int)v, m) != 0; }
template <class T>
__device__ __forceinline__ Arg<T> shfl_xor(Arg<T> a, int m) {
  Arg<T> r;
  r.v = shfl_xor(a.v, m);
  r.i = shfl_xor(a.i, m);
  return r;
}

template <int GROUP, class T, class Op>
__device__ __forceinline__ T group_reduce(T v, Op op) {
  if (GROUP == 1) return v;
#pragma unroll
  for (int o = (GROUP < 32 ? GROUP : 32) / 2; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  if (GROUP <= 32) return v;
  __shared__ T partial[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous reduction's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T r = partial[0];
  for (int w = 1; w < GROUP / 32; ++w) r = op(r, partial[w]);
  return r;
}

}  // namespace kiln
