// One rank of dist_test.cpp: every case of pytorch_dist_parity.py through
// ddp::dist, written to $DDP_TEST_DIR/cpp_r<rank>.txt in that script's line
// format (a case the backend lacks: "<case> unsupported"), objects shown
// as that script's show() does. `dist_worker parity` runs them; `dist_worker errors` prints "ERR <case>: <message>" for
// each refusal that must come before anything starts, then checks the group
// still works; `dist_worker teardown` destroys the group while holding it
// (its later calls must be refused) and `dist_worker exit` returns from main
// without destroying it (the library shuts it down at exit). DDP_TEST_BACKEND picks the backend (gloo by default; nccl
// puts every tensor on the rank's GPU).
#include <ddp/ddp.h>

#include "dist_worker.h"

#include <cstdlib>
#include <cstring>
#include <thread>
#include <functional>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

namespace dist = ddp::dist;
using ddp::ReduceOp;
using namespace dist_worker;

namespace dist_worker {

torch::Device g_device = torch::kCPU;

at::Tensor zeros(std::vector<int64_t> shape, at::ScalarType dtype) {
  return torch::zeros(shape, torch::TensorOptions().dtype(dtype).device(g_device));
}

}  // namespace dist_worker

namespace {

const std::map<std::string, at::ScalarType> kDtypes = {{"f32", at::kFloat}, {"f64", at::kDouble}, {"f16", at::kHalf},
                                                       {"i64", at::kLong},  {"i32", at::kInt},    {"u8", at::kByte}};

std::string dtype_name(at::ScalarType t) {
  for (const auto& [k, v] : kDtypes)
    if (v == t) return k;
  return "?";
}


// pytorch_dist_parity.py's val(): exact in every order of reduction.
at::Tensor val(std::vector<int64_t> shape, at::ScalarType dtype, int seed, int rank, bool bits = false) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  auto k = torch::arange(n, torch::kLong) * 3 + seed * 7 + rank * 5;
  auto v = (bits || dtype == at::kByte) ? k.remainder(16) : k.remainder(11) - 5;
  v = v.reshape(shape);
  if (at::isFloatingType(dtype)) return (v.to(at::kDouble) / 4).to(dtype).to(g_device);
  return v.to(dtype).to(g_device);
}

struct Out {
  std::vector<std::string> lines;

  void add(const std::string& name, const at::Tensor& t_in) {
    const auto t = t_in.detach().to(at::kCPU).contiguous();
    std::ostringstream s;
    s << name << " " << dtype_name(t.scalar_type()) << " ";
    std::string shape;
    for (auto d : t.sizes()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
    s << (shape.empty() ? "scalar" : shape) << " :";
    const auto v = at::isFloatingType(t.scalar_type()) ? t.to(at::kDouble).view(at::kLong).reshape({-1})
                                                        : t.to(at::kLong).reshape({-1});
    for (int64_t i = 0; i < v.numel(); ++i) s << " " << v[i].item<int64_t>();
    lines.push_back(s.str());
  }
  void text(const std::string& name, const std::string& s) { lines.push_back(name + " " + s); }
  void write(const std::string& path) {
    std::ofstream f(path);
    for (const auto& l : lines) f << l << "\n";
  }
};

}  // namespace

// pytorch_dist_parity.py's show(): an object as text.
std::string dist_worker::show(const c10::IValue& v) {
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    return "f" + std::to_string(bits);
  }
  if (v.isString()) return "'" + v.toStringRef() + "'";
  if (v.isTensor()) {
    Out o;
    o.add("", v.toTensor());
    return "T<" + o.lines[0].substr(1) + ">";
  }
  std::string s;
  auto join = [&](const std::string& item) { s += (s.size() > 1 ? ", " : "") + item; };
  if (v.isList()) {
    s = "[";
    for (const auto& x : v.toListRef()) join(show(x));
    return s + "]";
  }
  if (v.isTuple()) {
    s = "(";
    for (const auto& x : v.toTupleRef().elements()) join(show(x));
    return s + ")";
  }
  s = "{";
  for (const auto& e : v.toGenericDict()) join(show(e.key()) + ": " + show(e.value()));
  return s + "}";
}


