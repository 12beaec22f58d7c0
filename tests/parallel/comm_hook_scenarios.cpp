// Communication hooks in ddp_worker: what register_comm_hook accepts and
// refuses, what a hook sees and what the reducer does with its result, and
// the built-in hooks' errors for dtypes a backend cannot reduce.
#include <torch/version.h>

#include <iostream>

#include "../support/worker_common.h"

namespace ddp::testing {

namespace {

// This rank's rows of the global batch, through the wrapped model.
template <typename Model>
void one_backward(Model& model, int step, int rank, int world) {
  auto [x, y] = global_batch(step, 4 * world);
  torch::mse_loss(model(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
}

template <typename F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const ddp::UsageError& e) {
    std::cout << "caught: " << e.what() << std::endl;
    return e.what();
  }
  return "";
}

// What a hook was given, per call.
struct Seen {
  std::vector<size_t> indices;
  std::vector<bool> last;
  size_t parameters = 0;
};

}  // namespace

// register_comm_hook twice, or after a synchronised backward: UsageErrors
// in PyTorch's words, on every rank, with no collective.
int scenario_comm_hook_usage(std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  {
    ddp::DistributedDataParallel model(Net(false, false), pg);
    model.register_comm_hook(pg, ddp::hooks::allreduce_hook);
    const auto twice = usage_error_of([&] { model.register_comm_hook(pg, ddp::hooks::fp16_compress_hook); });
    EXPECT_OR_FAIL(twice.find("can only be called once") != std::string::npos, "a second hook is refused");
    EXPECT_OR_FAIL(twice.find("rank " + std::to_string(rank)) == 0, "names the rank");
    one_backward(model, 0, rank, world);  // the first hook still works
  }
  {
    ddp::DistributedDataParallel model(Net(false, false), pg);
    one_backward(model, 0, rank, world);
    const auto late = usage_error_of([&] { model.register_comm_hook(pg, ddp::hooks::allreduce_hook); });
    EXPECT_OR_FAIL(late.find("before the first forward and backward") != std::string::npos,
                   "a hook after the first backward is refused");
    one_backward(model, 1, rank, world);  // and the model goes on without it
  }
  return 0;
}

// A hook with state of its own: it sees every bucket once, in launch order,
// with its parameters and their gradients, undivided; what it returns is
// what the gradients become, and the reducer divides no further.
int scenario_comm_hook_semantics(std::shared_ptr<ProcessGroup> pg) {
  const int rank = pg->rank(), world = pg->size();
  Net net(false, false), reference(false, false);
  ddp::DistributedDataParallel model(net, pg, tiny_buckets());
  copy_params(*net, *reference);  // rank 0's, after the constructor's broadcast
  auto seen = std::make_shared<Seen>();
  // Sums without dividing: the gradients must come out world times the average.
  model.register_comm_hook(seen, [pg](std::shared_ptr<Seen>& s, ddp::GradBucket& bucket) {
    s->indices.push_back(bucket.index());
    s->last.push_back(bucket.is_last());
    s->parameters += bucket.parameters().size();
    auto grads = bucket.gradients();
    EXPECT_OR_FAIL(grads.size() == bucket.parameters().size(), "one gradient per parameter");
    for (size_t k = 0; k < grads.size(); ++k) {
      EXPECT_OR_FAIL(grads[k].sizes() == bucket.parameters()[k].sizes(), "gradients are shaped as parameters");
      EXPECT_OR_FAIL(torch::equal(grads[k], bucket.parameters()[k].grad()),
                     "the bucket holds the local gradient, not divided by the world size");
    }
    at::Tensor buffer = bucket.buffer();
    return ddp::CommFuture(pg->allreduce(buffer), buffer);
  });
  // The second backward, after the rebuild: several buckets.
  one_backward(model, 0, rank, world);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  *seen = Seen();
  one_backward(model, 1, rank, world);
  const size_t buckets = model.stats().num_buckets;
  EXPECT_OR_FAIL(buckets >= 3, "tiny buckets make several");
  EXPECT_OR_FAIL(seen->indices.size() == buckets, "one call per bucket");
  for (size_t k = 0; k < buckets; ++k) {
    EXPECT_OR_FAIL(seen->indices[k] == k, "buckets come in launch order");
    EXPECT_OR_FAIL(seen->last[k] == (k + 1 == buckets), "is_last() marks the last one only");
  }
  EXPECT_OR_FAIL(seen->parameters == unique_parameters(*net).size(), "every parameter in one bucket");

  // The single-process gradient of the global batch is the average; the sum
  // is world times it.
  auto [x, y] = global_batch(1, 4 * world);
  torch::mse_loss(reference(x), y).backward();
  auto ref = reference->named_parameters(true);
  for (auto& p : net->named_parameters(true)) {
    auto expected = ref[p.key()].grad() * world;
    EXPECT_OR_FAIL(torch::allclose(p.value().grad(), expected, 1e-6, 1e-9),
                   "gradient of " + p.key() + " is the hook's sum, not divided again");
  }

  // A hook that communicates nothing leaves each rank its own gradient.
  Net local(false, false);
  copy_params(*reference, *local);
  ddp::DistributedDataParallel alone(local, pg);
  alone.register_comm_hook(0, [](int&, ddp::GradBucket& bucket) { return ddp::CommFuture::ready(bucket.buffer()); });
  one_backward(alone, 1, rank, world);
  Net mine(false, false);
  copy_params(*reference, *mine);
  torch::mse_loss(mine(x.narrow(0, 4 * rank, 4)), y.narrow(0, 4 * rank, 4)).backward();
  auto mine_params = mine->named_parameters(true);
  for (auto& p : local->named_parameters(true))
    EXPECT_OR_FAIL(torch::equal(p.value().grad(), mine_params[p.key()].grad()),
                   "gradient of " + p.key() + " is this rank's own with a hook that does not communicate");
  return 0;
}

// bf16_compress_hook where the backend cannot sum bfloat16 (Gloo in LibTorch
// 1.13): backward fails on every rank with a CommError that names the dtype
// and the backend and says what to use; where it can, the step works.
int scenario_comm_hook_bf16(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank(), world = pg->size();
  // Gloo learnt bfloat16 after LibTorch 1.13; later versions may go either way.
  const std::string expect = flags.count("--expect") ? flags["--expect"]
                             : (TORCH_VERSION_MAJOR < 2 && pg->backend_name() == "gloo") ? "fails"
                                                                                          : "either";
  Net net(false, false), reference(false, false);
  ddp::DistributedDataParallel model(net, pg);
  copy_params(*net, *reference);
  if (flags["--hook"] == "wrapper")
    model.register_comm_hook(pg, ddp::hooks::bf16_compress_wrapper(ddp::hooks::allreduce_hook));
  else
    model.register_comm_hook(pg, ddp::hooks::bf16_compress_hook);
  try {
    one_backward(model, 0, rank, world);
  } catch (const ddp::CommError& e) {
    const std::string what = e.what();
    std::cout << "caught: " << what << std::endl;
    EXPECT_OR_FAIL(what.find("rank " + std::to_string(rank)) == 0, "names the rank");
    EXPECT_OR_FAIL(what.find("BFloat16") != std::string::npos, "names the dtype");
    EXPECT_OR_FAIL(what.find(pg->backend_name()) != std::string::npos, "names the backend");
    EXPECT_OR_FAIL(what.find("fp16_compress_hook") != std::string::npos, "says what to use instead");
    EXPECT_OR_FAIL(expect != "works", "bf16 was expected to work here");
    return 0;
  }
  EXPECT_OR_FAIL(expect != "fails", "bf16 was expected to fail here");
  // bfloat16 keeps 8 significant bits.
  auto [x, y] = global_batch(0, 4 * world);
  torch::mse_loss(reference(x), y).backward();
  auto ref = reference->named_parameters(true);
  for (auto& p : net->named_parameters(true))
    EXPECT_OR_FAIL(torch::allclose(p.value().grad(), ref[p.key()].grad(), 2e-2, 1e-3),
                   "gradient of " + p.key() + " is the average, to bfloat16's precision");
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kCommHookScenarios{
    {"comm_hook_usage", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_comm_hook_usage(pg); }},
    {"comm_hook_semantics", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_comm_hook_semantics(pg); }},
    {"comm_hook_bf16", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_comm_hook_bf16(pg, flags); }}};

}  // namespace ddp::testing
