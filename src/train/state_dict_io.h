// Between state dicts and the pickle value tree: what checkpoint.cpp and
// state_dict.cpp share, kept out of the installed headers.
#pragma once

#include <ATen/core/Dict.h>

#include <string>
#include <vector>

#include "ddp/train/state_dict.h"
#include "torch_pickle.h"

namespace ddp::detail {

// A pickled dict of name -> tensor into `out`; false if `v` is not one.
bool to_state_dict(const pickle::ValuePtr& v, StateDict& out);
// A GenericDict of name -> tensor for torch::pickle_save.
c10::impl::GenericDict to_ivalue(const StateDict& state);

// `msg` and the names that do not fit a model: missing from the state,
// unexpected in it, of another shape ("name (file [2, 3], model [3, 2])").
std::string misfit_message(std::string msg, const std::vector<std::string>& missing,
                           const std::vector<std::string>& unexpected, const std::vector<std::string>& mismatched);

}  // namespace ddp::detail
