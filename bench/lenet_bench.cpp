// One rank of the libddp throughput / memory benchmark. Started by
// bench/run_lenet_bench.py (or by hand, or by ddprun/torchrun) with torchrun's
// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); prints one
// machine-readable line:
//
//   RESULT impl=libddp mode=ddp model=lenet rank=0 world=2 iters=200 it_s=123.4 ...
//
// Modes (the gradient synchronisation, everything else is identical):
//   local           no communication while training: every process trains its
//                   own model (a barrier before and after the timed loop only,
//                   so that all processes load the cores at the same time)
//   ddp             ddp::DistributedDataParallel (--hook allreduce|fp16|powersgd:
//                   with ddp::hooks::allreduce_hook, fp16_compress_hook or
//                   powerSGD_hook registered, the latter at rank --powersgd-rank
//                   from the third step on; hook_bytes in the RESULT line: the
//                   bytes the hook asked the process group to all-reduce in one
//                   step)
//   allreduce_each  after backward, for each parameter: allreduce(grad).wait()
//                   and divide by the world size (pytorch/examples
//                   cpp/distributed/dist-mnist.cpp's approach)
//   sync_only       no gradient exchange; the ranks meet once per step through a
//                   one-float all-reduce (the ceiling of any transport)
//   allreduce       no model compute: each step all-reduces one flat float
//                   tensor of --allreduce-mb MiB (default: the model's whole
//                   gradient) through the same ddp::ProcessGroup and waits;
//                   ms_per_iter is the all-reduce's time (bench/run_link_bench.py)
//   interleaved     local, ddp, allreduce_each and ddp_overlap (ddp with 0.25 MB
//                   buckets) in the same processes, each with its own model,
//                   alternating every --chunk steps for --rounds alternations;
//                   one RESULT line per mode. The machine's speed drifts, and
//                   this keeps it out of the ratios between modes.
//
// Models: lenet (the seed's LeNet, Fashion-MNIST shaped synthetic data),
// d2l_lenet (the d2l.ai LeNet with sigmoids, same data shape), mlp100 (about
// 100 MB of float parameters, for the peak-RSS comparison) and resnet18
// (d2l.ai's ResNet-18 of examples/resnet18_fmnist, BatchNorm included, 1 input
// channel, 10 classes, 11.2 M parameters; --image N: N x N inputs, 28 by
// default).
//
// --bucket-cap-mb auto asks the library for its automatic bucket size
// (DistributedDataParallelOptions::bucket_cap_mb("auto")); the RESULT line
// gives the cap in effect as chosen_bucket_cap_mb, and the reducer's comm_ms
// and overlap_ms (medians over the timed steps) where ReducerStats has them.
#include <sys/resource.h>
#include <unistd.h>

#include <ctime>

#include <cmath>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ddp/ddp.h"
#ifdef DDP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include "ddp/parallel/default_hooks.h"
#include "ddp/parallel/powersgd_hook.h"
#include "../tests/support/fake_process_group.h"
#include "lenet_bench_args.h"
#include "models.h"
#include "rss.h"

