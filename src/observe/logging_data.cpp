#include "ddp/observe/logging_data.h"

#include "runtime/json_text.h"

namespace ddp {

std::string DDPLoggingData::to_json() const {
  std::map<std::string, std::string> all;
  for (const auto& [k, v] : ints_map) all[k] = std::to_string(v);
  for (const auto& [k, v] : strs_map) all[k] = json_string(v);
  std::string out = "{";
  for (const auto& [k, v] : all) out += (out.size() > 1 ? ",\n  " : "\n  ") + json_string(k) + ": " + v;
  return out + "\n}\n";
}

}  // namespace ddp
