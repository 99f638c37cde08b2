// plan-bench: the host side of the launcher's plan for the Hopper kernel
// (kernels/cuda/hopper_plan.h) on the grouped batches of gemm-bench, without
// a GPU: the per-problem eligibility check (RowsAlignedTo, as the launcher
// asks it of every problem), the cost model's one-pass tally of three tile
// widths, and the whole shape choice.
//
//   plan-bench [--benchmark_filter=Tally] [google-benchmark flags]
//
// The plan is the largest host phase of the 1024-problem batch
// (docs/BENCHMARKS.md, eleventh round), and it lost 9 µs unnoticed when a
// helper stopped being inlined (twenty-fourth round): run this before and
// after changes to hopper_plan.h.
#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/hopper_plan.h"

namespace matmul::cuda {
namespace {

// `count` bf16 problems with dimensions uniform in [lo, hi] (N and K rounded
// up to multiples of 8, as gemm-bench draws them), operands 256-byte aligned.
std::vector<DeviceGemmProblem> Batch(int count, int64_t lo, int64_t hi) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> dim(lo, hi);
  std::vector<DeviceGemmProblem> batch(count);
  uintptr_t at = uintptr_t{1} << 20;
  for (DeviceGemmProblem& p : batch) {
    p.m = dim(rng);
    p.n = (dim(rng) + 7) / 8 * 8;
    p.k = (dim(rng) + 7) / 8 * 8;
    p.lda = p.k;
    p.ldb = p.n;
    p.ldc = p.ldd = p.n;
    p.a = reinterpret_cast<const void*>(at);
    at += (static_cast<uintptr_t>(p.m * p.k * 2) + 255) / 256 * 256;
    p.b = reinterpret_cast<const void*>(at);
    at += (static_cast<uintptr_t>(p.k * p.n * 2) + 255) / 256 * 256;
    p.d = reinterpret_cast<void*>(at);
    at += (static_cast<uintptr_t>(p.m * p.n * 2) + 255) / 256 * 256;
  }
  return batch;
}

// The batches of gemm-bench's grouped rows, by the benchmark's argument.
std::vector<DeviceGemmProblem> GemmBenchBatch(int64_t which) {
  switch (which) {
    case 0: return Batch(1024, 64, 256);
    case 1: return Batch(256, 64, 1024);
    default: return Batch(64, 1024, 4096);
  }
}

void SetLabel(benchmark::State& state, size_t problems) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * problems));
  state.SetLabel(absl::StrCat(problems, " problems"));
}

void BM_RowsAlignedTo(benchmark::State& state) {
  const std::vector<DeviceGemmProblem> batch = GemmBenchBatch(state.range(0));
  for (auto _ : state) {
    int aligned = 0;
    for (const DeviceGemmProblem& p : batch) aligned += RowsAlignedTo(p, DType::kBFloat16, 16);
    benchmark::DoNotOptimize(aligned);
  }
  SetLabel(state, batch.size());
}
BENCHMARK(BM_RowsAlignedTo)->Arg(0)->Arg(1)->Arg(2);

void BM_TallyBatch(benchmark::State& state) {
  const std::vector<DeviceGemmProblem> batch = GemmBenchBatch(state.range(0));
  constexpr std::array<int, 3> kWidths = {kHopperWideN, kHopperNarrowN, kHopperSmallN};
  for (auto _ : state) {
    benchmark::DoNotOptimize(TallyBatch(batch, DType::kBFloat16, kWidths));
  }
  SetLabel(state, batch.size());
}
BENCHMARK(BM_TallyBatch)->Arg(0)->Arg(1)->Arg(2);

void BM_ChooseHopperShape(benchmark::State& state) {
  const std::vector<DeviceGemmProblem> batch = GemmBenchBatch(state.range(0));
  GroupedGemmOptions options;
  options.input = options.output = DType::kBFloat16;
  for (auto _ : state) {
    // An H100's 132 SMs, 66 pairs.
    benchmark::DoNotOptimize(ChooseHopperShape(batch, options, 132, 66));
  }
  SetLabel(state, batch.size());
}
BENCHMARK(BM_ChooseHopperShape)->Arg(0)->Arg(1)->Arg(2);

}  // namespace
}  // namespace matmul::cuda

BENCHMARK_MAIN();
