// The error of the data layer: a missing, unreadable or malformed data file.
// The message names the file, what is wrong with it and what to do.
#pragma once

#include <stdexcept>

namespace ddp {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ddp
