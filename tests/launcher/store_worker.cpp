// A worker that holds the workers' rendezvous store open: it joins the
// process group (rank 0 serves the store at MASTER_ADDR:MASTER_PORT), writes
// DIR/ready.<RANK> (MASTER_PORT inside), and stays in the group until the
// file DIR/go exists (at most 120 s). The store tests connect to the port in
// the meantime.
//   store_worker DIR
#include <ddp/comm/process_group.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: store_worker DIR\n");
    return 64;
  }
  const std::string dir = argv[1];
  auto group = ddp::init_process_group(ddp::ProcessGroupOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  const char* port = std::getenv("MASTER_PORT");
  const std::string ready = dir + "/ready." + std::to_string(group->rank());
  {
    std::ofstream f(ready + ".tmp");
    f << (port ? port : "");
  }
  std::filesystem::rename(ready + ".tmp", ready);
  for (int waited = 0; waited < 1200 && !std::filesystem::exists(dir + "/go"); ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ddp::destroy_process_group();
  return 0;
}
