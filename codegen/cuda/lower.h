#pragma once
// The lowering driver: plan -> kernel IR -> (after every pass) the final module.
#include <functional>
#include <string>

#include "codegen/cuda/kernel_ir.h"
#include "codegen/cuda/passes.h"

namespace rattn::cuda {

// Called after each pass with its name and the module it produced.
using PassObserver = std::function<void(const std::string& pass, const KernelModule&)>;

// Runs every pass on an abstract module (from lower_from_plan/lower_from_params).
KernelModule lower_decode_attention(KernelModule m, const PassObserver& after_pass = {});

// Convenience: lower_from_plan + lower_decode_attention.
KernelModule lower_decode_attention(const ModelLayout& model, const ConcretePlan& plan,
                                    const LowerOptions& options,
                                    const PassObserver& after_pass = {});
KernelModule lower_decode_attention(const DecodeAttentionParams& params,
                                    const PassObserver& after_pass = {});

}  // namespace rattn::cuda
