// Placeholder until the Halide kernels land (issue 4).
#include "core/error.h"
#include "tools/rattn/commands.h"
int rattn::cli::emit_halide_main(int, char**) { rattn::fail(rattn::Status::unsupported, "emit --target halide: not built yet"); }
