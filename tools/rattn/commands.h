#pragma once
// Entry points of the `rattn` subcommands (tools/rattn/*.cpp).
// argv[0] is the subcommand name. Return the process exit status.
namespace rattn::cli {
int inspect_main(int argc, char** argv);       // inspect.cpp
int emit_main(int argc, char** argv);          // emit.cpp
int emit_halide_main(int argc, char** argv);   // emit_halide.cpp
int emit_cuda_main(int argc, char** argv);     // emit_cuda.cpp
int emit_library_main(int argc, char** argv);  // emit_library.cpp
int bench_main(int argc, char** argv);         // bench.cpp: index, kernels, decode
int bench_index_main(int argc, char** argv);   // bench_index.cpp
int bench_kernels_main(int argc, char** argv); // bench_kernels.cpp
int bench_decode_main(int argc, char** argv);  // bench_decode.cpp
int capture_main(int argc, char** argv);       // capture.cpp
int eval_main(int argc, char** argv);          // eval.cpp
int tune_main(int argc, char** argv);          // tune.cpp
int tune_plan_main(int argc, char** argv);     // tune_plan.cpp: `rattn tune MODEL.ra ...`, the pass per hardware
}  // namespace rattn::cli
