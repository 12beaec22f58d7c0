#include "torch_pickle.h"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "zip_archive.h"

namespace ddp::pickle {

namespace {

using Kind = Value::Kind;

bool is_container(Kind k) { return k == Kind::Tuple || k == Kind::List || k == Kind::Dict || k == Kind::Object; }

ValuePtr make(Kind k) {
  auto v = std::make_shared<Value>();
  v->kind = k;
  v->depth = is_container(k) ? 1 : 0;
  return v;
}

std::string int_list_text(const std::vector<int64_t>& xs) {
  std::ostringstream s;
  s << "[";
  for (size_t k = 0; k < xs.size(); ++k) s << (k ? ", " : "") << xs[k];
  s << "]";
  return s.str();
}

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
  Unpickler(const std::string& pkl, const zip::Archive& zip, std::string what)
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
        case 't': push(container(Kind::Tuple, pop_mark())); break;
        case 0x85: case 0x86: case 0x87: {
          const size_t n = op - 0x84u;
          if (stack_.size() < n) fail("stack underflow");
          std::vector<ValuePtr> xs(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(container(Kind::Tuple, std::move(xs)));
          break;
        }
        case ']': case 0x8f: push(make(Kind::List)); break;
        case 'l': push(container(Kind::List, pop_mark())); break;
        case 'a': { auto x = pop(); auto l = list_of(top()); nest(*l, x); l->items.push_back(x); break; }
        case 'e': case 0x90: {
          auto xs = pop_mark();
          auto l = list_of(top());
          for (auto& x : xs) nest(*l, x);
          l->items.insert(l->items.end(), xs.begin(), xs.end());
          break;
        }
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
        case 0x81: { auto args = pop(); auto cls = pop(); auto v = container(Kind::Object, args->items); v->s = cls->s; push(v); break; }
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
  // `child` goes into `parent`. Depth is counted as containers are built: a
  // container already inside another may not grow deeper (its parents' depth
  // would go stale), which also rules out cycles. Pickles of plain data
  // (state dicts, checkpoints) always fill a container before nesting it.
  void nest(Value& parent, const ValuePtr& child) {
    const uint32_t need = child->depth + 1;
    if (need > parent.depth) {
      if (parent.contained || &parent == child.get())
        fail("a container filled after it was nested in another, or nested in itself (a self-referencing "
             "structure, which checkpoints never hold)");
      if (need > kMaxNesting) fail("containers nested more than " + std::to_string(kMaxNesting) + " deep");
      parent.depth = need;
    }
    child->contained = true;
  }
  ValuePtr container(Kind k, std::vector<ValuePtr> items) {
    auto v = make(k);
    for (auto& x : items) nest(*v, x);
    v->items = std::move(items);
    return v;
  }
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
      nest(*d, kv[k]);
      nest(*d, kv[k + 1]);
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
    if (obj->kind != Kind::Object || state->kind != Kind::Dict) return;
    for (auto& [k, v] : state->dict) {
      nest(*obj, k);
      nest(*obj, v);
    }
    obj->dict = state->dict;
  }

  ValuePtr persistent_load(const ValuePtr& pid) {
    // ('storage', torch.FloatStorage, key, location, numel)
    if (pid->kind != Kind::Tuple || pid->items.size() < 5 || pid->items[0]->s != "storage" ||
        pid->items[1]->kind != Kind::Global || pid->items[2]->kind != Kind::String)
      fail("unexpected persistent id");
    const auto dtype = storage_dtype(pid->items[1]->s, what_);
    const std::string key = pid->items[2]->s, location = pid->items[3]->s;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) {
      if (cached->second->tensor.scalar_type() != dtype) fail("storage " + key + " used with two element types");
      return cached->second;
    }
    const zip::Entry* entry = zip_.find("data/" + key);
    if (!entry) fail("tensor data " + zip_.prefix() + "data/" + key + " missing");
    const uint64_t elem = c10::elementSize(dtype);
    if (entry->size % elem != 0)
      fail("storage " + entry->name + " holds " + std::to_string(entry->size) + " bytes, not a whole number of " +
           std::to_string(elem) + "-byte " + pid->items[1]->s + " elements");
    if (entry->size / elem > static_cast<uint64_t>(INT64_MAX)) fail("storage " + entry->name + " too large");
    const char* bytes = zip_.bytes(*entry);  // checks its CRC-32
    auto flat = torch::empty({static_cast<int64_t>(entry->size / elem)}, torch::TensorOptions().dtype(dtype));
    if (entry->size) std::memcpy(flat.data_ptr(), bytes, static_cast<size_t>(entry->size));
    auto v = make(Kind::Tensor);
    v->tensor = flat;
    v->is_storage = true;
    v->saved_location = location;  // never materialised there: this is our map_location
    storages_[key] = v;
    return v;
  }

