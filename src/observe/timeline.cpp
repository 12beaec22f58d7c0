#include "ddp/observe/timeline.h"

#include "runtime/atomic_file.h"
#include "runtime/json_text.h"
#include "runtime/parse_number.h"
#include "usage_check.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "comm/objects/object_exchange.h"
#include "runtime/steady_clock.h"

namespace ddp {

namespace {

using detail::steady_ns;

int64_t exchange(ProcessGroup& pg, int64_t value, int root) {
  auto t = torch::tensor({value}, torch::kInt64).to(pg.device());
  pg.broadcast(t, root).wait();
  return t.cpu().item<int64_t>();
}

// Through a temporary beside it, synced, then renamed: a reader sees the old
// file or the whole new one (runtime/atomic_file.h).
void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  if (detail::write_synced_temporary(tmp, text.data(), text.size()))
    throw UsageError("cannot write the timeline to '" + tmp + "'; check that its folder exists and is writable");
  if (detail::rename_synced(tmp, path))
    throw UsageError("cannot move the timeline into place at '" + path + "'");
}

}  // namespace

Timeline::Timeline(std::shared_ptr<ProcessGroup> pg, std::string path) : pg_(std::move(pg)), path_(std::move(path)) {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) host_ = host;
  const int rank = pg_->rank(), world = pg_->size();
  // Offsets to rank 0, one rank at a time: rank 0 sends its time a, rank r
  // answers with the time b it received it, rank 0 notes the time c the
  // answer came. b - (a + c) / 2 is r's offset, exact when both legs take as
  // long; the round with the shortest round trip bounds the error best.
  constexpr int kRounds = 5;
  std::vector<int64_t> offsets(world, 0), rtts(world, 0);
  for (int r = 1; r < world; ++r) {
    int64_t best_rtt = std::numeric_limits<int64_t>::max(), best_offset = 0;
    for (int round = 0; round < kRounds; ++round) {
      const int64_t a = steady_ns();
      exchange(*pg_, a, 0);
      const int64_t b = steady_ns();
      const int64_t answer = exchange(*pg_, b, r);
      const int64_t c = steady_ns();
      if (rank == 0 && c - a < best_rtt) {
        best_rtt = c - a;
        best_offset = answer - (a + c) / 2;
      }
    }
    offsets[r] = best_offset;
    rtts[r] = best_rtt;
  }
  // Every rank learns its offset, and rank 0's clock at the start.
  auto table = torch::tensor(offsets, torch::kInt64);
  auto rtt_table = torch::tensor(rtts, torch::kInt64);
  table = torch::cat({table, rtt_table, torch::tensor({steady_ns()}, torch::kInt64)}).to(pg_->device());
  if (world > 1) pg_->broadcast(table, 0).wait();
  auto cpu = table.cpu();
  const int64_t* v = cpu.data_ptr<int64_t>();
  const int64_t offset_ns = v[rank];
  offset_rtt_us_ = v[world + rank] / 1000;
  offset_us_ = offset_ns / 1000;
  origin_ns_ = v[2 * world] + offset_ns;  // rank 0's start, on this rank's clock
}

Timeline::~Timeline() = default;

int64_t Timeline::now_us() const { return (steady_ns() - origin_ns_) / 1000; }

void Timeline::span(Row row, std::string name, int64_t start_us, int64_t end_us, std::string args) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({'X', row, start_us, std::max<int64_t>(0, end_us - start_us), step_, std::move(name), std::move(args)});
}

void Timeline::instant(Row row, std::string name, int64_t at_us, std::string args) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({'i', row, at_us, 0, step_, std::move(name), std::move(args)});
}

void Timeline::bucket_launched(int bucket, int64_t at_us, std::string args) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({'i', Row::communication, at_us, 0, step_, "bucket " + std::to_string(bucket) + " launched",
                     std::move(args)});
  launches_.push_back({step_, bucket, at_us});
}

void Timeline::communication_done(std::string name, int64_t launch_us, std::string args) {
  const int64_t end = now_us();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t start = std::min(end, std::max(launch_us, last_communication_end_us_));
  last_communication_end_us_ = std::max(last_communication_end_us_, end);
  if (!args.empty()) args += ", ";
  args += "\"done_us\": " + std::to_string(end);
  events_.push_back({'X', Row::communication, start, end - start, step_, std::move(name), std::move(args)});
}

