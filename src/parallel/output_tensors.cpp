#include "ddp/parallel/output_tensors.h"

namespace ddp::detail {

void collect_ivalue_tensors(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    collect_output_tensors(value.toTensor(), out);
  } else if (value.isTensorList()) {
    collect_output_tensors(value.toTensorVector(), out);
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toListRef()) collect_ivalue_tensors(e, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& e : value.toTupleRef().elements()) collect_ivalue_tensors(e, out);
  } else if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) collect_ivalue_tensors(item.value(), out);
  }
}

}  // namespace ddp::detail
