// Text for the JSON files libddp writes (timelines, error files, DDP logging
// data): strings quoted and escaped so that any reader reads the same text.
// Torch-free.
#pragma once

#include <string>

namespace ddp {

// `s` as a JSON string of pure ASCII: everything else as \uXXXX (surrogate
// pairs above U+FFFF), bytes that are not UTF-8 as U+FFFD.
std::string json_string(const std::string& s);

}  // namespace ddp
