// The C API's ABI (include/rattn.h, RATTN_ABI_VERSION): the layout of every
// public struct on LP64 Linux, pinned. A change to a struct fails here until
// RATTN_ABI_VERSION is bumped (which renames the soname) and this table is
// updated with it.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "rattn.h"

namespace {

struct Field {
  const char* name;
  size_t offset;    // as compiled
  size_t expected;  // as pinned for this ABI version
};

void expect_layout(const char* type, size_t size, size_t expected_size, const std::vector<Field>& fields) {
  EXPECT_EQ(size, expected_size) << type << "'s size changed: bump RATTN_ABI_VERSION";
  for (const auto& f : fields)
    EXPECT_EQ(f.offset, f.expected) << type << "::" << f.name << " moved: bump RATTN_ABI_VERSION";
}

#define RATTN_FIELD(type, name, expected) Field{#name, offsetof(type, name), expected}

static_assert(sizeof(void*) == 8 && sizeof(int) == 4, "the pinned layout is LP64's");

TEST(Abi, VersionMatchesThePinnedLayout) {
  // The table below is ABI version 1's; a bump comes with a new table.
  EXPECT_EQ(RATTN_ABI_VERSION, 1);
}

TEST(Abi, ContextParamsLayout) {
  expect_layout("rattn_context_params", sizeof(rattn_context_params), 152, {
      RATTN_FIELD(rattn_context_params, plan_path, 0),
      RATTN_FIELD(rattn_context_params, plan_text, 8),
      RATTN_FIELD(rattn_context_params, n_layers, 16),
      RATTN_FIELD(rattn_context_params, n_q_heads, 20),
      RATTN_FIELD(rattn_context_params, n_kv_heads, 24),
      RATTN_FIELD(rattn_context_params, head_dim, 28),
      RATTN_FIELD(rattn_context_params, sinks, 32),
      RATTN_FIELD(rattn_context_params, window, 36),
      RATTN_FIELD(rattn_context_params, kv_storage, 40),
      RATTN_FIELD(rattn_context_params, use_gpu, 44),
      RATTN_FIELD(rattn_context_params, top_k, 48),
      RATTN_FIELD(rattn_context_params, index_kind, 52),
      RATTN_FIELD(rattn_context_params, tail_samples, 56),
      RATTN_FIELD(rattn_context_params, graph_degree, 60),
      RATTN_FIELD(rattn_context_params, query_neighbors, 64),
      RATTN_FIELD(rattn_context_params, build_sample, 68),
      RATTN_FIELD(rattn_context_params, seed, 72),
      RATTN_FIELD(rattn_context_params, insert_evicted, 80),
      RATTN_FIELD(rattn_context_params, insert_batch, 84),
      RATTN_FIELD(rattn_context_params, refresh_sample, 88),
      RATTN_FIELD(rattn_context_params, search_queue, 92),
      RATTN_FIELD(rattn_context_params, search_seeds, 96),
      RATTN_FIELD(rattn_context_params, search_expand_first, 100),
      RATTN_FIELD(rattn_context_params, search_full_expand, 104),
      RATTN_FIELD(rattn_context_params, layer_search, 112),
      RATTN_FIELD(rattn_context_params, n_layer_search, 120),
      RATTN_FIELD(rattn_context_params, n_threads, 124),
      RATTN_FIELD(rattn_context_params, kernels, 128),
      RATTN_FIELD(rattn_context_params, progress_callback, 136),
      RATTN_FIELD(rattn_context_params, progress_user_data, 144)});
}

TEST(Abi, LayerSearchLayout) {
  expect_layout("rattn_layer_search", sizeof(rattn_layer_search), 20, {
      RATTN_FIELD(rattn_layer_search, layer, 0),
      RATTN_FIELD(rattn_layer_search, search_queue, 4),
      RATTN_FIELD(rattn_layer_search, search_seeds, 8),
      RATTN_FIELD(rattn_layer_search, search_expand_first, 12),
      RATTN_FIELD(rattn_layer_search, search_full_expand, 16)});
}

TEST(Abi, ContextInfoLayout) {
  expect_layout("rattn_context_info", sizeof(rattn_context_info), 112, {
      RATTN_FIELD(rattn_context_info, n_layers, 0),
      RATTN_FIELD(rattn_context_info, n_global_layers, 4),
      RATTN_FIELD(rattn_context_info, n_q_heads, 8),
      RATTN_FIELD(rattn_context_info, n_kv_heads, 12),
      RATTN_FIELD(rattn_context_info, head_dim, 16),
      RATTN_FIELD(rattn_context_info, sinks, 20),
      RATTN_FIELD(rattn_context_info, window, 24),
      RATTN_FIELD(rattn_context_info, top_k, 28),
      RATTN_FIELD(rattn_context_info, search_queue, 32),
      RATTN_FIELD(rattn_context_info, graph_degree, 36),
      RATTN_FIELD(rattn_context_info, query_neighbors, 40),
      RATTN_FIELD(rattn_context_info, build_sample, 44),
      RATTN_FIELD(rattn_context_info, kv_storage, 48),
      RATTN_FIELD(rattn_context_info, index_kind, 52),
      RATTN_FIELD(rattn_context_info, n_threads, 56),
      RATTN_FIELD(rattn_context_info, gpu, 60),
      RATTN_FIELD(rattn_context_info, cpu_kernels, 64),
      RATTN_FIELD(rattn_context_info, insert_batch, 72),
      RATTN_FIELD(rattn_context_info, gpu_status, 80),
      RATTN_FIELD(rattn_context_info, tail_samples, 88),
      RATTN_FIELD(rattn_context_info, search_seeds, 92),
      RATTN_FIELD(rattn_context_info, refresh_sample, 96),
      RATTN_FIELD(rattn_context_info, search_expand_first, 100),
      RATTN_FIELD(rattn_context_info, search_full_expand, 104)});
}

TEST(Abi, MemoryInfoLayout) {
  expect_layout("rattn_memory_info", sizeof(rattn_memory_info), 72, {
      RATTN_FIELD(rattn_memory_info, static_set_bytes, 0),
      RATTN_FIELD(rattn_memory_info, cpu_kv_bytes, 8),
      RATTN_FIELD(rattn_memory_info, index_bytes, 16),
      RATTN_FIELD(rattn_memory_info, query_ring_bytes, 24),
      RATTN_FIELD(rattn_memory_info, scratch_bytes, 32),
      RATTN_FIELD(rattn_memory_info, total_bytes, 40),
      RATTN_FIELD(rattn_memory_info, cpu_tokens, 48),
      RATTN_FIELD(rattn_memory_info, static_set_on_gpu, 56),
      RATTN_FIELD(rattn_memory_info, pending_tokens, 64)});
}

}  // namespace
