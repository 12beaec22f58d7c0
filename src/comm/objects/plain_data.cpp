#include "comm/objects/plain_data.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "ddp/errors.h"

namespace ddp::detail {
namespace {

// "DDPV" and the format's version, first in every encoding.
constexpr char kMagic[] = {'D', 'D', 'P', 'V', 1};
constexpr size_t kMaxDims = 64;

// The value's kind, one byte before it.
enum Tag : char {
  kNone = 'N', kFalse = 'F', kTrue = 'T', kInt = 'I', kDouble = 'D', kComplex = 'C', kString = 'S',
  kTensor = 'X', kList = 'L', kTuple = 'U', kDict = 'M',
};

// A container's element type, kept where it is one of these.
enum ElementKind : uint8_t { kAnyKind = 0, kIntKind, kFloatKind, kBoolKind, kStringKind, kTensorKind, kComplexKind };

ElementKind kind_of(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::IntType: return kIntKind;
    case c10::TypeKind::FloatType: return kFloatKind;
    case c10::TypeKind::BoolType: return kBoolKind;
    case c10::TypeKind::StringType: return kStringKind;
    case c10::TypeKind::TensorType: return kTensorKind;
    case c10::TypeKind::ComplexType: return kComplexKind;
    default: return kAnyKind;
  }
}

c10::TypePtr type_of(ElementKind kind) {
  switch (kind) {
    case kIntKind: return c10::IntType::get();
    case kFloatKind: return c10::FloatType::get();
    case kBoolKind: return c10::BoolType::get();
    case kStringKind: return c10::StringType::get();
    case kTensorKind: return c10::TensorType::get();
    case kComplexKind: return c10::ComplexType::get();
    case kAnyKind: break;
  }
  return c10::AnyType::get();
}

bool known_dtype(int code) {
  switch (static_cast<at::ScalarType>(code)) {
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kHalf: case at::kFloat:
    case at::kDouble: case at::kComplexFloat: case at::kComplexDouble: case at::kBool: case at::kBFloat16:
      return true;
    default: return false;
  }
}

// ---- encoding ----------------------------------------------------------------

struct Writer {
  std::string out;
  const std::string& who;
  std::vector<int64_t> path;  // the entry being written at each level, for errors

  // "the object[2][0]": where in the value the entry being written is.
  std::string where() const {
    std::string w = "the object";
    for (int64_t i : path) w += "[" + std::to_string(i) + "]";
    return w;
  }

