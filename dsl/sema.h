#pragma once
// Semantic checks of a parsed *.ra file and its lowering to the IR.
#include <string>
#include <string_view>

#include "dsl/ast.h"
#include "dsl/ir.h"

namespace rattn::internal {

// Throws Error(parse_error) "file:line:col: error: ..." on the first violation.
Program check_and_lower(const ProgramSyntax& syntax, std::string_view text, const std::string& filename);

// Limits the checks enforce (also quoted in docs/dsl.md).
inline constexpr int kMaxLayers = 1024;
inline constexpr int kMaxHeads = 1024;
inline constexpr int64_t kMaxContext = int64_t(1) << 32;
inline constexpr int kMinGpuArch = 75;
inline constexpr int64_t kMaxCandidates = 10000;
inline constexpr int kSupportedHeadDims[] = {64, 96, 128, 256};

}  // namespace rattn::internal
