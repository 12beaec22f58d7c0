#include "torch_pickle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>
#include <unordered_map>

#include "zip_archive.h"
#include "runtime/regular_file.h"
#include "runtime/unique_fd.h"

namespace ddp::pickle {

namespace {

using Kind = Value::Kind;

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

class Unpickler {
 public:
  // `stored_size`: what data.pkl takes in the file (less than its size when
  // deflated): the budget grows with what the file really holds.
  Unpickler(const std::string& pkl, const zip::Archive& zip, std::string what, uint64_t stored_size)
      : p_(pkl), zip_(zip), what_(std::move(what)),
        budget_(kValueBytesFloor + kValueBytesPerPickleByte * stored_size), view_budget_(kValueBytesFloor) {}

  ValuePtr run() {
    while (true) {
      const uint8_t op = u8();
      if (op == '.') {  // STOP
        if (stack_.size() != 1) fail("unbalanced stack at STOP");
        return stack_.back();
      }
      if (!basic_op(op) && !container_op(op) && !object_op(op)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "unknown pickle opcode 0x%02x at byte %zu", op, pos_ - 1);
        fail(buf);
      }
    }
  }

 private:
  // One opcode each; false for an opcode of another group. Framing, the
  // stack and its marks, None, booleans, integers, floats and strings:
  bool basic_op(uint8_t op) {
    switch (op) {
      case 0x80: u8(); break;                  // PROTO
      case 0x95: bytes(8); break;              // FRAME
      case '(': charge(sizeof(size_t)); marks_.push_back(stack_.size()); break;
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
      default: return false;
    }
    return true;
  }

  // Tuples, lists and dicts:
  bool container_op(uint8_t op) {
    switch (op) {
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
      case 'a': { auto x = pop(); auto l = list_of(top()); nest(*l, x); charge(kSlot); l->items.push_back(x); break; }
      case 'e': case 0x90: {
        auto xs = pop_mark();
        auto l = list_of(top());
        charge(kSlot * xs.size());
        for (auto& x : xs) nest(*l, x);
        l->items.insert(l->items.end(), xs.begin(), xs.end());
        break;
      }
      case '}': push(make(Kind::Dict)); break;
      case 'd': { auto v = make(Kind::Dict); set_items(v, pop_mark()); push(v); break; }
      case 's': { auto val = pop(); auto key = pop(); set_items(top(), {key, val}); break; }
      case 'u': { auto xs = pop_mark(); set_items(top(), xs); break; }
      default: return false;
    }
    return true;
  }

  // Globals, calls and objects, the memo, and persistent ids (storages):
  bool object_op(uint8_t op) {
    switch (op) {
      case 'c': { auto module = readline(); auto name = readline(); push_global(module + "." + name); break; }
      case 0x93: {                              // STACK_GLOBAL
        auto name = pop(), module = pop();
        push_global(module->s + "." + name->s);
        break;
      }
      case 'R': { auto args = pop(); auto fn = pop(); push(reduce(fn, args)); break; }
      case 0x81: { auto args = pop(); auto cls = pop(); auto v = container(Kind::Object, args->items); v->s = cls->s; push(v); break; }
      case 'b': { auto state = pop(); build(top(), state); break; }
      case 'q': put_memo(u8()); break;
      case 'r': { uint32_t k; std::memcpy(&k, bytes(4), 4); put_memo(k); break; }
      case 0x94: put_memo(memo_.size()); break;
      case 'p': put_memo(std::stoull(readline())); break;
      case 'h': push(memo(u8())); break;
      case 'j': { uint32_t k; std::memcpy(&k, bytes(4), 4); push(memo(k)); break; }
      case 'g': push(memo(std::stoull(readline()))); break;
      case 'Q': push(persistent_load(pop())); break;
      default: return false;
    }
    return true;
  }