std::string Timeline::events_json() const {
  const int pid = pg_->rank();
  std::ostringstream out;
  out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid << ", \"args\": {\"name\": "
      << json_string("rank " + std::to_string(pid) + (host_.empty() ? "" : " on " + host_)) << "}},\n"
      << "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " << pid << ", \"args\": {\"sort_index\": " << pid
      << "}},\n"
      << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid
      << ", \"tid\": 0, \"args\": {\"name\": \"compute\"}},\n"
      << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << pid
      << ", \"tid\": 1, \"args\": {\"name\": \"communication\"}},\n"
      << "{\"name\": \"clock offset to rank 0\", \"ph\": \"M\", \"pid\": " << pid << ", \"args\": {\"offset_us\": "
      << offset_us_ << ", \"round_trip_us\": " << offset_rtt_us_ << "}}";
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& e : events_) {
    out << ",\n{\"name\": " << json_string(e.name) << ", \"cat\": \""
        << (e.row == Row::compute ? "compute" : "communication") << "\", \"ph\": \"" << e.phase
        << "\", \"pid\": " << pid << ", \"tid\": " << static_cast<int>(e.row) << ", \"ts\": " << e.ts;
    if (e.phase == 'X') out << ", \"dur\": " << e.dur;
    if (e.phase == 'i') out << ", \"s\": \"t\"";
    out << ", \"args\": {\"step\": " << e.step << (e.args.empty() ? "" : ", ") << e.args << "}}";
  }
  return out.str();
}

void Timeline::write() {
  if (written_) return;
  written_ = true;
  const auto parts = detail::all_gather_bytes(*pg_, events_json());
  const auto launches = gather_launches(0, std::numeric_limits<int64_t>::max());
  if (pg_->rank() != 0) return;
  std::string csv;
  const std::string table = skew_table(launches, "in the whole run", &csv);
  write_file_atomically(report_path(".skew.csv"), csv);
  append_skew_table(table);
  std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  for (size_t r = 0; r < parts.size(); ++r) text += (r ? ",\n" : "") + parts[r];
  text += "\n]}\n";
  write_file_atomically(path_, text);
  std::cerr << "rank 0: DDP timeline of " << parts.size() << " rank(s) written to " << path_
            << " (open it in chrome://tracing or https://ui.perfetto.dev)" << std::endl;
}

void Timeline::write_own_part() noexcept {
  if (written_) return;
  written_ = true;
  const std::string own = path_ + ".rank" + std::to_string(pg_->rank()) + ".json";
  try {
    write_file_atomically(own, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" + events_json() + "\n]}\n");
    std::cerr << "rank " << pg_->rank() << ": the job's DDP timeline could not be gathered; this rank's part is in "
              << own << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "rank " << pg_->rank() << ": could not write the DDP timeline: " << e.what() << std::endl;
  }
}

std::vector<std::string> Timeline::gather_launches(int64_t from_step, int64_t to_step) const {
  std::string mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& l : launches_)
      if (l.step >= from_step && l.step < to_step)
        mine += std::to_string(l.step) + " " + std::to_string(l.bucket) + " " + std::to_string(l.at_us) + "\n";
  }
  return detail::all_gather_bytes(*pg_, mine);
}

std::string Timeline::report_path(const std::string& suffix) const {
  std::string path = path_;
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0) path.resize(path.size() - 5);
  return path + suffix;
}

void Timeline::append_skew_table(const std::string& table) const {
  const std::string path = report_path(".skew.txt");
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream old;
    old << in.rdbuf();
    text = old.str();
  }
  write_file_atomically(path, text + table + "\n");
  std::cerr << table << std::flush;
}

void Timeline::report_skew() {
  const int64_t from = reported_through_, to = step_;
  reported_through_ = step_;
  const auto launches = gather_launches(from, to);
  if (pg_->rank() != 0) return;
  append_skew_table(skew_table(launches, "in steps " + std::to_string(from + 1) + "-" + std::to_string(to), nullptr));
}

