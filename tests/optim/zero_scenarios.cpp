// ddp::ZeroRedundancyOptimizer's scenarios of ddp_worker: the models, data
// and optimizers of pytorch_zero_parity.py under DDP + ZeRO (zero_parity),
// each checked on every rank against the unsharded optimizer; a checkpoint
// taken after 15 steps and resumed (zero_resume); and the usage errors
// (zero_usage).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "../support/worker_common.h"
#include "optim/zero_state.h"

namespace ddp::testing {
namespace {

constexpr int kZeroRows = 8, kIn = 10, kOut = 3, kSteps = 30;
// l2's weight, 24 x kWide floats, is over 1 MiB: ZeRO broadcasts it in place,
// the others coalesced.
constexpr int kWide = 11000;

// Four Linear layers of different sizes, so the partition has something to
// balance. pytorch_zero_parity.py's Net: change both together.
struct ZeroNetImpl : torch::nn::Module {
  explicit ZeroNetImpl(bool extra = false) {
    l1 = register_module("l1", torch::nn::Linear(kIn, 24));
    l2 = register_module("l2", torch::nn::Linear(24, kWide));
    l3 = register_module("l3", torch::nn::Linear(kWide, 6));
    l4 = register_module("l4", torch::nn::Linear(6, kOut));
    if (extra) register_module("l5", torch::nn::Linear(3, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    return l4(torch::tanh(l3(torch::tanh(l2(torch::tanh(l1(x)))))));
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr}, l4{nullptr};
};
TORCH_MODULE(ZeroNet);

std::pair<torch::Tensor, torch::Tensor> zero_batch(int step, int rank) {
  auto n = torch::arange(kZeroRows, torch::kDouble).unsqueeze(1);
  auto x = torch::sin(0.1 * (step * 1000 + rank * 100 + n * 7 + torch::arange(kIn, torch::kDouble).unsqueeze(0) * 3))
               .to(torch::kFloat);
  auto y = torch::cos(0.05 * (step * 500 + rank * 50 + n * 5 + torch::arange(kOut, torch::kDouble).unsqueeze(0)))
               .to(torch::kFloat);
  return {x, y};
}

// The cases of pytorch_zero_parity.py: change both together.
std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::string& c, ZeroNet& net) {
  if (c != "sgd_groups") return {torch::optim::OptimizerParamGroup(net->parameters())};
  std::vector<torch::Tensor> a, b;
  for (auto& p : net->l1->parameters()) a.push_back(p);
  for (auto& p : net->l2->parameters()) a.push_back(p);
  for (auto& p : net->l3->parameters()) b.push_back(p);
  for (auto& p : net->l4->parameters()) b.push_back(p);
  return {torch::optim::OptimizerParamGroup(a),
          torch::optim::OptimizerParamGroup(b, std::make_unique<torch::optim::SGDOptions>(
                                                   torch::optim::SGDOptions(0.02).momentum(0.5)))};
}

auto sgd_options() { return torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3); }
auto adam_options() { return torch::optim::AdamOptions(1e-2).weight_decay(1e-3); }
auto adamw_options() { return torch::optim::AdamWOptions(1e-2).weight_decay(1e-2); }

std::unique_ptr<torch::optim::Optimizer> make_zero(const std::string& c, ZeroNet& net, std::shared_ptr<ProcessGroup> pg) {
  if (c == "adam") return std::make_unique<ZeroRedundancyOptimizer>(groups_of(c, net), adam_options(), pg);
  if (c == "adamw") return std::make_unique<ZeroRedundancyOptimizer>(groups_of(c, net), adamw_options(), pg);
  return std::make_unique<ZeroRedundancyOptimizer>(groups_of(c, net), sgd_options(), pg);
}

std::unique_ptr<torch::optim::Optimizer> make_plain(const std::string& c, ZeroNet& net) {
  if (c == "adam") return std::make_unique<torch::optim::Adam>(groups_of(c, net), adam_options());
  if (c == "adamw") return std::make_unique<torch::optim::AdamW>(groups_of(c, net), adamw_options());
  return std::make_unique<torch::optim::SGD>(groups_of(c, net), sgd_options());
}

ZeroNet fresh_net() {
  ZeroNet net;
  init_parity_parameters(*net);
  return net;
}

// Steps [from, to) of DDP(net) with `opt`, gradient_as_bucket_view=True as
// the oracle's.
void train(ZeroNet& net, std::shared_ptr<ProcessGroup> pg, torch::optim::Optimizer& opt, int from, int to) {
  ddp::DistributedDataParallel model(net, pg, ddp::DDPOptions().gradient_as_bucket_view(true));
  for (int step = from; step < to; ++step) {
    auto [x, y] = zero_batch(step, pg->rank());
    opt.zero_grad();
    torch::mse_loss(model(x), y).backward();
    opt.step();
  }
}

std::vector<torch::Tensor> params_of(ZeroNet& net) { return net->parameters(); }

void expect_bitwise(ZeroNet& a, ZeroNet& b, const std::string& what) {
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_OR_FAIL(torch::equal(pa[i], pb[i]),
                   what + ": parameter " + std::to_string(i) + " differs by " +
                       std::to_string((pa[i] - pb[i]).abs().max().item<double>()));
}

using ddp::zero_state::key_of;

// Whether two plain optimizers over the same parameters hold the same state, bitwise.
bool same_state(torch::optim::Optimizer& a, torch::optim::Optimizer& b, const std::vector<torch::Tensor>& params) {
  auto key = [&](const torch::Tensor& p) { return key_of(a.state(), p); };
  if (a.state().size() != b.state().size()) return false;
  for (const auto& p : params) {
    auto ia = a.state().find(key(p)), ib = b.state().find(key(p));
    if ((ia == a.state().end()) != (ib == b.state().end())) return false;
    if (ia == a.state().end()) continue;
    if (auto* x = dynamic_cast<torch::optim::SGDParamState*>(ia->second.get())) {
      auto* y = dynamic_cast<torch::optim::SGDParamState*>(ib->second.get());
      if (!torch::equal(x->momentum_buffer(), y->momentum_buffer())) return false;
    } else {
      auto* u = dynamic_cast<torch::optim::AdamParamState*>(ia->second.get());
      auto* v = dynamic_cast<torch::optim::AdamParamState*>(ib->second.get());
      if (u) {
        if (u->step() != v->step() || !torch::equal(u->exp_avg(), v->exp_avg()) || !torch::equal(u->exp_avg_sq(), v->exp_avg_sq()))
          return false;
      } else {
        auto* m = dynamic_cast<torch::optim::AdamWParamState*>(ia->second.get());
        auto* n = dynamic_cast<torch::optim::AdamWParamState*>(ib->second.get());
        if (m->step() != n->step() || !torch::equal(m->exp_avg(), n->exp_avg()) || !torch::equal(m->exp_avg_sq(), n->exp_avg_sq()))
          return false;
      }
    }
  }
  return true;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

// --out DIR --cases a,b: each case's final parameters (cpp_<case>_rank<r>.bin)
// and owners (cpp_<case>_owner_rank<r>.bin, one float per parameter).
int scenario_zero_parity(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank();
  for (const auto& c : split_commas(flags.at("--cases"))) {
    auto net = fresh_net();
    auto opt = make_zero(c, net, pg);
    auto& zero = dynamic_cast<ZeroRedundancyOptimizer&>(*opt);
    train(net, pg, *opt, 0, kSteps);
    expect_same_across_ranks(*pg, params_of(net), c + ": parameters");
    // State only for this rank's share; every parameter had a gradient.
    size_t own = 0;
    std::string owners;
    for (auto& p : net->parameters()) {
      const float owner = static_cast<float>(zero.rank_of(p));
      own += zero.rank_of(p) == rank;
      owners.append(reinterpret_cast<const char*>(&owner), sizeof owner);
    }
    EXPECT_OR_FAIL(zero.local_optimizer().state().size() == own,
                   c + ": state for " + std::to_string(zero.local_optimizer().state().size()) + " parameters, owns " +
                       std::to_string(own));
    EXPECT_OR_FAIL(zero.state().empty(), c + ": the wrapper's own state() is not empty");
    // The unsharded optimizer on every rank: the same arithmetic per parameter.
    auto ref = fresh_net();
    auto plain = make_plain(c, ref);
    train(ref, pg, *plain, 0, kSteps);
    expect_bitwise(net, ref, c + ": ZeRO against the unsharded optimizer");
    write_bytes(flags.at("--out") + "/cpp_" + c + "_rank" + std::to_string(rank) + ".bin", parity_state_bytes(*net));
    write_bytes(flags.at("--out") + "/cpp_" + c + "_owner_rank" + std::to_string(rank) + ".bin", owners);
  }
  return 0;
}

// --out DIR --cases a,b --to R: 15 steps, consolidate to rank R, which writes
// the state; every rank loads it into a fresh ZeRO (and into the unsharded
// optimizer) and trains 15 more: bitwise equal to 30 steps without a break.
int scenario_zero_resume(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank(), to = std::stoi(flags.at("--to"));
  for (const auto& c : split_commas(flags.at("--cases"))) {
    const std::string file = flags.at("--out") + "/" + c + "_optimizer.pt";
    // The reference breaks where the checkpoint does, DDP-wise: a new DDP at
    // step 15 over parameters without gradients, as in a new process (its
    // initial buckets sum in another order than the rebuilt ones, and a
    // gradient copied into a bucket is multiplied by 1/W where one that
    // aliases it is divided by W: the last bit differs at 3 ranks). Only the
    // optimizer's state crosses the break unchanged.
    auto whole = fresh_net();
    {
      auto opt = make_zero(c, whole, pg);
      train(whole, pg, *opt, 0, kSteps / 2);
      for (auto& p : whole->parameters()) p.mutable_grad() = torch::Tensor();
      train(whole, pg, *opt, kSteps / 2, kSteps);
    }

    auto first = fresh_net();
    auto opt = make_zero(c, first, pg);
    train(first, pg, *opt, 0, kSteps / 2);
    auto& zero = dynamic_cast<ZeroRedundancyOptimizer&>(*opt);
    bool refused = false;
    if (rank != to) {
      try { zero.state_dict(); } catch (const UsageError&) { refused = true; }
      EXPECT_OR_FAIL(refused, c + ": state_dict() without consolidation on this rank did not throw");
    }
    zero.consolidate_state_dict(to);
    if (rank == to) torch::save(zero, file);  // the same bytes as state_dict()
    pg->barrier();

    // Resumed with ZeRO: the parameters as they were (every rank has them), the state from the file.
    auto second = fresh_net();
    { torch::NoGradGuard g; for (size_t i = 0; i < first->parameters().size(); ++i) second->parameters()[i].copy_(first->parameters()[i]); }
    auto resumed = make_zero(c, second, pg);
    dynamic_cast<ZeroRedundancyOptimizer&>(*resumed).load_state_dict(read_all(file));
    train(second, pg, *resumed, kSteps / 2, kSteps);
    expect_bitwise(second, whole, c + ": ZeRO resumed from the consolidated state against 30 steps");

    // The consolidated state is the unsharded optimizer's own format.
    auto third = fresh_net();
    { torch::NoGradGuard g; for (size_t i = 0; i < first->parameters().size(); ++i) third->parameters()[i].copy_(first->parameters()[i]); }
    auto plain = make_plain(c, third);
    torch::load(*plain, file);
    train(third, pg, *plain, kSteps / 2, kSteps);
    expect_bitwise(third, whole, c + ": the unsharded optimizer resumed from ZeRO's state against 30 steps");
    pg->barrier();
  }
  return 0;
}

// --in DIR --cases a,b: loads each case's <case>_optimizer.pt, written by
// zero_resume at another world size, consolidates it again to rank 0 at this
// one, and checks there that it is the same state, bitwise.
int scenario_zero_reload(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  for (const auto& c : split_commas(flags.at("--cases"))) {
    const std::string file = flags.at("--in") + "/" + c + "_optimizer.pt";
    auto net = fresh_net();
    auto opt = make_zero(c, net, pg);
    auto& zero = dynamic_cast<ZeroRedundancyOptimizer&>(*opt);
    zero.load_state_dict(read_all(file));
    size_t own = 0;
    for (auto& p : net->parameters()) own += zero.rank_of(p) == pg->rank();
    EXPECT_OR_FAIL(zero.local_optimizer().state().size() == own, c + ": this rank took state for " +
                       std::to_string(zero.local_optimizer().state().size()) + " parameters, owns " + std::to_string(own));
    zero.consolidate_state_dict(0);
    if (pg->rank() == 0) {
      auto original = make_plain(c, net), again = make_plain(c, net);
      torch::load(*original, file);
      const auto bytes = zero.state_dict();
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
      again->load(archive);
      EXPECT_OR_FAIL(same_state(*original, *again, net->parameters()),
                     c + ": the state loaded and consolidated again at " + std::to_string(pg->size()) +
                         " ranks differs from the file's");
    }
    pg->barrier();
  }
  return 0;
}

// --case C: one usage error, which every rank must throw as UsageError
// before any collective the others would not join. Prints the message.
int scenario_zero_usage(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const std::string c = flags.at("--case");
  ZeroNet net(c == "different" && pg->rank() == 1);
  try {
    if (c == "different") {
      ZeroRedundancyOptimizer opt(net->parameters(), adam_options(), pg);
    } else if (c == "bad_lr") {
      ZeroRedundancyOptimizer opt(net->parameters(), torch::optim::AdamOptions(-1.0), pg);
    } else if (c == "lbfgs") {
      ZeroRedundancyOptimizer opt(
          {torch::optim::OptimizerParamGroup(net->parameters())}, std::make_unique<torch::optim::LBFGSOptions>(),
          [](std::vector<torch::optim::OptimizerParamGroup> g) {
            return std::make_unique<torch::optim::LBFGS>(std::move(g), torch::optim::LBFGSOptions());
          },
          pg);
    } else if (c == "bad_to") {
      ZeroRedundancyOptimizer opt(net->parameters(), adam_options(), pg);
      opt.consolidate_state_dict(pg->size());
    } else if (c == "add_group") {
      // The base class's add_param_group cannot re-partition: step() refuses.
      ZeroRedundancyOptimizer opt(net->parameters(), adam_options(), pg);
      opt.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({2}, torch::requires_grad())}));
      opt.step();
    } else if (c == "foreign_state") {
      ZeroRedundancyOptimizer opt(net->parameters(), adam_options(), pg);
      opt.load_state_dict("not an archive");
    } else {
      throw Fail("unknown case " + c);
    }
  } catch (const UsageError& e) {
    std::cout << "UsageError: " << e.what() << std::endl;
    pg->barrier();  // the group still works: nobody is stuck in a collective
    return 0;
  }
  throw Fail(c + ": no UsageError");
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kZeroScenarios{
    {"zero_parity", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_zero_parity(pg, flags); }},
    {"zero_resume", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_zero_resume(pg, flags); }},
    {"zero_reload", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_zero_reload(pg, flags); }},
    {"zero_usage", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_zero_usage(pg, flags); }}};

}  // namespace ddp::testing
