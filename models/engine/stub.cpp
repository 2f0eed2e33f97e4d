// Placeholder until the GGUF engine lands (issue 7).
#include "core/error.h"
#include "tools/rattn/commands.h"
int rattn::cli::capture_main(int, char**) { rattn::fail(rattn::Status::unsupported, "capture: not built yet"); }
int rattn::cli::eval_main(int, char**) { rattn::fail(rattn::Status::unsupported, "eval: not built yet"); }
