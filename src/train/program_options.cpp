// A program's own options (TrainOptions::add_option), which kit options it
// implements (TrainOptions::supports), and the resume check of both.
#include "program_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <iostream>

namespace ddp {

namespace po = boost::program_options;

namespace detail {

std::string shortest_text(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round trip (C++17)
  return std::string(buf, r.ptr);
}

void bind_program_options(std::vector<ProgramOption>& options, po::options_description& into) {
  for (auto& o : options) {
    const char* name = o.name.c_str();
    const char* help = o.help.c_str();
    std::visit(
        [&](auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>)
            into.add_options()(name, po::bool_switch(&v), help);
          else if constexpr (std::is_same_v<T, double>)
            into.add_options()(name, po::value(&v)->default_value(v, shortest_text(v)), help);
          else
            into.add_options()(name, po::value(&v)->default_value(v), help);
        },
        o.value);
  }
}

void check_program_options(const std::vector<ProgramOption>& options) {
  for (const auto& o : options)
    if (const double* v = std::get_if<double>(&o.value); v && !std::isfinite(*v))
      throw UsageError("--" + o.name + " must be a finite number, got " + shortest_text(*v));
}

}  // namespace detail

std::string ProgramOption::config_key() const {
  std::string key = name;
  for (char& c : key)
    if (c == '-') c = '_';
  return key;
}

std::string ProgramOption::text() const {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "1" : "0";  // as the kit's switches
        else if constexpr (std::is_same_v<T, double>) return detail::shortest_text(v);
        else if constexpr (std::is_same_v<T, int64_t>) return std::to_string(v);
        else return v;
      },
      value);
}

std::string TrainOptions::type_name(const ProgramOption& option) {
  static const char* names[] = {"int", "float", "str", "bool"};  // Python's, in the variant's order
  return names[option.value.index()];
}

TrainOptions& TrainOptions::add_program_option(ProgramOption option) {
  if (option.name.rfind("--", 0) == 0) option.name.erase(0, 2);  // argparse writes "--dim"
  const std::string& name = option.name;
  const bool well_formed = !name.empty() && name.front() != '-' &&
                           name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos;
  if (!well_formed)
    throw UsageError("add_option(\"" + name + "\"): an option's name is lower-case letters, digits and '-' "
                     "(\"seq-len\"), without the leading --");
  const auto& kit = kit_options();
  const auto kit_keys = TrainOptions().to_config();
  if (std::find(kit.begin(), kit.end(), name) != kit.end() || kit_keys.count(option.config_key()) || name == "h")
    throw UsageError("add_option(\"" + name + "\"): --" + name + " is one of the kit's options; give yours another name");
  for (const auto& o : program_)
    if (o.name == name || o.config_key() == option.config_key())
      throw UsageError("add_option(\"" + name + "\"): --" + o.name + " is registered already");
  if (const bool* b = std::get_if<bool>(&option.value); b && *b)
    throw UsageError("add_option(\"" + name + "\", true): a bool option is a switch, off by default; register the "
                     "opposite (--no-" + name + ") instead");
  program_.push_back(std::move(option));
  return *this;
}

const ProgramOption& TrainOptions::program_option(const std::string& name) const {
  for (const auto& o : program_)
    if (o.name == name) return o;
  throw UsageError("option --" + name + " was not registered (TrainOptions::add_option)");
}

TrainOptions& TrainOptions::supports(const std::vector<std::string>& names) {
  const auto& kit = kit_options();
  std::set<std::string> chosen;
  for (std::string n : names) {
    if (n.rfind("--", 0) == 0) n.erase(0, 2);
    if (std::find(kit.begin(), kit.end(), n) == kit.end()) {
      std::string all;
      for (const auto& k : kit) all += (all.empty() ? "" : ", ") + k;
      throw UsageError("supports(): \"" + n + "\" is not one of the kit's options (" + all + ")");
    }
    chosen.insert(n);
  }
  chosen.insert("help");
  // The kit's epoch loop writes both kinds of checkpoint.
  if (chosen.count("checkpoint-every")) chosen.insert("checkpoint-every-steps");
  // The run folder's TensorBoard files are the kit's, whatever the program implements.
  chosen.insert("tensorboard");
  chosen.insert("no-tensorboard");
  supported_ = std::move(chosen);
  return *this;
}

void TrainOptions::check_resume(const std::map<std::string, std::string>& recorded, const std::string& checkpoint,
                                bool notify) const {
  std::string unrecorded;
  for (const auto& o : program_) {
    if (o.on_resume != OnResume::must_match) continue;
    const auto it = recorded.find(o.config_key());
    if (it == recorded.end()) {
      unrecorded += " --" + o.name;
      continue;
    }
    if (it->second != o.text())
      throw UsageError("--" + o.name + " is " + o.text() + ", but " + checkpoint + " was written with --" + o.name +
                       " " + it->second + "; the program keeps it across a resume (it shapes the model or its data). "
                       "Resume with --" + o.name + " " + it->second + ", or start afresh in another --run-dir");
  }
  if (notify && !unrecorded.empty())
    std::cout << "notice: " << checkpoint << " does not record" << unrecorded
              << " (written before the program had them); not checked" << std::endl;
}

}  // namespace ddp
