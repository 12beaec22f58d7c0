// A minimal Informer (Zhou et al., AAAI 2021) for multivariate forecasting:
// ProbSparse self-attention, a distilling convolution between encoder
// layers, and a generative decoder that predicts the whole horizon in one
// forward pass from a start token (the last label_len inputs) and zeros.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <string>

namespace informer {

namespace nn = torch::nn;

struct InformerOptions {
  TORCH_ARG(int64_t, variables) = 11;
  TORCH_ARG(int64_t, seq_len) = 96;    // encoder input
  TORCH_ARG(int64_t, label_len) = 48;  // decoder start token
  TORCH_ARG(int64_t, pred_len) = 24;   // horizon
  TORCH_ARG(int64_t, d_model) = 64;
  TORCH_ARG(int64_t, heads) = 4;
  TORCH_ARG(int64_t, e_layers) = 2;
  TORCH_ARG(int64_t, d_layers) = 1;
  TORCH_ARG(int64_t, d_ff) = 128;
  TORCH_ARG(int64_t, factor) = 5;  // ProbSparse: c in u = c * ln L
  TORCH_ARG(double, dropout) = 0.05;
};

// Empty when `o` makes a model that runs, else what is wrong with it and what
// to do, for the command line's usage error.
inline std::string options_problem(const InformerOptions& o) {
  auto n = [](int64_t v) { return std::to_string(v); };
  if (o.seq_len() < 1) return "--seq-len must be at least 1, got " + n(o.seq_len());
  if (o.pred_len() < 1) return "--pred-len must be at least 1, got " + n(o.pred_len());
  if (o.label_len() < 0 || o.label_len() > o.seq_len())
    return "--label-len " + n(o.label_len()) + " must lie in 0.." + n(o.seq_len()) +
           " (--seq-len): the decoder starts from the last label-len steps of the encoder's input";
  if (o.d_model() < 1) return "--d-model must be at least 1, got " + n(o.d_model());
  if (o.heads() < 1) return "--heads must be at least 1, got " + n(o.heads());
  if (o.d_model() % o.heads() != 0)
    return "--d-model " + n(o.d_model()) + " does not divide by --heads " + n(o.heads()) +
           ": each head takes d-model / heads features; pick a multiple of " + n(o.heads());
  if (o.variables() < 1) return "the series has no variables";
  if (o.e_layers() < 1 || o.d_layers() < 1 || o.d_ff() < 1 || o.factor() < 1)
    return "layers, feed-forward width and the ProbSparse factor must be at least 1";
  if (!(o.dropout() >= 0 && o.dropout() < 1)) return "dropout must lie in [0, 1)";
  return "";
}

// Multi-head attention; `prob` selects ProbSparse (top-u queries by the
// max-mean sparsity measure on sampled keys; the others take the mean, or
// under a causal mask the running sum, of the values). Full otherwise.
struct AttentionImpl : nn::Module {
  AttentionImpl(int64_t d_model, int64_t heads, bool prob, bool causal, int64_t factor)
      : heads(heads), prob(prob), causal(causal), factor(factor),
        q(register_module("q", nn::Linear(d_model, d_model))), k(register_module("k", nn::Linear(d_model, d_model))),
        v(register_module("v", nn::Linear(d_model, d_model))), o(register_module("o", nn::Linear(d_model, d_model))) {}

