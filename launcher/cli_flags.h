// ddprun's flags as Boost.Program_options reads them (names, defaults, the
// one-line help of each), and the text --help prints above their list.
#pragma once

#include <boost/program_options/options_description.hpp>

namespace ddprun {

// --help's text: the synopsis, what ddprun does, examples, exit statuses.
extern const char* const kUsage;

// Every flag, with its default; parse_command_line (cli.h) checks the values.
boost::program_options::options_description make_description();

}  // namespace ddprun
