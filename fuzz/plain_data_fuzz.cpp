// Fuzzes the object collectives' decoder (src/comm/objects/plain_data.cpp): the
// bytes are what another rank sent. Bytes that are not an encoding must be a
// ddp::DataError; anything else (a crash, a sanitizer report, another
// exception, an allocation beyond the input's size) is a finding; a value
// decoded must encode again. Run: fuzz/README.md.
#include <string>

#include "comm/objects/plain_data.h"
#include "ddp/errors.h"
#include "harnesses.h"

namespace {

int fuzz_plain_data(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  c10::IValue value;
  try {
    value = ddp::detail::decode_plain_data(bytes, "fuzz: ");
  } catch (const ddp::DataError&) {
    return 0;
  }
  (void)ddp::detail::encode_plain_data(value, "fuzz: ");
  return 0;
}

const ddp::fuzz::AddHarness kPlainDataHarness{"plain_data_fuzz", fuzz_plain_data};

}  // namespace
