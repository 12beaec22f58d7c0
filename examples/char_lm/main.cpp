// A character-level language model, data-parallel over every process ddprun
// starts: the usual PyTorch script (an embedding tied to the output layer, a
// GRU, AdamW, gradient clipping, bits per character on held-out text) ported
// to LibTorch with DistributedDataParallel and the training kit.
//
//   ddprun --nproc-per-node 2 build/examples/char_lm/char_lm [--text FILE]
#include <ddp/train.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

// An output layer on a weight it is given (the embedding's): a
// torch::nn::Linear registers its own "weight", so `head->weight =
// emb->weight` would leave it training a second, unused one
// (docs/training.md, "Tied weights").
struct TiedOutputImpl : torch::nn::Module {
  explicit TiedOutputImpl(torch::Tensor w)
      : weight(register_parameter("weight", w)), bias(register_parameter("bias", torch::zeros({w.size(0)}))) {}
  torch::Tensor forward(torch::Tensor h) { return torch::nn::functional::linear(h, weight, bias); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(TiedOutput);

// embedding [vocab, dim] -> GRU (dim -> dim) -> logits through the same [vocab, dim] matrix.
struct CharLMImpl : torch::nn::Module {
  CharLMImpl(int64_t vocab, int64_t dim, int64_t layers)
      : emb(register_module("emb", torch::nn::Embedding(vocab, dim))),
        gru(register_module("gru",
                            torch::nn::GRU(torch::nn::GRUOptions(dim, dim).num_layers(layers).batch_first(true)))),
        head(register_module("head", TiedOutput(emb->weight))) {
    torch::NoGradGuard no_grad;
    emb->weight.normal_(0.0, 0.1);  // it is the output layer too: keep the first logits small
  }
  // tokens [N, T] -> logits [N, T, vocab]
  torch::Tensor forward(torch::Tensor tokens) { return head(std::get<0>(gru(emb(tokens)))); }
  // One character at a time, for sampling: token [1, 1], hidden state in and out.
  torch::Tensor step(torch::Tensor token, torch::Tensor& h) {
    auto [out, h_next] = gru(emb(token), h);  // an undefined h: zeros
    h = h_next;
    return head(out)[0][0];
  }
  torch::nn::Embedding emb;
  torch::nn::GRU gru;
  TiedOutput head;
};
TORCH_MODULE(CharLM);

// The text as character ids over its own alphabet (bytes: plain ASCII text
// is what this reads best), and back.
struct Corpus {
  std::string alphabet;           // the characters that occur, sorted
  torch::Tensor ids;              // [length] int64
  explicit Corpus(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ddp::UsageError("cannot read --text " + path + ": name a text file (any plain text will do)");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    alphabet = text;
    std::sort(alphabet.begin(), alphabet.end());
    alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
    ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kLong);
    auto* p = ids.data_ptr<int64_t>();
    for (size_t i = 0; i < text.size(); ++i) p[i] = alphabet.find(text[i]);
  }
  int64_t vocab() const { return static_cast<int64_t>(alphabet.size()); }
};

// Non-overlapping windows of seq_len + 1 characters of ids[begin, end):
// inputs are the first seq_len, targets the last seq_len (the next character).
ddp::TensorDataset windows(const torch::Tensor& ids, int64_t begin, int64_t end, int64_t seq_len) {
  const int64_t n = (end - begin - 1) / seq_len;
  if (n < 1) throw ddp::UsageError("the text is too short for --seq-len " + std::to_string(seq_len));
  auto x = ids.narrow(0, begin, n * seq_len).view({n, seq_len});
  auto y = ids.narrow(0, begin + 1, n * seq_len).view({n, seq_len});
  return ddp::TensorDataset(x.clone(), y.clone());
}

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    // 1. Options: the kit's, the program's own (recorded in every checkpoint; the shapes are checked on resume).
    const auto opts = ddp::parse_train_options(argc, argv,
        ddp::TrainOptions().epochs(20).global_batch_size(32).lr(3e-3).run_dir("runs/char_lm")
            .add_option("text", std::string("/usr/share/common-licenses/GPL-3"), "the text to learn")
            .add_option("dim", 128, "embedding width and GRU state")
            .add_option("layers", 1, "GRU layers")
            .add_option("seq-len", 64, "characters per training sequence")
            .add_option("val-fraction", 0.1, "the share of the text, at its end, held out for evaluation")
            .add_option("weight-decay", 0.01, "AdamW's decoupled weight decay", ddp::OnResume::may_change)
            .add_option("clip", 1.0, "clip the gradient norm to this (0: no clipping)", ddp::OnResume::may_change)
            .add_option("sample-len", 200, "characters sampled on rank 0 at the end", ddp::OnResume::may_change)
            .supports({"epochs", "batch-size", "global-batch-size", "lr", "seed", "backend", "bucket-cap-mb",
                       "timeout", "run-dir", "checkpoint-every", "resume", "workers", "limit-batches", "timeline",
                       "timeline-skew-every", "preemption-check-every", "nonfinite-loss", "log-samples"}));
    const int64_t dim = opts.get<int64_t>("dim"), seq_len = opts.get<int64_t>("seq-len");
    const double val_fraction = opts.get<double>("val-fraction"), clip = opts.get<double>("clip");
    if (dim < 1 || seq_len < 1 || opts.get<int64_t>("layers") < 1 || !(val_fraction > 0 && val_fraction < 1))
      throw ddp::UsageError("--dim, --layers and --seq-len must be positive, --val-fraction between 0 and 1");
    auto pg = opts.init_process_group();
    const int world = pg->size();
    const torch::Device device = pg->device();
    ddp::RunDir run(opts.run_dir(), *pg, "val_bpc");
    run.log(ddp::environment_summary(*pg));

