// ddprun: a torchrun-compatible launcher. See docs/launcher.md.
#include <sys/prctl.h>

#include <iostream>

#include "agent.h"
#include "cli.h"
#include "errors.h"
#include "output.h"
#include "rendezvous.h"
#include "signals.h"
#include "watchdog.h"

int main(int argc, char** argv) {
  using namespace ddprun;
  try {
    // Order matters: signals blocked before any thread exists, the watchdog
    // forked before any thread exists (GPU discovery and TCPStore start some).
    // Never destroyed: its destructor would unblock the signals, and one
    // arriving during the exit (srun ending the step as another node's ddprun
    // exits) would then kill ddprun with SIGTERM while LibTorch's static
    // objects are torn down, replacing the exit status it chose.
    SignalChannel& signals = *new SignalChannel;
    // Orphaned grandchildren come to ddprun instead of init, so it can end them.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    Watchdog watchdog;
    try {
      auto options = parse_command_line(argc, argv, std::cout);
      if (!options) return 0;
      for (const auto& note : options->notes) say(note);
      resolve_nproc(*options);
      Agent agent(*options, signals, watchdog);
      auto rendezvous = make_rendezvous(*options, [&] { agent.tick(); });
      return agent.run(*rendezvous);
    } catch (const UsageError& e) {
      say(std::string("error: ") + e.what());
      return kExitUsage;
    } catch (const LaunchError& e) {
      say(std::string("error: ") + e.what());
      return kExitLaunch;
    } catch (const Interrupted& e) {
      say("stopped by " + signal_name(e.signo()));
      return 128 + e.signo();
    }
  } catch (const std::exception& e) {
    say(std::string("error: ") + e.what());
    return kExitLaunch;
  }
}
