// ddp_bench_lenet's command line (bench/lenet_bench.cpp says what each flag
// measures): the flags, their defaults, and the checks that refuse a
// combination the bench cannot run.
#pragma once

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

namespace bench {

struct Args {
  std::string mode = "ddp";
  std::string model = "lenet";
  int iters = 200;
  int warmup = 20;
  int batch = 128;
  double lr = 0.2;
  double bucket_cap_mb = 25.0;
  bool bucket_cap_auto = false;  // --bucket-cap-mb auto
  double first_bucket_mb = 1.0;
  bool bucket_view = true;
  int image = 28;              // resnet18: N x N inputs
  std::string amp = "none";    // none | fp16 (with ddp::GradScaler) | bf16: autocast forward and loss
  double allreduce_mb = -1;    // allreduce: MiB per step (< 0: the model's whole gradient)
  // --bucket-cap-mb auto: after --warmup steps, warm-up goes on while the
  // tuning has not chosen, for at most this many steps in all.
  int auto_max_warmup = 64;
  int threads = 1;
  int rounds = 10;  // interleaved: alternations
  int chunk = 10;   // interleaved: steps per mode per alternation
  std::string hook = "none";  // ddp: none | allreduce | fp16 | powersgd (a comm hook)
  int powersgd_rank = 1;      // --hook powersgd: matrix_approximation_rank
  std::string tag;  // echoed in the result line, for the driver
  bool trace_rss = false;  // current and peak RSS after every step, on stderr
  // DDPOptions::malloc_mmap_threshold_mb for ddp (unset: the library's
  // default; -1: automatic); when positive, local and allreduce_each fix the
  // same thresholds.
  std::optional<double> malloc_mmap_mb;
  // DDPOptions::retain_step_memory for ddp (unset: the library's default).
  std::optional<bool> retain_step_memory;
  // Fixed data is memorised within a few dozen steps; gradients then shrink
  // into denormal floats, which x86 handles up to 100x slower, and the timing
  // would depend on how far each mode has trained. Flushed in both programs.
  bool flush_denormal = true;
  // --device cuda: model and data on the GPU of this rank's LOCAL_RANK;
  // --backend: the process group's (nccl for GPU runs).
  std::string device = "cpu";
  std::string backend = "gloo";
};

[[noreturn]] inline void usage(const std::string& why) {
  std::cerr << "lenet_bench: " << why << "\n"
            << "usage: ddp_bench_lenet [--mode local|ddp|allreduce_each|sync_only|allreduce|interleaved]\n"
               "         [--model lenet|d2l_lenet|mlp100|resnet18] [--image N (resnet18)] [--amp none|fp16|bf16] [--iters N]\n"
               "         [--warmup W] [--batch B] [--lr LR] [--bucket-cap-mb MB|auto] [--first-bucket-mb MB]\n"
               "         [--allreduce-mb MB (allreduce; default: the model's gradient)]\n"
               "         [--auto-max-warmup N (--bucket-cap-mb auto: warm up until it chose, at most N steps)]\n"
               "         [--bucket-view 0|1] [--threads T] [--tag NAME] [--trace-rss 0|1]\n"
               "         [--flush-denormal 0|1] [--rounds R --chunk K (interleaved)] [--malloc-mmap-mb MB]\n"
               "         [--retain-step-memory 0|1] [--hook none|allreduce|fp16|powersgd (ddp)]\n"
               "         [--powersgd-rank R (--hook powersgd; from the third step on)]\n"
               "         [--device cpu|cuda] [--backend gloo|nccl]\n"
               "  env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun)\n";
  std::exit(2);
}

// `has_auto_bucket_cap`: whether this libddp takes bucket_cap_mb("auto").
inline Args parse(int argc, char** argv, bool has_auto_bucket_cap) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") usage("help");
    if (i + 1 >= argc) usage("missing value for " + k);
    std::string v = argv[++i];
    if (k == "--mode") a.mode = v;
    else if (k == "--model") a.model = v;
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--batch") a.batch = std::stoi(v);
    else if (k == "--lr") a.lr = std::stod(v);
    else if (k == "--bucket-cap-mb" && v == "auto") a.bucket_cap_auto = true;
    else if (k == "--bucket-cap-mb") a.bucket_cap_mb = std::stod(v);
    else if (k == "--image") a.image = std::stoi(v);
    else if (k == "--amp") a.amp = v;
    else if (k == "--allreduce-mb") a.allreduce_mb = std::stod(v);
    else if (k == "--auto-max-warmup") a.auto_max_warmup = std::stoi(v);
    else if (k == "--first-bucket-mb") a.first_bucket_mb = std::stod(v);
    else if (k == "--bucket-view") a.bucket_view = v != "0";
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--rounds") a.rounds = std::stoi(v);
    else if (k == "--chunk") a.chunk = std::stoi(v);
    else if (k == "--tag") a.tag = v;
    else if (k == "--hook") a.hook = v;
    else if (k == "--powersgd-rank") a.powersgd_rank = std::stoi(v);
    else if (k == "--trace-rss") a.trace_rss = v != "0";
    else if (k == "--flush-denormal") a.flush_denormal = v != "0";
    else if (k == "--malloc-mmap-mb") a.malloc_mmap_mb = std::stod(v);
    else if (k == "--retain-step-memory") a.retain_step_memory = v != "0";
    else if (k == "--device") a.device = v;
    else if (k == "--backend") a.backend = v;
    else usage("unknown flag " + k);
  }
  if (a.mode != "local" && a.mode != "ddp" && a.mode != "allreduce_each" && a.mode != "sync_only" &&
      a.mode != "allreduce" && a.mode != "interleaved")
    usage("unknown mode " + a.mode);
  if (a.hook != "none" && a.hook != "allreduce" && a.hook != "fp16" && a.hook != "powersgd")
    usage("unknown hook " + a.hook);
  if (a.powersgd_rank < 1) usage("--powersgd-rank >= 1");
  if (a.hook != "none" && a.mode != "ddp") usage("--hook needs --mode ddp");
  if (a.model != "lenet" && a.model != "d2l_lenet" && a.model != "mlp100" && a.model != "resnet18")
    usage("unknown model " + a.model);
  if (a.image < 8) usage("--image >= 8");
  if (a.amp != "none" && a.amp != "fp16" && a.amp != "bf16") usage("--amp none|fp16|bf16");
  if (a.device != "cpu" && a.device != "cuda") usage("--device cpu|cuda");
#ifndef DDP_WITH_CUDA
  if (a.device == "cuda") usage("--device cuda: this build's LibTorch has no CUDA");
#endif
  if (a.bucket_cap_auto && !has_auto_bucket_cap)
    usage("--bucket-cap-mb auto: this build of libddp has no DistributedDataParallelOptions::bucket_cap_mb(\"auto\")");
  if (a.iters < 1 || a.warmup < 0 || a.batch < 1 || a.rounds < 1 || a.chunk < 1)
    usage("iters, rounds, chunk >= 1, warmup >= 0, batch >= 1");
  return a;
}

}  // namespace bench
