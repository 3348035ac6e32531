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
// vectorized loads, and warp/block reductions.
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

// ---------------------------------------------------------------------------
// Tensor-core tiles (the f16/bf16 attention kernel, codegen/attention_mma.rs).
// mma_16816 is one warp-wide D += A B with A 16x16 and B 16x8 in f16 or bf16
// and D in f32, in PTX's m16n8k16 fragment layout: lane = 4 g + c holds, two
// 16-bit values per u32 (the lower index in the low half), A's rows g and
// g+8 at columns 2c, 2c+1 (a[0], a[1]) and 2c+8, 2c+9 (a[2], a[3]), B's
// column g at rows 2c, 2c+1 (b[0]) and 2c+8, 2c+9 (b[1]), and D's rows g
// (d[0], d[1]) and g+8 (d[2], d[3]) at columns 2c, 2c+1. On sm_80 and later
// it is one `mma.sync`; elsewhere, and in the CPU emulator, the same product
// from warp shuffles in the same layout (slow, but the kernel runs and
// checks everywhere).

__device__ __forceinline__ float half_at(u32 pair, int hi, f16) {
  f16 h;
  h.bits = (unsigned short)(hi ? pair >> 16 : pair & 0xffffu);
  return to_float(h);
}
__device__ __forceinline__ float half_at(u32 pair, int hi, bf16) {
  bf16 h;
  h.bits = (unsigned short)(hi ? pair >> 16 : pair & 0xffffu);
  return to_float(h);
}
// Two floats rounded to the narrow type T, packed as one fragment register.
__device__ __forceinline__ u32 pack2(float lo, float hi, f16) {
  return (u32)f16_from(lo).bits | ((u32)f16_from(hi).bits << 16);
}
__device__ __forceinline__ u32 pack2(float lo, float hi, bf16) {
  return (u32)bf16_from(lo).bits | ((u32)bf16_from(hi).bits << 16);
}

template <class T>
__device__ __forceinline__ void mma_16816_shuffled(float* d, const u32* a, const u32* b) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#ifdef KILN_EMULATE
  // The emulator's shuffles cost two barriers each: gather the warp's
  // fragments once instead.
  u32 mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  u32 all[32][8];
  emu::warp_gather(mine, 6, all);
  for (int k = 0; k < 16; ++k) {
    const int hi = k >= 8, src = (k % 8) / 2, half = k % 2;
    const float a0 = half_at(all[g * 4 + src][hi ? 2 : 0], half, T());
    const float a1 = half_at(all[g * 4 + src][hi ? 3 : 1], half, T());
    const float b0 = half_at(all[2 * c * 4 + src][4 + hi], half, T());
    const float b1 = half_at(all[(2 * c + 1) * 4 + src][4 + hi], half, T());
    d[0] += a0 * b0;
    d[1] += a0 * b1;
    d[2] += a1 * b0;
    d[3] += a1 * b1;
  }
  return;
#endif
  for (int k = 0; k < 16; ++k) {
    const int hi = k >= 8, src = (k % 8) / 2, half = k % 2;
    const float a0 = half_at(__shfl_sync(0xffffffffu, hi ? a[2] : a[0], g * 4 + src), half, T());
    const float a1 = half_at(__shfl_sync(0xffffffffu, hi ? a[3] : a[1], g * 4 + src), half, T());
    const float b0 = half_at(__shfl_sync(0xffffffffu, b[hi], 2 * c * 4 + src), half, T());
    const float b1 = half_at(__shfl_sync(0xffffffffu, b[hi], (2 * c + 1) * 4 + src), half, T());
    d[0] += a0 * b0;
    d[1] += a0 * b1;
    d[2] += a1 * b0;
    d[3] += a1 * b1;
  }
}

