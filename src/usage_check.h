// check_usage(cond, parts...): throws ddp::UsageError with the parts joined
// (c10::str) when cond is false. For conditions the program using libddp
// causes; TORCH_CHECK stays for libddp's own invariants.
#pragma once

#include <c10/util/StringUtil.h>

#include "ddp/errors.h"

namespace ddp {

template <typename... Parts>
void check_usage(bool cond, const Parts&... parts) {
  if (!cond) throw UsageError(c10::str(parts...));
}

}  // namespace ddp
