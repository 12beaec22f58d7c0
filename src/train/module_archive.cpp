#include "module_archive.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "torch_pickle.h"
#include "zip_archive.h"

namespace ddp::module_archive {

namespace {

using pickle::Value;
using pickle::ValuePtr;
using Kind = Value::Kind;

// Per class ("__torch__.___torch_mangle_1.Module"): the attributes its code
// declares as parameters and as buffers.
struct Slots {
  std::set<std::string> parameters, buffers;
};
using Declared = std::map<std::string, Slots>;

// `__parameters__ = ["a", "b/size", ]` -> {"a", "b/size"}.
std::set<std::string> quoted_names(const std::string& line) {
  std::set<std::string> out;
  for (size_t i = line.find('['); i != std::string::npos && i < line.size(); ++i) {
    if (line[i] == ']') break;
    if (line[i] != '"') continue;
    std::string name;
    for (++i; i < line.size() && line[i] != '"'; ++i) {
      if (line[i] == '\\' && i + 1 < line.size()) ++i;
      name += line[i];
    }
    out.insert(name);
  }
  return out;
}

// Scans code/<qualifier>.py text for class headers and their parameter and
// buffer lists. Nothing else of the code is looked at, let alone run.
Declared declared_slots(const zip::Archive& zip) {
  Declared out;
  const std::string code = zip.prefix() + "code/";
  for (const auto& e : zip.entries()) {
    if (e.name.compare(0, code.size(), code) != 0 || e.name.size() < code.size() + 3 ||
        e.name.compare(e.name.size() - 3, 3, ".py") != 0)
      continue;
    std::string qualifier = e.name.substr(code.size(), e.name.size() - code.size() - 3);
    for (auto& c : qualifier)
      if (c == '/') c = '.';
    std::istringstream text(std::string(zip.bytes(e), e.size));
    std::string line, current;
    while (std::getline(text, line)) {
      if (line.rfind("class ", 0) == 0) {
        const size_t end = line.find_first_of("(:", 6);
        current = qualifier + "." + line.substr(6, end == std::string::npos ? std::string::npos : end - 6);
        continue;
      }
      const size_t start = line.find_first_not_of(' ');
      if (current.empty() || start == std::string::npos) continue;
      if (line.compare(start, 16, "__parameters__ =") == 0) out[current].parameters = quoted_names(line);
      if (line.compare(start, 13, "__buffers__ =") == 0) out[current].buffers = quoted_names(line);
    }
  }
  return out;
}

// TorchScript type names as the pickler tags lists and dicts with
// ("List[Tensor]", "Dict[str, List[int]]"), into c10 types.
class TypeParser {
 public:
  TypeParser(const std::string& text, std::function<void(const std::string&)> fail)
      : s_(text), fail_(std::move(fail)) {}

  c10::TypePtr parse() {
    auto t = type(0);
    skip_spaces();
    if (pos_ != s_.size()) bad();
    return t;
  }

 private:
  [[noreturn]] void bad() {
    fail_("the type tag \"" + s_.substr(0, 200) + "\" is not one of plain data's types");
    std::abort();  // fail_ throws
  }
  void skip_spaces() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool eat(char c) {
    skip_spaces();
    if (pos_ < s_.size() && s_[pos_] == c) return ++pos_, true;
    return false;
  }
  std::vector<c10::TypePtr> args(uint32_t depth) {
    std::vector<c10::TypePtr> out;
    if (!eat('[')) bad();
    if (eat('(')) {  // Tuple[()]
      if (!eat(')') || !eat(']')) bad();
      return out;
    }
    do out.push_back(type(depth + 1));
    while (eat(','));
    if (!eat(']')) bad();
    return out;
  }
  c10::TypePtr type(uint32_t depth) {
    if (depth > pickle::kMaxNesting) bad();
    skip_spaces();
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
    const std::string name = s_.substr(start, pos_ - start);
    if (name == "Tensor") return c10::TensorType::get();
    if (name == "int") return c10::IntType::get();
    if (name == "float") return c10::FloatType::get();
    if (name == "bool") return c10::BoolType::get();
    if (name == "str") return c10::StringType::get();
    if (name == "NoneType") return c10::NoneType::get();
    if (name == "Any") return c10::AnyType::get();
    if (name == "List" || name == "Optional") {
      auto a = args(depth);
      if (a.size() != 1) bad();
      return name == "List" ? c10::TypePtr(c10::ListType::create(a[0])) : c10::TypePtr(c10::OptionalType::create(a[0]));
    }
    if (name == "Dict") {
      auto a = args(depth);
      if (a.size() != 2 || (a[0]->kind() != c10::TypeKind::StringType && a[0]->kind() != c10::TypeKind::IntType &&
                            a[0]->kind() != c10::TypeKind::TensorType && a[0]->kind() != c10::TypeKind::FloatType &&
                            a[0]->kind() != c10::TypeKind::BoolType))
        bad();
      return c10::DictType::create(a[0], a[1]);
    }
    if (name == "Tuple") return c10::TupleType::create(args(depth));
    bad();
  }