std::string Timeline::skew_table(const std::vector<std::string>& launches, const std::string& when,
                                 std::string* csv_out) const {
  const int world = static_cast<int>(launches.size());
  // (step, bucket) -> every rank's launch; only those all ranks launched.
  std::map<std::pair<int64_t, int>, std::vector<int64_t>> by_bucket;
  for (int r = 0; r < world; ++r) {
    std::istringstream in(launches[r]);
    int64_t step, at;
    int bucket;
    while (in >> step >> bucket >> at) {
      auto& v = by_bucket[{step, bucket}];
      v.resize(world, -1);
      v[r] = at;
    }
  }
  std::ostringstream csv;
  csv << "step,bucket,last_rank,lag_us";
  for (int r = 0; r < world; ++r) csv << ",launch_us_rank" << r;
  csv << "\n";
  std::vector<int64_t> times_last(world, 0), lag_sum(world, 0), lag_max(world, 0);
  int64_t counted = 0, steps = 0, last_step = -1;
  for (const auto& [key, at] : by_bucket) {
    if (std::count(at.begin(), at.end(), -1) > 0) continue;  // a rank that joined early
    const auto last = std::max_element(at.begin(), at.end()) - at.begin();
    const int64_t lag = at[last] - *std::min_element(at.begin(), at.end());
    ++counted;
    if (key.first != last_step) ++steps, last_step = key.first;
    ++times_last[last];
    lag_sum[last] += lag;
    lag_max[last] = std::max(lag_max[last], lag);
    csv << key.first << "," << key.second << "," << last << "," << lag;
    for (int64_t t : at) csv << "," << t;
    csv << "\n";
  }
  if (csv_out) *csv_out = csv.str();
  std::ostringstream table;
  table << "rank 0: DDP skew " << when << ", over " << counted << " bucket launch(es) in " << steps
        << " step(s): the last rank to launch a bucket, and by how much after the first (" << report_path(".skew.csv")
        << ")\n"
        << "  rank   last   share   mean lag ms   max lag ms\n";
  for (int r = 0; r < world; ++r) {
    char line[128];
    std::snprintf(line, sizeof line, "  %4d  %5lld  %5.1f %%  %11.3f  %11.3f\n", r,
                  static_cast<long long>(times_last[r]), counted ? 100.0 * times_last[r] / counted : 0.0,
                  times_last[r] ? lag_sum[r] / 1000.0 / times_last[r] : 0.0, lag_max[r] / 1000.0);
    table << line;
  }
  return table.str();
}

std::shared_ptr<Timeline> timeline_from_env(const std::shared_ptr<ProcessGroup>& pg) {
  const char* env = std::getenv("DDP_TIMELINE");
  const bool mine = env != nullptr && *env != '\0';
  int64_t every = 0;
  if (const char* e = std::getenv("DDP_TIMELINE_SKEW_EVERY"); mine && e && *e) {
    const auto v = parse_integer(e, 0, std::numeric_limits<int32_t>::max());
    check_usage(v.has_value(), "rank ", pg->rank(), ": DDP_TIMELINE_SKEW_EVERY='", e,
                "' is not a whole number of steps >= 0; set it to N to report the rank skew every N steps (0: only "
                "at the end)");
    every = *v;
  }
  // Every rank must agree, or the offsets' broadcasts (and the skew reports'
  // gathers) would meet other collectives: one small all-gather tells.
  auto flags = pg->allgather(torch::tensor({static_cast<int64_t>(mine ? 1 : 0), every}, torch::kInt64).to(pg->device()));
  std::string without;
  int with = 0;
  for (int r = 0; r < pg->size(); ++r) {
    const auto f = flags[r].cpu();
    if (f[0].item<int64_t>() != 0)
      ++with;
    else
      without += (without.empty() ? "" : ", ") + std::to_string(r);
    check_usage(f[1].item<int64_t>() == every, "rank ", pg->rank(), ": DDP_TIMELINE_SKEW_EVERY is ", every,
                " here but ", f[1].item<int64_t>(), " on rank ", r, "; set the same value for the whole job");
  }
  if (with == pg->size()) {
    auto timeline = std::make_shared<Timeline>(pg, env);
    timeline->set_skew_every(every);
    return timeline;
  }
  check_usage(with == 0, "rank ", pg->rank(), ": DDP_TIMELINE is set on some ranks but not on rank(s) ", without,
              "; set it for the whole job (ddprun passes its environment to every worker; with srun or mpirun, "
              "export it or pass it with -x)");
  return nullptr;
}

}  // namespace ddp
