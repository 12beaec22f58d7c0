// ddp_worker scenarios of what DDP reports about itself and tunes: the
// automatic bucket size (bucket_cap_mb("auto")) and PyTorch's DDP logging
// data. (The timeline's periodic skew reports use the timeline scenario.)
#include <fstream>

#include "../support/worker_common.h"

namespace ddp::testing {

namespace {

// One synchronised step of `model` on this rank's rows of `step`'s global
// batch; with `accumulate`, the rows in two halves, the first under no_sync.
void train_step(ddp::DistributedDataParallel<NetImpl>& model, Net& ref, Net& net, torch::optim::SGD& opt,
                ProcessGroup& pg, int step, bool accumulate) {
  const int rank = pg.rank(), world = pg.size(), rows = 6;
  auto [x, y] = global_batch(step, rows * world);
  copy_params(*net, *ref);
  ref->zero_grad();
  torch::mse_loss(ref->forward(x), y).backward();
  opt.zero_grad();
  auto mine_x = x.narrow(0, rank * rows, rows), mine_y = y.narrow(0, rank * rows, rows);
  if (accumulate) {
    {
      auto guard = model.no_sync();
      (0.5 * torch::mse_loss(model(mine_x.narrow(0, 0, 3)), mine_y.narrow(0, 0, 3))).backward();
    }
    (0.5 * torch::mse_loss(model(mine_x.narrow(0, 3, 3)), mine_y.narrow(0, 3, 3))).backward();
  } else {
    torch::mse_loss(model(mine_x), mine_y).backward();
  }
  expect_grads_close(*net, *ref, "step " + std::to_string(step));
  opt.step();
  expect_same_across_ranks(pg, net->parameters(), "parameters after step " + std::to_string(step));
}

}  // namespace

// bucket_cap_mb("auto") with candidates of which two pack the same buckets
// as an earlier one: only the distinct ones are tried, the buckets change
// under training (a gradient-accumulation step among them) without changing
// a gradient, and every rank keeps the same cap, which the logging data
// reports. --join 1: rank r trains 3r steps more than rank 0, under
// ddp::Join, so joined ranks shadow part of the trials.
int scenario_auto_bucket(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const int rank = pg->rank();
  const bool join = flags["--join"] == "1";
  torch::manual_seed(17);
  Net net(false, false), ref(false, false);
  // Buckets (8-byte parameters, first bucket 104 bytes) at 0.001 MiB: three;
  // at 0.004 the same three; at 0.01 and 0.02, two.
  auto options = ddp::DDPOptions()
                     .first_bucket_mb(0.0001)
                     .bucket_cap_mb(std::string("auto"))
                     .bucket_cap_candidates_mb({0.001, 0.004, 0.01, 0.02});
  ddp::DistributedDataParallel model(net, pg, options);
  EXPECT_OR_FAIL(model.stats().bucket_cap_tuning, "tuning has not started before the first step");
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const int steps = 20 + (join ? 3 * rank : 0);
  std::set<size_t> bucket_counts;
  auto loop = [&] {
    for (int step = 0; step < steps; ++step) {
      if (join) {
        // Under Join the reference is not the global batch: only check that
        // training goes on and agrees at the end.
        auto [x, y] = global_batch(step, 6);
        opt.zero_grad();
        torch::mse_loss(model(x), y).backward();
        opt.step();
      } else {
        train_step(model, ref, net, opt, *pg, step, step == 6);
      }
      bucket_counts.insert(model.stats().num_buckets);
    }
  };
  if (join)
    ddp::join({&model}, loop);
  else
    loop();
  const auto& s = model.stats();
  EXPECT_OR_FAIL(!s.bucket_cap_tuning, "auto is still tuning after " + std::to_string(steps) + " steps");
  EXPECT_OR_FAIL(s.bucket_cap_trials.size() == 2,
                 "expected 2 distinct candidates tried, got " + std::to_string(s.bucket_cap_trials.size()));
  EXPECT_OR_FAIL(s.bucket_cap_trials[0].first == 0.001 && s.bucket_cap_trials[1].first == 0.01,
                 "the candidates tried are not 0.001 and 0.01 MiB");
  if (!join) EXPECT_OR_FAIL(bucket_counts.count(3) && bucket_counts.count(2), "the buckets never changed");
  const double chosen = s.bucket_cap_mb;
  EXPECT_OR_FAIL(chosen == 0.001 || chosen == 0.01, "chose " + std::to_string(chosen));
  EXPECT_OR_FAIL(s.num_buckets == (chosen == 0.001 ? 3u : 2u), "the buckets are not the chosen cap's");
  expect_same_across_ranks(*pg, {torch::tensor({chosen}, torch::kDouble)}, "the chosen cap");
  expect_same_across_ranks(*pg, net->parameters(), "final parameters");
  const auto data = model.get_ddp_logging_data();
  EXPECT_OR_FAIL(data.ints_map.at("bucket_cap_auto") == 1, "logging data: bucket_cap_auto");
  EXPECT_OR_FAIL(data.ints_map.at("bucket_cap_bytes") == static_cast<int64_t>(chosen * 1024 * 1024),
                 "logging data: bucket_cap_bytes is not the chosen cap");
  EXPECT_OR_FAIL(data.strs_map.at("bucket_cap_trials").find("0.01 MB: ") != std::string::npos,
                 "logging data: bucket_cap_trials: " + data.strs_map.at("bucket_cap_trials"));
  std::cout << "rank " << rank << ": chose " << chosen << " MiB: " << data.strs_map.at("bucket_cap_trials")
            << std::endl;
  return 0;
}

// PyTorch's DDP logging data after a few steps with one parameter unused:
// the keys, the unused bytes, the rebuilt buckets, and times that add up.
// Rank 0 writes its JSON to --out for the test to compare with PyTorch's keys.
int scenario_logging_data(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  torch::manual_seed(5);
  Net net(false, false, 4, true);
  ddp::DistributedDataParallel model(net, pg, tiny_buckets().find_unused_parameters(true));
  const auto before = model.get_ddp_logging_data();
  EXPECT_OR_FAIL(before.ints_map.at("iteration") == 0, "iteration before training");
  EXPECT_OR_FAIL(before.ints_map.at("world_size") == pg->size() && before.ints_map.at("rank") == pg->rank(),
                 "world_size and rank");
  EXPECT_OR_FAIL(before.strs_map.at("backend_name") == pg->backend_name(), "backend_name");
  EXPECT_OR_FAIL(before.ints_map.at("num_parameter_tensors") == 8, "num_parameter_tensors");
  EXPECT_OR_FAIL(before.strs_map.at("dtypes") == "double", "dtypes: " + before.strs_map.at("dtypes"));
  EXPECT_OR_FAIL(before.ints_map.count("avg_backward_comm_time") == 0, "runtime figures before any step");
  torch::optim::SGD opt(net->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step, 6);
    opt.zero_grad();
    torch::mse_loss(model(x), y).backward();  // `extra` unused
    opt.step();
  }
  const auto d = model.get_ddp_logging_data();
  EXPECT_OR_FAIL(d.ints_map.at("iteration") == 3, "iteration");
  const int64_t extra_bytes = (net->extra->weight.numel() + net->extra->bias.numel()) * 8;
  EXPECT_OR_FAIL(d.ints_map.at("unused_parameter_size") == extra_bytes,
                 "unused_parameter_size " + std::to_string(d.ints_map.at("unused_parameter_size")) + ", expected " +
                     std::to_string(extra_bytes));
  EXPECT_OR_FAIL(d.ints_map.at("find_unused_parameters") == 1, "find_unused_parameters");
  for (const char* k : {"avg_forward_compute_time", "avg_backward_compute_time", "forward_compute_time",
                        "backward_compute_time"})
    EXPECT_OR_FAIL(d.ints_map.at(k) > 0, std::string(k) + " is not positive");
  if (pg->size() > 1) {
    EXPECT_OR_FAIL(d.ints_map.at("avg_backward_comm_time") > 0, "avg_backward_comm_time");
    EXPECT_OR_FAIL(d.ints_map.at("backward_comm_time") >= d.ints_map.at("backward_exposed_comm_time"),
                   "the exposed communication exceeds the communication");
  }
  EXPECT_OR_FAIL(d.strs_map.count("prev_iteration_grad_ready_order_indices") == 1, "ready order");
  const std::string json = d.to_json();
  EXPECT_OR_FAIL(json.find("\"avg_backward_compute_comm_overlap_time\": ") != std::string::npos, "to_json");
  if (pg->rank() == 0 && flags.count("--out")) std::ofstream(flags["--out"]) << json;
  return 0;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kObservabilityScenarios{
    {"auto_bucket", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_auto_bucket(pg, flags); }},
    {"logging_data", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_logging_data(pg, flags); }}};

}  // namespace ddp::testing
