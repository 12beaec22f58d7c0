#include "torch_pickle.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include <cstring>
#include <fstream>
#include <map>

namespace ddp::pickle {

namespace {

using Kind = Value::Kind;

ValuePtr make(Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  return v;
}

class VectorReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit VectorReader(const std::vector<char>& data) : data_(data) {}
  size_t size() const override { return data_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= data_.size()) return 0;
    n = std::min<size_t>(n, data_.size() - pos);
    std::memcpy(buf, data_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& data_;
};

c10::ScalarType storage_dtype(const std::string& global, const std::string& what) {
  static const std::map<std::string, c10::ScalarType> types{
      {"torch.FloatStorage", c10::kFloat},   {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},     {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},     {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},   {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},     {"torch.BoolStorage", c10::kBool},
      {"torch.ComplexFloatStorage", c10::kComplexFloat}, {"torch.ComplexDoubleStorage", c10::kComplexDouble}};
  auto it = types.find(global);
  if (it == types.end()) throw CheckpointError(what + ": unsupported storage type " + global);
  return it->second;
}

std::vector<int64_t> int_list(const ValuePtr& v, const std::string& what) {
  if (!v || (v->kind != Kind::Tuple && v->kind != Kind::List)) throw CheckpointError(what + ": malformed tensor shape");
  std::vector<int64_t> out;
  for (auto& e : v->items) {
    if (e->kind != Kind::Int) throw CheckpointError(what + ": malformed tensor shape");
    out.push_back(e->i);
  }
  return out;
}

class Unpickler {
 public:
  Unpickler(const std::string& pkl, caffe2::serialize::PyTorchStreamReader& zip, std::string what)
      : p_(pkl), zip_(zip), what_(std::move(what)) {}