namespace {

using namespace bench;

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// CPU time in ms: the whole process (Gloo's threads included), or this thread.
long minor_faults_now() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

double cpu_ms(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}


// What this build of the library offers, found at compile time so that the
// bench builds before and after the library gains it: bucket_cap_mb("auto")
// and ReducerStats' comm_ms, overlap_ms and bucket_cap_mb.
template <class O, class = void>
struct HasAutoBucketCap : std::false_type {};
template <class O>
struct HasAutoBucketCap<O, std::void_t<decltype(std::declval<O&>().bucket_cap_mb(std::declval<const std::string&>()))>>
    : std::true_type {};
constexpr bool kHasAutoBucketCap = HasAutoBucketCap<ddp::DDPOptions>::value;

template <class O>
void set_auto_bucket_cap(O& options) {
  if constexpr (HasAutoBucketCap<O>::value) options.bucket_cap_mb(std::string("auto"));
}

#define DDP_BENCH_OPTIONAL_STAT(field)                                                                        \
  template <class S, class = void>                                                                           \
  struct HasStat_##field : std::false_type {};                                                               \
  template <class S>                                                                                         \
  struct HasStat_##field<S, std::void_t<decltype(std::declval<const S&>().field)>> : std::true_type {};     \
  template <class S>                                                                                         \
  double stat_##field(const S& s) {                                                                          \
    if constexpr (HasStat_##field<S>::value) return static_cast<double>(s.field);                            \
    else return std::nan("");                                                                                 \
  }
DDP_BENCH_OPTIONAL_STAT(comm_ms)
DDP_BENCH_OPTIONAL_STAT(overlap_ms)
DDP_BENCH_OPTIONAL_STAT(bucket_cap_mb)
DDP_BENCH_OPTIONAL_STAT(bucket_cap_tuning)
#undef DDP_BENCH_OPTIONAL_STAT

// "auto"'s trials as CAP:MS/CAP:MS/... (empty before it chose, or without the field).
template <class S, class = void>
struct HasTrials : std::false_type {};
template <class S>
struct HasTrials<S, std::void_t<decltype(std::declval<const S&>().bucket_cap_trials)>> : std::true_type {};
template <class S>
std::string bucket_cap_trials(const S& s) {
  std::ostringstream out;
  if constexpr (HasTrials<S>::value) {
    for (const auto& [cap, ms] : s.bucket_cap_trials) out << (out.tellp() > 0 ? "/" : "") << cap << ":" << ms;
  }
  return out.str().empty() ? "-" : out.str();
}

// The most memory the caching allocator held for tensors on `device`
// (torch.cuda.max_memory_allocated), 0 on the CPU.
int64_t peak_gpu_bytes(const torch::Device& device) {
#ifdef DDP_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
  }
#endif
  (void)device;
  return 0;
}

using bench::current_rss_kb;
using bench::peak_rss_kb;

