// The tensors in a forward's result, found as PyTorch's DDP finds them
// (_find_tensors): DistributedDataParallel walks what the wrapped module's
// forward returns to learn which parameters the loss can reach
// (find_unused_parameters), whatever its structure:
//
//   - at::Tensor (an undefined one holds none);
//   - tuples, pairs, std::array: each element;
//   - maps (std::map, std::unordered_map, c10::Dict, torch::OrderedDict): each value;
//   - other ranges (std::vector, std::deque, c10::List, ...): each element;
//   - std::optional and c10::optional: the value when there is one;
//   - c10::IValue: tensors, lists, tuples, dicts and optionals inside it;
//   - a struct of your own: give it a `ddp_fields` function in its namespace
//     that returns its members (as a dataclass's fields):
//         struct Output { torch::Tensor logits, aux; int steps; };
//         auto ddp_fields(const Output& o) { return std::tie(o.logits, o.aux); }
//   - anything else (numbers, strings, your types without ddp_fields): no
//     tensors, as PyTorch ignores a value that is none of the above.
// Any nesting of these works.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>
#include <torch/ordered_dict.h>

#include <iterator>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp {

namespace detail {

template <typename T, typename = void>
struct has_ddp_fields : std::false_type {};
template <typename T>
struct has_ddp_fields<T, std::void_t<decltype(ddp_fields(std::declval<const T&>()))>> : std::true_type {};

template <typename T, typename = void>
struct is_tuple_like : std::false_type {};
template <typename T>
struct is_tuple_like<T, std::void_t<decltype(std::tuple_size<T>::value)>> : std::true_type {};

template <typename T, typename = void>
struct is_range : std::false_type {};
template <typename T>
struct is_range<T, std::void_t<decltype(std::begin(std::declval<const T&>())),
                               decltype(std::end(std::declval<const T&>()))>> : std::true_type {};

// A map's element: an item with key() and value() (c10::Dict,
// torch::OrderedDict), or std::map's pair of a const key and its value.
template <typename T, typename = void>
struct is_keyed_item : std::false_type {};
template <typename T>
struct is_keyed_item<T, std::void_t<decltype(std::declval<const T&>().key()), decltype(std::declval<const T&>().value())>>
    : std::true_type {};
template <typename T>
struct is_map_pair : std::false_type {};
template <typename K, typename V>
struct is_map_pair<std::pair<const K, V>> : std::true_type {};

template <typename T>
struct is_c10_list : std::false_type {};
template <typename T>
struct is_c10_list<c10::List<T>> : std::true_type {};

template <typename T, typename = void>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<T, std::void_t<decltype(std::declval<const T&>().has_value()), decltype(*std::declval<const T&>())>>
    : std::true_type {};

void collect_ivalue_tensors(const c10::IValue& value, std::vector<at::Tensor>& out);

}  // namespace detail

// Appends the tensors found in `value` to `out`, in order.
template <typename T>
void collect_output_tensors(const T& value, std::vector<at::Tensor>& out) {
  using V = std::decay_t<T>;
  if constexpr (std::is_same_v<V, at::Tensor>) {
    if (value.defined()) out.push_back(value);
  } else if constexpr (std::is_same_v<V, c10::IValue>) {
    detail::collect_ivalue_tensors(value, out);
  } else if constexpr (detail::has_ddp_fields<V>::value) {
    collect_output_tensors(ddp_fields(value), out);
  } else if constexpr (std::is_convertible_v<const V&, std::string_view>) {
    // text holds no tensors
  } else if constexpr (detail::is_optional<V>::value) {
    if (value.has_value()) collect_output_tensors(*value, out);
  } else if constexpr (detail::is_tuple_like<V>::value) {
    std::apply([&](const auto&... e) { (collect_output_tensors(e, out), ...); }, value);
  } else if constexpr (detail::is_c10_list<V>::value) {
    for (size_t i = 0; i < value.size(); ++i) collect_output_tensors(value.get(i), out);
  } else if constexpr (detail::is_range<V>::value) {
    for (const auto& e : value) {
      using E = std::decay_t<decltype(e)>;
      if constexpr (detail::is_keyed_item<E>::value) {
        collect_output_tensors(e.value(), out);
      } else if constexpr (detail::is_map_pair<E>::value) {
        collect_output_tensors(e.second, out);
      } else {
        collect_output_tensors(e, out);
      }
    }
  }
}

template <typename T>
std::vector<at::Tensor> output_tensors(const T& value) {
  std::vector<at::Tensor> out;
  collect_output_tensors(value, out);
  return out;
}

}  // namespace ddp