  ValuePtr run() {
    while (true) {
      const uint8_t op = u8();
      switch (op) {
        case 0x80: u8(); break;                  // PROTO
        case 0x95: bytes(8); break;              // FRAME
        case '.':                                 // STOP
          if (stack_.size() != 1) fail("unbalanced stack at STOP");
          return stack_.back();
        case '(': marks_.push_back(stack_.size()); break;
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case '2': push(top()); break;
        case 'N': push(make(Kind::None)); break;
        case 0x88: case 0x89: { auto v = make(Kind::Bool); v->b = op == 0x88; push(v); break; }
        case 'J': { int32_t x; std::memcpy(&x, bytes(4), 4); push_int(x); break; }
        case 'K': push_int(u8()); break;
        case 'M': { uint16_t x; std::memcpy(&x, bytes(2), 2); push_int(x); break; }
        case 0x8a: {                              // LONG1: little-endian two's complement
          const size_t n = u8();
          const auto* b = reinterpret_cast<const uint8_t*>(bytes(n));
          if (n > 8) fail("integer wider than 64 bits");
          uint64_t x = 0;
          for (size_t k = 0; k < n; ++k) x |= uint64_t(b[k]) << (8 * k);
          if (n > 0 && n < 8 && (b[n - 1] & 0x80)) x |= ~uint64_t(0) << (8 * n);
          push_int(static_cast<int64_t>(x));
          break;
        }
        case 'I': { auto line = readline(); push_int(line == "01" ? 1 : line == "00" ? 0 : std::stoll(line)); break; }
        case 'G': {                               // big-endian double
          const auto* b = reinterpret_cast<const uint8_t*>(bytes(8));
          uint64_t x = 0;
          for (int k = 0; k < 8; ++k) x = (x << 8) | b[k];
          auto v = make(Kind::Float);
          std::memcpy(&v->f, &x, 8);
          push(v);
          break;
        }
        case 'X': case 'B': case 'T': { uint32_t n; std::memcpy(&n, bytes(4), 4); push_str(bytes(n), n); break; }
        case 0x8c: case 'C': case 'U': { size_t n = u8(); push_str(bytes(n), n); break; }
        case 0x8d: case 0x8e: { uint64_t n; std::memcpy(&n, bytes(8), 8); push_str(bytes(n), n); break; }
        case ')': push(make(Kind::Tuple)); break;
        case 't': { auto v = make(Kind::Tuple); v->items = pop_mark(); push(v); break; }
        case 0x85: case 0x86: case 0x87: {
          const size_t n = op - 0x84u;
          if (stack_.size() < n) fail("stack underflow");
          auto v = make(Kind::Tuple);
          v->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(v);
          break;
        }
        case ']': case 0x8f: push(make(Kind::List)); break;
        case 'l': { auto v = make(Kind::List); v->items = pop_mark(); push(v); break; }
        case 'a': { auto x = pop(); list_of(top())->items.push_back(x); break; }
        case 'e': case 0x90: { auto xs = pop_mark(); auto& l = list_of(top())->items; l.insert(l.end(), xs.begin(), xs.end()); break; }
        case '}': push(make(Kind::Dict)); break;
        case 'd': { auto v = make(Kind::Dict); set_items(v, pop_mark()); push(v); break; }
        case 's': { auto val = pop(); auto key = pop(); set_items(top(), {key, val}); break; }
        case 'u': { auto xs = pop_mark(); set_items(top(), xs); break; }
        case 'c': { auto module = readline(); auto name = readline(); push_global(module + "." + name); break; }
        case 0x93: {                              // STACK_GLOBAL
          auto name = pop(), module = pop();
          push_global(module->s + "." + name->s);
          break;
        }
        case 'R': { auto args = pop(); auto fn = pop(); push(reduce(fn, args)); break; }
        case 0x81: { auto args = pop(); auto cls = pop(); auto v = make(Kind::Object); v->s = cls->s; v->items = args->items; push(v); break; }
        case 'b': { auto state = pop(); build(top(), state); break; }
        case 'q': memo_[u8()] = top(); break;
        case 'r': { uint32_t k; std::memcpy(&k, bytes(4), 4); memo_[k] = top(); break; }
        case 0x94: memo_[memo_.size()] = top(); break;
        case 'p': memo_[std::stoull(readline())] = top(); break;
        case 'h': push(memo(u8())); break;
        case 'j': { uint32_t k; std::memcpy(&k, bytes(4), 4); push(memo(k)); break; }
        case 'g': push(memo(std::stoull(readline()))); break;
        case 'Q': push(persistent_load(pop())); break;
        default: {
          char buf[64];
          std::snprintf(buf, sizeof buf, "unknown pickle opcode 0x%02x at byte %zu", op, pos_ - 1);
          fail(buf);
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(what_ + ": not a readable PyTorch file (" + why + "); is it truncated or corrupt?");
  }
  uint8_t u8() { return static_cast<uint8_t>(*bytes(1)); }
  const char* bytes(size_t n) {
    if (n > p_.size() || pos_ > p_.size() - n) fail("data.pkl ends early");
    const char* at = p_.data() + pos_;
    pos_ += n;
    return at;
  }
  std::string readline() {
    const size_t end = p_.find('\n', pos_);
    if (end == std::string::npos) fail("data.pkl ends early");
    std::string line = p_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  void push_int(int64_t x) { auto v = make(Kind::Int); v->i = x; push(v); }
  void push_str(const char* s, size_t n) { auto v = make(Kind::String); v->s.assign(s, n); push(v); }
  void push_global(std::string name) { auto v = make(Kind::Global); v->s = std::move(name); push(v); }
  ValuePtr top() {
    if (stack_.empty()) fail("stack underflow");
    return stack_.back();
  }
  ValuePtr pop() {
    auto v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) fail("stack underflow");
    std::vector<ValuePtr> xs(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return xs;
  }
  ValuePtr memo(uint64_t k) {
    auto it = memo_.find(k);
    if (it == memo_.end()) fail("memo key " + std::to_string(k) + " missing");
    return it->second;
  }
  ValuePtr list_of(ValuePtr v) {
    if (v->kind != Kind::List) fail("APPEND to a non-list");
    return v;
  }
  void set_items(const ValuePtr& d, const std::vector<ValuePtr>& kv) {
    if (kv.size() % 2) fail("odd number of dict items");
    if (d->kind != Kind::Dict && d->kind != Kind::Object) fail("SETITEM on a non-dict");
    for (size_t k = 0; k < kv.size(); k += 2) {
      bool replaced = false;
      if (kv[k]->kind == Kind::String)
        for (auto& e : d->dict)
          if (e.first->kind == Kind::String && e.first->s == kv[k]->s) {
            e.second = kv[k + 1];
            replaced = true;
          }
      if (!replaced) d->dict.emplace_back(kv[k], kv[k + 1]);
    }
  }
  void build(const ValuePtr& obj, const ValuePtr& state) {
    // OrderedDict's state is its _metadata (layer versions); an object's is its attributes.
    if (obj->kind == Kind::Object && state->kind == Kind::Dict) obj->dict = state->dict;
  }

  ValuePtr persistent_load(const ValuePtr& pid) {
    // ('storage', torch.FloatStorage, key, location, numel)
    if (pid->kind != Kind::Tuple || pid->items.size() < 5 || pid->items[0]->s != "storage")
      fail("unexpected persistent id");
    const auto dtype = storage_dtype(pid->items[1]->s, what_);
    const std::string key = pid->items[2]->s, location = pid->items[3]->s;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    const std::string record = "data/" + key;
    if (!zip_.hasRecord(record)) fail("tensor data " + record + " missing");
    auto [data, size] = zip_.getRecord(record);
    const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
    auto flat = torch::empty({static_cast<int64_t>(size) / elem}, torch::TensorOptions().dtype(dtype));
    if (size) std::memcpy(flat.data_ptr(), data.get(), static_cast<size_t>(flat.numel() * elem));
    auto v = make(Kind::Tensor);
    v->tensor = flat;
    v->saved_location = location;  // never materialised there: this is our map_location
    storages_[key] = v;
    return v;
  }

  ValuePtr reduce(const ValuePtr& fn, const ValuePtr& args) {
    const std::string& name = fn->s;
    auto& a = args->items;
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      if (a.size() < 4 || a[0]->kind != Kind::Tensor || a[1]->kind != Kind::Int) fail("malformed tensor");
      auto sizes = int_list(a[2], what_), strides = int_list(a[3], what_);
      int64_t extent = 1;  // highest element reached + 1
      for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d] == 0) { extent = 0; break; }
        extent += (sizes[d] - 1) * strides[d];
      }
      if (a[1]->i < 0 || (extent > 0 && a[1]->i + extent > a[0]->tensor.numel())) fail("tensor outside its storage");
      auto v = make(Kind::Tensor);
      v->tensor = a[0]->tensor.as_strided(sizes, strides, a[1]->i);
      v->saved_location = a[0]->saved_location;
      return v;
    }
    if (name == "torch._utils._rebuild_from_type_v2") {  // PyTorch 2.x: (func, type, args, state)
      if (a.size() < 3 || a[0]->kind != Kind::Global) fail("malformed " + name);
      return reduce(a[0], a[2]);
    }
    if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state" ||
        name == "torch.jit._pickle.restore_type_tag" || name.rfind("torch.jit._pickle.build_", 0) == 0) {
      if (a.empty()) fail("malformed " + name);
      return a[0];
    }
    if (name == "collections.OrderedDict" || name == "builtins.dict") {
      auto d = make(Kind::Dict);
      if (!a.empty() && (a[0]->kind == Kind::List || a[0]->kind == Kind::Tuple))
        for (auto& kv : a[0]->items)
          if (kv->items.size() == 2) d->dict.emplace_back(kv->items[0], kv->items[1]);
      return d;
    }
    if (name == "torch.device" && !a.empty()) return a[0];
    auto v = make(Kind::Object);  // something we do not need: kept inert
    v->s = name;
    v->items = a;
    return v;
  }

