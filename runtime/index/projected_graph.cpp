// The projected bipartite graph lands in the next commit.
#include <memory>
#include <string_view>

#include "core/error.h"
#include "runtime/index/key_index.h"

namespace rattn::internal {
std::unique_ptr<KeyIndex> load_projected_graph(std::string_view, uint32_t) {
  fail(Status::unsupported, "projected graph index: not built yet");
}
}  // namespace rattn::internal