  const std::string& s_;
  std::function<void(const std::string&)> fail_;
  size_t pos_ = 0;
};

class Rebuilder {
 public:
  Rebuilder(const zip::Archive& zip, std::string what, uint64_t pickle_bytes)
      : declared_(declared_slots(zip)), what_(std::move(what)), work_left_(16 * pickle_bytes + (1u << 20)) {}

  void module(const ValuePtr& obj, torch::serialize::OutputArchive& out, uint32_t depth) {
    const Slots& slots = check_module(obj, depth);
    for (const auto& [k, v] : obj->dict) {
      const std::string& key = k->s;
      if (is_module(v)) {
        torch::serialize::OutputArchive child;
        module(v, child, depth + 1);
        out.write(key, child);
      } else if (v->is_tensor() && slots.parameters.count(key)) {
        out.write(key, tensor(v), /*is_buffer=*/false);
      } else if (v->is_tensor() && slots.buffers.count(key)) {
        out.write(key, tensor(v), /*is_buffer=*/true);
      } else {
        out.write(key, to_ivalue(v, nullptr, depth + 1));
      }
    }
  }

  void tensors(const ValuePtr& obj, const std::string& prefix, StateDict& out, uint32_t depth) {
    const Slots& slots = check_module(obj, depth);
    for (const auto& [k, v] : obj->dict) {
      const std::string name = prefix + k->s;
      if (is_module(v)) {
        tensors(v, name + ".", out, depth + 1);
      } else if (v->is_tensor() && (slots.parameters.count(k->s) || slots.buffers.count(k->s))) {
        if (out.contains(name)) fail("two tensors named " + name);
        out.insert(name, tensor(v));
      }
    }
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(what_ + ": not a LibTorch archive of plain data (" + why +
                          "). Only tensors, numbers, strings, lists, tuples, dicts and nested modules are read; "
                          "code in a file is never run.");
  }

 private:
  static bool is_module(const ValuePtr& v) { return v->kind == Kind::Object && v->s.rfind("__torch__.", 0) == 0; }

  void spend() {
    if (work_left_-- == 0) fail("its values are shared so often that rebuilding them would not end");
  }

  const Slots& check_module(const ValuePtr& obj, uint32_t depth) {
    spend();
    if (depth > pickle::kMaxNesting) fail("modules nested too deep");
    if (!is_module(obj)) fail("it holds " + describe(obj) + " where a module belongs");
    if (!obj->items.empty())
      fail("the object of class " + obj->s + " is built from arguments or a custom state (__setstate__), not from "
           "its attributes");
    for (const auto& kv : obj->dict)
      if (kv.first->kind != Kind::String) fail("an attribute of " + obj->s + " is not named by a string");
    static const Slots none;
    auto it = declared_.find(obj->s);
    return it == declared_.end() ? none : it->second;
  }

  static std::string describe(const ValuePtr& v) {
    switch (v->kind) {
      case Kind::Object: return "an object of class " + v->s.substr(0, 200);
      case Kind::Global: return "a reference to " + v->s.substr(0, 200);
      default: return "a plain value";
    }
  }

  torch::Tensor tensor(const ValuePtr& v) const {
    if (v->is_storage) fail("a bare storage where a tensor belongs");
    return v->tensor;
  }

  c10::IValue to_ivalue(const ValuePtr& v, c10::TypePtr want, uint32_t depth) {
    spend();
    if (depth > pickle::kMaxNesting) fail("values nested too deep");
    if (!v->type_tag.empty())
      want = TypeParser(v->type_tag, [this](const std::string& why) { fail(why); }).parse();
    if (want && want->kind() == c10::TypeKind::OptionalType) {
      if (v->kind == Kind::None) return c10::IValue();
      want = want->expectRef<c10::OptionalType>().getElementType();
    }
    if (want && want->kind() == c10::TypeKind::AnyType) want = nullptr;
    c10::IValue out;
    switch (v->kind) {
      case Kind::None: out = c10::IValue(); break;
      case Kind::Bool: out = v->b; break;
      case Kind::Int: out = v->i; break;
      case Kind::Float: out = v->f; break;
      case Kind::String: out = v->s; break;
      case Kind::Tensor: out = tensor(v); break;
      case Kind::Tuple: out = tuple_to_ivalue(v, want, depth); break;
      case Kind::List: out = list_to_ivalue(v, want, depth); break;
      case Kind::Dict: out = dict_to_ivalue(v, want, depth); break;
      default: fail("it holds " + describe(v));
    }
    if (want && !out.type()->isSubtypeOf(*want)) fail("a value that is not of its tagged type " + want->str());
    return out;
  }

