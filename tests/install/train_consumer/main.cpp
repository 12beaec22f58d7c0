// The training kit from the installed package: options, a tensor dataset
// sharded by the sampler, DDP, metrics summed over ranks.
#include <ddp/train.h>

#include <iostream>

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    const auto opts = ddp::parse_train_options(argc, argv, ddp::TrainOptions().batch_size(8).backend("gloo"));
    auto pg = ddp::init_process_group(opts.process_group_options());
    ddp::TensorDataset data(torch::randn({32, 4}), torch::randn({32, 1}));
    ddp::DistributedSampler sampler(data.size().value(), *pg);
    auto loader = torch::data::make_data_loader(data, sampler, torch::data::DataLoaderOptions(opts.batch_size()));
    torch::nn::Linear net(4, 1);
    ddp::DistributedDataParallel model(net, pg, opts.ddp_options());
    torch::optim::SGD opt(net->parameters(), opts.lr());
    ddp::MetricSums sums({"loss"});
    for (auto& batch : *loader) {
      opt.zero_grad();
      auto loss = torch::mse_loss(model(batch.data), batch.target);
      loss.backward();
      opt.step();
      sums.add("loss", loss.item<double>() * batch.data.size(0));
      sums.add_count(batch.data.size(0));
    }
    const auto total = sums.all_reduced(*pg);
    std::cout << "train consumer ok: " << total.count() << " samples, mean loss " << total.mean("loss") << std::endl;
    ddp::destroy_process_group();
    return 0;
  });
}
