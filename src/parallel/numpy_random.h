// numpy.random.RandomState(seed).randint(high), numpy's legacy generator:
// MT19937 seeded by init_genrand (as std::mt19937 is), and a bounded draw
// that masks 32-bit outputs to the smallest power of two above the range and
// rejects those beyond it. PyTorch's PowerSGD draws the seed of every random
// Q with it. Private to the core.
#pragma once

#include <cstdint>
#include <random>

namespace ddp::hooks::detail {

// Uniform in [0, high), 0 < high <= 2^32, from `engine`.
int64_t numpy_randint(std::mt19937& engine, int64_t high);

}  // namespace ddp::hooks::detail
