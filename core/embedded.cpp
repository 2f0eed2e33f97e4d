// The weak default of rattn::embedded::payload(): no payload. A deployable
// library links a generated object with the strong definition.
#include "core/embedded_abi.h"

namespace rattn::embedded {

__attribute__((weak)) const Payload* payload() { return nullptr; }

}  // namespace rattn::embedded
