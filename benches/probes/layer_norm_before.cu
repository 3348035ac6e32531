#include "kiln.cuh"
extern "C" __global__ void k(kiln::bf16* __restrict__ out, const kiln::bf16* __restrict__ in0, const kiln::bf16* __restrict__ in1, const kiln::bf16* __restrict__ in2, const kiln::bf16* __restrict__ in3) {
  typedef int I;
  const I R = 4096, C = 768;
  const int lane = threadIdx.x % 128;
  for (I row = (I)blockIdx.x * 1 + threadIdx.x / 128; row < R; row += (I)gridDim.x * 1) {
    const I rb0 = row * 768;
    const I rb1 = row * 768;
    const I rb15 = 0;
    const I rb18 = 0;
    float c0[6];
    float c1[6];
    double a3 = -0.0;
#pragma unroll
    for (int it = 0; it < 6; ++it) {
      const I col = lane + it * 128;
      {
        c0[it] = kiln::to_float(in0[rb0 + col]);
        c1[it] = kiln::to_float(in1[rb1 + col]);
        const float v2 = kiln::rnd_bf16((c0[it] + c1[it]));
        a3 += (double)(v2);
      }
    }
    a3 = kiln::group_reduce<128>(a3, kiln::Sum());
    const float r3 = kiln::to_float(kiln::bf16_from((double)((a3 / (double)C))));
    double a7 = -0.0;
#pragma unroll
    for (int it = 0; it < 6; ++it) {
      const I col = lane + it * 128;
      {
        const float v2 = kiln::rnd_bf16((c0[it] + c1[it]));
        const float v4 = r3;
        const float v5 = kiln::rnd_bf16((v2 - v4));
        const float v6 = kiln::rnd_bf16((v5 * v5));
        a7 += (double)(v6);
      }
    }
    a7 = kiln::group_reduce<128>(a7, kiln::Sum());
    const float r7 = kiln::to_float(kiln::bf16_from((double)((a7 / (double)C))));
    const float r10 = kiln::rnd_bf16((r7 + 1.0018653e-12f));
    const float r11 = kiln::rnd_bf16((1.0f / sqrtf(r10)));
#pragma unroll
    for (int it = 0; it < 6; ++it) {
      const I col = lane + it * 128;
      {
        const float v2 = kiln::rnd_bf16((c0[it] + c1[it]));
        const float v4 = r3;
        const float v5 = kiln::rnd_bf16((v2 - v4));
        const float v12 = r11;
        const float v13 = kiln::rnd_bf16((v5 * v12));
        const float v16 = kiln::rnd_bf16((v13 * kiln::to_float(in2[rb15 + col])));
        const float v19 = kiln::rnd_bf16((v16 + kiln::to_float(in3[rb18 + col])));
        out[row * C + col] = kiln::bf16_from(v19);
      }
    }
  }
}
