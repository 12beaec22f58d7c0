// Plain data: the values the object collectives exchange (ddp::dist's
// all_gather_object, broadcast_object_list, gather_object,
// scatter_object_list), as bytes and back. A value is None, a bool, an int,
// a double, a complex, a string (any bytes), a tensor, or a list, tuple or
// dict of values. Decoding only builds such values: no code runs, no type
// is looked up by name, and what it allocates is bounded by the bytes it
// was given (each element, byte of a string and tensor byte is in them).
// Lists and dicts keep their element types where those are a kind above
// (c10::List<int64_t> comes back as one); other element types come back as
// Any.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace ddp::detail {

// UsageError(who + ...) for a value that is not plain data (a module, a
// future, an object), naming where in the value it is.
std::string encode_plain_data(const c10::IValue& value, const std::string& who);

// DataError(who + ...) for bytes that are not one value encode_plain_data
// wrote: truncated, a kind or dtype it does not know, nesting deeper than
// kMaxPlainDataDepth, sizes that do not add up, bytes left over.
c10::IValue decode_plain_data(const std::string& bytes, const std::string& who);

constexpr int kMaxPlainDataDepth = 512;

}  // namespace ddp::detail
