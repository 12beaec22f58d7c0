// Between state dicts and the pickle value tree: what checkpoint.cpp and
// state_dict.cpp share, kept out of the installed headers.
#pragma once

#include <ATen/core/Dict.h>

#include "ddp/train/state_dict.h"
#include "torch_pickle.h"

namespace ddp::detail {

// A pickled dict of name -> tensor into `out`; false if `v` is not one.
bool to_state_dict(const pickle::ValuePtr& v, StateDict& out);
// A GenericDict of name -> tensor for torch::pickle_save.
c10::impl::GenericDict to_ivalue(const StateDict& state);

}  // namespace ddp::detail
