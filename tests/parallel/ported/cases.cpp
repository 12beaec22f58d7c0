// PyTorch's own DDP tests (distributed_test.py, test_c10d_gloo.py), ported
// to libddp line by line: the rank program's side of pytorch_ddp_tests.py,
// which runs each case with PyTorch's DDP. Each case is named after the test
// it ports and writes the same lines as the script (parameters, gradients,
// outputs and buffers bit for bit; whether an error came) to
// <dir>/cpp_r<rank>.txt; pytorch_parity_test.cpp compares the two. Where
// PyTorch's test checks an error's words, the port checks that ours names the
// same cause.
#include <fstream>
#include <iostream>

#include "ported_case.h"

namespace ddp::testing {

// --cases a,b (default: every case): runs them, each followed by a barrier as
// the script's, and writes <DDP_TEST_DIR>/cpp_r<rank>.txt. A case that throws
// writes so (its lines then differ from PyTorch's) and the others go on.
int scenario_pytorch_tests(std::shared_ptr<ProcessGroup> pg, Flags flags) {
  const auto wanted = split_commas(flags.count("--cases") ? flags["--cases"] : "");
  ported::Out out;
  for (const auto& cases : {ported::training_cases(), ported::unused_parameter_cases(),
                            ported::output_and_static_graph_cases(), ported::join_cases(),
                            ported::post_local_sgd_cases(), ported::c10d_gloo_cases()}) {
    for (const auto& [name, run] : cases) {
      if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
      out.case_name = name;
      try {
        run(out, pg);
      } catch (const std::exception& e) {  // the case differs; the others still run
        std::cerr << "rank " << pg->rank() << ": " << name << " threw: " << e.what() << std::endl;
        out.text("threw", "(see the rank's output)");
      }
      pg->barrier();
    }
  }
  std::ofstream f(std::string(std::getenv("DDP_TEST_DIR")) + "/cpp_r" + std::to_string(pg->rank()) + ".txt");
  for (const auto& l : out.lines) f << l << "\n";
  return f.good() ? 0 : 1;
}

// ddp_worker runs these by name (worker_common.h).
const AddScenarios kPortedPytorchTests{
    {"pytorch_tests", [](std::shared_ptr<ProcessGroup> pg, const Flags& flags) { return scenario_pytorch_tests(pg, flags); }}};

}  // namespace ddp::testing
