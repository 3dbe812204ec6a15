// A CPU emulator for the CUDA kernels of ../cuda_norm_device.cuh, so that their logic (indexing,
// reductions, rounding points, dtype handling) is tested on machines without a GPU. Test code
// only: builtin:cuda never uses it.
//
// Each CUDA thread of a block is a fiber (ucontext) on one OS thread; fibers switch only at
// __syncthreads() (all live threads of the block must arrive) and in __shfl_xor_sync() (all live
// lanes of the warp exchange values), so a divergent barrier or shuffle is detected as a
// deadlock and aborts. Blocks run one after another; __shared__ variables are function statics,
// shared by the fibers of the running block. What it cannot show: races that real hardware
// might expose (fibers never interleave between barriers), and the GPU's own arithmetic (here
// rsqrtf is 1/sqrtf, correctly rounded twice; CUDA's is within 2 ulp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <ucontext.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

enum class State { runnable, block_barrier, warp_barrier, done };

struct Fiber {
  ucontext_t ctx{};
  Dim3 tid;
  State state = State::runnable;
};

struct Scheduler {
  static constexpr std::size_t kStack = 64 * 1024;
  ucontext_t main{};
  std::vector<Fiber> fibers;
  std::vector<std::vector<char>> stacks;
  std::vector<double> warp_slots;  // one per thread: the value it offers in a shuffle
  Fiber* current = nullptr;
  Dim3 block_idx, block_dim;
  std::function<void()> body;  // the kernel call of the running launch
};

inline Scheduler& sched() {
  static Scheduler s;
  return s;
}

inline void wait(State why) {
  Fiber* f = sched().current;
  f->state = why;
  swapcontext(&f->ctx, &sched().main);
}

inline void fiber_entry() {
  sched().body();
  sched().current->state = State::done;  // returning resumes uc_link, the scheduler
}

[[noreturn]] inline void deadlock() {
  std::fprintf(stderr, "cuda emulator: deadlock in block %u: threads wait at different barriers\n",
               sched().block_idx.x);
  std::abort();
}

// Runs one block of `threads` (a multiple of 32) to completion.
inline void run_block(unsigned threads) {
  Scheduler& s = sched();
  s.fibers.assign(threads, Fiber{});
  while (s.stacks.size() < threads) s.stacks.emplace_back(Scheduler::kStack);
  s.warp_slots.assign(threads, 0.0);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = s.stacks[t].data();
    f.ctx.uc_stack.ss_size = Scheduler::kStack;
    f.ctx.uc_link = &s.main;
    makecontext(&f.ctx, fiber_entry, 0);
    f.tid.x = t;
  }
  unsigned live = threads;
  while (live > 0) {
    for (Fiber& f : s.fibers) {
      if (f.state != State::runnable) continue;
      s.current = &f;
      swapcontext(&s.main, &f.ctx);
      if (f.state == State::done) --live;
    }
    if (live == 0) break;
    // Release a barrier once every live thread it concerns has arrived.
    bool released = false;
    bool all_at_block = true;
    for (const Fiber& f : s.fibers)
      if (f.state != State::done && f.state != State::block_barrier) all_at_block = false;
    if (all_at_block) {
      for (Fiber& f : s.fibers)
        if (f.state == State::block_barrier) f.state = State::runnable;
      released = true;
    }
    for (unsigned w = 0; w < threads; w += 32) {
      bool all_at_warp = true, any = false;
      for (unsigned t = w; t < w + 32 && t < threads; ++t) {
        const State st = s.fibers[t].state;
        if (st == State::done) continue;
        any = true;
        if (st != State::warp_barrier) all_at_warp = false;
      }
      if (!any || !all_at_warp) continue;
      for (unsigned t = w; t < w + 32 && t < threads; ++t)
        if (s.fibers[t].state == State::warp_barrier) s.fibers[t].state = State::runnable;
      released = true;
    }
    if (!released) deadlock();
  }
}

// A launch of `blocks` blocks of `threads` running `kernel_call`.
inline void launch(unsigned blocks, unsigned threads, std::function<void()> kernel_call) {
  Scheduler& s = sched();
  s.body = std::move(kernel_call);
  s.block_dim = {threads, 1, 1};
  for (unsigned b = 0; b < blocks; ++b) {
    s.block_idx = {b, 0, 0};
    run_block(threads);
  }
}

}  // namespace emu

// The CUDA names the kernels use.
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define threadIdx (::emu::sched().current->tid)
#define blockIdx (::emu::sched().block_idx)
#define blockDim (::emu::sched().block_dim)

inline void __syncthreads() { emu::wait(emu::State::block_barrier); }

template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask) {
  emu::Scheduler& s = emu::sched();
  const unsigned t = s.current->tid.x;
  s.warp_slots[t] = static_cast<double>(v);  // exact for float and double
  emu::wait(emu::State::warp_barrier);
  const T r = static_cast<T>(s.warp_slots[(t & ~31u) | ((t & 31u) ^ static_cast<unsigned>(lane_mask))]);
  emu::wait(emu::State::warp_barrier);  // nobody overwrites its slot before every lane has read
  return r;
}

inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline double rsqrt(double v) { return 1.0 / std::sqrt(v); }
