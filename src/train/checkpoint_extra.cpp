#include "checkpoint_extra.h"

#include <ATen/core/List.h>
#include <ATen/core/jit_type.h>

#include <unordered_set>

#include "ddp/errors.h"
#include "ddp/train/checkpoint.h"

namespace ddp::detail {

namespace {

using Kind = pickle::Value::Kind;

// A key as an error names it: cut short, so that a path through deeply
// nested long keys (one memoised string, reused) stays small.
std::string key_text(const c10::IValue& key) {
  if (!key.isString()) return std::to_string(key.toInt());
  const std::string& k = key.toStringRef();
  return "\"" + (k.size() <= 40 ? k : k.substr(0, 40) + "...") + "\"";
}

// `where` one level down; past 200 characters the path stops growing.
std::string child(const std::string& where, const std::string& step) {
  if (where.size() > 200) return where.compare(where.size() - 3, 3, "...") == 0 ? where : where + "...";
  return where + "[" + step + "]";
}

c10::IValue to_plain(const c10::IValue& v, const std::string& where, uint32_t depth) {
  auto refuse = [&](const std::string& why) {
    throw CheckpointError("checkpoint entry " + where + ": " + why +
                          "; an entry holds tensors, numbers, strings, bools, None, lists, tuples and dicts with str "
                          "or int keys");
  };
  if (depth > pickle::kMaxNesting) refuse("nested more than " + std::to_string(pickle::kMaxNesting) + " deep");
  if (v.isNone() || v.isInt() || v.isDouble() || v.isBool() || v.isString()) return v;
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) return c10::IValue();
    if (t.layout() != c10::kStrided || t.is_quantized()) refuse("a " + std::string(c10::toString(t.layout())) +
                                                                " or quantized tensor is not plain data");
    return t.detach().cpu();
  }
  if (v.isList()) {
    const auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (size_t i = 0; i < list.size(); ++i)
      out.push_back(to_plain(list.get(i), child(where, std::to_string(i)), depth + 1));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> items;
    const auto& elements = v.toTupleRef().elements();
    for (size_t i = 0; i < elements.size(); ++i)
      items.push_back(to_plain(elements[i], child(where, std::to_string(i)), depth + 1));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  if (v.isGenericDict()) {
    const auto dict = v.toGenericDict();
    const auto key_type = dict.keyType();
    if (key_type->kind() != c10::TypeKind::StringType && key_type->kind() != c10::TypeKind::IntType)
      refuse("a dict with " + key_type->str() + " keys");
    c10::impl::GenericDict out(key_type, dict.valueType());
    for (const auto& kv : dict)
      out.insert(kv.key(), to_plain(kv.value(), child(where, key_text(kv.key())), depth + 1));
    return out;
  }
  refuse("a " + v.tagKind() + " is not plain data");
  return {};
}

// The item type every item of `items` shares (int, float, bool, str,
// Tensor), or nullptr.
c10::TypePtr common_type(const std::vector<c10::IValue>& items) {
  auto type_of = [](const c10::IValue& i) -> c10::TypePtr {
    if (i.isInt()) return c10::IntType::get();
    if (i.isDouble()) return c10::FloatType::get();
    if (i.isBool()) return c10::BoolType::get();
    if (i.isString()) return c10::StringType::get();
    if (i.isTensor()) return c10::TensorType::get();
    return nullptr;
  };
  if (items.empty()) return nullptr;
  c10::TypePtr t = type_of(items.front());
  for (const auto& i : items) {
    const auto ti = type_of(i);
    if (!t || !ti || *ti != *t) return nullptr;
  }
  return t;
}

c10::TypePtr tagged_item_type(const std::string& tag) {
  if (tag == "List[int]") return c10::IntType::get();
  if (tag == "List[float]") return c10::FloatType::get();
  if (tag == "List[bool]") return c10::BoolType::get();
  if (tag == "List[str]") return c10::StringType::get();
  if (tag == "List[Tensor]") return c10::TensorType::get();
  return nullptr;
}

// Reading an entry back: the values the unpickler built, as c10 values.
// A value the pickle memoised may sit in many containers at the cost of a
// reference each (L0 = ["x"], Lk = [Lk-1, Lk-1]: 61 lists in 2 KB), but the
// c10 values are a tree, one copy a path: 2^60 lists. So every value copied
// (and every string's bytes, each time) is paid from a budget of a few times
// what the entry holds, each value counted once.
class FromPickle {
 public:
  FromPickle(const pickle::ValuePtr& entry, std::string path) : path_(std::move(path)) {
    held_ = held_bytes(entry);
    budget_ = kFloor + kExpansion * held_;
  }