  // A view of a storage, after checking that it stays inside it.
  ValuePtr rebuild_tensor(const std::vector<ValuePtr>& a) {
    if (a.size() < 4 || a[1]->kind != Kind::Int) fail("malformed tensor");
    if (!a[0]->is_storage) fail("a tensor rebuilt from something that is not a storage");
    const auto& storage = a[0]->tensor;
    const int64_t offset = a[1]->i;
    const auto sizes = int_list(a[2], what_), strides = int_list(a[3], what_);
    const std::string shape = "offset " + std::to_string(offset) + ", sizes " + int_list_text(sizes) + ", strides " +
                              int_list_text(strides);
    if (sizes.size() != strides.size())
      fail("a tensor with " + std::to_string(sizes.size()) + " sizes but " + std::to_string(strides.size()) +
           " strides (" + shape + ")");
    if (offset < 0) fail("a tensor with a negative storage offset (" + shape + ")");
    int64_t numel = 1, last = offset;  // the highest element index it reaches
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 0) fail("a tensor with a negative size (" + shape + ")");
      if (strides[d] < 0) fail("a tensor with a negative stride (" + shape + ")");
      if (__builtin_mul_overflow(numel, sizes[d], &numel)) fail("tensor sizes whose product overflows (" + shape + ")");
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(storage.element_size()), &bytes))
      fail("a tensor whose byte size overflows (" + shape + ")");
    if (numel > 0) {
      for (size_t d = 0; d < sizes.size(); ++d) {
        int64_t reach = 0;
        if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &reach) || __builtin_add_overflow(last, reach, &last))
          fail("a tensor whose extent overflows (" + shape + ")");
      }
      if (last >= storage.numel())
        fail("a tensor reaching element " + std::to_string(last) + ", outside its storage of " +
             std::to_string(storage.numel()) + " elements (" + shape + ")");
    }
    auto v = make(Kind::Tensor);
    v->tensor = storage.as_strided(sizes, strides, offset);
    v->saved_location = a[0]->saved_location;
    return v;
  }

  ValuePtr reduce(ValuePtr fn, ValuePtr args) {
    // PyTorch 2.x wraps rebuilds: (func, type, args, state); unwrapped with a loop, not a recursion.
    for (uint32_t hops = 0; fn->s == "torch._utils._rebuild_from_type_v2"; ++hops) {
      auto& w = args->items;
      if (w.size() < 3 || w[0]->kind != Kind::Global || hops > kMaxNesting) fail("malformed " + fn->s);
      fn = w[0];
      args = w[2];
    }
    const std::string& name = fn->s;
    auto& a = args->items;
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") return rebuild_tensor(a);
    if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state" ||
        name == "torch.jit._pickle.restore_type_tag" || name.rfind("torch.jit._pickle.build_", 0) == 0) {
      if (a.empty()) fail("malformed " + name);
      return a[0];
    }
    if (name == "collections.OrderedDict" || name == "builtins.dict") {
      auto d = make(Kind::Dict);
      if (!a.empty() && (a[0]->kind == Kind::List || a[0]->kind == Kind::Tuple))
        for (auto& kv : a[0]->items)
          if (kv->items.size() == 2) set_items(d, {kv->items[0], kv->items[1]});
      return d;
    }
    if (name == "torch.device" && !a.empty()) return a[0];
    auto v = container(Kind::Object, a);  // something we do not need: kept inert
    v->s = name;
    return v;
  }

  const std::string& p_;
  const zip::Archive& zip_;
  std::string what_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
  std::map<std::string, ValuePtr> storages_;
};

}  // namespace

Value::~Value() {
  // A chain of nested values would free itself by recursion, one stack frame
  // a level: the children of a value about to go are taken out first.
  std::vector<ValuePtr> pending;
  auto take = [&pending](Value& v) {
    for (auto& x : v.items) pending.push_back(std::move(x));
    for (auto& [k, x] : v.dict) {
      pending.push_back(std::move(k));
      pending.push_back(std::move(x));
    }
    v.items.clear();
    v.dict.clear();
  };
  take(*this);
  while (!pending.empty()) {
    ValuePtr v = std::move(pending.back());
    pending.pop_back();
    if (v && v.use_count() == 1) take(*v);
  }
}

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

ValuePtr load(const std::vector<char>& bytes, const std::string& what) { return load(bytes.data(), bytes.size(), what); }

ValuePtr load(const char* bytes, size_t size, const std::string& what) {
  if (size < 4 || std::memcmp(bytes, "PK\x03\x04", 4) != 0) {
    if (size >= 2 && static_cast<uint8_t>(bytes[0]) == 0x80)
      throw CheckpointError(what + ": saved in PyTorch's legacy format (before 1.6, or "
                                   "_use_new_zipfile_serialization=False); load it in Python and save it again "
                                   "with torch.save(obj, path)");
    throw CheckpointError(what + ": not a PyTorch file (no zip header" +
                          std::string(size == 0 ? ", the file is empty" : "") + ")");
  }
  try {
    const zip::Archive zip(bytes, size, what);
    const zip::Entry* data = zip.find("data.pkl");
    if (!data) throw CheckpointError(what + ": a PyTorch archive without data.pkl (a TorchScript module?)");
    if (const zip::Entry* order = zip.find("byteorder");
        order && std::string(zip.bytes(*order), order->size) != "little")
      throw CheckpointError(what + ": saved on a big-endian machine (byteorder " +
                            std::string(zip.bytes(*order), std::min<uint64_t>(order->size, 16)) +
                            "); load it there and save it again, or convert it in Python");
    const std::string pkl(zip.bytes(*data), data->size);
    auto root = Unpickler(pkl, zip, what).run();
    zip.verify_all();  // entries the pickle did not use: still a sign of damage
    return root;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw CheckpointError(what + ": not a readable PyTorch file (" + msg + "); is it truncated or corrupt?");
  }
}

}  // namespace ddp::pickle
