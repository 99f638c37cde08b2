// half-bench: the bulk 16-bit float conversions (kernels/half.h) against
// plain element loops over the scalar functions, on random normal values.
//
//   half-bench [--benchmark_filter=BFloat16] [google-benchmark flags]
//
// The element loops are compiled with GCC's vectorizers off, so they are
// what the bulk functions were before they went in blocks
// (docs/BENCHMARKS.md, "Host-side costs on the development machine").
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/half.h"

namespace matmul {
namespace {

#define MATMUL_SCALAR_LOOP __attribute__((noinline, optimize("no-tree-vectorize,no-tree-slp-vectorize")))

MATMUL_SCALAR_LOOP void ElementLoop(const float* in, uint16_t* out, size_t n, bool bf16) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16 ? FloatToBFloat16(in[i]) : FloatToHalf(in[i]);
}
MATMUL_SCALAR_LOOP void ElementLoop(const uint16_t* in, float* out, size_t n, bool bf16) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16 ? BFloat16ToFloat(in[i]) : HalfToFloat(in[i]);
}

struct Data {
  explicit Data(size_t n) : floats(n), halves(n), out(n) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
    for (float& v : floats) v = dist(rng);
    FloatToHalf(floats.data(), halves.data(), n);
  }
  std::vector<float> floats;
  std::vector<uint16_t> halves;
  std::vector<float> out;
};

template <bool kBulk, bool kBf16>
void Narrow(benchmark::State& state) {
  Data d(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    if constexpr (kBulk) {
      if (kBf16) FloatToBFloat16(d.floats.data(), d.halves.data(), d.floats.size());
      else FloatToHalf(d.floats.data(), d.halves.data(), d.floats.size());
    } else {
      ElementLoop(d.floats.data(), d.halves.data(), d.floats.size(), kBf16);
    }
    benchmark::DoNotOptimize(d.halves.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

template <bool kBulk, bool kBf16>
void Widen(benchmark::State& state) {
  Data d(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    if constexpr (kBulk) {
      if (kBf16) BFloat16ToFloat(d.halves.data(), d.out.data(), d.halves.size());
      else HalfToFloat(d.halves.data(), d.out.data(), d.halves.size());
    } else {
      ElementLoop(d.halves.data(), d.out.data(), d.halves.size(), kBf16);
    }
    benchmark::DoNotOptimize(d.out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(Narrow<true, true>)->Name("BFloat16/narrow/bulk")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Narrow<false, true>)->Name("BFloat16/narrow/element_loop")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Widen<true, true>)->Name("BFloat16/widen/bulk")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Widen<false, true>)->Name("BFloat16/widen/element_loop")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Narrow<true, false>)->Name("Float16/narrow/bulk")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Narrow<false, false>)->Name("Float16/narrow/element_loop")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Widen<true, false>)->Name("Float16/widen/bulk")->Arg(1 << 16)->Arg(1 << 20);
BENCHMARK(Widen<false, false>)->Name("Float16/widen/element_loop")->Arg(1 << 16)->Arg(1 << 20);

}  // namespace
}  // namespace matmul

BENCHMARK_MAIN();
