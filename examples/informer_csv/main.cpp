// A minimal Informer forecasting a multivariate CSV series (seed 000's
// informer.py on datatry.csv), data-parallel. Without --csv it trains on the
// repository's deterministic synthetic series (written into the run folder).
// Reports test MSE and MAE (on the normalised scale, as Informer does) next
// to a last-value baseline, which the model must beat.
//
//   ddprun --nproc-per-node 2 build/examples/informer_csv/informer_csv
#include <ddp/train.h>

#include <cstdio>
#include <filesystem>

#include "informer.h"
#include "synthetic_series.h"

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    // 1. Options and the process group. The model's shape is fixed across a
    // resume (a changed --d-model is refused, naming both values); the CSV may move.
    informer::InformerOptions model_opts;
    const auto opts = ddp::parse_train_options(
        argc, argv,
        ddp::TrainOptions()
            .epochs(6)
            .global_batch_size(64)
            .lr(1e-3)
            .run_dir("runs/informer_csv")
            .add_option("csv", "", "the series (default: the synthetic one, in the run folder)",
                        ddp::OnResume::may_change)
            .add_option("seq-len", model_opts.seq_len(), "encoder input length")
            .add_option("label-len", model_opts.label_len(), "decoder start token")
            .add_option("pred-len", model_opts.pred_len(), "forecast horizon")
            .add_option("d-model", model_opts.d_model(), "model width")
            .add_option("heads", model_opts.heads(), "attention heads (divide --d-model)")
            // No --data-dir (--csv instead) and no --amp: the kit refuses them as unknown.
            .supports({"epochs", "batch-size", "global-batch-size", "lr", "seed", "backend", "bucket-cap-mb",
                       "timeout", "run-dir", "checkpoint-every", "resume", "workers", "limit-batches", "timeline",
                       "timeline-skew-every", "preemption-check-every", "nonfinite-loss", "log-samples"}));
    std::string csv = opts.get<std::string>("csv");
    model_opts.seq_len(opts.get<int64_t>("seq-len"))
        .label_len(opts.get<int64_t>("label-len"))
        .pred_len(opts.get<int64_t>("pred-len"))
        .d_model(opts.get<int64_t>("d-model"))
        .heads(opts.get<int64_t>("heads"));
    if (const auto problem = informer::options_problem(model_opts); !problem.empty()) throw ddp::UsageError(problem);
    auto pg = opts.init_process_group();
    const int rank = pg->rank(), world = pg->size();
    const torch::Device device = pg->device();
    ddp::RunDir run(opts.run_dir(), *pg, "test_mae");
    run.log(ddp::environment_summary(*pg));

    // 2. Data: 80% of the rows train, the last 20% test (with seq_len rows of context before them).
    if (csv.empty()) {
      csv = run.file("datatry.csv");
      if (rank == 0 && !std::filesystem::exists(csv)) informer::write_synthetic_series(csv);
      pg->barrier();  // the file is complete before anyone reads it
    }
    const auto series = ddp::read_csv_series(csv);
    const int64_t rows = series.values.size(0), train_rows = rows * 8 / 10;
    model_opts.variables(series.values.size(1));
    const auto norm = ddp::Normalizer::fit(series.values.narrow(0, 0, train_rows));
    const auto values = norm.apply(series.values);
    const int64_t context = model_opts.seq_len();
    ddp::SlidingWindows train_set(values.narrow(0, 0, train_rows), context, model_opts.pred_len());
    ddp::SlidingWindows test_set(values.narrow(0, train_rows - context, rows - train_rows + context), context,
                                 model_opts.pred_len());
    ddp::DistributedSampler train_sampler(train_set.size().value(), *pg,
                                          ddp::DistributedSamplerOptions().seed(opts.seed()));
    ddp::DistributedSampler test_sampler(test_set.size().value(), *pg,
                                         ddp::DistributedSamplerOptions().shuffle(false).pad(false));
    const int64_t batch = opts.per_process_batch(world);
    auto loader_options = torch::data::DataLoaderOptions(batch).workers(opts.workers());
    auto train_loader = torch::data::make_data_loader(train_set, train_sampler, loader_options);
    auto test_loader = torch::data::make_data_loader(test_set, test_sampler, loader_options);
    run.log("informer_csv: " + csv + ", " + std::to_string(rows) + " rows x " + std::to_string(series.columns.size()) +
            " variables" + (series.time_column.empty() ? "" : " (time column '" + series.time_column + "')") + ", " +
            std::to_string(train_set.size().value()) + " training and " + std::to_string(test_set.size().value()) +
            " test windows");

    // 3. Model, DDP, optimizer.
    torch::manual_seed(opts.seed());
    informer::Informer net(model_opts);
    net->to(device);
    ddp::DistributedDataParallel model(net, pg, opts.ddp_options());
    torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(opts.lr()));

    // 4. Resume.
    ddp::TrainState state = ddp::resume_or_start(opts, run, *net, optimizer, *pg);

    // 5. The loop.
    for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
      const auto train = ddp::train_epoch(*train_loader, train_sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
        auto x = b.data.to(device), y = b.target.to(device);
        optimizer.zero_grad();
        auto loss = torch::mse_loss(model(x), y);
        loss.backward();
        ddp::optimizer_step(model, optimizer);
        return loss;
      });

      // Evaluation: sums of errors over this rank's test windows, one all-reduce.
      ddp::MetricSums sums({"mse", "mae", "last_mse", "last_mae"});
      {
        torch::NoGradGuard no_grad;
        net->eval();
        int64_t batches = 0;
        for (auto& b : *test_loader) {
          if (opts.limit_batches() >= 0 && batches++ >= opts.limit_batches()) break;
          auto x = b.data.to(device), y = b.target.to(device);
          auto pred = net->forward(x);
          auto last = x.narrow(1, context - 1, 1).expand_as(y);  // the baseline: the last value, held
          sums.add("mse", (pred - y).pow(2).sum().item<double>());
          sums.add("mae", (pred - y).abs().sum().item<double>());
          sums.add("last_mse", (last - y).pow(2).sum().item<double>());
          sums.add("last_mae", (last - y).abs().sum().item<double>());
          sums.add_count(y.numel());
        }
        net->train();
      }
      const auto test = sums.all_reduced(*pg);

      char line[200];
      std::snprintf(line, sizeof line,
                    "train mse %.4f | test mse %.4f mae %.4f | last-value baseline mse %.4f mae %.4f%s",
                    train.loss, test.mean("mse"), test.mean("mae"),
                    test.mean("last_mse"), test.mean("last_mae"),
                    test.mean("mse") < test.mean("last_mse") && test.mean("mae") < test.mean("last_mae")
                        ? " (beats the baseline)"
                        : " (does not beat the baseline yet)");
      ddp::end_epoch(epoch, train, test.mean("mse"), test.mean("mae"), line, *net, optimizer, opts, state, run, *pg);
    }

    // 6. What the run leaves behind.
    ddp::save_ddp_logging_data(run, model, *pg);
    ddp::finish_run(run, *net, *pg);
    ddp::destroy_process_group();
    return 0;
  });
}
