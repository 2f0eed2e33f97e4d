// Placeholder until the CUDA generator lands (issue 5).
#include "core/error.h"
#include "tools/rattn/commands.h"
int rattn::cli::emit_cuda_main(int, char**) { rattn::fail(rattn::Status::unsupported, "emit --target cuda: not built yet"); }