    // 2. Data: every rank reads the text; the samplers pick its share of the sequences.
    const Corpus corpus(opts.get<std::string>("text"));
    const int64_t length = corpus.ids.size(0), split = length - static_cast<int64_t>(val_fraction * length);
    auto train_set = windows(corpus.ids, 0, split, seq_len), val_set = windows(corpus.ids, split, length, seq_len);
    ddp::DistributedSampler train_sampler(train_set.size().value(), *pg,
                                          ddp::DistributedSamplerOptions().seed(opts.seed()));
    ddp::DistributedSampler val_sampler(val_set.size().value(), *pg,
                                        ddp::DistributedSamplerOptions().shuffle(false).pad(false));
    const int64_t batch = opts.per_process_batch(*pg);
    auto train_loader = torch::data::make_data_loader(train_set, train_sampler,
                                                      torch::data::DataLoaderOptions(batch).workers(opts.workers()));
    auto val_loader = torch::data::make_data_loader(val_set, val_sampler,
                                                    torch::data::DataLoaderOptions(batch).workers(opts.workers()));

    // 3. Model, DDP, and an optimizer that steps the tied weight once (ddp::unique_parameters).
    torch::manual_seed(opts.seed());
    CharLM net(corpus.vocab(), dim, opts.get<int64_t>("layers"));
    net->to(device);
    ddp::DistributedDataParallel model(net, pg, opts.ddp_options());
    const auto params = ddp::unique_parameters(net);
    torch::optim::AdamW optimizer(params,
                                  torch::optim::AdamWOptions(opts.lr()).weight_decay(opts.get<double>("weight-decay")));

    // 4. Resume, with the program's own state from the checkpoint's "extra".
    ddp::TrainState state = ddp::resume_or_start(opts, run, *net, optimizer, *pg);
    if (state.extra.count("alphabet") && state.extra.at("alphabet").toStringRef() != corpus.alphabet)
      throw ddp::UsageError("--text " + opts.get<std::string>("text") + " has changed since the checkpoint: its " +
                            "characters are not those the model was trained on; resume with that text");
    double best_bpc = state.extra.count("best_bpc") ? state.extra.at("best_bpc").toDouble() : INFINITY;
    state.extra["alphabet"] = corpus.alphabet;
    run.log("char_lm: " + std::to_string(length) + " characters (" + std::to_string(corpus.vocab()) +
            " distinct), " + std::to_string(train_set.size().value()) + " training and " +
            std::to_string(val_set.size().value()) + " validation sequences of " + std::to_string(seq_len) + "; " +
            std::to_string(world) + " x " + std::to_string(batch) + " sequences per step");

