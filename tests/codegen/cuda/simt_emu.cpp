#include "tests/codegen/cuda/simt_emu.h"

#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// ASan keeps one stack per OS thread: every fiber switch must tell it which
// stack runs next, or exceptions and stack checks on a fiber stack misfire.
#if defined(__SANITIZE_ADDRESS__)
#define RATTN_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RATTN_ASAN_FIBERS 1
#endif
#endif
#ifdef RATTN_ASAN_FIBERS
#include <sanitizer/common_interface_defs.h>
#endif

float4 rattn_smem[rattn::emu::kSharedBytes / sizeof(float4)];

namespace rattn::emu {

namespace ctx = boost::context;

struct Barrier {
  int count = 0;
  uint64_t generation = 0;
};

struct WarpState {
  Barrier barrier;
  uint64_t slots[2][32] = {};
};

struct ThreadState {
  dim3 idx;
  int linear = 0;
  int lane = 0;
  int warp = 0;
  int warp_size = 32;  // threads of this warp (the last warp may be partial)
  uint64_t exchanges = 0;
  ctx::fiber fiber;
  ctx::fiber scheduler;
  bool done = false;
  const void* stack_bottom = nullptr;  // the fiber's stack, for ASan
  size_t stack_size = 0;
};

namespace {

// Annotations of a switch to the stack [bottom, bottom + size): start on the
// side that leaves, finish on the side that arrives (no-ops without ASan).
// A null `fake_stack` on start means the leaving fiber ends.
inline void switch_start([[maybe_unused]] void** fake_stack, [[maybe_unused]] const void* bottom,
                         [[maybe_unused]] size_t size) {
#ifdef RATTN_ASAN_FIBERS
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#endif
}
inline void switch_finish([[maybe_unused]] void* fake_stack, [[maybe_unused]] const void** bottom_old,
                          [[maybe_unused]] size_t* size_old) {
#ifdef RATTN_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#endif
}

// The pooled stacks, recording each fiber's stack in its ThreadState.
struct TrackedStack {
  ctx::pooled_fixedsize_stack pool;
  ThreadState* thread;
  ctx::stack_context allocate() {
    ctx::stack_context sc = pool.allocate();
    thread->stack_bottom = static_cast<const char*>(sc.sp) - sc.size;
    thread->stack_size = sc.size;
    return sc;
  }
  void deallocate(ctx::stack_context& sc) noexcept { pool.deallocate(sc); }
};

struct BlockState {
  std::vector<ThreadState> threads;
  std::vector<WarpState> warps;
  Barrier barrier;
  uint64_t progress = 0;
};

ThreadState* g_current = nullptr;
BlockState* g_block = nullptr;
dim3 g_block_idx, g_block_dim, g_grid_dim;
uint64_t g_switches = 0;
const void* g_scheduler_stack = nullptr;  // the scheduler's stack, for ASan
size_t g_scheduler_stack_size = 0;

void yield() {
  ThreadState* t = g_current;
  void* fake_stack = nullptr;
  switch_start(&fake_stack, g_scheduler_stack, g_scheduler_stack_size);
  // Also when the resume throws Boost's forced_unwind (the fiber is destroyed).
  struct Arrive {
    void*& fake;
    ~Arrive() { switch_finish(fake, nullptr, nullptr); }
  } arrive{fake_stack};
  t->scheduler = std::move(t->scheduler).resume();
}

// Resumes `t` from the scheduler (or destroys it, which unwinds its stack).
void enter(ThreadState& t, bool destroy) {
  void* fake_stack = nullptr;
  switch_start(&fake_stack, t.stack_bottom, t.stack_size);
  if (destroy)
    t.fiber = ctx::fiber();
  else
    t.fiber = std::move(t.fiber).resume();
  switch_finish(fake_stack, nullptr, nullptr);
}

void wait_barrier(Barrier& b, int expected) {
  const uint64_t gen = b.generation;
  ++g_block->progress;
  if (++b.count == expected) {
    b.count = 0;
    ++b.generation;
    return;
  }
  while (b.generation == gen) yield();
}

}  // namespace

ThreadState* current_thread() { return g_current; }
const dim3& thread_idx() { return g_current->idx; }
const dim3& block_idx() { return g_block_idx; }
const dim3& block_dim() { return g_block_dim; }
const dim3& grid_dim() { return g_grid_dim; }
int lane_id() { return g_current->lane; }
uint64_t last_switches() { return g_switches; }

void sync_threads() { wait_barrier(g_block->barrier, int(g_block->threads.size())); }

void sync_warp() {
  ThreadState* t = g_current;
  wait_barrier(g_block->warps[size_t(t->warp)].barrier, t->warp_size);
}

uint64_t warp_exchange(uint64_t mine, int src) {
  ThreadState* t = g_current;
  WarpState& w = g_block->warps[size_t(t->warp)];
  // Alternate buffers: a lane can only overwrite buffer b again after the next
  // barrier, which every lane reaches only after reading buffer b.
  const int buf = int(t->exchanges++ & 1);
  w.slots[buf][t->lane] = mine;
  wait_barrier(w.barrier, t->warp_size);
  if (src < 0 || src >= t->warp_size) src = t->lane;
  return w.slots[buf][src];
}

void run_grid(dim3 grid, dim3 block, size_t dynamic_smem, const std::function<void()>& body) {
  if (dynamic_smem > kSharedBytes)
    throw std::runtime_error("simt_emu: launch asks for " + std::to_string(dynamic_smem) +
                             " bytes of shared memory (emulator has " +
                             std::to_string(kSharedBytes) + ")");
  const int nthreads = int(block.x * block.y * block.z);
  if (nthreads <= 0 || nthreads > 1024) throw std::runtime_error("simt_emu: bad block size");
  g_grid_dim = grid;
  g_block_dim = block;
  g_switches = 0;
  ctx::pooled_fixedsize_stack stacks(128 * 1024);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        g_block_idx = dim3(bx, by, bz);
        std::memset(rattn_smem, 0xff, dynamic_smem);
        BlockState bs;
        bs.threads.resize(size_t(nthreads));
        bs.warps.resize(size_t((nthreads + 31) / 32));
        g_block = &bs;
        std::exception_ptr error;
        for (int i = 0; i < nthreads; ++i) {
          ThreadState& t = bs.threads[size_t(i)];
          t.linear = i;
          t.idx = dim3(unsigned(i) % block.x, (unsigned(i) / block.x) % block.y,
                       unsigned(i) / (block.x * block.y));
          t.lane = i % 32;
          t.warp = i / 32;
          t.warp_size = std::min(32, nthreads - t.warp * 32);
        }
        // A fiber is made right before its first resume: every fiber that
        // exists has run its first line (the ASan handshake).
        auto make_fiber = [&](ThreadState& t) {
          t.fiber = ctx::fiber(std::allocator_arg, TrackedStack{stacks, &t},
                               [&t, &body, &error](ctx::fiber&& sched) {
            switch_finish(nullptr, &g_scheduler_stack, &g_scheduler_stack_size);
            t.scheduler = std::move(sched);
            try {
              body();
            } catch (const ctx::detail::forced_unwind&) {
              switch_start(nullptr, g_scheduler_stack, g_scheduler_stack_size);
              throw;  // the fiber is being destroyed: let Boost unwind it
            } catch (...) {
              if (!error) error = std::current_exception();
            }
            t.done = true;
            switch_start(nullptr, g_scheduler_stack, g_scheduler_stack_size);
            return std::move(t.scheduler);
          });
        };
        int live = nthreads;
        bool deadlock = false;
        while (live > 0) {
          const uint64_t before = bs.progress;
          for (auto& t : bs.threads) {
            if (t.done) continue;
            if (!t.fiber) make_fiber(t);
            g_current = &t;
            enter(t, /*destroy=*/false);
            ++g_switches;
            if (t.done) {
              --live;
              ++bs.progress;
            }
          }
          if (error) break;
          if (live > 0 && bs.progress == before) {
            deadlock = true;
            break;
          }
        }
        // Unwind fibers still suspended (after an error) before the block dies.
        for (auto& t : bs.threads)
          if (t.fiber) {
            g_current = &t;
            enter(t, /*destroy=*/true);
          }
        g_current = nullptr;
        g_block = nullptr;
        if (error) std::rethrow_exception(error);
        if (deadlock)
          throw std::runtime_error("simt_emu: deadlock in block (" + std::to_string(bx) + ", " +
                                   std::to_string(by) +
                                   "): threads wait at a barrier that others never reach");
      }
}

}  // namespace rattn::emu