namespace {

// Runs `fn`; a UsageError (the backend lacks the op) is the line "unsupported".
template <typename Fn>
void maybe(Out& out, const std::string& name, Fn&& fn) {
  try {
    fn();
  } catch (const ddp::UsageError& e) {
    std::cerr << name << ": " << e.what() << "\n";
    out.text(name, "unsupported");
  }
}

ReduceOp op_of(const std::string& s) {
  static const std::map<std::string, ReduceOp> ops = {{"SUM", ReduceOp::SUM},   {"PRODUCT", ReduceOp::PRODUCT},
                                                      {"MIN", ReduceOp::MIN},   {"MAX", ReduceOp::MAX},
                                                      {"BAND", ReduceOp::BAND}, {"BOR", ReduceOp::BOR},
                                                      {"BXOR", ReduceOp::BXOR}};
  return ops.at(s);
}

void subgroups(Out& out, int rank, int world, int last);
void point_to_point(Out& out, int rank, int world);
void objects(Out& out, int rank, int world, int last, int src1);

void parity(const std::string& dir) {
  const int rank = dist::get_rank(), world = dist::get_world_size(), last = world - 1;
  const int src1 = world > 1 ? 1 : 0;
  Out out;
  for (std::string op : {"SUM", "PRODUCT", "MIN", "MAX"})
    for (std::string d : {"f32", "f64", "i64", "i32"}) {
      auto t = val({3, 5}, kDtypes.at(d), 1, rank);
      dist::all_reduce(t, op_of(op));
      out.add("all_reduce_" + op + "_" + d, t);
    }
  for (std::string op : {"BAND", "BOR", "BXOR"})
    for (std::string d : {"i64", "i32"}) {
      maybe(out, "all_reduce_" + op + "_" + d, [&] {  // not in NCCL
        auto t = val({3, 5}, kDtypes.at(d), 2, rank, true);
        dist::all_reduce(t, op_of(op));
        out.add("all_reduce_" + op + "_" + d, t);
      });
    }
  auto h = val({7}, at::kHalf, 3, rank);
  dist::all_reduce(h);
  out.add("all_reduce_SUM_f16", h);
  // A non-contiguous view, reduced in place: PyTorch 2.x's NCCL refuses it
  // (c10d's own check, an error of LibTorch's rather than a UsageError).
  try {
    auto base = val({5, 3}, at::kFloat, 4, rank);
    dist::all_reduce(base.t());
    out.add("all_reduce_view", base);
  } catch (const std::exception& e) {
    if (dist::get_backend() != "nccl") throw;
    std::cerr << "all_reduce_view: " << e.what() << "\n";
    out.text("all_reduce_view", "unsupported");
  }
  auto a = val({4}, at::kFloat, 5, rank);
  dist::all_reduce(a, ReduceOp::MAX, {}, true).wait();
  out.add("all_reduce_async", a);
  if (dist::get_backend() == "nccl") {  // PREMUL_SUM: NCCL's only
    auto p = val({4}, at::kFloat, 56, rank);
    dist::all_reduce(p, dist::make_nccl_premul_sum(2.0));
    out.add("all_reduce_premul_sum", p);
  }

  for (std::string op : {"SUM", "MAX"}) {
    auto t = val({2, 3}, at::kFloat, 6, rank);
    dist::reduce(t, last, op_of(op));
    if (rank == last) out.add("reduce_" + op, t);
  }
  for (std::string d : {"f32", "i64", "f16", "u8"}) {
    auto t = val({2, 4}, kDtypes.at(d), 7, rank);
    dist::broadcast(t, src1);
    out.add("broadcast_" + d, t);
  }
  for (std::string d : {"f32", "i64"}) {
    std::vector<at::Tensor> list;
    for (int r = 0; r < world; ++r) list.push_back(zeros({2, 3}, kDtypes.at(d)));
    dist::all_gather(list, val({2, 3}, kDtypes.at(d), 8, rank));
    for (int r = 0; r < world; ++r) out.add("all_gather_" + d + "_" + std::to_string(r), list[r]);
  }
  maybe(out, "all_gather_uneven", [&] {
    std::vector<at::Tensor> list;
    for (int r = 0; r < world; ++r) list.push_back(zeros({r + 1}));
    dist::all_gather(list, val({rank + 1}, at::kFloat, 9, rank), {}, true).wait();
    out.add("all_gather_uneven", torch::cat(list));
  });
  maybe(out, "all_gather_into_tensor", [&] {
    auto o = zeros({2 * world, 2});
    dist::all_gather_into_tensor(o, val({2, 2}, at::kFloat, 10, rank));
    out.add("all_gather_into_tensor", o);
  });
  {
    std::vector<at::Tensor> list;
    if (rank == 0)
      for (int r = 0; r < world; ++r) list.push_back(zeros({3}));
    dist::gather(val({3}, at::kFloat, 11, rank), list, 0);
    if (rank == 0) out.add("gather", torch::cat(list));
    auto t = zeros({4}, at::kLong);
    std::vector<at::Tensor> sl;
    if (rank == last)
      for (int r = 0; r < world; ++r) sl.push_back(val({4}, at::kLong, 12, r) * (r + 1));
    dist::scatter(t, sl, last);
    out.add("scatter", t);
  }
  maybe(out, "reduce_scatter", [&] {
    std::vector<at::Tensor> ins;
    for (int d = 0; d < world; ++d) ins.push_back(val({3}, at::kFloat, 13 + d, rank));
    auto o = zeros({3});
    dist::reduce_scatter(o, ins);
    out.add("reduce_scatter", o);
  });
  maybe(out, "reduce_scatter_tensor", [&] {
    auto o = zeros({2});
    dist::reduce_scatter_tensor(o, val({world * 2}, at::kFloat, 20, rank), ReduceOp::MAX);
    out.add("reduce_scatter_tensor", o);
  });
  maybe(out, "all_to_all", [&] {
    std::vector<at::Tensor> ins, outs;
    for (int d = 0; d < world; ++d) ins.push_back(val({rank + d + 1}, at::kFloat, 21 + d, rank));
    for (int s = 0; s < world; ++s) outs.push_back(zeros({s + rank + 1}));
    dist::all_to_all(outs, ins);
    out.add("all_to_all", torch::cat(outs));
  });
  {
    auto o = zeros({2 * world, 3});
    dist::all_to_all_single(o, val({2 * world, 3}, at::kFloat, 30, rank));
    out.add("all_to_all_single", o);
    std::vector<int64_t> in_splits, out_splits;
    int64_t in_rows = 0, out_rows = 0;
    for (int d = 0; d < world; ++d) in_rows += rank + d + 1, in_splits.push_back(rank + d + 1);
    for (int s = 0; s < world; ++s) out_rows += s + rank + 1, out_splits.push_back(s + rank + 1);
    auto o2 = zeros({out_rows, 2}, at::kDouble);
    dist::all_to_all_single(o2, val({in_rows, 2}, at::kDouble, 31, rank), out_splits, in_splits);
    out.add("all_to_all_single_uneven", o2);
  }
  if (world > 1) {
    subgroups(out, rank, world, last);
    point_to_point(out, rank, world);
  }
  objects(out, rank, world, last, src1);
  dist::barrier();
  out.text("get", std::to_string(dist::get_rank()) + " " + std::to_string(dist::get_world_size()) + " " +
                      dist::get_backend());
  out.write(dir + "/cpp_r" + std::to_string(rank) + ".txt");
  dist::barrier({}, true).wait();
}

// Subgroups: every rank but 0, and the first and last ranks.
void subgroups(Out& out, int rank, int world, int last) {
  std::vector<int> all_but_0;
  for (int r = 1; r < world; ++r) all_but_0.push_back(r);
  auto g1 = dist::new_group(all_but_0);
  auto g2 = dist::new_group({last, 0});
  out.text("rank_in_g1", std::to_string(dist::get_rank(g1)) + " " + std::to_string(dist::get_world_size(g1)));
  out.text("rank_in_g2", std::to_string(dist::get_rank(g2)) + " " + std::to_string(dist::get_world_size(g2)));
  if (g2.is_member()) {
    auto t = val({5}, at::kFloat, 40, rank);
    dist::all_reduce(t, ReduceOp::SUM, g2);
    out.add("g2_all_reduce", t);
  }
  if (g1.is_member()) {
    auto t = val({3}, at::kLong, 41, rank);
    dist::broadcast(t, last, g1.process_group());  // its ProcessGroup still knows the global ranks
    out.add("g1_broadcast", t);
    std::vector<at::Tensor> list;
    for (int r = 0; r < world - 1; ++r) list.push_back(zeros({2}));
    dist::all_gather(list, val({2}, at::kFloat, 42, rank), g1, true).wait();
    out.add("g1_all_gather", torch::cat(list));
    if (world > 2) {
      auto m = val({2}, at::kFloat, 43, rank);
      dist::reduce(m, 1, ReduceOp::MIN, g1);
      if (rank == 1) out.add("g1_reduce", m);
    }
    if (world > 2 && rank == 1) {  // point-to-point on a group without rank 0
      dist::send(val({2}, at::kFloat, 44, rank), last, g1);
      dist::isend(val({2}, at::kFloat, 45, rank), last, g1).wait();
    } else if (world > 2 && rank == last) {
      auto t = zeros({2});
      out.text("g1_recv_sender", std::to_string(dist::recv(t, std::nullopt, g1)));
      out.add("g1_recv", t);
      auto t2 = zeros({2});
      auto w = dist::irecv(t2, std::nullopt, g1);
      w.wait();
      out.text("g1_irecv_source_rank", std::to_string(w.source_rank()));
      out.add("g1_irecv", t2);
    }
  } else {
    auto t = val({3}, at::kLong, 41, rank);
    const auto before = t.clone();
    dist::broadcast(t, last, g1);  // not a member: nothing happens (PyTorch warns)
    if (!t.equal(before)) throw std::runtime_error("a collective on a group this rank is not in changed its tensor");
  }
}

// pytorch_dist_parity.py's obj(r).
c10::IValue obj(int r) {
  c10::impl::GenericList values(c10::AnyType::get());
  values.push_back(int64_t{r});
  values.push_back(r * 0.25 - 1.5);
  values.push_back(r % 2 == 0);
  values.push_back(c10::IValue());
  c10::List<c10::List<int64_t>> deep;
  deep.push_back(c10::List<int64_t>({r}));
  deep.push_back(c10::List<int64_t>({r, r + 1}));
  c10::impl::GenericDict nested(c10::StringType::get(), c10::AnyType::get());
  nested.insert("deep", deep);
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("rank", int64_t{r});
  d.insert("name", "rank" + std::to_string(r));
  d.insert("values", values);
  d.insert("pair", c10::ivalue::Tuple::create({int64_t{r}, std::string(static_cast<size_t>(r), 'x')}));
  d.insert("t", val({2, 3}, at::kFloat, 60, r));
  d.insert("i", val({r + 1}, at::kLong, 61, r));
  d.insert("nested", nested);
  return d;
}

void objects(Out& out, int rank, int world, int last, int src1) {
  std::vector<c10::IValue> list(static_cast<size_t>(world));
  dist::all_gather_object(list, obj(rank));
  for (int r = 0; r < world; ++r) out.text("all_gather_object_" + std::to_string(r), show(list[r]));
  std::vector<c10::IValue> got(static_cast<size_t>(world));
  dist::gather_object(obj(rank + 10), rank == last ? &got : nullptr, last);
  if (rank == last)
    for (int r = 0; r < world; ++r) out.text("gather_object_" + std::to_string(r), show(got[r]));
  std::vector<c10::IValue> objs(3);
  if (rank == src1) objs = {obj(20 + rank), std::string("plain"), int64_t{42}};
  dist::broadcast_object_list(objs, src1);
  c10::impl::GenericList shown(c10::AnyType::get());
  for (const auto& o : objs) shown.push_back(o);
  out.text("broadcast_object_list", show(shown));
  std::vector<c10::IValue> mine(1), ins;
  if (rank == 0)
    for (int r = 0; r < world; ++r) ins.push_back(obj(30 + r));
  dist::scatter_object_list(mine, rank == 0 ? &ins : nullptr, 0);
  out.text("scatter_object_list", show(mine[0]));
}

void point_to_point(Out& out, int rank, int world) {
  const int next = (rank + 1) % world, prev = (rank - 1 + world) % world, last = world - 1;
  auto s = val({4}, at::kFloat, 50, rank), r = zeros({4});
  for (auto& w : std::vector<ddp::Work>{dist::isend(s, next), dist::irecv(r, prev)}) w.wait();
  out.add("p2p_ring", r);
  auto s2 = val({3}, at::kLong, 51, rank), r2 = zeros({3}, at::kLong);
  for (auto& w : dist::batch_isend_irecv({dist::P2POp(dist::isend, s2, prev), dist::P2POp(dist::irecv, r2, next)}))
    w.wait();
  out.add("p2p_batch_ring", r2);
  auto t = zeros({2}, at::kDouble);  // a pipeline: each rank adds its part and passes it on
  if (rank > 0) dist::recv(t, rank - 1);
  t += val({2}, at::kDouble, 52, rank);
  if (rank < last) dist::send(t, rank + 1);
  else out.add("p2p_pipeline", t);
  for (std::string d : {"f16", "u8"}) {
    if (rank == 0) {
      dist::send(val({3}, kDtypes.at(d), 53, 0), last);
    } else if (rank == last) {
      auto got = zeros({3}, kDtypes.at(d));
      dist::recv(got, 0);
      out.add("p2p_" + d, got);
    }
  }
  if (rank == 0) {  // tags: sent 4 then 3, received 3 then 4
    for (auto& w : std::vector<ddp::Work>{dist::isend(val({2}, at::kFloat, 54, 0), 1, {}, 4),
                                          dist::isend(val({2}, at::kFloat, 55, 0), 1, {}, 3)})
      w.wait();
  } else if (rank == 1) {
    auto a = zeros({2}), b = zeros({2});
    dist::recv(a, 0, {}, 3);
    dist::recv(b, 0, {}, 4);
    out.add("p2p_tag3", a);
    out.add("p2p_tag4", b);
  }
  if (dist::get_backend() == "nccl") {
    out.text("p2p_any_source", "unsupported");
  } else if (rank == 0) {  // from any source: the sender is returned
    std::vector<std::string> got;
    for (int i = 0; i < world - 1; ++i) {
      auto one = zeros({1}, at::kLong);
      const int sender = dist::recv(one, std::nullopt, {}, 7);
      got.push_back(std::to_string(sender) + ":" + std::to_string(one.item<int64_t>()));
    }
    std::sort(got.begin(), got.end());
    std::string line;
    for (const auto& g : got) line += (line.empty() ? "" : " ") + g;
    out.text("p2p_any_source", line);
  } else {
    dist::send(torch::tensor({int64_t{rank} * 10}).to(g_device), 0, {}, 7);
  }
  auto g3 = dist::new_group({0, last}, std::nullopt, "gloo");  // a gloo group whatever the default's backend
  if (g3.is_member()) {
    auto v = val({3}, at::kFloat, 70, rank).cpu();
    dist::all_reduce(v, ReduceOp::SUM, g3);
    out.add("g3_gloo_all_reduce", v);
    std::vector<c10::IValue> list(2);
    dist::all_gather_object(list, "from " + std::to_string(rank), g3);
    c10::impl::GenericList shown(c10::AnyType::get());
    for (const auto& o : list) shown.push_back(o);
    out.text("g3_all_gather_object", show(shown));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return ddp::guarded_main([&] {
    const std::string mode = argc > 1 ? argv[1] : "parity";
    const char* backend = std::getenv("DDP_TEST_BACKEND");
    g_device = ddp::init_process_group(ddp::ProcessGroupOptions().backend(backend ? backend : "gloo"))->device();
    if (mode == "teardown") {
      teardown();
      return 0;
    }
    if (mode == "exit") {
      auto t = torch::ones({3}, torch::TensorOptions().device(g_device));
      dist::all_reduce(t);
      std::cout << "summed " << t.sum().item<double>() << std::endl;
      return 0;  // no destroy_process_group(): the library shuts the group down at exit
    }
    if (mode == "monitored") monitored();
    if (mode == "beside") {  // a group of DDP_TEST_OTHER_BACKEND beside the default one
      auto g = dist::new_group({}, std::nullopt, std::getenv("DDP_TEST_OTHER_BACKEND"));
      auto t = torch::full({2}, dist::get_rank() + 1.0);
      dist::all_reduce(t, ReduceOp::SUM, g);
      std::vector<c10::IValue> names(static_cast<size_t>(dist::get_world_size()));
      dist::all_gather_object(names, dist::get_backend(g), g);
      std::cout << "beside " << dist::get_backend(g) << " " << t.sum().item<double>() << " "
                << names.back().toStringRef() << std::endl;
    }
    if (mode == "parity") parity(std::getenv("DDP_TEST_DIR"));
    else errors();
    ddp::destroy_process_group();
    return 0;
  });
}
