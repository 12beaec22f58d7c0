// What parse_train_options needs of the program's own options (add_option):
// binding them to the command line and checking what it gave. Private.
#pragma once

#include <boost/program_options.hpp>

#include <string>
#include <vector>

#include "ddp/train/train_options.h"

namespace ddp::detail {

// The shortest text that reads back as exactly `v` ("0.003", not
// "0.0030000000000000001"): what --help shows and the config records.
std::string shortest_text(double v);

// Adds every option to `into`, bound to its value (which must outlive the parse).
void bind_program_options(std::vector<ProgramOption>& options, boost::program_options::options_description& into);

// After the parse: UsageError for a number that is not finite ("inf", "nan").
void check_program_options(const std::vector<ProgramOption>& options);

}  // namespace ddp::detail