// ldsm_x2_trans: two 8x8 tiles of 16-bit elements read down their columns,
// as mma_16816's B operand: lane l (l < 16) passes the address of row l of
// the two tiles stacked (rows 0-7 the first, 8-15 the second; lanes 16-31
// pass any valid address), and lane 4 g + c gets r[m] = tile m's
// (row 2c, column g) in the low half and (row 2c + 1, column g) in the high
// half. On sm_75 and later one `ldmatrix.trans` (rows 16-byte aligned);
// elsewhere, and in the CPU emulator, the same from the rows' addresses.
__device__ __forceinline__ void ldsm_x2_trans(u32* r, const unsigned short* row) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned at = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
#else
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const unsigned long long mine = (unsigned long long)row;
  for (int m = 0; m < 2; ++m) {
    const unsigned short* p0 = (const unsigned short*)__shfl_sync(0xffffffffu, mine, 8 * m + 2 * c);
    const unsigned short* p1 = (const unsigned short*)__shfl_sync(0xffffffffu, mine, 8 * m + 2 * c + 1);
    r[m] = (u32)p0[g] | ((u32)p1[g] << 16);
  }
#endif
}

__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b, f16) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_16816_shuffled<f16>(d, a, b);
#endif
}
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b, bf16) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  mma_16816_shuffled<bf16>(d, a, b);
#endif
}

// Eight 16-bit elements, for 16-byte loads and stores.
struct __align__(16) u16x8 {
  u32 w[4];
};

// ldsm_x4: four 8x8 tiles of 16-bit elements read along their rows, as
// mma_16816's B operands of two column groups (r[0], r[1] and r[2], r[3])
// or one A operand: lane l passes the address of row l % 8 of tile l / 8,
// and lane 4 g + c gets r[m] = tile m's (row g, columns 2c, 2c + 1). On
// sm_75 and later one `ldmatrix` (rows 16-byte aligned), where two 32-bit
// loads an `mma` took it; elsewhere, and in the CPU emulator, the same
// from the rows' addresses.
__device__ __forceinline__ void ldsm_x4(u32* r, const unsigned short* row) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned at = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
#else
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const unsigned long long mine = (unsigned long long)row;
  for (int m = 0; m < 4; ++m) {
    const unsigned short* p = (const unsigned short*)__shfl_sync(0xffffffffu, mine, 8 * m + g);
    r[m] = (u32)p[2 * c] | ((u32)p[2 * c + 1] << 16);
  }
#endif
}

// ldsm_x4_trans: ldsm_x2_trans for four tiles (two column groups of a B
// operand read down its columns): lane l passes the address of row l % 8
// of tile l / 8, and lane 4 g + c gets r[m] = tile m's (row 2c, column g)
// and (row 2c + 1, column g).
__device__ __forceinline__ void ldsm_x4_trans(u32* r, const unsigned short* row) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  const unsigned at = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
#else
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const unsigned long long mine = (unsigned long long)row;
  for (int m = 0; m < 4; ++m) {
    const unsigned short* p0 = (const unsigned short*)__shfl_sync(0xffffffffu, mine, 8 * m + 2 * c);
    const unsigned short* p1 = (const unsigned short*)__shfl_sync(0xffffffffu, mine, 8 * m + 2 * c + 1);
    r[m] = (u32)p0[g] | ((u32)p1[g] << 16);
  }
#endif
}

// f32 on tensor cores at f32 accuracy (the f32 attention kernel,
// codegen/attention_tf32.rs). mma_1688_tf32 is one warp-wide D += A B with
// A 16x8 and B 8x8 in tf32 (f32 bit patterns of which the tensor core reads
// the top 19 bits: sign, exponent and 10 mantissa bits) and D in f32, in
// PTX's m16n8k8 layout: lane = 4 g + c holds A's (row g, column c) a[0],
// (g + 8, c) a[1], (g, c + 4) a[2] and (g + 8, c + 4) a[3]; B's (row c,
// column g) b[0] and (c + 4, g) b[1]; D as mma_16816's. On sm_80 and later
// it is one `mma.sync`; elsewhere, and in the CPU emulator, the same
// product from the warp's fragments, with the low 13 bits of each input
// dropped as the tensor core drops them.
__device__ __forceinline__ float tf32_value(u32 x) { return __uint_as_float(x & 0xffffe000u); }

