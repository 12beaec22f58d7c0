#include "ddp/comm/object_collectives.h"

#include <algorithm>
#include <cstring>

#include "comm/dist/dist_notes.h"
#include "comm/objects/object_exchange.h"
#include "comm/objects/plain_data.h"

namespace ddp {
namespace detail {
namespace {

torch::Tensor to_tensor(const std::string& bytes, int64_t size) {
  auto t = torch::zeros({size}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), std::min<size_t>(bytes.size(), size));
  return t;
}

std::string to_bytes(const torch::Tensor& t, int64_t size) {
  auto c = t.cpu().contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), static_cast<size_t>(size));
}

std::vector<int64_t> to_sizes(const torch::Tensor& t) {
  auto c = t.cpu().contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::vector<int64_t> all_gather_sizes(ProcessGroup& pg, size_t mine) {
  std::vector<int64_t> sizes;
  for (const auto& l : pg.allgather(torch::tensor({static_cast<int64_t>(mine)}, torch::kInt64).to(pg.device())))
    sizes.push_back(l.cpu().item<int64_t>());
  return sizes;
}

void run(ProcessGroup& pg, CollectiveCall::Kind kind, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
         int root) {
  CollectiveCall call;
  call.kind = kind;
  call.inputs = std::move(inputs);
  call.outputs = std::move(outputs);
  call.root = root;
  pg.collective(call).wait();
}

}  // namespace

bool broadcast_flag(ProcessGroup& pg, bool flag, int root) {
  auto t = torch::tensor({flag ? int64_t(1) : int64_t(0)}, torch::kLong).to(pg.device());
  pg.broadcast(t, root).wait();
  return t.cpu().item<int64_t>() != 0;
}

bool any_rank(ProcessGroup& pg, bool flag) {
  auto t = torch::tensor({flag ? int64_t(1) : int64_t(0)}, torch::kLong).to(pg.device());
  pg.allreduce(t).wait();
  return t.cpu().item<int64_t>() > 0;
}

std::string broadcast_bytes(ProcessGroup& pg, std::string bytes, int root) {
  if (pg.size() == 1) return bytes;
  const bool mine = pg.rank() == root;
  auto length = torch::tensor({static_cast<int64_t>(mine ? bytes.size() : 0)}, torch::kInt64).to(pg.device());
  pg.broadcast(length, root).wait();
  const int64_t size = length.cpu().item<int64_t>();
  if (size == 0) return std::string();  // every rank knows: no second collective
  auto data = (mine ? to_tensor(bytes, size) : torch::empty({size}, torch::kUInt8)).to(pg.device());
  pg.broadcast(data, root).wait();
  if (mine) return bytes;  // moved out: a checkpoint's bytes are not copied again
  return to_bytes(data, size);
}

std::vector<std::string> all_gather_bytes(ProcessGroup& pg, const std::string& bytes) {
  if (pg.size() == 1) return {bytes};
  const auto sizes = all_gather_sizes(pg, bytes.size());
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  if (longest == 0) return std::vector<std::string>(sizes.size());
  auto rows = pg.allgather(to_tensor(bytes, longest).to(pg.device()));
  std::vector<std::string> out;
  for (size_t r = 0; r < rows.size(); ++r) out.push_back(to_bytes(rows[r], sizes[r]));
  return out;
}

std::vector<std::string> gather_bytes(ProcessGroup& pg, const std::string& bytes, int root) {
  if (pg.size() == 1) return {bytes};
  const auto sizes = all_gather_sizes(pg, bytes.size());
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  if (longest == 0) return pg.rank() == root ? std::vector<std::string>(sizes.size()) : std::vector<std::string>();
  std::vector<at::Tensor> rows;
  if (pg.rank() == root)
    for (int r = 0; r < pg.size(); ++r) rows.push_back(torch::empty({longest}, torch::kUInt8).to(pg.device()));
  run(pg, CollectiveCall::Kind::Gather, {to_tensor(bytes, longest).to(pg.device())}, rows, root);
  std::vector<std::string> out;
  for (size_t r = 0; r < rows.size(); ++r) out.push_back(to_bytes(rows[r], sizes[r]));
  return out;
}

