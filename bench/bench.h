#pragma once
// The three benchmarks, each parsing its own options (argv[0] is the
// benchmark's name) and printing its report; `rattn bench` calls them.
// Return the process exit status.
namespace rattn::bench {
int bench_index(int argc, char** argv);    // bench/index
int bench_kernels(int argc, char** argv);  // bench/kernels
int bench_decode(int argc, char** argv);   // bench/decode
}  // namespace rattn::bench
