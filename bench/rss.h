// This process's resident memory, as the benchmarks report it: the peak
// (getrusage) and now (/proc/self/statm), in KiB; -1 when unreadable.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

namespace bench {

inline long peak_rss_kb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;  // KiB on Linux
}

inline long current_rss_kb() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long pages = 0, resident = 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
  std::fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace bench
