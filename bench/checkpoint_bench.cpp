// What a checkpoint costs training: an MLP of 100.7M parameters (6 x
// Linear(4096, 4096) and a head) under DDP with Adam, plain or ZeRO, saved
// every few steps in one of four ways, or loaded. One rank of a job started
// by ddprun:
//   ddprun --standalone --nproc-per-node W ddp_bench_checkpoint --dir D
//       [--optimizer plain|zero] [--save file|file_async|sharded|sharded_async|none]
//       [--steps 9] [--every 3] [--load PATH]
// file: save_checkpoint (rank 0 writes one file, ZeRO consolidated first);
// file_async: CheckpointWriter; sharded: save_sharded_checkpoint;
// sharded_async: CheckpointWriter(CheckpointLayout::sharded). --load PATH
// loads PATH (a file or a sharded folder) into a fresh model first. Prints,
// per rank, one "save" line per save (the seconds the training thread spent
// in the call: the stall), a "durable" line (the seconds from the last
// save's call until wait() returned, with no training between), "load"
// (seconds), and RSS: resident before the first save or load (and its peak
// until then: the training steps' own), its peak after, in MiB. bench/run_checkpoint_bench.py drives it.
#include <chrono>
#include <iostream>
#include <string>

#include "ddp/ddp.h"
#include "ddp/train.h"
#include "models.h"
#include "rss.h"

namespace {


double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double mib(long kb) { return static_cast<double>(kb) / 1024.0; }

}  // namespace

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    std::string optimizer = "plain", save = "file", dir = "/tmp/ckpt_bench", load;
    int steps = 9, every = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--optimizer") optimizer = v;
      else if (k == "--save") save = v;
      else if (k == "--dir") dir = v;
      else if (k == "--load") load = v;
      else if (k == "--steps") steps = std::stoi(v);
      else if (k == "--every") every = std::stoi(v);
      else throw ddp::UsageError("unknown option " + k);
    }
    auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::minutes(10)));
    const std::string tag = "rank " + std::to_string(pg->rank()) + ": ";
    torch::manual_seed(1);
    bench::MLP net(4096);
    ddp::DistributedDataParallel model(net, pg);
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (optimizer == "zero")
      opt = std::make_unique<ddp::ZeroRedundancyOptimizer>(net->parameters(), torch::optim::AdamOptions(1e-4), pg);
    else
      opt = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-4));
    ddp::TrainState state;
    if (!load.empty()) {
      const long before = bench::current_rss_kb();
      const auto t = std::chrono::steady_clock::now();
      state = ddp::load_checkpoint(load, *net, opt.get(), *pg);
      std::cout << tag << "load " << seconds_since(t) << " s, written by " << state.world_size << " ranks; RSS "
                << mib(before) << " MiB before, peak " << mib(bench::peak_rss_kb()) << " MiB" << std::endl;
    }
    const bool sharded = save.rfind("sharded", 0) == 0;
    ddp::CheckpointWriter writer(*pg, sharded ? ddp::CheckpointLayout::sharded : ddp::CheckpointLayout::single_file);
    const std::string path = dir + (sharded ? "/sharded_" + optimizer : "/" + optimizer + ".pt");
    long before_saves = -1, peak_before_saves = -1;
    std::chrono::steady_clock::time_point last_save;
    for (int step = 1; step <= steps; ++step) {
      torch::manual_seed(100 + step * 10 + pg->rank());
      opt->zero_grad();
      model(torch::randn({16, 4096})).pow(2).mean().backward();
      opt->step();
      ++state.step;
      if (save == "none" || step % every != 0) continue;
      if (before_saves < 0) before_saves = bench::current_rss_kb(), peak_before_saves = bench::peak_rss_kb();
      last_save = std::chrono::steady_clock::now();
      if (save == "file") ddp::save_checkpoint(path, *net, *opt, state, *pg);
      else if (save == "sharded") ddp::save_sharded_checkpoint(path, *net, *opt, state, *pg);
      else writer.save(path, *net, *opt, state);
      std::cout << tag << "save at step " << step << ": " << seconds_since(last_save) << " s" << std::endl;
    }
    if (save != "none") {
      writer.wait();
      std::cout << tag << "durable " << seconds_since(last_save) << " s after the last save's call; RSS "
                << mib(before_saves) << " MiB before the saves (peak so far " << mib(peak_before_saves) << " MiB), peak "
                << mib(bench::peak_rss_kb()) << " MiB"
                << std::endl;
    }
    ddp::destroy_process_group();
    return 0;
  });
}