    // 5. The loop: cross-entropy per character, clipped gradients, AdamW; bits per character held out.
    namespace F = torch::nn::functional;
    for (int64_t epoch = state.epoch; epoch < opts.epochs(); ++epoch) {
      const auto train = ddp::train_epoch(*train_loader, train_sampler, epoch, batch, opts, state, *pg, [&](auto& b) {
        auto x = b.data.to(device), y = b.target.to(device);
        optimizer.zero_grad();
        auto loss = F::cross_entropy(model(x).flatten(0, 1), y.flatten());
        loss.backward();  // gradients are averaged over the ranks when it returns
        if (clip > 0) {
          // The norm before clipping, as PyTorch's clip_grad_norm_ returns it; TensorBoard gets it (rank 0).
          const double norm = torch::nn::utils::clip_grad_norm_(params, clip);
          if (auto* tb = run.tensorboard()) tb->add_scalar("train/grad_norm", norm, state.step + 1);
        }
        ddp::optimizer_step(model, optimizer);
        return loss;
      });
      // Sums over this rank's validation sequences, one all-reduce: every rank gets the whole set's mean.
      auto measure = [&](torch::data::Example<>& b, ddp::MetricSums& sums) {
        auto logits = net->forward(b.data.to(device));
        auto y = b.target.to(device);
        sums.add("nats", F::cross_entropy(logits.flatten(0, 1), y.flatten(),
                                          F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>());
        sums.add_count(y.numel());  // characters
      };
      const auto val = ddp::evaluate(net, *val_loader, *pg, {"nats"}, measure, opts.limit_batches());
      const double bpc = val.mean("nats") / std::log(2.0);
      best_bpc = std::min(best_bpc, bpc);
      state.extra["best_bpc"] = best_bpc;
      char line[200];
      std::snprintf(line, sizeof line, "train loss %.4f (%.3f bits/char), val %.4f bits/char (%lld chars), %.1f s",
                    train.loss, train.loss / std::log(2.0), bpc, static_cast<long long>(val.count()), train.seconds);
      ddp::end_epoch(epoch, train, val.mean("nats"), bpc, line, *net, optimizer, opts, state, run, *pg);
    }

    // 6. A sample on rank 0, each rank's parameter checksum (DDP keeps them equal), the run's files.
    if (pg->rank() == 0 && opts.get<int64_t>("sample-len") > 0) {
      torch::NoGradGuard no_grad;
      net->eval();
      torch::manual_seed(opts.seed());  // the same sample from the same model
      torch::Tensor h, token = torch::full({1, 1}, corpus.ids[0].item<int64_t>(), torch::kLong).to(device);
      std::string text(1, corpus.alphabet[token.item<int64_t>()]);
      for (int64_t i = 0; i < opts.get<int64_t>("sample-len"); ++i) {
        auto probs = torch::softmax(net->step(token, h).cpu(), 0);
        token = torch::multinomial(probs, 1).view({1, 1}).to(device);
        text += corpus.alphabet[token.item<int64_t>()];
      }
      run.log("sample: " + text);
      net->train();
    }
    double checksum = 0;
    for (const auto& p : params) checksum += p.detach().to(torch::kDouble).sum().item<double>();
    std::printf("rank %d: parameter checksum %.17g\n", pg->rank(), checksum);
    std::fflush(stdout);
    char best[96];
    std::snprintf(best, sizeof best, "best val %.4f bits/char", best_bpc);
    ddp::save_ddp_logging_data(run, model, *pg);
    ddp::finish_run(run, *net, *pg, best);
    ddp::destroy_process_group();
    return 0;
  });
}
