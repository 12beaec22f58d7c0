// The SyncBatchNorm scenarios of ddp_worker (sync_batch_norm_test.cpp starts
// them). PyTorch 1.13's SyncBatchNorm runs on CUDA only, so the oracle is the
// definition: with every rank's rows of one global batch, SyncBatchNorm
// must give each rank its rows of single-process torch::nn::BatchNorm on the
// whole batch: outputs, input gradients, running statistics; and the ranks'
// weight and bias gradients summed give the whole batch's.
#include <cmath>
#include <iostream>

#include "../support/fake_process_group.h"
#include "../support/worker_common.h"

namespace ddp::testing {

namespace {

// Rows per rank, from --batches "3,5,2".
std::vector<int64_t> batch_sizes(const Flags& flags, int world) {
  std::vector<int64_t> sizes;
  for (const auto& s : split_commas(flags.at("--batches"))) sizes.push_back(std::stoll(s));
  EXPECT_OR_FAIL(static_cast<int>(sizes.size()) == world, "--batches must name one size per rank");
  return sizes;
}

// This rank's first row in the concatenated batch, and the batch's rows.
std::pair<int64_t, int64_t> offset_and_total(const std::vector<int64_t>& sizes, int rank) {
  int64_t total = 0, offset = 0;
  for (int r = 0; r < static_cast<int>(sizes.size()); ++r) {
    if (r == rank) offset = total;
    total += sizes[r];
  }
  return {offset, total};
}

// max |a - b| / max |b|: the error relative to the reference's scale, or
// to `floor` where that is smaller (a gradient that is 0 up to rounding).
double rel_error(const torch::Tensor& a, const torch::Tensor& b, double floor = 1e-30) {
  if (b.numel() == 0) return 0.0;
  const double scale = std::max(b.abs().max().item<double>(), floor);
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / scale;
}

struct Case {
  std::string layout;  // "nc", "ncl" (BatchNorm1d), "nchw" (BatchNorm2d)
  bool affine, track;
  c10::optional<double> momentum;
  torch::Dtype dtype;
  std::string name() const {
    return layout + (affine ? "_affine" : "_noaffine") + (track ? "_track" : "_notrack") +
           (momentum ? "_momentum" : "_cumulative") + (dtype == torch::kDouble ? "_double" : "_float");
  }
};

struct Reference {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

Reference make_reference(const Case& c, int64_t channels) {
  auto options = torch::nn::BatchNormOptions(channels).momentum(c.momentum).affine(c.affine).track_running_stats(c.track);
  if (c.layout == "nchw") {
    torch::nn::BatchNorm2d bn(options);
    return {bn.ptr(), [bn](const torch::Tensor& x) mutable { return bn(x); }};
  }
  torch::nn::BatchNorm1d bn(options);
  return {bn.ptr(), [bn](const torch::Tensor& x) mutable { return bn(x); }};
}

std::vector<int64_t> shape_of(const std::string& layout, int64_t rows, int64_t channels) {
  if (layout == "nc") return {rows, channels};
  if (layout == "ncl") return {rows, channels, 7};
  return {rows, channels, 4, 3};
}

// The largest error seen per dtype, for the test's report.
struct Worst {
  double value = 0;
  std::string where;
  void add(double e, const std::string& what) {
    if (e > value) value = e, where = what;
  }
};

}  // namespace

// Every case of Case, three training steps and one in evaluation, against
// torch::nn::BatchNorm on the concatenated batch.
int scenario_sync_bn_definition(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank(), world = pg->size();
  const auto sizes = batch_sizes(flags, world);
  const auto span = offset_and_total(sizes, rank);
  const int64_t offset = span.first, total = span.second;
  const int64_t rows = sizes[rank], channels = 3;
  auto counting = std::make_shared<CountingGroup>(pg);
  std::vector<Case> cases;
  for (std::string layout : {"nc", "ncl", "nchw"})
    for (bool affine : {true, false})
      for (bool track : {true, false})
        for (c10::optional<double> momentum : {c10::optional<double>(0.3), c10::optional<double>()})
          for (auto dtype : {torch::kFloat, torch::kDouble}) cases.push_back({layout, affine, track, momentum, dtype});

  Worst worst_float, worst_double;
  const double tol_double = 1e-12, tol_float = 1e-5;
  for (const auto& c : cases) {
    Worst& worst = c.dtype == torch::kDouble ? worst_double : worst_float;
    const double tol = c.dtype == torch::kDouble ? tol_double : tol_float;
    auto check = [&](const torch::Tensor& ours, const torch::Tensor& ref, const std::string& what) {
      const double e = rel_error(ours, ref);
      worst.add(e, c.name() + " " + what);
      EXPECT_OR_FAIL(e <= tol, c.name() + ": " + what + " differs from single-process BatchNorm by " +
                                   std::to_string(e) + " (relative)");
    };
    torch::manual_seed(7);
    auto ref = make_reference(c, channels);
    ref.module->to(c.dtype);
    auto sync = SyncBatchNorm(
        SyncBatchNormOptions(channels).momentum(c.momentum).affine(c.affine).track_running_stats(c.track), counting);
    sync->to(c.dtype);
    if (c.affine) {
      // Not the defaults (ones, zeros), the same on every rank.
      torch::NoGradGuard no_grad;
      auto w = torch::linspace(0.5, 1.5, channels, c.dtype), b = torch::linspace(-0.2, 0.3, channels, c.dtype);
      for (auto* m : {ref.module.get(), static_cast<torch::nn::Module*>(sync.get())}) {
        m->named_parameters()["weight"].copy_(w);
        m->named_parameters()["bias"].copy_(b);
      }
    }
    for (int step = 0; step < 4; ++step) {
      const bool eval = step == 3;
      ref.module->train(!eval);
      sync->train(!eval);
      torch::manual_seed(100 + step);
      // Offset and scaled, so the variance is not 1 and the mean not 0.
      auto x_all = (torch::randn(shape_of(c.layout, total, channels), torch::kDouble) * 2.5 + 3.0).to(c.dtype);
      auto g_all = torch::randn(x_all.sizes(), torch::kDouble).to(c.dtype);
      auto x_ref = x_all.clone().requires_grad_(true);
      ref.module->zero_grad();
      auto y_ref = ref.forward(x_ref);
      if (!eval) (y_ref * g_all).sum().backward();

      auto x = x_all.narrow(0, offset, rows).clone().requires_grad_(true);
      sync->zero_grad();
      const int64_t gathers = counting->counts().allgathers, reduces = counting->counts().allreduces;
      const std::string at = "step " + std::to_string(step);
      if (eval && !c.track) {
        // Without running statistics evaluation normalises by this rank's
        // own batch, as PyTorch's: nothing to compare with the whole batch's.
        continue;
      }
      auto y = sync(x);
      check(y.detach(), y_ref.detach().narrow(0, offset, rows), at + " output");
      if (eval) {
        EXPECT_OR_FAIL(counting->counts().allgathers == gathers && counting->counts().allreduces == reduces,
                       c.name() + ": evaluation communicated");
        continue;
      }
      (y * g_all.narrow(0, offset, rows)).sum().backward();
      EXPECT_OR_FAIL(counting->counts().allgathers - gathers == 1 && counting->counts().allreduces - reduces == 1,
                     c.name() + ": a training step is one all-gather and one all-reduce");
      check(x.grad(), x_ref.grad().narrow(0, offset, rows), at + " input gradient");
      if (c.affine) {
        auto ref_params = ref.module->named_parameters();
        for (const std::string name : {"weight", "bias"}) {
          // This rank's share; summed over the ranks as DDP would (a rank
          // without rows has none).
          auto grad = sync->named_parameters()[name].grad();
          auto share = grad.defined() ? grad.detach().clone() : torch::zeros({channels}, c.dtype);
          counting->allreduce(share).wait();
          check(share, ref_params[name].grad(), at + " " + name + " gradient summed over ranks");
        }
      }
      if (c.track) {
        auto ref_buffers = ref.module->named_buffers();
        auto buffers = sync->named_buffers();
        check(buffers["running_mean"], ref_buffers["running_mean"], at + " running_mean");
        check(buffers["running_var"], ref_buffers["running_var"], at + " running_var");
        EXPECT_OR_FAIL(torch::equal(buffers["num_batches_tracked"], ref_buffers["num_batches_tracked"]),
                       c.name() + ": num_batches_tracked");
      }
    }
  }
  std::cout << "rank " << rank << ": " << cases.size() << " cases; worst relative error: double "
            << worst_double.value << " (" << worst_double.where << "), float " << worst_float.value << " ("
            << worst_float.where << ")" << std::endl;
  return 0;
}

namespace {

// Conv2d, BatchNorm2d, Linear, BatchNorm1d, Linear: a typed model whose
// norm layers sit in Sequentials, as convert_sync_batchnorm needs.
struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl() {
    namespace nn = torch::nn;
    features = register_module("features", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1)),
                                                          nn::BatchNorm2d(4), nn::ReLU()));
    head = register_module("head", nn::Sequential(nn::Linear(4 * 5 * 5, 16), nn::BatchNorm1d(16), nn::ReLU(),
                                                  nn::Linear(16, 16), nn::BatchNorm1d(16), nn::ReLU(),
                                                  nn::Linear(16, 3)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(features->forward(x).flatten(1)); }
  torch::nn::Sequential features{nullptr}, head{nullptr};
};
TORCH_MODULE(ConvNet);

}  // namespace

