// Moved to <ddp/comm/process_group.h> (issue 28: the core in folders per part). This
// forwarding header keeps existing includes working until 1.0; new code
// includes the folder path.
#pragma once

#include "ddp/comm/process_group.h"