  // What one more reference to a value costs (a shared_ptr in a vector).
  static constexpr uint64_t kSlot = sizeof(ValuePtr);

  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(what_ + ": not a readable PyTorch file (" + why + "); is it truncated or corrupt?");
  }
  // Every allocation the pickle asks for is paid from the budget first.
  void charge(uint64_t n) {
    if (n > budget_ - spent_) {
      throw CheckpointError(what_ + ": its data.pkl (" + std::to_string(p_.size()) +
                            " bytes inflated) would build more than " + std::to_string(budget_ >> 20) +
                            " MiB of values; a pickle of plain data never needs that many. Is it crafted or corrupt?");
    }
    spent_ += n;
  }
  ValuePtr make(Kind k) {
    charge(sizeof(Value) + 2 * kSlot);  // the value and its shared_ptr's control block
    auto v = std::make_shared<Value>();
    v->kind = k;
    const bool container = k == Kind::Tuple || k == Kind::List || k == Kind::Dict || k == Kind::Object;
    v->depth = container ? 1 : 0;
    return v;
  }
  void put_memo(uint64_t key) {
    charge(64);  // a map node
    memo_[key] = top();
  }
  std::vector<int64_t> int_list(const ValuePtr& v) {
    if (!v || (v->kind != Kind::Tuple && v->kind != Kind::List)) fail("malformed tensor shape");
    charge(sizeof(int64_t) * v->items.size());
    std::vector<int64_t> out;
    for (auto& e : v->items) {
      if (e->kind != Kind::Int) fail("malformed tensor shape");
      out.push_back(e->i);
    }
    return out;
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
    charge(end - pos_);
    std::string line = p_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }
  void push(ValuePtr v) {
    charge(kSlot);
    stack_.push_back(std::move(v));
  }
  void push_int(int64_t x) { auto v = make(Kind::Int); v->i = x; push(v); }
  void push_str(const char* s, size_t n) {
    auto v = make(Kind::String);
    charge(n);
    v->s.assign(s, n);
    push(v);
  }
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
    charge(kSlot * items.size());
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
    charge(kSlot * (stack_.size() - m));
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
  // A string key replaces its earlier value, as in Python. Looked up in a
  // hash index: a dict of n keys costs O(n), not O(n^2).
  void set_items(const ValuePtr& d, const std::vector<ValuePtr>& kv) {
    if (kv.size() % 2) fail("odd number of dict items");
    if (d->kind != Kind::Dict && d->kind != Kind::Object) fail("SETITEM on a non-dict");
    auto& index = dict_index_[d.get()];
    index.owner = d;  // kept alive: a freed dict's address could come back
    for (size_t k = 0; k < kv.size(); k += 2) {
      nest(*d, kv[k]);
      nest(*d, kv[k + 1]);
      if (kv[k]->kind == Kind::String) {
        charge(64 + kv[k]->s.size());  // an index node
        auto [it, fresh] = index.slots.emplace(kv[k]->s, d->dict.size());
        if (!fresh) {
          d->dict[it->second].second = kv[k + 1];
          continue;
        }
      }
      charge(2 * kSlot);
      d->dict.emplace_back(kv[k], kv[k + 1]);
    }
  }
  void build(const ValuePtr& obj, const ValuePtr& state) {
    // OrderedDict's state is its _metadata (layer versions); an object's is
    // its attributes, or whatever its class's __setstate__ would take (kept
    // after its arguments: a data-only reader refuses it).
    if (obj->kind != Kind::Object) return;
    if (state->kind != Kind::Dict) {
      nest(*obj, state);
      charge(kSlot);
      obj->items.push_back(state);
      return;
    }
    for (auto& [k, v] : state->dict) {
      nest(*obj, k);
      nest(*obj, v);
    }
    charge(2 * kSlot * state->dict.size());
    dict_index_.erase(obj.get());
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
    view_budget_ += 4 * entry->size;        // views of it: a few, overlapping at most
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
    const auto sizes = int_list(a[2]), strides = int_list(a[3]);
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
    // A view may reach few elements and still claim many (stride 0): what
    // it claims is what a copy of it would take.
    if (static_cast<uint64_t>(bytes) > view_budget_ - view_spent_)
      fail("tensors claiming more than " + std::to_string(view_budget_ >> 20) + " MiB from storages of " +
           "fewer bytes (" + shape + ")");
    view_spent_ += static_cast<uint64_t>(bytes);
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
      // LibTorch's pickler says which TorchScript type a list or dict has.
      static const std::map<std::string, std::string> specialised{
          {"torch.jit._pickle.build_intlist", "List[int]"},   {"torch.jit._pickle.build_tensorlist", "List[Tensor]"},
          {"torch.jit._pickle.build_doublelist", "List[float]"}, {"torch.jit._pickle.build_boollist", "List[bool]"}};
      if (auto it = specialised.find(name); it != specialised.end()) a[0]->type_tag = it->second;
      if (name == "torch.jit._pickle.restore_type_tag" && a.size() >= 2 && a[1]->kind == Kind::String)
        a[0]->type_tag = a[1]->s;
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
  struct DictIndex {
    ValuePtr owner;
    std::unordered_map<std::string, size_t> slots;  // key -> position in owner->dict
  };
  std::unordered_map<const Value*, DictIndex> dict_index_;
  uint64_t budget_, spent_ = 0;            // values built from data.pkl
  uint64_t view_budget_, view_spent_ = 0;  // bytes tensor views claim
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
  auto fail = [&](const std::string& why) { throw CheckpointError(path + ": " + why); };
  // Non-blocking: opening a FIFO for reading would wait for a writer.
  const UniqueFd file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!file) fail(std::string("cannot open (") + std::strerror(errno) + ")");
  const int fd = file.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(std::string("cannot stat (") + std::strerror(errno) + ")");
  if (const std::string why = why_not_regular(st); !why.empty())
    fail(why + "; give the path of a checkpoint or state dict file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  auto read_at = [&](char* to, uint64_t n, uint64_t offset) {
    for (uint64_t done = 0; done < n;) {
      const ssize_t got = ::pread(fd, to + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(std::string("read failed (") + std::strerror(errno) + ")");
      if (got == 0) fail("the file shrank while it was read; was it being written?");
      done += static_cast<uint64_t>(got);
    }
  };
  // A zip's end record lies in its last 64 KiB + 22 bytes: a zip without one
  // (a truncated file, a sparse one of zeros) is refused before the rest is read.
  char head[4] = {};
  if (size >= 4) read_at(head, 4, 0);
  constexpr uint64_t kTail = 0xffff + 22;
  if (size < 4 || std::memcmp(head, "PK\x03\x04", 4) != 0) {
    // Not a zip: load() says what it is from the first bytes alone.
    std::vector<char> start(static_cast<size_t>(std::min<uint64_t>(size, 16)));
    read_at(start.data(), start.size(), 0);
    return start;
  }
  if (size > 2 * kTail) {
    std::vector<char> tail(kTail);
    read_at(tail.data(), kTail, size - kTail);
    bool found = false;
    for (size_t i = 0; i + 4 <= tail.size() && !found; ++i) found = std::memcmp(tail.data() + i, "PK\x05\x06", 4) == 0;
    if (!found)
      fail("not a readable zip archive (no end of central directory record in its last " + std::to_string(kTail) +
           " bytes); is the file truncated or corrupt?");
  }
  std::vector<char> bytes(static_cast<size_t>(size));
  read_at(bytes.data(), size, 0);
  return bytes;
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
    auto root = Unpickler(pkl, zip, what, std::min(data->compressed_size, data->size)).run();
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
