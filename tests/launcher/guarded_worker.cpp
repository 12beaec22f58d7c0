// A worker for the launcher tests that fails the way a libddp program does:
// through ddp::guarded_main, which writes TORCHELASTIC_ERROR_FILE.
//
//   guarded_worker R   rank R throws a ddp::CommError; the others wait to be stopped
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "ddp/errors.h"
#include "ddp/runtime/main_guard.h"

int main(int argc, char** argv) {
  const int fail_rank = argc > 1 ? std::atoi(argv[1]) : 0;
  return ddp::guarded_main([&] {
    const char* rank = std::getenv("RANK");
    if (rank && std::atoi(rank) == fail_rank)
      throw ddp::CommError(std::string("rank ") + rank + ": allreduce of bucket 0 timed out after 30 s "
                           "(\"gloo\", peer rank 0); check the network");
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 0;
  });
}
