#pragma once
// Entry points of the `rattn` subcommands; each lives in the component it drives.
// argv[0] is the subcommand name. Return the process exit status.
namespace rattn::cli {
int inspect_main(int argc, char** argv);        // dsl/inspect_cmd.cpp
int emit_main(int argc, char** argv);           // codegen/emit_cmd.cpp
int emit_halide_main(int argc, char** argv);    // codegen/halide
int emit_cuda_main(int argc, char** argv);      // codegen/cuda
int bench_main(int argc, char** argv);          // bench/bench_cmd.cpp
int bench_index_main(int argc, char** argv);    // bench/index
int bench_kernels_main(int argc, char** argv);  // bench/kernels
int bench_decode_main(int argc, char** argv);   // bench/decode
int capture_main(int argc, char** argv);        // models/engine
int eval_main(int argc, char** argv);           // models/engine
int tune_main(int argc, char** argv);           // autotune
}  // namespace rattn::cli