  torch::Tensor forward(const torch::Tensor& xq, const torch::Tensor& xkv) {
    const int64_t B = xq.size(0), Lq = xq.size(1), Lk = xkv.size(1), D = xq.size(2), E = D / heads;
    auto Q = q(xq).view({B, Lq, heads, E}).transpose(1, 2);  // [B, H, Lq, E]
    auto K = k(xkv).view({B, Lk, heads, E}).transpose(1, 2);
    auto V = v(xkv).view({B, Lk, heads, E}).transpose(1, 2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(E));
    torch::Tensor context;
    if (!prob) {
      auto scores = torch::matmul(Q, K.transpose(-2, -1)) * scale;
      if (causal) scores = scores.masked_fill(torch::ones({Lq, Lk}, torch::kBool).triu(1).to(scores.device()), -INFINITY);
      context = torch::matmul(torch::softmax(scores, -1), V);
    } else {
      const int64_t u_keys = std::min<int64_t>(factor * static_cast<int64_t>(std::ceil(std::log(Lk))), Lk);
      const int64_t u = std::min<int64_t>(factor * static_cast<int64_t>(std::ceil(std::log(Lq))), Lq);
      // Sparsity of each query, measured on u_keys random keys: M = max - mean of q.k over the sample.
      // At these lengths one Q.K^T and a gather cost less than materialising the sampled keys
      // per query, and give the same numbers.
      auto qk_all = torch::matmul(Q, K.transpose(-2, -1));                               // [B, H, Lq, Lk]
      auto sample = torch::randint(Lk, {Lq, u_keys}, torch::TensorOptions().dtype(torch::kLong).device(Q.device()));
      auto qk = qk_all.gather(-1, sample.expand({B, heads, Lq, u_keys}));
      auto M = std::get<0>(qk.max(-1)) - qk.sum(-1) / Lk;
      auto top = std::get<1>(M.topk(u, -1));                                             // [B, H, u]: the active queries
      auto scores = qk_all.gather(2, top.unsqueeze(-1).expand({B, heads, u, Lk})) * scale;  // [B, H, u, Lk]
      if (causal) {
        auto key_pos = torch::arange(Lk, top.options()).view({1, 1, 1, Lk});
        scores = scores.masked_fill(key_pos > top.unsqueeze(-1), -INFINITY);
      }
      // The lazy queries' output: mean of V (or its running sum under the mask).
      context = causal ? V.cumsum(2) : V.mean(2, /*keepdim=*/true).expand({B, heads, Lq, E}).clone();
      context = context.scatter(2, top.unsqueeze(-1).expand({B, heads, u, E}), torch::matmul(torch::softmax(scores, -1), V));
    }
    return o(context.transpose(1, 2).reshape({B, Lq, D}));
  }

