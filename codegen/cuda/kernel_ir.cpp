#include "codegen/cuda/kernel_ir.h"

#include <sstream>

namespace rattn::cuda {

const char* kv_layout_name(KvLayout l) { return l == KvLayout::paged ? "paged" : "contiguous"; }

const char* loop_kind_name(LoopKind k) {
  switch (k) {
    case LoopKind::serial: return "serial";
    case LoopKind::unrolled: return "unrolled";
    case LoopKind::block_x: return "blockIdx.x";
    case LoopKind::block_y: return "blockIdx.y";
    case LoopKind::threads: return "threads";
  }
  return "?";
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::load_queries: return "load_queries";
    case OpKind::init_state: return "init_state";
    case OpKind::stage_prologue: return "stage_prologue";
    case OpKind::stage_issue: return "stage_issue";
    case OpKind::stage_wait: return "stage_wait";
    case OpKind::stage_tile: return "stage_tile";
    case OpKind::barrier: return "barrier";
    case OpKind::scores: return "scores";
    case OpKind::online_softmax: return "online_softmax";
    case OpKind::accumulate_values: return "accumulate_values";
    case OpKind::merge_slots: return "merge_slots";
    case OpKind::merge_warps: return "merge_warps";
    case OpKind::store_final: return "store_final";
    case OpKind::store_partial: return "store_partial";
    case OpKind::merge_splits: return "merge_splits";
  }
  return "?";
}

namespace {

void print_stmt(std::ostringstream& os, const Stmt& s, int indent) {
  const std::string pad(size_t(indent) * 2, ' ');
  switch (s.kind) {
    case Stmt::Kind::seq:
      for (const auto& c : s.body) print_stmt(os, c, indent);
      break;
    case Stmt::Kind::loop:
      os << pad << "for " << s.var << " in [0, " << s.extent << ") " << loop_kind_name(s.loop_kind)
         << " {\n";
      for (const auto& c : s.body) print_stmt(os, c, indent + 1);
      os << pad << "}\n";
      break;
    case Stmt::Kind::op:
      os << pad << op_kind_name(s.op);
      for (const auto& [k, v] : s.attrs) os << ' ' << k << '=' << v;
      os << '\n';
      break;
  }
}

}  // namespace

std::string print_ir(const KernelModule& m) {
  std::ostringstream os;
  const auto& p = m.params;
  os << "module " << (m.name.empty() ? "<unnamed>" : m.name) << " arch=" << p.arch << '\n';
  os << "  spec head_dim=" << p.head_dim << " group=" << p.group_size
     << " kv=" << dtype_name(p.kv_dtype) << " layout=" << kv_layout_name(p.layout);
  if (p.layout == KvLayout::paged) os << " page=" << p.page_size;
  os << " tile=" << p.tile << " warps=" << p.warps << " splits=" << p.splits << " vec=" << p.vec
     << " stages=" << p.stages << '\n';
  if (m.mapping.mapped) {
    const auto& t = m.mapping;
    os << "  mapping threads=" << t.block_threads << " lanes_per_token=" << t.lanes_per_token
       << " chunks_per_lane=" << t.chunks_per_lane << " slots_per_warp=" << t.slots_per_warp
       << " tokens_per_pass=" << t.tokens_per_pass << " tokens_per_slot=" << t.tokens_per_slot;
    if (t.group_blocks > 1)
      os << " heads_per_block=" << t.heads_per_block << " group_blocks=" << t.group_blocks;
    os << '\n';
  }
  for (const auto& k : m.kernels) {
    os << "kernel " << (k.role == KernelRole::partial ? "partial" : "merge") << ' '
       << (k.name.empty() ? "<unnamed>" : k.name) << " grid=(" << k.grid_x << ", " << k.grid_y
       << (k.grid_z == "1" ? "" : ", " + k.grid_z) << ") block=" << k.block_threads << " smem=" << k.shared_bytes << "B\n";
    for (const auto& b : k.shared)
      os << "  shared " << b.name << ": " << b.elem << '[' << b.count << "] @" << b.offset_bytes
         << '\n';
    print_stmt(os, k.body, 1);
  }
  return os.str();
}

const KernelDef* find_kernel(const KernelModule& m, KernelRole role) {
  for (const auto& k : m.kernels)
    if (k.role == role) return &k;
  return nullptr;
}
KernelDef* find_kernel(KernelModule& m, KernelRole role) {
  for (auto& k : m.kernels)
    if (k.role == role) return &k;
  return nullptr;
}

}  // namespace rattn::cuda
