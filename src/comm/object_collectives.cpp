#include "ddp/comm/object_collectives.h"

#include <algorithm>
#include <cstring>

namespace ddp {
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

}  // namespace

std::string broadcast_object(ProcessGroup& pg, std::string bytes, int root) {
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

std::vector<std::string> all_gather_object(ProcessGroup& pg, const std::string& bytes) {
  if (pg.size() == 1) return {bytes};
  auto lengths = pg.allgather(torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64).to(pg.device()));
  std::vector<int64_t> sizes;
  int64_t longest = 0;
  for (const auto& l : lengths) {
    sizes.push_back(l.cpu().item<int64_t>());
    longest = std::max(longest, sizes.back());
  }
  if (longest == 0) return std::vector<std::string>(sizes.size());
  auto rows = pg.allgather(to_tensor(bytes, longest).to(pg.device()));
  std::vector<std::string> out;
  for (size_t r = 0; r < rows.size(); ++r) out.push_back(to_bytes(rows[r], sizes[r]));
  return out;
}

}  // namespace ddp
