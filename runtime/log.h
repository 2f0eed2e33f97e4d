#pragma once
// The log lives in core (codegen logs compiler output too).
#include "core/log.h"