  const std::string& p_;
  caffe2::serialize::PyTorchStreamReader& zip_;
  std::string what_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

}  // namespace

ValuePtr Value::get(const std::string& key) const {
  for (auto& [k, v] : dict)
    if (k->kind == Kind::String && k->s == key) return v;
  return nullptr;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot open (" + std::strerror(errno) + ")");
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ValuePtr load(const std::vector<char>& bytes, const std::string& what) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(), "PK\x03\x04", 4) != 0) {
    if (bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x80)
      throw CheckpointError(what + ": saved in PyTorch's legacy format (before 1.6, or "
                                   "_use_new_zipfile_serialization=False); load it in Python and save it again "
                                   "with torch.save(obj, path)");
    throw CheckpointError(what + ": not a PyTorch file (no zip header" +
                          std::string(bytes.empty() ? ", the file is empty" : "") + ")");
  }
  try {
    caffe2::serialize::PyTorchStreamReader zip(std::make_unique<VectorReader>(bytes));
    if (!zip.hasRecord("data.pkl"))
      throw CheckpointError(what + ": a PyTorch archive without data.pkl (a TorchScript module?)");
    auto [data, size] = zip.getRecord("data.pkl");
    std::string pkl(static_cast<const char*>(data.get()), size);
    return Unpickler(pkl, zip, what).run();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw CheckpointError(what + ": not a readable PyTorch file (" + msg + "); is it truncated or corrupt?");
  }
}

}  // namespace ddp::pickle
