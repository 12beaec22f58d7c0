#include "ddp/train/evaluation.h"

#include "ddp/errors.h"

namespace ddp {

MetricSums::MetricSums(std::vector<std::string> names) : names_(std::move(names)), sums_(names_.size(), 0.0) {}

size_t MetricSums::index(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return i;
  throw UsageError("MetricSums: '" + name + "' was not declared");
}

void MetricSums::add(const std::string& name, double value) { sums_[index(name)] += value; }
double MetricSums::sum(const std::string& name) const { return sums_[index(name)]; }
double MetricSums::mean(const std::string& name) const {
  return count_ ? sums_[index(name)] / static_cast<double>(count_) : 0.0;
}

MetricSums MetricSums::all_reduced(ProcessGroup& pg) const {
  // The count travels as a double: exact up to 2^53 samples.
  auto t = torch::empty({static_cast<int64_t>(sums_.size()) + 1}, torch::kDouble);
  auto* p = t.data_ptr<double>();
  for (size_t i = 0; i < sums_.size(); ++i) p[i] = sums_[i];
  p[sums_.size()] = static_cast<double>(count_);
  auto on_device = t.to(pg.device());
  pg.allreduce(on_device).wait();
  t = on_device.cpu();
  p = t.data_ptr<double>();
  MetricSums out(names_);
  for (size_t i = 0; i < sums_.size(); ++i) out.sums_[i] = p[i];
  out.count_ = static_cast<int64_t>(p[sums_.size()]);
  return out;
}

}  // namespace ddp