  void byte(char c) { out.push_back(c); }
  template <typename T>
  void raw(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.append(b, sizeof(T));
  }
  void bytes(const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
  void value(const c10::IValue& v);
  void tensor(const at::Tensor& t);
  void container(const c10::IValue& v);
};

void Writer::tensor(const at::Tensor& t) {
  if (!t.defined()) return byte(kNone);  // an undefined tensor is None, as in TorchScript
  if (t.layout() != at::kStrided || t.is_quantized() || !known_dtype(static_cast<int>(t.scalar_type())) ||
      !(t.is_cpu() || t.is_cuda()) || static_cast<size_t>(t.dim()) > kMaxDims)
    throw UsageError(who + where() + ": a " + std::string(c10::toString(t.scalar_type())) + " tensor on " +
                     t.device().str() + " is not plain data (dense CPU or CUDA tensors of up to 64 dimensions are)");
  const at::Tensor c = t.detach().resolve_conj().resolve_neg().to(at::kCPU).contiguous();
  byte(kTensor);
  raw<uint8_t>(static_cast<uint8_t>(t.scalar_type()));
  raw<uint8_t>(t.is_cuda() ? 1 : 0);
  raw<int16_t>(t.is_cuda() ? t.device().index() : -1);
  raw<uint8_t>(t.requires_grad() ? 1 : 0);
  raw<uint8_t>(static_cast<uint8_t>(t.dim()));
  for (int64_t s : t.sizes()) raw<int64_t>(s);
  const uint64_t n = static_cast<uint64_t>(c.numel()) * c.element_size();
  raw<uint64_t>(n);
  if (n) bytes(c.data_ptr(), n);
}

void Writer::container(const c10::IValue& v) {
  if (v.isList()) {
    const auto list = v.toList();
    byte(kList);
    raw<uint8_t>(kind_of(list.elementType()));
    raw<uint64_t>(list.size());
    for (size_t i = 0; i < list.size(); ++i) path.back() = static_cast<int64_t>(i), value(list.get(i));
  } else if (v.isTuple()) {
    const auto& elements = v.toTupleRef().elements();
    byte(kTuple);
    raw<uint64_t>(elements.size());
    for (size_t i = 0; i < elements.size(); ++i) path.back() = static_cast<int64_t>(i), value(elements[i]);
  } else {
    const auto dict = v.toGenericDict();
    const ElementKind key = kind_of(dict.keyType());
    if (key == kAnyKind && dict.size() > 0)
      throw UsageError(who + where() + ": a dict whose keys are " + dict.keyType()->str() +
                       " is not plain data (keys: int, float, bool, str, complex or Tensor)");
    byte(kDict);
    raw<uint8_t>(key);
    raw<uint8_t>(kind_of(dict.valueType()));
    raw<uint64_t>(dict.size());
    int64_t i = 0;
    for (const auto& entry : dict) {
      path.back() = i++;  // the entry's place in the dict's order
      value(entry.key());
      value(entry.value());
    }
  }
}

void Writer::value(const c10::IValue& v) {
  if (path.size() > static_cast<size_t>(kMaxPlainDataDepth))
    throw UsageError(who + where() + ": nested deeper than " + std::to_string(kMaxPlainDataDepth) +
                     " levels (a container that holds itself?); the object collectives refuse such values");
  if (v.isNone()) return byte(kNone);
  if (v.isBool()) return byte(v.toBool() ? kTrue : kFalse);
  if (v.isInt()) return byte(kInt), raw<int64_t>(v.toInt());
  if (v.isDouble()) return byte(kDouble), raw<double>(v.toDouble());
  if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    return byte(kComplex), raw<double>(c.real()), raw<double>(c.imag());
  }
  if (v.isString()) {
    const auto& s = v.toStringRef();
    return byte(kString), raw<uint64_t>(s.size()), bytes(s.data(), s.size());
  }
  if (v.isTensor()) return tensor(v.toTensor());
  if (v.isList() || v.isTuple() || v.isGenericDict()) {
    path.push_back(0);
    container(v);
    path.pop_back();
    return;
  }
  throw UsageError(who + where() + ": a " + v.tagKind() +
                   " is not plain data; the object collectives take None, bool, int, double, complex, str, Tensor, "
                   "and lists, tuples and dicts of them");
}

// ---- decoding ----------------------------------------------------------------

struct Reader {
  const char* p;
  size_t left;
  const std::string& who;

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(who + "the object received is not plain data libddp wrote: " + what +
                    " (every rank must run the same libddp and call the same object collectives in the same order)");
  }
  void need(size_t n, const char* what) const {
    if (n > left) fail(std::string("it ends inside ") + what);
  }
  template <typename T>
  T raw(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    left -= sizeof(T);
    return v;
  }
  // A count of things each taking at least one more byte: never more than remain.
  size_t count(const char* what) {
    const auto n = raw<uint64_t>(what);
    if (n > left) fail(std::string("a ") + what + " of " + std::to_string(n) + " entries in " + std::to_string(left) +
                       " bytes");
    return static_cast<size_t>(n);
  }
  ElementKind kind(const char* what) {
    const auto k = raw<uint8_t>(what);
    if (k > kComplexKind) fail(std::string("an unknown element type in a ") + what);
    return static_cast<ElementKind>(k);
  }
  c10::IValue value(int depth);
  c10::IValue tensor();
  c10::IValue list(int depth);
  c10::IValue tuple(int depth);
  c10::IValue dict(int depth);
};

// `value` as an element of a container of `kind` (Any takes everything).
void check_element(const Reader& r, ElementKind kind, const c10::IValue& value) {
  if (kind == kAnyKind) return;
  const bool ok = (kind == kIntKind && value.isInt()) || (kind == kFloatKind && value.isDouble()) ||
                  (kind == kBoolKind && value.isBool()) || (kind == kStringKind && value.isString()) ||
                  (kind == kTensorKind && value.isTensor()) || (kind == kComplexKind && value.isComplexDouble());
  if (!ok) r.fail("a container holds a " + value.tagKind() + " where its type says " + type_of(kind)->str());
}

// The tensor's element count; the sizes' product with every 0 taken as 1
// (what LibTorch's strides are made of) must fit too.
int64_t checked_numel(Reader& r, const std::vector<int64_t>& sizes) {
  int64_t numel = 1, span = 1;
  for (int64_t s : sizes) {
    if (s < 0) r.fail("a tensor of negative size");
    if (__builtin_mul_overflow(numel, s, &numel) || __builtin_mul_overflow(span, std::max<int64_t>(s, 1), &span))
      r.fail("a tensor too large to exist");
  }
  return numel;
}