  int64_t heads;
  bool prob, causal;
  int64_t factor;
  nn::Linear q, k, v, o;
};
TORCH_MODULE(Attention);

struct EncoderLayerImpl : nn::Module {
  EncoderLayerImpl(const InformerOptions& o)
      : attn(register_module("attn", Attention(o.d_model(), o.heads(), true, false, o.factor()))),
        ff1(register_module("ff1", nn::Linear(o.d_model(), o.d_ff()))),
        ff2(register_module("ff2", nn::Linear(o.d_ff(), o.d_model()))),
        norm1(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        norm2(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        drop(register_module("drop", nn::Dropout(o.dropout()))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = norm1(x + drop(attn(x, x)));
    return norm2(x + drop(ff2(drop(torch::gelu(ff1(x))))));
  }
  Attention attn;
  nn::Linear ff1, ff2;
  nn::LayerNorm norm1, norm2;
  nn::Dropout drop;
};
TORCH_MODULE(EncoderLayer);

// Self-attention distilling: halves the sequence between encoder layers.
struct DistilImpl : nn::Module {
  explicit DistilImpl(int64_t d)
      : conv(register_module("conv", nn::Conv1d(nn::Conv1dOptions(d, d, 3).padding(1).padding_mode(torch::kCircular)))),
        norm(register_module("norm", nn::BatchNorm1d(d))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // [B, L, D] -> [B, ceil(L/2), D]
    auto y = torch::elu(norm(conv(x.transpose(1, 2))));
    return torch::max_pool1d(y, 3, 2, 1).transpose(1, 2);
  }
  nn::Conv1d conv;
  nn::BatchNorm1d norm;
};
TORCH_MODULE(Distil);

struct DecoderLayerImpl : nn::Module {
  DecoderLayerImpl(const InformerOptions& o)
      : self_attn(register_module("self_attn", Attention(o.d_model(), o.heads(), true, true, o.factor()))),
        cross_attn(register_module("cross_attn", Attention(o.d_model(), o.heads(), false, false, o.factor()))),
        ff1(register_module("ff1", nn::Linear(o.d_model(), o.d_ff()))),
        ff2(register_module("ff2", nn::Linear(o.d_ff(), o.d_model()))),
        norm1(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        norm2(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        norm3(register_module("norm3", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        drop(register_module("drop", nn::Dropout(o.dropout()))) {}
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& memory) {
    x = norm1(x + drop(self_attn(x, x)));
    x = norm2(x + drop(cross_attn(x, memory)));
    return norm3(x + drop(ff2(drop(torch::gelu(ff1(x))))));
  }
  Attention self_attn, cross_attn;
  nn::Linear ff1, ff2;
  nn::LayerNorm norm1, norm2, norm3;
  nn::Dropout drop;
};
TORCH_MODULE(DecoderLayer);

// Value embedding (a circular 3-tap convolution, as Informer's TokenEmbedding) plus sinusoidal positions.
struct EmbeddingImpl : nn::Module {
  EmbeddingImpl(int64_t variables, int64_t d_model, int64_t max_len, double dropout)
      : token(register_module("token", nn::Conv1d(nn::Conv1dOptions(variables, d_model, 3).padding(1).padding_mode(torch::kCircular).bias(false)))),
        drop(register_module("drop", nn::Dropout(dropout))) {
    auto pos = torch::arange(max_len, torch::kFloat).unsqueeze(1);
    auto div = torch::exp(torch::arange(0, d_model, 2, torch::kFloat) * (-std::log(10000.0) / d_model));
    auto pe = torch::zeros({max_len, d_model});
    pe.slice(1, 0, d_model, 2).copy_(torch::sin(pos * div));
    pe.slice(1, 1, d_model, 2).copy_(torch::cos(pos * div));
    positions = register_buffer("positions", pe);
  }
  torch::Tensor forward(const torch::Tensor& x) {  // [B, L, C] -> [B, L, D]
    return drop(token(x.transpose(1, 2)).transpose(1, 2) + positions.narrow(0, 0, x.size(1)));
  }
  nn::Conv1d token;
  nn::Dropout drop;
  torch::Tensor positions;
};
TORCH_MODULE(Embedding);

struct InformerImpl : nn::Module {
  explicit InformerImpl(const InformerOptions& o)
      : opts(o),
        enc_embed(register_module("enc_embed", Embedding(o.variables(), o.d_model(), o.seq_len(), o.dropout()))),
        dec_embed(register_module("dec_embed", Embedding(o.variables(), o.d_model(), o.label_len() + o.pred_len(), o.dropout()))),
        enc_norm(register_module("enc_norm", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        dec_norm(register_module("dec_norm", nn::LayerNorm(nn::LayerNormOptions({o.d_model()})))),
        projection(register_module("projection", nn::Linear(o.d_model(), o.variables()))) {
    for (int64_t i = 0; i < o.e_layers(); ++i) {
      encoder.push_back(register_module("encoder" + std::to_string(i), EncoderLayer(o)));
      if (i + 1 < o.e_layers()) distil.push_back(register_module("distil" + std::to_string(i), Distil(o.d_model())));
    }
    for (int64_t i = 0; i < o.d_layers(); ++i) decoder.push_back(register_module("decoder" + std::to_string(i), DecoderLayer(o)));
  }

  // x: [B, seq_len, C] -> the next pred_len steps, [B, pred_len, C].
  torch::Tensor forward(const torch::Tensor& x) {
    auto memory = enc_embed(x);
    for (size_t i = 0; i < encoder.size(); ++i) {
      memory = encoder[i](memory);
      if (i < distil.size()) memory = distil[i](memory);
    }
    memory = enc_norm(memory);
    const int64_t B = x.size(0);
    auto start = x.narrow(1, opts.seq_len() - opts.label_len(), opts.label_len());
    auto dec_in = torch::cat({start, torch::zeros({B, opts.pred_len(), x.size(2)}, x.options())}, 1);
    auto y = dec_embed(dec_in);
    for (auto& layer : decoder) y = layer(y, memory);
    return projection(dec_norm(y)).narrow(1, opts.label_len(), opts.pred_len());
  }

  InformerOptions opts;
  Embedding enc_embed, dec_embed;
  std::vector<EncoderLayer> encoder;
  std::vector<Distil> distil;
  std::vector<DecoderLayer> decoder;
  nn::LayerNorm enc_norm, dec_norm;
  nn::Linear projection;
};
TORCH_MODULE(Informer);

}  // namespace informer
