// torch.distributed's object collectives for C++ ranks: all_gather_object,
// broadcast_object_list, gather_object and scatter_object_list exchange
// values that are not one tensor: strings (any bytes), numbers, tensors,
// and lists, tuples and dicts of them, as c10::IValue.
//
//   dist.all_gather_object(out, obj)               ->  dist::all_gather_object(out, obj);
//   dist.broadcast_object_list(objs, src=0)        ->  dist::broadcast_object_list(objs, 0);
//   dist.gather_object(obj, out if r == 0 else None, dst=0)
//                                                  ->  dist::gather_object(obj, r == 0 ? &out : nullptr, 0);
//   dist.scatter_object_list(out, ins if r == 0 else None, src=0)
//                                                  ->  dist::scatter_object_list(out, r == 0 ? &ins : nullptr, 0);
//
// Building a value to send, as Python writes it:
//   {"step": 3, "names": ["a", "b"], "shape": (2, 3)}
//   ->  dist::dict({{"step", 3}, {"names", dist::list({"a", "b"})}, {"shape", dist::tuple({2, 3})}})
//
// As in PyTorch, the sizes travel first, then the bytes, on the group's
// device; src and dst are global ranks; a rank outside the group does
// nothing (a warning, once per op). Unlike pickle, the encoding is plain
// data: what a rank receives only ever becomes such values, never runs
// code, and a malformed message is a DataError. Values come back as they
// were sent (a c10::List<int64_t> as one; tensors on the device they came
// from, as PyTorch's unpickling puts them); exchanging objects with Python
// ranks is not a goal.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

#include "ddp/comm/dist.h"

namespace ddp::dist {

// object_list: one entry per rank of the group (its size); entry r becomes
// rank r's obj.
void all_gather_object(std::vector<c10::IValue>& object_list, const c10::IValue& obj, const Group& group = {});

// On `dst`, object_gather_list (one entry per rank of the group) gets every
// rank's obj; every other rank passes nullptr (PyTorch's None).
void gather_object(const c10::IValue& obj, std::vector<c10::IValue>* object_gather_list = nullptr, int dst = 0,
                   const Group& group = {});

// Every rank's object_list becomes src's (each rank passes a list of the
// same length; on the others its entries are overwritten).
void broadcast_object_list(std::vector<c10::IValue>& object_list, int src = 0, const Group& group = {});

// Rank r of the group gets scatter_object_input_list[r] in
// scatter_object_output_list[0] (a list of at least one entry). The input
// list is given on src (one entry per rank of the group), nullptr elsewhere
// (PyTorch's None; ignored there). Where src refuses the call (no list, the
// wrong size, a value it cannot send), every rank throws a UsageError.
void scatter_object_list(std::vector<c10::IValue>& scatter_object_output_list,
                         const std::vector<c10::IValue>* scatter_object_input_list = nullptr, int src = 0,
                         const Group& group = {});

// Values as Python writes them, for the object collectives: a list, a tuple
// and a dict of any values (c10's GenericList, Tuple and GenericDict; a
// dict's keys are strings, ints, doubles or bools, all of one kind).
// dist::list({1, 2.5, "x"}), dist::tuple({...}), dist::dict({{"k", v}, ...}).
c10::IValue list(std::vector<c10::IValue> items);
c10::IValue tuple(std::vector<c10::IValue> items);
c10::IValue dict(std::vector<std::pair<c10::IValue, c10::IValue>> items);

}  // namespace ddp::dist