// NaN when there is no value or the library does not report it.
double median_or_nan(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One way of training: its own model (same initial values), optimizer and
// gradient synchronisation, and what its timed steps cost.
template <typename Net>
struct Trainer {
  using DDP = ddp::DistributedDataParallel<typename Net::ContainedType>;
  std::string name, kind;  // kind: local | ddp | allreduce_each | sync_only | allreduce
  std::string amp = "none";
  double bucket_cap_mb = 25, first_bucket_mb = 1;
  bool bucket_cap_auto = false;
  torch::Tensor flat;  // allreduce: the buffer all-reduced every step
  bool bucket_view = true;
  torch::Device device{torch::kCPU};
  Net net{nullptr};
  std::unique_ptr<DDP> model;
  std::unique_ptr<torch::optim::SGD> opt;
  std::unique_ptr<ddp::GradScaler> scaler;  // --amp fp16
  std::vector<at::Tensor> params;

  std::vector<double> fwd, bwd, sync, step, exposed, backward_ms, comm_ms, overlap_ms, chunk_it_s;
  double elapsed_ms = 0, proc_cpu_ms = 0, main_cpu_ms = 0;
  long minor_faults = 0;  // page faults of the whole process during timed steps
  // --hook: bytes the hook handed to all-reduce since the last step began.
  std::shared_ptr<ddp::testing::CollectiveCounts> hook_counts = std::make_shared<ddp::testing::CollectiveCounts>();
  int64_t hook_bytes_last = 0;
  int timed = 0;
  int warmup_steps = 0;
  torch::Tensor last_loss;

  // "auto" still trying caps (false without the field or for a fixed cap).
  bool tuning() const {
    if (!model || !bucket_cap_auto) return false;
    const double v = stat_bucket_cap_tuning(model->stats());
    return !std::isnan(v) && v != 0;
  }

  void build(const Args& a, const std::shared_ptr<ddp::ProcessGroup>& pg) {
    torch::manual_seed(0);  // same initial parameters on every rank and in every trainer
    net = Net();
    net->to(device);
    if (kind == "ddp") {
      auto options =
          ddp::DDPOptions().bucket_cap_mb(bucket_cap_mb).first_bucket_mb(first_bucket_mb).gradient_as_bucket_view(bucket_view);
      if (bucket_cap_auto) set_auto_bucket_cap(options);
      if (a.malloc_mmap_mb) options.malloc_mmap_threshold_mb(*a.malloc_mmap_mb);
      if (a.retain_step_memory) options.retain_step_memory(*a.retain_step_memory);
      model = std::make_unique<DDP>(net, pg, options);
      if (a.hook == "powersgd") {
        // PowerSGD's collectives are its own (the uncompressed gradients, P,
        // Q): a group that counts their bytes sees what it sends.
        auto counting = std::make_shared<ddp::testing::CountingGroup>(pg, hook_counts);
        model->register_comm_hook(
            ddp::hooks::PowerSGDState(
                counting, ddp::hooks::PowerSGDOptions().matrix_approximation_rank(a.powersgd_rank).start_powerSGD_iter(2)),
            ddp::hooks::powerSGD_hook);
      } else if (a.hook != "none") {
        // Counts what each bucket sends: the bucket's size for allreduce_hook,
        // its float16 copy (2 bytes an element) for fp16_compress_hook.
        const bool fp16 = a.hook == "fp16";
        model->register_comm_hook(pg, [fp16, counter = hook_counts](const std::shared_ptr<ddp::ProcessGroup>& g,
                                                                    ddp::GradBucket& bucket) {
          const auto& buf = bucket.buffer();
          counter->allreduced_bytes += buf.numel() * (fp16 ? 2 : buf.element_size());
          return fp16 ? ddp::hooks::fp16_compress_hook(g, bucket) : ddp::hooks::allreduce_hook(g, bucket);
        });
      }
    } else if (a.malloc_mmap_mb.value_or(0) > 0) {
      ddp::fix_malloc_thresholds(*a.malloc_mmap_mb);
    }
    opt = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(a.lr));
    params = net->parameters();
    amp = a.amp;
    if (amp == "fp16") scaler = std::make_unique<ddp::GradScaler>(pg, ddp::GradScalerOptions());
  }

  void one_step(ddp::ProcessGroup& pg, const torch::Tensor& x, const torch::Tensor& y, bool record) {
    const int world = pg.size();
    if (kind == "allreduce") {
      // The whole gradient's all-reduce alone, no compute.
      auto t0 = Clock::now();
      if (world > 1) pg.allreduce(flat).wait();
      if (record) {
        sync.push_back(ms_since(t0));
        fwd.push_back(0);
        bwd.push_back(0);
        step.push_back(0);
      }
      if (!last_loss.defined()) last_loss = torch::zeros({});
      return;
    }
    auto t0 = Clock::now();
    opt->zero_grad();
    hook_counts->allreduced_bytes = 0;
    torch::Tensor loss;
    {
      ddp::Autocast autocast(x.device().type(), amp == "fp16" ? torch::kHalf : torch::kBFloat16, amp != "none");
      auto out = model ? (*model)(x) : net->forward(x);
      loss = torch::cross_entropy_loss(out, y);
    }
    auto t1 = Clock::now();
    (scaler ? scaler->scale(loss) : loss).backward();
    auto t2 = Clock::now();
    if (kind == "allreduce_each" && world > 1) {
      // pytorch/examples cpp/distributed/dist-mnist.cpp's approach, blocking.
      torch::NoGradGuard no_grad;
      for (auto& p : params) {
        auto& g = p.mutable_grad();
        pg.allreduce(g).wait();
        g.div_(world);
      }
    }
    if (kind == "sync_only" && world > 1) {
      // No gradient exchange: the ranks only meet once per step (a one-float
      // all-reduce), which bounds what any transport could reach.
      static auto one = torch::zeros({1});
      pg.allreduce(one).wait();
    }
    auto t3 = Clock::now();
    if (scaler) {
      scaler->step(*opt);
      scaler->update();
    } else {
      opt->step();
    }
    auto t4 = Clock::now();
    last_loss = loss.detach();
    hook_bytes_last = hook_counts->allreduced_bytes;
    if (record) {
      auto d = [](auto s, auto e) { return std::chrono::duration<double, std::milli>(e - s).count(); };
      fwd.push_back(d(t0, t1));
      bwd.push_back(d(t1, t2));
      sync.push_back(d(t2, t3));
      step.push_back(d(t3, t4));
      if (model) {
        const auto& s = model->stats();
        exposed.push_back(s.exposed_comm_ms);
        backward_ms.push_back(s.backward_ms);
        comm_ms.push_back(stat_comm_ms(s));
        overlap_ms.push_back(stat_overlap_ms(s));
      }
    }
  }

  // `n` timed steps, after a barrier so that every rank starts together.
  template <typename After>
  void timed_steps(ddp::ProcessGroup& pg, const torch::Tensor& x, const torch::Tensor& y, int n, After after) {
    pg.barrier();
    sync_device();
    const double proc0 = cpu_ms(CLOCK_PROCESS_CPUTIME_ID), thread0 = cpu_ms(CLOCK_THREAD_CPUTIME_ID);
    const long faults0 = minor_faults_now();
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      one_step(pg, x, y, true);
      after();
    }
    sync_device();  // the GPU's work of these steps is in the time
    const double ms = ms_since(start);
    elapsed_ms += ms;
    proc_cpu_ms += cpu_ms(CLOCK_PROCESS_CPUTIME_ID) - proc0;
    main_cpu_ms += cpu_ms(CLOCK_THREAD_CPUTIME_ID) - thread0;
    minor_faults += minor_faults_now() - faults0;
    timed += n;
    chunk_it_s.push_back(n * 1000.0 / ms);
  }

  void sync_device() const {
#ifdef DDP_WITH_CUDA
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
  }

  double checksum() const {
    torch::NoGradGuard g;
    double c = 0;
    for (const auto& p : params) c += p.to(torch::kDouble).sum().template item<double>();
    return c;
  }
};

