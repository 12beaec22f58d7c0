#include "ddp/parallel/comm_hook.h"

namespace ddp {

GradBucket::GradBucket(size_t index, size_t bucket_count, at::Tensor buffer, std::vector<at::Tensor> parameters)
    : index_(index), bucket_count_(bucket_count), buffer_(std::move(buffer)), parameters_(std::move(parameters)) {}

std::vector<at::Tensor> GradBucket::gradients() const {
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& p : parameters_) {
    out.push_back(buffer_.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

struct CommFuture::State {
  Work work;
  at::Tensor value;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> continuations;
  bool done = false;
};

CommFuture::CommFuture(Work work, at::Tensor result) : state_(std::make_shared<State>()) {
  state_->work = std::move(work);
  state_->value = std::move(result);
}

CommFuture CommFuture::ready(at::Tensor result) { return CommFuture(Work(), std::move(result)); }

CommFuture CommFuture::then(std::function<at::Tensor(const at::Tensor&)> fn) && {
  TORCH_CHECK(state_, "CommFuture::then on an empty future");
  state_->continuations.push_back(std::move(fn));
  return std::move(*this);
}

bool CommFuture::on_complete(std::function<void()> fn) {
  TORCH_CHECK(state_, "CommFuture::on_complete on an empty future");
  if (state_->done || !state_->continuations.empty() || !state_->work.valid()) return false;
  return state_->work.on_complete(std::move(fn));
}

at::Tensor CommFuture::wait() {
  TORCH_CHECK(state_, "CommFuture::wait on an empty future");
  if (!state_->done) {
    state_->work.wait();
    state_->done = true;  // a continuation that throws is not run again
    torch::NoGradGuard no_grad;
    for (auto& fn : state_->continuations) state_->value = fn(state_->value);
    state_->continuations.clear();
  }
  return state_->value;
}

}  // namespace ddp