// Under DistributedDataParallel with several buckets, over several steps:
// SyncBatchNorm's collectives in forward and backward interleave with the
// reducer's bucket all-reduces (one ordered stream on the backward's thread),
// and training equals single-process training on the concatenated batch.
int scenario_sync_bn_ddp(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank(), world = pg->size();
  const auto sizes = batch_sizes(flags, world);
  const auto span = offset_and_total(sizes, rank);
  const int64_t offset = span.first, total = span.second;
  const int64_t rows = sizes[rank];
  auto counting = std::make_shared<CountingGroup>(pg);
  torch::manual_seed(3);
  ConvNet net, ref;
  net->to(torch::kDouble);
  ref->to(torch::kDouble);
  copy_params(*ref, *net);
  convert_sync_batchnorm(net, counting);
  int sync_layers = 0;
  for (const auto& m : net->modules()) sync_layers += m->as<SyncBatchNorm>() ? 1 : 0;
  EXPECT_OR_FAIL(sync_layers == 3, "three layers converted");
  // --find-unused 1: the reducer's map of used parameters is one more
  // all-reduce, launched after the last bucket.
  const bool find_unused = flags.count("--find-unused") && flags.at("--find-unused") == "1";
  DistributedDataParallel model(net, counting, tiny_buckets().find_unused_parameters(find_unused));
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  double worst = 0;
  for (int step = 0; step < 6; ++step) {
    torch::manual_seed(500 + step);
    auto x_all = torch::randn({total, 2, 5, 5}, torch::kDouble);
    auto y_all = torch::randn({total, 3}, torch::kDouble);
    // The whole batch's loss, sum over rows / total rows: DDP's average of
    // the ranks' gradients is its gradient when each rank's loss is its
    // rows' sum times world / total.
    ref_opt.zero_grad();
    ((ref->forward(x_all) - y_all).pow(2).sum() / static_cast<double>(total)).backward();
    opt.zero_grad();
    const int64_t reduces = counting->counts().allreduces, gathers = counting->counts().allgathers;
    auto out = model(x_all.narrow(0, offset, rows));
    ((out - y_all.narrow(0, offset, rows)).pow(2).sum() * (static_cast<double>(world) / total)).backward();
    const int64_t buckets = static_cast<int64_t>(model.stats().num_buckets);
    // As PyTorch 1.13: one bucket in the first iteration, the caps' after its rebuild.
    if (step > 0)
      EXPECT_OR_FAIL(buckets >= 3, "expected several buckets, got " + std::to_string(buckets) + " of " +
                                     c10::str(model.stats().bucket_bytes) + " bytes");
    EXPECT_OR_FAIL(counting->counts().allgathers - gathers == sync_layers, "one all-gather per SyncBatchNorm in forward");
    EXPECT_OR_FAIL(counting->counts().allreduces - reduces == buckets + sync_layers + (find_unused ? 1 : 0),
                   "one all-reduce per bucket and per SyncBatchNorm, got " +
                       std::to_string(counting->counts().allreduces - reduces));
    auto ref_params = ref->named_parameters();
    for (const auto& p : net->named_parameters()) {
      // A convolution's bias before BatchNorm has a gradient of 0 up to rounding.
      const double e = rel_error(p.value().grad(), ref_params[p.key()].grad(), 1e-3);
      worst = std::max(worst, e);
      EXPECT_OR_FAIL(e <= 1e-10, "step " + std::to_string(step) + ": gradient of " + p.key() +
                                     " differs from single-process training by " + std::to_string(e));
    }
    opt.step();
    ref_opt.step();
    expect_same_across_ranks(*pg, net->parameters(), "parameters after step " + std::to_string(step));
    expect_same_across_ranks(*pg, net->buffers(), "buffers after step " + std::to_string(step));
    auto ref_buffers = ref->named_buffers();
    for (const auto& b : net->named_buffers()) {
      if (!b.value().is_floating_point()) {
        EXPECT_OR_FAIL(torch::equal(b.value(), ref_buffers[b.key()]), b.key());
        continue;
      }
      const double e = rel_error(b.value(), ref_buffers[b.key()]);
      worst = std::max(worst, e);
      EXPECT_OR_FAIL(e <= 1e-10, "step " + std::to_string(step) + ": " + b.key() + " differs by " + std::to_string(e));
    }
  }
  // Evaluation through the wrapper: SyncBatchNorm communicates nothing; as
  // PyTorch's DDP, the first forward after training takes rank 0's buffers
  // (broadcasts only), and the ones after it run no collective at all.
  model->eval();
  ref->eval();
  torch::NoGradGuard no_grad;
  for (int evaluation = 0; evaluation < 2; ++evaluation) {
    const int64_t reduces = counting->counts().allreduces, gathers = counting->counts().allgathers,
                  broadcasts = counting->counts().broadcasts;
    auto x = torch::randn({4, 2, 5, 5}, torch::kDouble);
    const double e = rel_error(model(x), ref->forward(x));
    EXPECT_OR_FAIL(e <= 1e-10, "evaluation differs by " + std::to_string(e));
    EXPECT_OR_FAIL(counting->counts().allreduces == reduces && counting->counts().allgathers == gathers,
                   "evaluation communicated");
    EXPECT_OR_FAIL((counting->counts().broadcasts > broadcasts) == (evaluation == 0),
                   "the first evaluation broadcasts the buffers, the second nothing");
  }
  std::cout << "rank " << rank << ": buckets=" << model.stats().num_buckets << " worst relative error " << worst
            << std::endl;
  return 0;
}

// Bad input is refused before any collective, naming the rank.
int scenario_sync_bn_errors(std::shared_ptr<ProcessGroup> pg) {
  SyncBatchNorm bn(SyncBatchNormOptions(3), pg);
  const std::string tag = "rank " + std::to_string(pg->rank()) + "/" + std::to_string(pg->size());
  for (auto shape : {std::vector<int64_t>{5}, std::vector<int64_t>{4, 2, 6}}) {
    try {
      bn(torch::randn(shape));
      throw Fail("no error for an input of shape " + c10::str(shape));
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_OR_FAIL(what.find(tag) != std::string::npos, "the error names the rank: " + what);
      std::cout << what << std::endl;
    }
  }
  // The group still works: no rank entered a collective.
  auto y = bn(torch::randn({4, 3}));
  EXPECT_OR_FAIL(y.size(0) == 4, "a good input after the errors");
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kSyncBatchNormScenarios{
    {"sync_bn_definition", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_sync_bn_definition(pg, flags); }},
    {"sync_bn_ddp", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_sync_bn_ddp(pg, flags); }},
    {"sync_bn_errors", [](std::shared_ptr<ProcessGroup> pg, const Flags&) { return scenario_sync_bn_errors(pg); }}};

}  // namespace ddp::testing
