// emulate.h: runs kiln's generated CUDA C on the CPU, for developers
// without a GPU (feature `cuda-emulator`, see src/backends/cuda/emulate).
//
// A block's threads are fibers on the calling thread (ucontext), run in
// turn: each runs until it finishes or waits at a barrier. `__syncthreads`
// is a barrier over the block, warp shuffles exchange through one slot per
// thread between two barriers over the warp, `__shared__` is a static
// (blocks run one after another), atomics are GCC builtins. Fibers, not
// POSIX threads: a thread per GPU thread cost a `clone` each (tens of
// microseconds) and futex sleeps at every barrier, and was most of the
// test suite's emulated time. It is not a model of the GPU's memory
// system: it checks what the code computes (indexing, reductions,
// conversions), not how fast or how racy it is on a device. A barrier some
// thread of the block never reaches, which hangs a GPU, fails the launch.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <utility>

#define KILN_EMULATE 1

namespace emu {
struct dim3 {
  unsigned x, y, z;
};
// The running fiber's indices: one fiber runs at a time, and the scheduler
// sets these before resuming it.
inline dim3 thread_idx = {0, 0, 0};
inline dim3 block_idx = {0, 0, 0};
inline dim3 block_dim = {1, 1, 1};
inline dim3 grid_dim = {1, 1, 1};
inline unsigned long long exchange[1024];

// A block's threads. `progress` counts barrier arrivals and finished
// fibers: a round of the scheduler that moves it by nothing has every live
// fiber waiting on a barrier that cannot fill.
inline ucontext_t scheduler;
inline ucontext_t fibers[1024];
inline bool finished[1024];
inline unsigned current = 0;
inline unsigned long long progress = 0;

inline void yield() { swapcontext(&fibers[current], &scheduler); }

struct Barrier {
  unsigned expected = 1, arrived = 0;
  unsigned long long generation = 0;
  void reset(unsigned n) {
    expected = n;
    arrived = 0;
  }
  void wait() {
    const unsigned long long g = generation;
    ++progress;
    if (++arrived == expected) {
      arrived = 0;
      ++generation;
      return;
    }
    while (generation == g) yield();
  }
};
inline Barrier block_barrier;
inline Barrier warp_barrier[32];
}  // namespace emu

#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define __global__
#define __device__
#define __forceinline__ inline
// A register cap means nothing on the CPU.
#define __launch_bounds__(...)
#define KILN_NOINLINE __attribute__((noinline))
#define __shared__ static
#define KILN_DYNAMIC_SHARED(T, name, count) alignas(16) static T name[count]
#define __restrict__ __restrict
#define __align__(n) alignas(n)

inline void __syncthreads() { emu::block_barrier.wait(); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m) {
  unsigned t = threadIdx.x, w = t / 32, lane = t % 32;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  emu::exchange[t] = bits;
  emu::warp_barrier[w].wait();
  unsigned long long o = emu::exchange[w * 32 + (lane ^ (unsigned)m)];
  emu::warp_barrier[w].wait();
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
  emu::warp_barrier[w].wait();
  unsigned long long o = emu::exchange[w * 32 + ((unsigned)src & 31u)];
  emu::warp_barrier[w].wait();
  T r;
  memcpy(&r, &o, sizeof(T));
  return r;
}

// Bit l of the result is lane l's predicate (every lane of the warp
// takes part, as in kiln's kernels).
inline unsigned __ballot_sync(unsigned, int p) {
  unsigned t = threadIdx.x, w = t / 32;
  emu::exchange[t] = p ? 1 : 0;
  emu::warp_barrier[w].wait();
  unsigned r = 0;
  for (unsigned l = 0; l < 32; ++l) r |= (emu::exchange[w * 32 + l] ? 1u : 0u) << l;
  emu::warp_barrier[w].wait();
  return r;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
// The GPU's fast division (2 ulp there), as a correctly rounded one.
inline float __fdividef(float a, float b) { return a / b; }

namespace emu {
inline unsigned gather_slots[1024][8];
// Every lane of the calling thread's warp gets every lane's n <= 8 words
// (all[lane][i]), with two barriers: what a warp-wide tensor-core product
// needs, without one shuffle per element (kiln::mma_16816).
inline void warp_gather(const unsigned* v, int n, unsigned (*all)[8]) {
  unsigned t = threadIdx.x, w = t / 32;
  memcpy(gather_slots[t], v, n * sizeof(unsigned));
  warp_barrier[w].wait();
  memcpy(all, gather_slots[w * 32], 32 * sizeof(gather_slots[0]));
  warp_barrier[w].wait();
}
}  // namespace emu

inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
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
// Each fiber's stack, with an unmapped guard page below it (an overflow
// faults instead of writing the next fiber's stack). Mapped once, on the
// first launch, and kept: pages a kernel never touches cost nothing.
constexpr size_t kStack = 256 << 10;
inline char* stacks = nullptr;
inline size_t guard = 0;

inline bool map_stacks() {
  if (stacks) return true;
  guard = (size_t)sysconf(_SC_PAGESIZE);
  const size_t each = guard + kStack;
  void* p = mmap(nullptr, each * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  for (unsigned t = 0; t < 1024; ++t) {
    if (mprotect(static_cast<char*>(p) + t * each, guard, PROT_NONE) != 0) {
      munmap(p, each * 1024);
      return false;
    }
  }
  stacks = static_cast<char*>(p);
  return true;
}

inline void (*body_fn)(void**) = nullptr;
inline void** body_args = nullptr;

inline void fiber_main() {
  body_fn(body_args);
  finished[current] = true;
  ++progress;
  // Returning resumes `scheduler` (the fiber's uc_link).
}

// Runs `body` on a grid of `grid` blocks of `block` threads, block by
// block. 0: ran; 1: a block size CUDA refuses; 2: no memory for the
// fibers; 4: threads of a block wait at barriers that cannot fill.
inline int run(unsigned grid, unsigned block, void (*body)(void**), void** args) {
  if (block == 0 || block > 1024) return 1;
  if (!map_stacks()) return 2;
  grid_dim = {grid, 1, 1};
  block_dim = {block, 1, 1};
  body_fn = body;
  body_args = args;
  const unsigned warps = (block + 31) / 32;
  for (unsigned b = 0; b < grid; ++b) {
    block_idx = {b, 0, 0};
    block_barrier.reset(block);
    for (unsigned w = 0; w < warps; ++w) warp_barrier[w].reset(block - 32 * w < 32 ? block - 32 * w : 32);
    for (unsigned t = 0; t < block; ++t) {
      if (getcontext(&fibers[t]) != 0) return 2;
      fibers[t].uc_stack.ss_sp = stacks + t * (guard + kStack) + guard;
      fibers[t].uc_stack.ss_size = kStack;
      fibers[t].uc_link = &scheduler;
      makecontext(&fibers[t], fiber_main, 0);
      finished[t] = false;
    }
    unsigned live = block;
    while (live > 0) {
      const unsigned long long before = progress;
      for (unsigned t = 0; t < block; ++t) {
        if (finished[t]) continue;
        current = t;
        thread_idx = {t, 0, 0};
        swapcontext(&scheduler, &fibers[t]);
        if (finished[t]) --live;
      }
      if (live > 0 && progress == before) return 4;
    }
  }
  return 0;
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