c10::IValue Reader::tensor() {
  const int dtype = raw<uint8_t>("a tensor");
  const bool cuda = raw<uint8_t>("a tensor") != 0;
  const int16_t index = raw<int16_t>("a tensor");
  const bool requires_grad = raw<uint8_t>("a tensor") != 0;
  const size_t dims = raw<uint8_t>("a tensor");
  if (!known_dtype(dtype)) fail("a tensor of unknown dtype " + std::to_string(dtype));
  if (dims > kMaxDims) fail("a tensor of " + std::to_string(dims) + " dimensions");
  std::vector<int64_t> sizes;
  for (size_t d = 0; d < dims; ++d) sizes.push_back(raw<int64_t>("a tensor's sizes"));
  const auto type = static_cast<at::ScalarType>(dtype);
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(checked_numel(*this, sizes), static_cast<int64_t>(c10::elementSize(type)), &nbytes))
    fail("a tensor too large to exist");
  if (raw<uint64_t>("a tensor") != static_cast<uint64_t>(nbytes)) fail("a tensor whose bytes do not match its sizes");
  need(static_cast<size_t>(nbytes), "a tensor's data");
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(type));
  if (nbytes) std::memcpy(t.data_ptr(), p, static_cast<size_t>(nbytes));
  p += nbytes;
  left -= static_cast<size_t>(nbytes);
  if (requires_grad) {
    if (!at::isFloatingType(type) && !at::isComplexType(type)) fail("an integer tensor that requires grad");
    t.set_requires_grad(true);
  }
  if (!cuda) return t;
  if (index < 0 || index > 127) fail("a tensor of cuda:" + std::to_string(index));
  try {
    return t.to(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
  } catch (const std::exception& e) {
    throw DataError(who + "a tensor sent from cuda:" + std::to_string(index) +
                    " cannot be placed there on this rank (as PyTorch, received tensors go to the device they came "
                    "from): " + e.what());
  }
}

c10::IValue Reader::list(int depth) {
  const ElementKind kind = this->kind("list");
  const size_t n = count("list");
  c10::impl::GenericList out(type_of(kind));
  out.reserve(std::min<size_t>(n, 64));  // a count is only a claim: the elements must follow
  for (size_t i = 0; i < n; ++i) {
    auto v = value(depth + 1);
    if (kind == kTensorKind && v.isNone()) v = at::Tensor();  // an undefined tensor was sent as None
    check_element(*this, kind, v);
    out.push_back(std::move(v));
  }
  return out;
}

c10::IValue Reader::tuple(int depth) {
  const size_t n = count("tuple");
  std::vector<c10::IValue> elements;
  elements.reserve(std::min<size_t>(n, 64));
  for (size_t i = 0; i < n; ++i) elements.push_back(value(depth + 1));
  return c10::ivalue::Tuple::create(std::move(elements));
}

c10::IValue Reader::dict(int depth) {
  const ElementKind key_kind = kind("dict");
  const ElementKind value_kind = kind("dict");
  const size_t n = count("dict");
  if (key_kind == kAnyKind && n > 0) fail("a dict whose keys have no type");
  c10::impl::GenericDict out(type_of(key_kind == kAnyKind ? kStringKind : key_kind), type_of(value_kind));
  for (size_t i = 0; i < n; ++i) {
    auto k = value(depth + 1);
    check_element(*this, key_kind, k);
    auto v = value(depth + 1);
    check_element(*this, value_kind, v);
    if (!out.insert(std::move(k), std::move(v)).second) fail("a dict with a key twice");
  }
  return out;
}

c10::IValue Reader::value(int depth) {
  if (depth > kMaxPlainDataDepth) fail("nesting deeper than " + std::to_string(kMaxPlainDataDepth) + " levels");
  const char tag = raw<char>("a value");
  switch (tag) {
    case kNone: return c10::IValue();
    case kFalse: return false;
    case kTrue: return true;
    case kInt: return raw<int64_t>("an int");
    case kDouble: return raw<double>("a double");
    case kComplex: {
      const double re = raw<double>("a complex");
      return c10::complex<double>(re, raw<double>("a complex"));
    }
    case kString: {
      const size_t n = count("string");
      std::string s(p, n);
      p += n;
      left -= n;
      return s;
    }
    case kTensor: return tensor();
    case kList: return list(depth);
    case kTuple: return tuple(depth);
    case kDict: return dict(depth);
    default: fail("an unknown kind of value (byte " + std::to_string(static_cast<unsigned char>(tag)) + ")");
  }
}

}  // namespace

c10::IValue decode_plain_data(const std::string& bytes, const std::string& who) {
  Reader r{bytes.data(), bytes.size(), who};
  if (bytes.size() < sizeof kMagic || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    r.fail("it does not start as libddp's encoding (version 1) does");
  r.p += sizeof kMagic;
  r.left -= sizeof kMagic;
  c10::IValue v = r.value(0);
  if (r.left != 0) r.fail(std::to_string(r.left) + " bytes after the value");
  return v;
}

std::string encode_plain_data(const c10::IValue& value, const std::string& who) {
  Writer w{std::string(kMagic, sizeof kMagic), who};
  w.value(value);
  return std::move(w.out);
}

}  // namespace ddp::detail
