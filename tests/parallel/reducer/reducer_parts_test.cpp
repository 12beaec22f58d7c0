// The reducer's parts, each alone, in one process: BucketSet (buckets and
// their views), GraphTasks (which backward's end finalizes), JoinDivisor
// (what gradients are divided by), ParameterUsage (unused parameters) and
// the observers (runtime figures, timeline, bucket-size search). The whole
// reducer is tested over real ranks by the multi-process suites.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "../../support/fake_process_group.h"
#include "comm/work_handle.h"
#include "ddp/errors.h"
#include "ddp/observe/timeline.h"
#include "parallel/reducer/bucket_set.h"
#include "parallel/reducer/graph_tasks.h"
#include "parallel/reducer/observers.h"
#include "parallel/reducer/parameter_usage.h"
#include "parallel/reducer/reducer_impl.h"

namespace {

using ddp::detail::BucketSet;

std::vector<at::Tensor> three_parameters() {
  return {torch::ones({2, 3}, torch::requires_grad()), torch::ones({4}, torch::requires_grad()),
          torch::ones({5}, torch::requires_grad())};
}

// ---- BucketSet ---------------------------------------------------------

TEST(BucketSet, ViewsAliasTheirBucketInAssignmentOrder) {
  auto params = three_parameters();
  BucketSet buckets;
  buckets.lay_out(params, {{2, 1}, {0}}, /*gradient_as_bucket_view=*/false);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].contents.numel(), 9);
  EXPECT_EQ(buckets[1].contents.numel(), 6);
  EXPECT_EQ(buckets.bucket_of(1), 0u);
  EXPECT_EQ(buckets.bucket_of(0), 1u);
  EXPECT_EQ(buckets.view_of(0).sizes(), params[0].sizes());
  // Parameter 2 first in bucket 0, then parameter 1 right after it.
  EXPECT_EQ(buckets.view_of(2).data_ptr(), buckets[0].contents.data_ptr());
  EXPECT_EQ(static_cast<float*>(buckets.view_of(1).data_ptr()), buckets[0].contents.data_ptr<float>() + 5);
  buckets.view_of(1).fill_(7);
  EXPECT_EQ(buckets[0].contents.slice(0, 5, 9).sum().item<float>(), 28);
  EXPECT_EQ(buckets[0].pending, 2u);
  EXPECT_EQ(buckets.total_bytes(), 15 * 4);
  EXPECT_EQ(buckets.assignment(), (ddp::detail::Assignment{{2, 1}, {0}}));
}

TEST(BucketSet, AdoptingTheSameAssignmentKeepsTheBuckets) {
  auto params = three_parameters();
  BucketSet buckets;
  buckets.lay_out(params, {{2, 1, 0}}, false);
  const void* before = buckets[0].contents.data_ptr();
  EXPECT_FALSE(buckets.adopt(params, {{2, 1, 0}}, false));
  EXPECT_EQ(buckets[0].contents.data_ptr(), before);
  EXPECT_TRUE(buckets.adopt(params, {{0}, {1, 2}}, false));
  EXPECT_EQ(buckets.size(), 2u);
}

TEST(BucketSet, GradientsAsBucketViewsMoveIntoTheNewBuckets) {
  auto params = three_parameters();
  params[1].mutable_grad() = torch::full({4}, 3.0f);
  BucketSet buckets;
  buckets.lay_out(params, {{0, 1, 2}}, /*gradient_as_bucket_view=*/true);
  EXPECT_TRUE(BucketSet::is_alias(params[1].grad(), buckets.view_of(1)));
  EXPECT_FALSE(params[0].grad().defined());  // no gradient yet: none made
  buckets.lay_out(params, {{1}, {0, 2}}, true);
  EXPECT_TRUE(BucketSet::is_alias(params[1].grad(), buckets.view_of(1)));
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::full({4}, 3.0f)));
}

TEST(BucketSet, ResetMakesEveryBucketPendingAndDropsItsReduction) {
  auto params = three_parameters();
  BucketSet buckets;
  buckets.lay_out(params, {{0, 1}, {2}}, false);
  buckets[0].pending = 0;
  buckets[0].reduced = ddp::CommFuture::ready(buckets[0].contents);
  buckets.reset();
  EXPECT_EQ(buckets[0].pending, 2u);
  EXPECT_FALSE(buckets[0].reduced.valid());
}

