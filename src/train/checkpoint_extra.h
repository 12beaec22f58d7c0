// A checkpoint's "extra" entry (TrainState::extra): the program's own state,
// checked to be plain data on the way in and on the way out. Private.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <map>
#include <string>

#include "torch_pickle.h"

namespace ddp::detail {

// The entries as the dict save_checkpoint pickles: tensors copied to the
// CPU. CheckpointError naming the entry (extra["a"]["b"]) for anything but
// tensors, numbers, strings, bools, None, lists, tuples and dicts with str
// or int keys, or for nesting deeper than pickle::kMaxNesting.
c10::impl::GenericDict extra_to_ivalue(const std::map<std::string, c10::IValue>& extra);

// The entry read back (nullptr: a checkpoint without one, empty). Only plain
// data: a Python object or global in it is a CheckpointError naming the
// entry and `path`. Bounded by what the file holds: a value the pickle
// refers to from many places is copied into each, and copies beyond a few
// times the entry's own values (each counted once) are a CheckpointError.
std::map<std::string, c10::IValue> extra_from_pickle(const pickle::ValuePtr& entry, const std::string& path);

}  // namespace ddp::detail