  // A tuple, a list and a dict, item by item, each item of the type that
  // `want` gives it (when it gives one).
  c10::IValue tuple_to_ivalue(const ValuePtr& v, const c10::TypePtr& want, uint32_t depth) {
    const auto* tt = want && want->kind() == c10::TypeKind::TupleType ? &want->expectRef<c10::TupleType>() : nullptr;
    if (tt && tt->elements().size() != v->items.size()) fail("a tuple whose length differs from its type's");
    std::vector<c10::IValue> xs;
    for (size_t i = 0; i < v->items.size(); ++i)
      xs.push_back(to_ivalue(v->items[i], tt ? tt->elements()[i] : nullptr, depth + 1));
    return c10::ivalue::Tuple::create(std::move(xs));
  }

  c10::IValue list_to_ivalue(const ValuePtr& v, const c10::TypePtr& want, uint32_t depth) {
    c10::TypePtr elem = want && want->kind() == c10::TypeKind::ListType
                            ? want->expectRef<c10::ListType>().getElementType()
                            : nullptr;
    std::vector<c10::IValue> xs;
    for (const auto& item : v->items) xs.push_back(to_ivalue(item, elem, depth + 1));
    if (!elem) elem = xs.empty() ? c10::AnyType::get() : xs[0].type();
    c10::impl::GenericList list(elem);
    for (auto& x : xs) {
      if (!x.type()->isSubtypeOf(*elem)) fail("a list whose items are not all of type " + elem->str());
      list.push_back(std::move(x));
    }
    return list;
  }

  c10::IValue dict_to_ivalue(const ValuePtr& v, const c10::TypePtr& want, uint32_t depth) {
    c10::TypePtr key_type, value_type;
    if (want && want->kind() == c10::TypeKind::DictType) {
      key_type = want->expectRef<c10::DictType>().getKeyType();
      value_type = want->expectRef<c10::DictType>().getValueType();
    }
    std::vector<std::pair<c10::IValue, c10::IValue>> kvs;
    for (const auto& [k, x] : v->dict) kvs.emplace_back(to_ivalue(k, key_type, depth + 1), to_ivalue(x, value_type, depth + 1));
    if (!key_type) key_type = kvs.empty() ? c10::StringType::get() : kvs[0].first.type();
    if (!value_type) value_type = kvs.empty() ? c10::AnyType::get() : kvs[0].second.type();
    c10::impl::GenericDict dict(key_type, value_type);
    for (auto& [k, x] : kvs) {
      if (!k.type()->isSubtypeOf(*key_type) || !x.type()->isSubtypeOf(*value_type))
        fail("a dict whose entries are not all of type Dict[" + key_type->str() + ", " + value_type->str() + "]");
      if (!dict.insert(std::move(k), std::move(x)).second) fail("a dict with a key twice");
    }
    return dict;
  }

  Declared declared_;
  std::string what_;
  uint64_t work_left_;
};

// The unpickled root and the rebuilder, both checked.
template <typename F>
auto with_root(const char* data, size_t size, const std::string& what, F&& f) {
  auto root = pickle::load(data, size, what);  // the zip and every CRC checked, data.pkl parsed
  const zip::Archive zip(data, size, what);
  const zip::Entry* pkl = zip.find("data.pkl");
  Rebuilder r(zip, what, pkl ? pkl->size : 0);
  try {
    return f(root, r);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    r.fail(msg.substr(0, msg.find('\n')));
  }
}

}  // namespace

torch::serialize::InputArchive read(const char* data, size_t size, const std::string& what, torch::Device device) {
  std::string bytes = with_root(data, size, what, [](const ValuePtr& root, Rebuilder& r) {
    torch::serialize::OutputArchive out;
    r.module(root, out, 0);
    std::ostringstream s;
    out.save_to(s);
    return s.str();
  });
  // LibTorch's reader keeps reading after load_from (debug records, on
  // demand): the bytes live as long as its read function.
  auto kept = std::make_shared<const std::string>(std::move(bytes));
  auto read_at = [kept](uint64_t pos, void* buf, size_t n) -> size_t {
    if (pos >= kept->size()) return 0;
    const size_t k = std::min<uint64_t>(n, kept->size() - pos);
    std::memcpy(buf, kept->data() + pos, k);
    return k;
  };
  torch::serialize::InputArchive in;
  try {
    // Ours: LibTorch's writer made every line of its code.
    in.load_from(read_at, [kept] { return kept->size(); }, device);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    throw CheckpointError(what + ": its data did not load back into a LibTorch archive (" +
                          msg.substr(0, msg.find('\n')) + ")");
  }
  return in;
}

StateDict tensors(const char* data, size_t size, const std::string& what) {
  return with_root(data, size, what, [](const ValuePtr& root, Rebuilder& r) {
    StateDict out;
    r.tensors(root, "", out, 0);
    return out;
  });
}

}  // namespace ddp::module_archive
