// Writes the synthetic series the Informer example trains on:
//   informer_make_csv datatry.csv [rows] [variables] [seed]
#include <cstdlib>
#include <iostream>

#include "synthetic_series.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: informer_make_csv OUT.csv [rows=10000] [variables=11] [seed=1]\n";
    return 2;
  }
  try {
    const int rows = argc > 2 ? std::atoi(argv[2]) : 10000, variables = argc > 3 ? std::atoi(argv[3]) : 11;
    const uint64_t seed = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 1;
    informer::write_synthetic_series(argv[1], rows, variables, seed);
    std::cout << "wrote " << argv[1] << ": " << rows << " rows, date + " << variables << " variables" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
