// kiln_mma.cuh: the tensor-core helpers of the attention kernels
// (codegen/attention_mma.rs, attention_grad.rs, attention_tf32.rs): warp-wide
// mma products in f16/bf16 and in tf32 (with the 3xTF32 split that keeps
// f32's accuracy), ldmatrix fragment loads, and cp.async copies into shared
// memory. Every form has a fallback for older parts and the CPU emulator.
// The kernels include only "kiln.cuh": this file is compiled right after it
// (codegen/mod.rs, KILN_CUH), so it uses kiln.cuh's types without an
// include (and needs no `#pragma once`).

namespace kiln {

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
// Two floats rounded to the narrow type T, packed as one fragment register:
// on the GPU one paired conversion (the bits of two), as rnd2_bf16.
#ifdef KILN_EMULATE
__device__ __forceinline__ u32 pack2(float lo, float hi, f16) {
  return (u32)f16_from(lo).bits | ((u32)f16_from(hi).bits << 16);
}
__device__ __forceinline__ u32 pack2(float lo, float hi, bf16) {
  return (u32)bf16_from(lo).bits | ((u32)bf16_from(hi).bits << 16);
}
#else
__device__ __forceinline__ u32 pack2(float lo, float hi, f16) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ u32 pack2(float lo, float hi, bf16) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif
// Two floats T holds exactly (values already rounded to it), packed: for
// bf16 their high halves, with no conversion (bf16_exact's rule); f16 has
// no such shortcut.
__device__ __forceinline__ u32 pack2_exact(float lo, float hi, f16) { return pack2(lo, hi, f16()); }
__device__ __forceinline__ u32 pack2_exact(float lo, float hi, bf16) {
  return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
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
