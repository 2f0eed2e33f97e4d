#pragma once
// The SIMT emulation's runtime API without the CUDA-spelling macros of
// simt_emu.h: what host code that launches emulated kernels includes.
#include <cstddef>
#include <cstdint>
#include <functional>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace rattn::emu {

constexpr size_t kSharedBytes = 256 * 1024;  // largest dynamic shared memory a launch may ask for

struct ThreadState;
ThreadState* current_thread();
const dim3& thread_idx();
const dim3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void sync_threads();
void sync_warp();
// Every lane of the calling warp passes `mine` and gets lane `src`'s value
// (its own when src is out of range).
uint64_t warp_exchange(uint64_t mine, int src);
int lane_id();

// Runs `body` for every thread of every block of the grid (blocks one after
// another, a block's threads as fibers). Throws std::runtime_error on deadlock.
void run_grid(dim3 grid, dim3 block, size_t dynamic_smem, const std::function<void()>& body);

// Fiber switches of the last run_grid.
uint64_t last_switches();

template <typename K, typename... A>
void launch(K kernel, dim3 grid, dim3 block, size_t dynamic_smem, A... args) {
  run_grid(grid, block, dynamic_smem, [&] { kernel(args...); });
}

}  // namespace rattn::emu