void refuse_scatter(ProcessGroup& pg, int root) {
  if (pg.size() == 1) return;
  auto sizes = torch::full({pg.size()}, int64_t{-1}, torch::kInt64).to(pg.device());
  pg.broadcast(sizes, root).wait();
}

std::string scatter_bytes(ProcessGroup& pg, const std::vector<std::string>& parts, int root) {
  if (pg.size() == 1) return parts.at(0);
  const bool mine = pg.rank() == root;
  auto sizes = torch::zeros({pg.size()}, torch::kInt64);
  if (mine)
    for (int r = 0; r < pg.size(); ++r) sizes[r] = static_cast<int64_t>(parts.at(static_cast<size_t>(r)).size());
  sizes = sizes.to(pg.device());
  pg.broadcast(sizes, root).wait();
  const auto all = to_sizes(sizes);
  if (all[0] < 0)
    throw UsageError("rank " + std::to_string(pg.rank()) + ": the scatter's source (rank " + std::to_string(root) +
                     " of the group) refused the call; its own error says why");
  const int64_t longest = *std::max_element(all.begin(), all.end());
  if (longest == 0) return std::string();
  std::vector<at::Tensor> rows;
  if (mine)
    for (const auto& part : parts) rows.push_back(to_tensor(part, longest).to(pg.device()));
  auto out = torch::empty({longest}, torch::kUInt8).to(pg.device());
  run(pg, CollectiveCall::Kind::Scatter, rows, {out}, root);
  return to_bytes(out, all[static_cast<size_t>(pg.rank())]);
}

}  // namespace detail

