// The launcher's plan for the Hopper kernel: which tile width a batch runs
// with (128 rows by 256, 128 or 64 columns), whether its wide tiles run in
// pairs of CTAs (2-CTA clusters sharing B), and the split-K tail of a lone
// problem, chosen from a cost model of the persistent grid. Host code only
// (no CUDA calls), so that it is tested without a GPU
// (tests/kernels/cuda/hopper_plan_test.cc); GroupedGemmLauncher::Run
// (grouped_gemm.cc) lays the batch out and launches it as planned.
//
//   // `hopper`: the batch's Hopper problems as the kernel takes them.
//   HopperShape shape = ChooseHopperShape(hopper, options, num_sms, max_clusters);
//   // shape.tile_n, shape.cluster (1 or 2), shape.split (splits > 1: a tail)
#ifndef MATMUL_KERNELS_CUDA_HOPPER_PLAN_H_
#define MATMUL_KERNELS_CUDA_HOPPER_PLAN_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/types/span.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"

namespace matmul::cuda {

// a / b rounded up, for a >= 0 and b > 0.
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// CeilDiv by a power of two `b`, as a shift: the launcher divides by tile
// widths, k-block depths and cluster sizes for every problem of a batch,
// several times over, and a 64-bit division costs tens of cycles.
inline int64_t CeilDivPow2(int64_t a, int64_t b) { return (a + b - 1) >> __builtin_ctzll(b); }

// True when A and B of `p` and every one of their rows start on a multiple
// of `bytes` (elements of `input`). Inline, with a mask where `bytes` is a
// power of two (the launcher asks 16 and 32): the launcher asks it of every
// problem of a batch, and as a call into hopper_plan.cc with two 64-bit
// divisions it was half of the plan of 1024 problems on the development
// machine (docs/BENCHMARKS.md, twenty-fourth round).
inline bool RowsAlignedTo(const DeviceGemmProblem& p, DType input, int64_t bytes) {
  const int64_t size = static_cast<int64_t>(ElementSize(input));
  const uint64_t a = reinterpret_cast<uintptr_t>(p.a), b = reinterpret_cast<uintptr_t>(p.b);
  const uint64_t lda = static_cast<uint64_t>(p.lda * size), ldb = static_cast<uint64_t>(p.ldb * size);
  const uint64_t n = static_cast<uint64_t>(bytes);
  if ((n & (n - 1)) == 0) return ((lda | ldb | a | b) & (n - 1)) == 0;
  return lda % n == 0 && ldb % n == 0 && a % n == 0 && b % n == 0;
}

// Relative rate per FLOP of the narrower tiles (less reuse of each loaded
// byte, shorter wgmma instructions). Fitted to single bf16 problems on the
// H200 (docs/BENCHMARKS.md, split-K round): a wave of 128x128 tiles took
// 0.79x the time of a wave of 128x256 tiles on 2056^3, and 128x64 tiles
// ran 1024^3 at 0.675 of the wide tile's time per k-block; the earlier
// 0.85 and 0.65 chose 128x128 for 2056^3, 18% slower than 128x256.
inline double TileRate(int tile_n) {
  return tile_n == kHopperWideN ? 1.0 : (tile_n == kHopperNarrowN ? 0.65 : 0.37);
}

// Fixed cost of a tile (pipeline fill, epilogue, tile lookup), in the units
// of EstimateHopperTime.
constexpr double kPerTile = 2.0;
// Cost of one 128 x 256 float32 partial tile (128 KiB) of a split tile, in
// the same units: a unit writes one, the last unit reads every unit's.
// Measured on the H200 (docs/BENCHMARKS.md, split-K round) at 5-7 (4 on
// long K), whichever way the last unit sums them, so a split pays only
// where K is long. At 6, TF32 1024^3 took 128x128 tiles split 2 ways
// (estimate 23.3 against 23.6 for unsplit 128x64 tiles), which ran 9%
// slower than the 128x64 tiles on an H100 (2026-12-06, interleaved
// timing); 7 keeps every other measured row's choice.
constexpr double kPerPartial = 7.0;

// Elements of `input` in one k-block (128 bytes of K).
inline int64_t KBlockDepth(DType input) { return 128 / static_cast<int64_t>(ElementSize(input)); }

// k-blocks of `p`.
inline int64_t KBlocks(const DeviceGemmProblem& p, DType input) {
  return CeilDivPow2(p.k, KBlockDepth(input));
}

// Tiles of width `tile_n` (single CTAs) that cover `p`.
inline int64_t HopperTiles(const DeviceGemmProblem& p, int tile_n) {
  return CeilDiv(p.m, kHopperTileM) * CeilDivPow2(p.n, tile_n);
}

// Time of one k-block of a tile of width `tile_n`, in the units of
// EstimateHopperTime.
inline double KBlockCost(int tile_n) { return tile_n / 256.0 / TileRate(tile_n); }

// The split-K tail of a single problem (HopperSplit).
struct SplitPlan {
  int splits = 1;          // Units per split tile; 1: no split.
  int64_t first_tile = 0;  // The first split tile.
  int64_t tiles = 0;       // Split tiles (the problem's last ones).
};

// Problem `p` alone on `num_sms` SMs with tiles of width `tile_n`: its
// estimated time (in the units of EstimateHopperTime) and the split of its
// last, partial wave that gives it. `splits`: 0 lets the estimate choose,
// 1 splits nothing, 2 or more asks for that many units per tile (fewer
// where the problem has fewer k-blocks), splitting the last full wave when
// there is no partial one.
std::pair<double, SplitPlan> PlanSingle(const DeviceGemmProblem& p, DType input, int tile_n,
                                        int num_sms, int splits);

// What EstimateHopperTime needs of a batch of several problems for one
// tile width: its tiles, their summed cost and the costliest one.
struct BatchTally {
  int64_t tiles = 0;
  double work = 0;
  double longest = 0;
  // `work` as pairs of CTAs (2-CTA clusters) would do it: whole pairs of
  // tile-rows, a pair whose second tile lies below its problem costing two.
  double pair_work = 0;
};

// Tallies `problems` for every width of `widths` in one pass. Each width
// walking a large batch on its own cost the launcher's plan a few µs per
// width for 1024 problems (docs/BENCHMARKS.md, eleventh round: the plan is
// the largest host phase of that batch). A tile of `kb` k-blocks costs
// kb * KBlockCost + kPerTile, so the pass sums tiles and tiles times
// k-blocks in local accumulators and prices them once at the end: summing
// each tile's cost into the tallies themselves chained every problem's
// additions through memory (a third of the plan of 1024 problems on the
// development machine).
template <size_t kWidths>
inline std::array<BatchTally, kWidths> TallyBatch(absl::Span<const DeviceGemmProblem> problems,
                                                  DType input,
                                                  const std::array<int, kWidths>& widths) {
  // Per width: tiles and pair tiles (integers), and each times its
  // k-blocks (doubles: a problem of 2^31 rows, columns and k-blocks
  // would overflow 64 bits).
  std::array<int64_t, kWidths> tiles{}, pair_tiles{};
  std::array<double, kWidths> tile_kblocks{}, pair_kblocks{};
  int64_t most_kblocks = -1;
  const int64_t depth = KBlockDepth(input);  // Divided once, not per problem.
  for (const DeviceGemmProblem& p : problems) {
    const int64_t kblocks = CeilDivPow2(p.k, depth);  // KBlocks(p, input)
    const int64_t rows = CeilDiv(p.m, kHopperTileM);
    const int64_t pair_rows = (rows + 1) / 2 * 2;  // A pair's second tile below its problem counts.
    const double kb = static_cast<double>(kblocks);
    most_kblocks = std::max(most_kblocks, kblocks);
    // Unrolled, so that the accumulators stay in registers.
#pragma GCC unroll 4
    for (size_t w = 0; w < kWidths; ++w) {
      const int64_t columns = CeilDivPow2(p.n, widths[w]);
      const int64_t n = rows * columns;  // HopperTiles(p, widths[w])
      tiles[w] += n;
      tile_kblocks[w] += static_cast<double>(n) * kb;
      pair_tiles[w] += pair_rows * columns;
      pair_kblocks[w] += static_cast<double>(pair_rows * columns) * kb;
    }
  }
  std::array<BatchTally, kWidths> tally{};
  for (size_t w = 0; w < kWidths; ++w) {
    const double per_kblock = KBlockCost(widths[w]);
    tally[w].tiles = tiles[w];
    tally[w].work = tile_kblocks[w] * per_kblock + static_cast<double>(tiles[w]) * kPerTile;
    tally[w].pair_work =
        pair_kblocks[w] * per_kblock + static_cast<double>(pair_tiles[w]) * kPerTile;
    tally[w].longest =
        most_kblocks < 0 ? 0.0 : static_cast<double>(most_kblocks) * per_kblock + kPerTile;
  }
  return tally;
}

// Estimated time of the Hopper problems on `num_sms` SMs with tiles of width
// `tile_n`, in units of one 128x256x64 k-block at the wide tile's rate. Each
// tile costs its k-blocks at the width's relative rate plus a fixed
// per-tile cost (pipeline fill, epilogue, tile lookup); the persistent grid
// hands tiles out in order to whichever SM is free, so the estimate is that
// list schedule: exact for one problem (whole waves, or with its last wave
// split when `split_tail` allows: PlanSingle), simulated for small batches,
// and work / SMs plus the longest tile for large ones. `tally`: the batch's
// TallyBatch for `tile_n` (several problems only).
double EstimateHopperTime(absl::Span<const DeviceGemmProblem> problems, DType input, int tile_n,
                          int num_sms, bool split_tail, const BatchTally& tally);

// The least share of a batch's pair work (BatchTally) that is real work for
// the launcher to run it in pairs of CTAs. Measured on an H100
// (docs/BENCHMARKS.md, twenty-second round), pairs against single CTAs,
// bf16 batches: 64 x [1024,4096] (share about 0.98) 34% faster,
// 256 x [64,1024] (about 0.91) 12% faster, 1024 x [64,256] (about 0.83)
// 9% slower.
constexpr double kPairsMinShare = 0.875;

// Whether the launcher runs the wide tiles of `hopper` (a batch with its
// TallyBatch for wide tiles, `wide`) in pairs of CTAs when the options
// leave it the choice: 16-bit problems on the persistent grid whose pairs
// are nearly all whole. A single problem must also have rows of A or B
// that start off 32-byte sectors, at least two waves of single tiles on
// `num_sms` SMs, and no split-K tail asked for (hopper_split_k of 2 or
// more). Measured on an H100 (docs/BENCHMARKS.md, twenty-second round):
// with rows off sectors, the third less that pairs read from L2 pays for
// the quarter more that split sectors cost (3000^3 and 4104^3 31-37%
// faster than single CTAs with their split-K tail; 2056^3, 1.2 waves,
// level). With rows on sectors pairs ran level with single CTAs or a few
// percent slower, and without the split-K tail a problem of about a wave
// (1032 x 4096 x 4096) 20% slower. TF32 was not measured in pairs.
bool PairsPay(absl::Span<const DeviceGemmProblem> hopper, const GroupedGemmOptions& o,
              const BatchTally& wide, int num_sms);

// How the Hopper problems of a batch run: tile width, cluster size and,
// for a batch of one problem, the split-K tail.
struct HopperShape {
  int tile_n = kHopperWideN;
  int cluster = 1;
  SplitPlan split;
};

// The shape for `hopper` (the batch's Hopper problems; options already
// validated): the asked width or the one with the shortest estimate (ties:
// the wider), pairs where asked for or where they pay (PairsPay), and a split tail
// only for a lone problem on the persistent grid of single CTAs that goes
// in the launch parameters (the launcher drops it where the problem's maps
// then cannot be encoded on the host).
HopperShape ChooseHopperShape(absl::Span<const DeviceGemmProblem> hopper,
                              const GroupedGemmOptions& o, int num_sms, int max_clusters);

}  // namespace matmul::cuda

#endif  // MATMUL_KERNELS_CUDA_HOPPER_PLAN_H_