__device__ __forceinline__ void mma_1688_tf32(float* d, const u32* a, const u32* b) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#ifdef KILN_EMULATE
  u32 mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
  u32 all[32][8];
  emu::warp_gather(mine, 6, all);
  for (int k = 0; k < 8; ++k) {
    const int src = k % 4, hi = k >= 4;
    const float a0 = tf32_value(all[g * 4 + src][hi ? 2 : 0]);
    const float a1 = tf32_value(all[g * 4 + src][hi ? 3 : 1]);
    const float b0 = tf32_value(all[2 * c * 4 + src][4 + hi]);
    const float b1 = tf32_value(all[(2 * c + 1) * 4 + src][4 + hi]);
    d[0] += a0 * b0;
    d[1] += a0 * b1;
    d[2] += a1 * b0;
    d[3] += a1 * b1;
  }
#else
  for (int k = 0; k < 8; ++k) {
    const int src = k % 4, hi = k >= 4;
    const float a0 = tf32_value(__shfl_sync(0xffffffffu, hi ? a[2] : a[0], g * 4 + src));
    const float a1 = tf32_value(__shfl_sync(0xffffffffu, hi ? a[3] : a[1], g * 4 + src));
    const float b0 = tf32_value(__shfl_sync(0xffffffffu, b[hi], 2 * c * 4 + src));
    const float b1 = tf32_value(__shfl_sync(0xffffffffu, b[hi], (2 * c + 1) * 4 + src));
    d[0] += a0 * b0;
    d[1] += a0 * b1;
    d[2] += a1 * b0;
    d[3] += a1 * b1;
  }
#endif
#endif
}

// tf32_split: x as big + small, big its top 19 bits (a tf32) and small the
// rest, exact in f32 (the tensor core then reads small's own top 19 bits).
// Three products, a_small b_big + a_big b_small + a_big b_big (the small
// ones first), give a b to about 2^-21 of its size, where one tf32 product
// is off by up to 2^-10: "3xTF32", CUTLASS's OpMultiplyAddFastF32, which is
// how PyTorch's f32 efficient attention computes with TF32 off.
// Infinities: where the rest is 0 (x a tf32 already, a probability of 1)
// or not a number (x infinite), small is big * 2^-30 instead, a term below
// f32's precision with x's sign and class. A small of 0 would make
// `a_small b_big` 0 * inf = NaN for an infinite b and a finite a, where
// the product is inf; an infinite x's small is inf, so inf * inf stays
// inf, and 0 * inf stays NaN (through a_big b_big) as it should.
__device__ __forceinline__ void tf32_split(float x, u32& big, u32& small) {
  big = __float_as_uint(x) & 0xffffe000u;
  const float b = __uint_as_float(big), rest = x - b;
  small = __float_as_uint(rest != 0.f && rest == rest ? rest : b * 9.313225746154785e-10f);
}

// D += A B from split operands (tf32_split of each element): 3xTF32.
__device__ __forceinline__ void mma_1688_tf32x3(float* d, const u32* a_big, const u32* a_small,
                                                const u32* b_big, const u32* b_small) {
  mma_1688_tf32(d, a_small, b_big);
  mma_1688_tf32(d, a_big, b_small);
  mma_1688_tf32(d, a_big, b_big);
}

// cp_async16: 16 bytes from global to shared memory without passing
// through registers, or 16 zero bytes where `valid` is false (the source
// address must still be a valid one); cp_async_commit closes the group of
// copies issued so far, and cp_async_wait<N> waits until at most N groups
// are in flight (then a __syncthreads makes them visible to the block).
// One `cp.async.cg` on sm_80 and later, so a tile's loads run under the
// previous tile's products; elsewhere, and in the CPU emulator, a plain
// copy at issue, and the waits do nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned at = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(at), "l"(gmem), "r"(valid ? 16 : 0));
#else
  u16x8 x = {{0u, 0u, 0u, 0u}};
  if (valid) x = *(const u16x8*)gmem;
  *(u16x8*)smem = x;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(KILN_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

}  // namespace kiln
