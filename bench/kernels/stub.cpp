// Placeholder until this benchmark lands.
#include "core/error.h"
#include "tools/rattn/commands.h"
int rattn::cli::bench_kernels_main(int, char**) { rattn::fail(rattn::Status::unsupported, "bench kernels: not built yet"); }