  c10::IValue convert(const pickle::ValuePtr& v, const std::string& where) {
    auto refuse = [&](const std::string& why) {
      throw CheckpointError(path_ + ": checkpoint entry " + where + " is " + why + ", not plain data; a crafted file?");
    };
    charge(kValueCost + (v->kind == Kind::String ? v->s.size() : 0), where);
    switch (v->kind) {
      case Kind::None: return c10::IValue();
      case Kind::Bool: return v->b;
      case Kind::Int: return v->i;
      case Kind::Float: return v->f;
      case Kind::String: return v->s;
      case Kind::Tensor:
        if (v->is_storage) refuse("a bare storage");
        return v->tensor;  // a view of the storage read once: no copy
      case Kind::Tuple: case Kind::List: {
        std::vector<c10::IValue> items;
        items.reserve(v->items.size());
        for (size_t i = 0; i < v->items.size(); ++i) items.push_back(convert(v->items[i], child(where, std::to_string(i))));
        if (v->kind == Kind::Tuple) return c10::ivalue::Tuple::create(std::move(items));
        c10::TypePtr item = common_type(items);
        if (const auto tagged = tagged_item_type(v->type_tag); tagged && (items.empty() || (item && *item == *tagged)))
          item = tagged;
        c10::impl::GenericList out(item ? item : c10::AnyType::get());
        for (auto& i : items) out.push_back(std::move(i));
        return out;
      }
      case Kind::Dict: {
        c10::TypePtr key_type;
        for (const auto& kv : v->dict) {
          const auto& k = kv.first;
          if (k->kind != Kind::String && k->kind != Kind::Int) refuse("a dict whose keys are not all str or all int");
          c10::TypePtr t = k->kind == Kind::String ? c10::TypePtr(c10::StringType::get()) : c10::IntType::get();
          if (key_type && *key_type != *t) refuse("a dict whose keys are not all str or all int");
          key_type = t;
        }
        c10::impl::GenericDict out(key_type ? key_type : c10::StringType::get(), c10::AnyType::get());
        for (const auto& [k, x] : v->dict) {
          charge(kValueCost + k->s.size(), where);
          const c10::IValue key = k->kind == Kind::String ? c10::IValue(k->s) : c10::IValue(k->i);
          out.insert_or_assign(key, convert(x, child(where, key_text(key))));
        }
        return out;
      }
      case Kind::Global: refuse("the Python name " + v->s); break;
      case Kind::Object: refuse("a Python object (" + v->s + ")"); break;
    }
    refuse("of an unknown kind");
    return {};
  }

 private:
  // What a value costs once converted (an IValue, its container's share),
  // besides a string's bytes; what a reference to it costs in the file.
  static constexpr uint64_t kValueCost = 64, kReferenceCost = 16;
  // A tree of shared strings a program wrote (Python memoises a str object
  // used twice) stays within a few times its file; anything reads within the floor.
  static constexpr uint64_t kExpansion = 8, kFloor = uint64_t(16) << 20;

  // The entry's values as the file holds them: each once, whatever refers to it.
  static uint64_t held_bytes(const pickle::ValuePtr& entry) {
    std::unordered_set<const pickle::Value*> seen;
    std::vector<const pickle::Value*> pending{entry.get()};
    uint64_t held = 0;
    while (!pending.empty()) {
      const pickle::Value* v = pending.back();
      pending.pop_back();
      if (!seen.insert(v).second) continue;
      held += kValueCost + v->s.size() + kReferenceCost * (v->items.size() + 2 * v->dict.size());
      for (const auto& x : v->items) pending.push_back(x.get());
      for (const auto& [k, x] : v->dict) {
        pending.push_back(k.get());
        pending.push_back(x.get());
      }
    }
    return held;
  }

  void charge(uint64_t n, const std::string& where) {
    if (n > budget_ - spent_)
      throw CheckpointError(path_ + ": checkpoint entry " + where + " refers to the same values over and over: read " +
                            "as plain data it would take more than " + std::to_string(budget_ >> 20) + " MiB, from " +
                            std::to_string(held_) + " bytes of values in the file. A malformed or hostile file: "
                            "delete it, or resume from another checkpoint");
    spent_ += n;
  }

  std::string path_;
  uint64_t held_ = 0, budget_ = 0, spent_ = 0;
};

}  // namespace

}  // namespace ddp::detail

namespace ddp {

c10::impl::GenericDict extra_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

}  // namespace ddp

namespace ddp::detail {

c10::impl::GenericDict extra_to_ivalue(const std::map<std::string, c10::IValue>& extra) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [k, v] : extra) out.insert(k, to_plain(v, "extra[" + key_text(k) + "]", 1));
  return out;
}

std::map<std::string, c10::IValue> extra_from_pickle(const pickle::ValuePtr& entry, const std::string& path) {
  std::map<std::string, c10::IValue> extra;
  if (!entry) return extra;
  if (!entry->is_dict()) throw CheckpointError(path + ": checkpoint entry \"extra\" is not a dict; corrupt file?");
  FromPickle reader(entry, path);
  for (const auto& [k, v] : entry->dict) {
    if (k->kind != Kind::String) throw CheckpointError(path + ": checkpoint entry \"extra\" has a key that is not a str");
    extra[k->s] = reader.convert(v, "extra[" + key_text(k->s) + "]");
  }
  return extra;
}

}  // namespace ddp::detail