TEST(BucketSet, AViewOfAChannelsLastParameterIsChannelsLast) {
  std::vector<at::Tensor> params{
      torch::ones({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast).requires_grad_()};
  BucketSet buckets;
  buckets.lay_out(params, {{0}}, false);
  EXPECT_EQ(buckets.view_of(0).strides(), params[0].strides());
}

// ---- GraphTasks --------------------------------------------------------

// No outputs known (a forward whose result holds no tensor DDP can see):
// every task counts as the outer one.
TEST(GraphTasks, EachTaskIsArmedOnceAndEndsOnce) {
  ddp::detail::GraphTasks tasks;
  auto x = torch::ones({3}, torch::requires_grad());
  auto y = (x * 2).sum();
  tasks.expect_outputs({});
  std::vector<bool> armed;
  const void* task = nullptr;
  x.register_hook([&](const at::Tensor& g) {
    armed.push_back(tasks.arm_current(task));
    armed.push_back(tasks.arm_current(task));  // the same task: already armed
    return g;
  });
  y.backward();
  EXPECT_EQ(armed, (std::vector<bool>{true, false}));
  EXPECT_FALSE(tasks.end(&armed).armed);  // not a task of ours
  const auto ended = tasks.end(task);
  EXPECT_TRUE(ended.armed);
  EXPECT_TRUE(ended.outer);
  EXPECT_TRUE(ended.none_left);
  EXPECT_FALSE(tasks.end(task).armed);  // once
}

TEST(GraphTasks, ATaskStillRunningIsReportedByTheOneThatEndsFirst) {
  ddp::detail::GraphTasks tasks;
  auto x = torch::ones({3}, torch::requires_grad());
  auto z = torch::ones({3}, torch::requires_grad());
  const void* outer = nullptr;
  const void* inner = nullptr;
  z.register_hook([&](const at::Tensor& g) {
    tasks.arm_current(inner);
    return g;
  });
  x.register_hook([&](const at::Tensor& g) {
    tasks.arm_current(outer);
    torch::AutoGradMode grad_mode(true);
    (z * 3).sum().backward();  // a reentrant backward, as checkpointing runs
    return g;
  });
  (x * 2).sum().backward();
  ASSERT_NE(outer, inner);
  EXPECT_FALSE(tasks.end(inner).none_left);  // the outer one is still armed
  EXPECT_TRUE(tasks.end(outer).none_left);
}

// ---- JoinDivisor -------------------------------------------------------

TEST(JoinDivisor, TheWorldSizeUnlessJoinCountsTheRanksStillTraining) {
  ddp::detail::JoinDivisor divisor;
  EXPECT_EQ(divisor.get(4), 4);
  divisor.reset();
  divisor.set_forward_count(ddp::CommFuture::ready(torch::tensor({3.0f})), /*divide_by_nonjoined=*/true);
  EXPECT_EQ(divisor.get(4), 3);
  divisor.reset();
  divisor.set_forward_count(ddp::CommFuture::ready(torch::tensor({2.0f})), /*divide_by_nonjoined=*/false);
  EXPECT_EQ(divisor.get(4), 4);
}

TEST(JoinDivisor, ReadOnceABackward) {
  ddp::detail::JoinDivisor divisor;
  divisor.set_forward_count(ddp::CommFuture::ready(torch::tensor({3.0f})), true);
  EXPECT_EQ(divisor.get(4), 3);
  divisor.set_forward_count(ddp::CommFuture::ready(torch::tensor({2.0f})), true);
  EXPECT_EQ(divisor.get(4), 3);  // this backward's figure stands until reset
  divisor.reset();
  EXPECT_EQ(divisor.get(4), 2);
}

// ---- ParameterUsage ----------------------------------------------------

std::vector<ddp::detail::AccumulatorPtr> accumulators_of(const std::vector<at::Tensor>& params) {
  std::vector<ddp::detail::AccumulatorPtr> out;
  for (const auto& p : params) out.push_back(torch::autograd::impl::grad_accumulator(p));
  return out;
}

TEST(ParameterUsage, FindsTheParametersTheForwardsGraphCannotReach) {
  auto params = three_parameters();
  const auto accumulators = accumulators_of(params);
  ddp::detail::ParameterUsage usage(3, ddp::DDPOptions().find_unused_parameters(true));
  ASSERT_TRUE(usage.dynamic());
  auto out = params[0].sum() + params[2].sum();
  usage.prepare_backward({out}, accumulators);
  EXPECT_EQ(usage.unused(), (std::vector<size_t>{1}));
  usage.prepare_backward({}, accumulators);  // no outputs: the end of backward tells
  EXPECT_TRUE(usage.unused().empty());
}

TEST(ParameterUsage, AParameterNoRankUsedKeepsItsGradient) {
  ddp::testing::FakeGroup pg(0, 2);
  ddp::detail::ParameterUsage usage(3, ddp::DDPOptions().find_unused_parameters(true));
  usage.note_hook(0, true);
  usage.note_hook(2, false);  // a hook without a gradient is no use
  usage.launch_used_map(pg);
  usage.wait_used_map();
  usage.read_used_map();
  EXPECT_TRUE(usage.reduced_gradient_applies(0));
  EXPECT_FALSE(usage.reduced_gradient_applies(1));
  EXPECT_FALSE(usage.reduced_gradient_applies(2));
  usage.end_step();
  usage.reset_iteration();
  usage.read_used_map();
  EXPECT_FALSE(usage.reduced_gradient_applies(0));  // local usage starts again
}

TEST(ParameterUsage, AStaticGraphLearnsItsHooksInTheFirstIterationAndHoldsLaterOnesToThem) {
  ddp::detail::ParameterUsage usage(3, ddp::DDPOptions().static_graph(true));
  usage.count_synchronised_forward();
  ASSERT_TRUE(usage.static_first_iteration());
  usage.count_first_iteration_hook(0, true);
  usage.count_first_iteration_hook(0, true);  // a parameter used twice
  usage.count_first_iteration_hook(2, true);
  usage.end_first_iteration();
  EXPECT_EQ(usage.unused(), (std::vector<size_t>{1}));
  usage.read_used_map();
  usage.end_step();

  usage.count_synchronised_forward();
  ASSERT_TRUE(usage.static_after_first_iteration());
  usage.prepare_backward({}, {});
  EXPECT_FALSE(usage.last_hook(0, "rank 0: ", "w0"));
  EXPECT_TRUE(usage.last_hook(0, "rank 0: ", "w0"));
  EXPECT_TRUE(usage.last_hook(2, "rank 0: ", "w2"));
  EXPECT_FALSE(usage.reduced_gradient_applies(1));  // the first iteration's usage holds
  try {
    usage.last_hook(1, "rank 0: ", "w1");
    FAIL() << "a hook the first iteration did not see must be refused";
  } catch (const ddp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'w1' received a gradient, but it received none"), std::string::npos)
        << e.what();
  }
}

// ---- the observers -----------------------------------------------------

TEST(Observers, RuntimeFiguresCountBucketsAndLeaveCommunicationAtZeroWhenThereWasNone) {
  auto params = three_parameters();
  BucketSet buckets;
  buckets.lay_out(params, {{2}, {1, 0}}, false);
  ddp::ReducerStats stats;
  ddp::detail::RuntimeFigures figures(stats);
  figures.buckets_laid_out(buckets);
  EXPECT_EQ(stats.num_buckets, 2u);
  EXPECT_EQ(stats.bucket_bytes, (std::vector<int64_t>{20, 40}));
  figures.forward_started();
  figures.backward_prepared();
  figures.backward_started();
  figures.bucket_launching(0);
  std::vector<size_t> order{2, 1, 0};
  const auto now = ddp::detail::Clock::now();
  stats.iterations = 1;
  figures.step_finished({now, now, now, 0, /*communicated=*/false, /*buckets_skipped=*/0, /*bytes_skipped=*/0, &order});
  EXPECT_EQ(stats.bytes_reduced, 60);
  EXPECT_EQ(stats.comm_ms, 0);
  EXPECT_EQ(stats.at_ns.comm_start, 0);
  EXPECT_EQ(stats.ready_order, (std::vector<size_t>{2, 1, 0}));
}

// Every bucket's end reaches the timeline: from the backend's thread when
// the bucket's future is a collective of its own, else when it is waited for
// (a hook's future, a ready one).
TEST(Observers, TheTimelineSeesEveryBucketsEnd) {
  auto pg = std::make_shared<ddp::testing::FakeGroup>();
  auto timeline = std::make_shared<ddp::Timeline>(pg, ::testing::TempDir() + "/reducer_parts_timeline.json");
  auto params = three_parameters();
  BucketSet buckets;
  buckets.lay_out(params, {{2}, {1, 0}}, false);
  ddp::detail::TimelineRecorder recorder(timeline, buckets);
  recorder.backward_started();
  for (size_t k = 0; k < buckets.size(); ++k) {
    recorder.bucket_ready(k);
    recorder.bucket_launching(k);
    buckets[k].reduced = ddp::CommFuture::ready(buckets[k].contents);
    recorder.bucket_launched(k, buckets[k]);
  }
  recorder.wait_started();
  for (size_t k = 0; k < buckets.size(); ++k) {
    buckets[k].reduced.wait();
    recorder.bucket_done(k, buckets[k]);
  }
  recorder.wait_ended(true);
  const std::string events = timeline->events_json();
  for (const std::string bucket : {"bucket 0", "bucket 1"})
    EXPECT_NE(events.find("\"name\": \"" + bucket + "\", \"cat\": \"communication\", \"ph\": \"X\""),
              std::string::npos)
        << events;
  EXPECT_NE(events.find("wait for communication"), std::string::npos) << events;
}

// A backend's collective whose end the test decides.
class EndsWhenTold final : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds) override {
    future_->wait();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void end() { future_->markCompleted(c10::IValue()); }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_ = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A bucket whose future is the collective itself: its end is on the
// timeline the moment the backend says so, and only once.
TEST(Observers, ACollectivesEndReachesTheTimelineWhenTheBackendSaysSo) {
  auto pg = std::make_shared<ddp::testing::FakeGroup>();
  auto timeline = std::make_shared<ddp::Timeline>(pg, ::testing::TempDir() + "/reducer_parts_timeline_end.json");
  auto params = three_parameters();
  BucketSet buckets;
  buckets.lay_out(params, {{2, 1, 0}}, false);
  ddp::detail::TimelineRecorder recorder(timeline, buckets);
  const std::string done = "\"name\": \"bucket 0\", \"cat\": \"communication\", \"ph\": \"X\"";
  auto work = c10::make_intrusive<EndsWhenTold>();
  recorder.backward_started();
  recorder.bucket_ready(0);
  recorder.bucket_launching(0);
  buckets[0].reduced = ddp::CommFuture(ddp::detail::make_work(work, "test allreduce", 0), buckets[0].contents);
  recorder.bucket_launched(0, buckets[0]);
  EXPECT_EQ(count(timeline->events_json(), done), 0u);
  work->end();  // on the backend's thread, in a real group
  EXPECT_EQ(count(timeline->events_json(), done), 1u);
  recorder.wait_started();
  buckets[0].reduced.wait();
  recorder.bucket_done(0, buckets[0]);
  recorder.wait_ended(true);
  EXPECT_EQ(count(timeline->events_json(), done), 1u) << timeline->events_json();
}

TEST(Observers, TheBucketSizeSearchWaitsForASettledLayoutAndSkipsCapsThatPackTheSameBuckets) {
  ddp::testing::FakeGroup pg;
  ddp::ReducerStats stats;
  stats.bucket_cap_tuning = true;
  const auto options = ddp::DDPOptions().bucket_cap_mb("auto").bucket_cap_candidates_mb({1, 25, 100});
  int layouts = 0;
  ddp::detail::BucketCapSearch search(
      options, pg, stats,
      [&](double) {
        ++layouts;
        return ddp::detail::Assignment{{0, 1, 2}};  // every cap packs one bucket
      },
      "rank 0: ");
  search.between_steps(5.0, /*layout_settled=*/false);
  EXPECT_EQ(layouts, 0);
  EXPECT_EQ(search.take_pending_cap(), 0);
  search.between_steps(5.0, true);
  EXPECT_EQ(layouts, 3);
  EXPECT_EQ(search.take_pending_cap(), 1);  // the only cap worth a trial, chosen at once
  EXPECT_FALSE(stats.bucket_cap_tuning);
}

}  // namespace
