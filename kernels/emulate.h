// emulate.h: runs kiln's generated CUDA C on the CPU, for developers
// without a GPU (feature `cuda-emulator`, see src/backends/cuda/emulate).
//
// A block's threads are POSIX threads; `__syncthreads` is a barrier over
// the block, warp shuffles exchange through one slot per thread between two
// barriers over the warp, `__shared__` is a static (blocks run one after
// another), atomics are GCC builtins. It is slow and it is not a model of
// the GPU's memory system: it checks what the code computes (indexing,
// reductions, conversions), not how fast or how racy it is on a device.
#pragma once
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <utility>

#define KILN_EMULATE 1

namespace emu {
struct dim3 {
  unsigned x, y, z;
};
inline thread_local dim3 thread_idx = {0, 0, 0};
inline thread_local dim3 block_idx = {0, 0, 0};
inline dim3 block_dim = {1, 1, 1};
inline dim3 grid_dim = {1, 1, 1};
inline pthread_barrier_t block_barrier;
inline pthread_barrier_t warp_barrier[32];
inline unsigned long long exchange[1024];
}  // namespace emu

#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__ __restrict
#define __align__(n) alignas(n)

inline void __syncthreads() { pthread_barrier_wait(&emu::block_barrier); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m) {
  unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  emu::exchange[t] = bits;
  pthread_barrier_wait(&emu::warp_barrier[w]);
  unsigned long long o = emu::exchange[w * 32 + (lane ^ (unsigned)m)];
  pthread_barrier_wait(&emu::warp_barrier[w]);
  T r;
  memcpy(&r, &o, sizeof(T));
  return r;
}

template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  unsigned t = threadIdx.x, w = t / 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  emu::exchange[t] = bits;
  pthread_barrier_wait(&emu::warp_barrier[w]);
  unsigned long long o = emu::exchange[w * 32 + ((unsigned)src & 31u)];
  pthread_barrier_wait(&emu::warp_barrier[w]);
  T r;
  memcpy(&r, &o, sizeof(T));
  return r;
}

namespace emu {
inline unsigned gather_slots[1024][8];
// Every lane of the calling thread's warp gets every lane's n <= 8 words
// (all[lane][i]), with two barriers: what a warp-wide tensor-core product
// needs, without one shuffle per element (kiln::mma_16816).
inline void warp_gather(const unsigned* v, int n, unsigned (*all)[8]) {
  unsigned t = threadIdx.x, w = t / 32;
  memcpy(gather_slots[t], v, n * sizeof(unsigned));
  pthread_barrier_wait(&warp_barrier[w]);
  memcpy(all, gather_slots[w * 32], 32 * sizeof(gather_slots[0]));
  pthread_barrier_wait(&warp_barrier[w]);
}
}  // namespace emu

inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline double __longlong_as_double(long long u) {
  double f;
  memcpy(&f, &u, 8);
  return f;
}
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}

inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
// An L2 load on the GPU (skips L1, which other blocks' writes do not reach).
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}

namespace emu {
struct Launch {
  void (*body)(void**);
  void** args;
  unsigned block;
  unsigned thread;
};

inline void* thread_main(void* p) {
  Launch* l = static_cast<Launch*>(p);
  block_idx = {l->block, 0, 0};
  thread_idx = {l->thread, 0, 0};
  l->body(l->args);
  return nullptr;
}

// Runs `body` on a grid of `grid` blocks of `block` threads, block by block.
inline int run(unsigned grid, unsigned block, void (*body)(void**), void** args) {
  if (block == 0 || block > 1024) return 1;
  grid_dim = {grid, 1, 1};
  block_dim = {block, 1, 1};
  pthread_barrier_init(&block_barrier, nullptr, block);
  unsigned warps = (block + 31) / 32;
  for (unsigned w = 0; w < warps; ++w) {
    unsigned n = block - 32 * w < 32 ? block - 32 * w : 32;
    pthread_barrier_init(&warp_barrier[w], nullptr, n);
  }
  static pthread_t threads[1024];
  static Launch launches[1024];
  int status = 0;
  for (unsigned b = 0; b < grid && status == 0; ++b) {
    unsigned started = 0;
    for (unsigned t = 0; t < block; ++t) {
      launches[t] = Launch{body, args, b, t};
      if (pthread_create(&threads[t], nullptr, thread_main, &launches[t]) != 0) {
        status = 2;
        break;
      }
      ++started;
    }
    for (unsigned t = 0; t < started; ++t) pthread_join(threads[t], nullptr);
  }
  pthread_barrier_destroy(&block_barrier);
  for (unsigned w = 0; w < warps; ++w) pthread_barrier_destroy(&warp_barrier[w]);
  return status;
}

template <class... P, std::size_t... I>
inline void call(void (*f)(P...), void** a, std::index_sequence<I...>) {
  f(static_cast<P>(a[I])...);
}
template <class... P>
inline void invoke(void (*f)(P...), void** a) {
  call(f, a, std::index_sequence_for<P...>{});
}
}  // namespace emu