template <typename Net>
int run(const Args& a) {
  const auto env = ddp::LaunchEnv::from_environment();
  const int rank = env.rank, world = env.world_size;
  // Every mode joins the group (local only for the barriers), so that the
  // processes are equally set up; Gloo's threads idle outside collectives.
  auto pg = ddp::init_process_group(ddp::ProcessGroupOptions().backend(a.backend).timeout(std::chrono::seconds(300)));
  torch::Device device(torch::kCPU);
  if (a.device == "cuda")
    device = pg->device().is_cuda() ? pg->device()
                                    : torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  const long rss_before_model = current_rss_kb();

  std::vector<std::unique_ptr<Trainer<Net>>> trainers;
  auto add = [&](std::string name, std::string kind, double cap, double first, bool view) {
    auto t = std::make_unique<Trainer<Net>>();
    t->name = std::move(name);
    t->kind = std::move(kind);
    t->bucket_cap_mb = cap;
    t->bucket_cap_auto = a.bucket_cap_auto && a.mode != "interleaved";
    t->first_bucket_mb = first;
    t->bucket_view = view;
    t->device = device;
    t->build(a, pg);
    trainers.push_back(std::move(t));
  };
  if (a.mode == "interleaved") {
    // All modes in one pair of processes, alternating every --chunk steps, so
    // that they see the same machine (this host's speed drifts by 2x).
    add("local", "local", a.bucket_cap_mb, a.first_bucket_mb, a.bucket_view);
    add("ddp", "ddp", a.bucket_cap_mb, a.first_bucket_mb, a.bucket_view);
    add("allreduce_each", "allreduce_each", a.bucket_cap_mb, a.first_bucket_mb, a.bucket_view);
    add("ddp_overlap", "ddp", 0.25, 0.25, a.bucket_view);
  } else {
    add(a.tag.empty() ? a.mode : a.tag, a.mode, a.bucket_cap_mb, a.first_bucket_mb, a.bucket_view);
  }
  const int64_t param_bytes = [&] {
    int64_t b = 0;
    for (const auto& p : trainers.front()->params) b += p.numel() * p.element_size();
    return b;
  }();
  int64_t param_count = 0;
  for (const auto& p : trainers.front()->params) param_count += p.numel();
  double allreduce_mb = 0;
  if (a.mode == "allreduce") {
    allreduce_mb = a.allreduce_mb < 0 ? param_bytes / 1048576.0 : a.allreduce_mb;
    const int64_t numel = std::max<int64_t>(1, static_cast<int64_t>(allreduce_mb * 1048576.0 / sizeof(float) + 0.5));
    trainers.front()->flat = torch::zeros({numel});  // zeros: sums stay finite however many steps
    allreduce_mb = numel * sizeof(float) / 1048576.0;
  }

  // Synthetic, fixed data: a different shard per rank, reused every step.
  torch::manual_seed(1234 + rank);
  torch::Tensor x = a.model == "mlp100"     ? torch::randn({a.batch, MLPImpl::kWidth})
                    : a.model == "resnet18" ? torch::randn({a.batch, 1, a.image, a.image})
                                            : torch::randn({a.batch, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {a.batch}, torch::kLong);
  x = x.to(device);
  y = y.to(device);

  int step_no = 0;
  auto trace = [&] {
    if (a.trace_rss)
      std::cerr << "RSS rank=" << rank << " step=" << step_no++ << " current_mb=" << current_rss_kb() / 1024.0
                << " peak_mb=" << peak_rss_kb() / 1024.0 << std::endl;
  };
  trace();
  for (auto& t : trainers) {
    // "auto": on until it chose (ReducerStats::bucket_cap_tuning is set from
    // the start; both ranks see it clear at the same step, agreed by them).
    for (int i = 0; i < a.warmup || (t->tuning() && i < a.auto_max_warmup); ++i) {
      t->one_step(*pg, x, y, false);
      t->warmup_steps = i + 1;
      trace();
    }
  }
  if (a.mode == "interleaved") {
    const size_t n = trainers.size();
    for (int r = 0; r < a.rounds; ++r)
      for (size_t k = 0; k < n; ++k) trainers[(k + r) % n]->timed_steps(*pg, x, y, a.chunk, trace);
  } else {
    trainers.front()->timed_steps(*pg, x, y, a.iters, trace);
  }
  const long peak = peak_rss_kb();
  const double peak_gpu_mb = peak_gpu_bytes(device) / 1048576.0;
  pg->barrier();

  for (auto& tp : trainers) {
    auto& t = *tp;
    const bool is_ddp = static_cast<bool>(t.model);
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(4);
    line << "RESULT impl=libddp mode=" << t.kind << " model=" << a.model << " rank=" << rank << " world=" << world
         << " batch=" << a.batch << " iters=" << t.timed << " it_s=" << (t.timed * 1000.0 / t.elapsed_ms)
         << " chunk_it_s=" << median(t.chunk_it_s) << " ms_per_iter=" << t.elapsed_ms / t.timed
         << " cpu_ms_per_iter=" << t.proc_cpu_ms / t.timed << " main_cpu_ms_per_iter=" << t.main_cpu_ms / t.timed
         << " faults_per_iter=" << static_cast<double>(t.minor_faults) / t.timed
         << " fwd_ms=" << median(t.fwd) << " bwd_ms=" << median(t.bwd) << " sync_ms=" << median(t.sync)
         << " step_ms=" << median(t.step) << " exposed_comm_ms=" << (is_ddp ? median(t.exposed) : 0.0)
         << " backward_ms=" << (is_ddp ? median(t.backward_ms) : 0.0)
         << " buckets=" << (is_ddp ? t.model->stats().num_buckets : 0)
         << " bytes_reduced=" << (is_ddp ? t.model->stats().bytes_reduced : 0)
         << " bucket_view=" << (is_ddp ? static_cast<int>(t.bucket_view) : -1)
         << " bucket_cap_mb=" << (t.bucket_cap_auto ? std::string("auto") : std::to_string(t.bucket_cap_mb))
         << " chosen_bucket_cap_mb=" << (is_ddp ? stat_bucket_cap_mb(t.model->stats()) : std::nan(""))
         << " comm_ms=" << (is_ddp ? median_or_nan(t.comm_ms) : std::nan(""))
         << " overlap_ms=" << (is_ddp ? median_or_nan(t.overlap_ms) : std::nan(""))
         << " warmup_steps=" << t.warmup_steps << " tuning=" << static_cast<int>(t.tuning())
         << " bucket_cap_trials=" << (is_ddp ? bucket_cap_trials(t.model->stats()) : std::string("-"))
         << " allreduce_mb=" << (t.kind == "allreduce" ? allreduce_mb : 0.0) << " params=" << param_count
         << " image=" << (a.model == "resnet18" ? a.image : 0) << " amp=" << a.amp << " first_bucket_mb=" << t.first_bucket_mb
         << " param_mb=" << param_bytes / 1048576.0 << " peak_rss_mb=" << peak / 1024.0
         << " base_rss_mb=" << rss_before_model / 1024.0 << " checksum=" << t.checksum()
         << " loss=" << t.last_loss.template item<double>()
         << " hook=" << (is_ddp ? a.hook : "none") << " hook_bytes=" << t.hook_bytes_last
         << " flush_denormal=" << static_cast<int>(a.flush_denormal) << " device=" << device
         << " peak_gpu_mb=" << peak_gpu_mb << " tag=" << t.name;
    std::cout << line.str() << std::endl;
  }
  trainers.clear();
  ddp::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv, kHasAutoBucketCap);
  try {
    torch::set_num_threads(a.threads);
    torch::set_num_interop_threads(1);
    at::globalContext().setFlushDenormal(a.flush_denormal);
    if (a.model == "lenet") return run<LeNet>(a);
    if (a.model == "d2l_lenet") return run<D2lLeNet>(a);
    if (a.model == "resnet18") return run<ResNet18>(a);
    return run<MLP>(a);
  } catch (const std::exception& e) {
    std::cerr << "lenet_bench: " << e.what() << std::endl;
    return 1;
  }
}
