// Slurm host lists: "gpu[01-03,07],cpu5" -> gpu01 gpu02 gpu03 gpu07 cpu5.
// Torch-free, shared by the library (launch environment) and the launcher.
#pragma once

#include <string>
#include <vector>

namespace ddp {

// Expands a Slurm host list (the syntax of SLURM_JOB_NODELIST and
// `scontrol show hostnames`): comma-separated entries, each a name with
// any number of bracketed ranges ("n[1-3]", "rack[1-2]-n[01-02]"); ranges keep
// their zero padding. Throws ddp::LaunchEnvError naming the text and the
// position on malformed input (unbalanced brackets, empty or reversed ranges).
std::vector<std::string> expand_hostlist(const std::string& hostlist);

// The first host of a host list, without expanding all of it.
std::string first_host(const std::string& hostlist);

}  // namespace ddp
