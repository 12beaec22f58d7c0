// Host copies of a checkpoint's tensors, made on the training thread for the
// background writer (checkpoint_writer.cpp): buffers kept from one save to
// the next, page-locked for a GPU's tensors, which are copied on a side
// stream so that the training stream only waits where it would change a
// tensor still being copied. Private.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace ddp::detail {

class StagingBuffers {
 public:
  StagingBuffers();
  ~StagingBuffers();
  StagingBuffers(const StagingBuffers&) = delete;
  StagingBuffers& operator=(const StagingBuffers&) = delete;

  // A new save: the i-th tensor staged goes to the i-th buffer again when
  // that has its shape and dtype, so that a run's saves allocate once.
  void restart();
  // A host copy of `t` (undefined stays undefined). A GPU tensor's copy is
  // queued on the side stream of its device, after the work queued so far on
  // that device's current stream; it is in the buffer once seal()'s wait ends.
  at::Tensor copy(const at::Tensor& t);
  // On the training thread, after the last copy of a save: each current
  // stream that had tensors copied waits for the copies (the optimizer's
  // next step must not change a tensor on its way to the host), without the
  // host waiting. The function returned blocks until every copy is in host
  // memory: the writer's thread calls it before reading a buffer.
  std::function<void()> seal();

 private:
  struct Side;
  std::vector<at::Tensor> buffers_;
  size_t next_ = 0;
  std::vector<std::unique_ptr<Side>> sides_;  // one per GPU, made on first use
};

}  // namespace ddp::detail