namespace dist {
namespace {

using ddp::detail::dist_who;

// The group's process group, or null (with PyTorch's warning, once per op)
// where this rank is not in it.
std::shared_ptr<ProcessGroup> member_group(const Group& group, const char* op) {
  auto pg = group.process_group();
  if (!pg) ddp::detail::dist_warn_not_in_group(op);
  return pg;
}

c10::IValue decode(const std::string& bytes, const char* op, int from) {
  return detail::decode_plain_data(bytes, dist_who(op) + "from group rank " + std::to_string(from) + ": ");
}

}  // namespace

void all_gather_object(std::vector<c10::IValue>& object_list, const c10::IValue& obj, const Group& group) {
  const auto pg = member_group(group, "all_gather_object");
  if (!pg) return;
  if (object_list.size() != static_cast<size_t>(pg->size()))
    throw UsageError(dist_who("all_gather_object") + "object_list has " + std::to_string(object_list.size()) +
                     " entries; it must have one per rank of the group (" + std::to_string(pg->size()) + ")");
  const auto parts = detail::all_gather_bytes(*pg, detail::encode_plain_data(obj, dist_who("all_gather_object")));
  for (size_t r = 0; r < parts.size(); ++r) object_list[r] = decode(parts[r], "all_gather_object", static_cast<int>(r));
}

void gather_object(const c10::IValue& obj, std::vector<c10::IValue>* object_gather_list, int dst,
                   const Group& group) {
  const auto pg = member_group(group, "gather_object");
  if (!pg) return;
  const int root = ddp::detail::dist_root_of(group, dst, "gather_object", "dst");
  const bool is_root = pg->rank() == root;
  if (is_root && !object_gather_list)
    throw UsageError(dist_who("gather_object") +
                     "Argument `object_gather_list` must be specified on destination rank.");
  if (!is_root && object_gather_list)
    throw UsageError(dist_who("gather_object") +
                     "Argument `object_gather_list` must NOT be specified on non-destination ranks.");
  if (is_root && object_gather_list->size() != static_cast<size_t>(pg->size()))
    throw UsageError(dist_who("gather_object") + "object_gather_list has " +
                     std::to_string(object_gather_list->size()) +
                     " entries; it must have one per rank of the group (" + std::to_string(pg->size()) + ")");
  const auto parts = detail::gather_bytes(*pg, detail::encode_plain_data(obj, dist_who("gather_object")), root);
  for (size_t r = 0; r < parts.size() && is_root; ++r)
    (*object_gather_list)[r] = decode(parts[r], "gather_object", static_cast<int>(r));
}

void broadcast_object_list(std::vector<c10::IValue>& object_list, int src, const Group& group) {
  const auto pg = member_group(group, "broadcast_object_list");
  if (!pg) return;
  const int root = ddp::detail::dist_root_of(group, src, "broadcast_object_list", "src");
  std::string bytes;
  if (pg->rank() == root)
    bytes = detail::encode_plain_data(c10::ivalue::Tuple::create(object_list), dist_who("broadcast_object_list"));
  bytes = detail::broadcast_bytes(*pg, std::move(bytes), root);
  if (pg->rank() == root) return;
  const auto sent = decode(bytes, "broadcast_object_list", root);
  if (!sent.isTuple())
    throw DataError(dist_who("broadcast_object_list") + "src sent a " + sent.tagKind() +
                    ", not the list of objects (every rank must call the same object collectives in the same order)");
  const auto& elements = sent.toTupleRef().elements();
  if (elements.size() != object_list.size())
    throw UsageError(dist_who("broadcast_object_list") + "object_list has " + std::to_string(object_list.size()) +
                     " entries here and " + std::to_string(elements.size()) +
                     " on src: every rank passes a list of the same length");
  for (size_t i = 0; i < elements.size(); ++i) object_list[i] = elements[i];
}

void scatter_object_list(std::vector<c10::IValue>& scatter_object_output_list,
                         const std::vector<c10::IValue>* scatter_object_input_list, int src, const Group& group) {
  const auto pg = member_group(group, "scatter_object_list");
  if (!pg) return;
  if (scatter_object_output_list.empty())
    throw UsageError(dist_who("scatter_object_list") +
                     "Expected argument scatter_object_output_list to be a list of size at least 1.");
  const int root = ddp::detail::dist_root_of(group, src, "scatter_object_list", "src");
  std::vector<std::string> parts;
  if (pg->rank() == root) {
    // What src cannot send, it refuses on every rank: the others, waiting
    // in the scatter, hear of it at once instead of at their timeout.
    try {
      if (!scatter_object_input_list)
        throw UsageError(dist_who("scatter_object_list") + "scatter_object_input_list must be given on src");
      if (scatter_object_input_list->size() != static_cast<size_t>(pg->size()))
        throw UsageError(dist_who("scatter_object_list") + "scatter_object_input_list has " +
                         std::to_string(scatter_object_input_list->size()) +
                         " entries on src; it must have one per rank of the group (" + std::to_string(pg->size()) +
                         ")");
      for (const auto& obj : *scatter_object_input_list)
        parts.push_back(detail::encode_plain_data(obj, dist_who("scatter_object_list")));
    } catch (const std::exception&) {
      detail::refuse_scatter(*pg, root);
      throw;
    }
  }
  scatter_object_output_list[0] = decode(detail::scatter_bytes(*pg, parts, root), "scatter_object_list", root);
}

c10::IValue list(std::vector<c10::IValue> items) {
  c10::impl::GenericList out(c10::AnyType::get());
  out.reserve(items.size());
  for (auto& item : items) out.push_back(std::move(item));
  return out;
}

c10::IValue tuple(std::vector<c10::IValue> items) { return c10::ivalue::Tuple::create(std::move(items)); }

c10::IValue dict(std::vector<std::pair<c10::IValue, c10::IValue>> items) {
  auto key_type = [](const c10::IValue& k) -> c10::TypePtr {
    if (k.isString()) return c10::StringType::get();
    if (k.isInt()) return c10::IntType::get();
    if (k.isDouble()) return c10::FloatType::get();
    if (k.isBool()) return c10::BoolType::get();
    throw UsageError(dist_who("dict") + "a key is a " + k.tagKind() + "; keys are strings, ints, doubles or bools");
  };
  const c10::TypePtr keys = items.empty() ? c10::StringType::get() : key_type(items.front().first);
  c10::impl::GenericDict out(keys, c10::AnyType::get());
  for (auto& [k, v] : items) {
    if (*key_type(k) != *keys)
      throw UsageError(dist_who("dict") + "keys of two kinds (" + keys->str() + " and " + key_type(k)->str() +
                       "); a dict's keys are all of one kind, as the object collectives send them");
    if (!out.insert(k, std::move(v)).second)
      throw UsageError(dist_who("dict") + "the key " + c10::str(k) + " is given twice");
  }
  return out;
}

}  // namespace dist
}  // namespace ddp
