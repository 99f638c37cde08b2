// The launcher's plan for the Hopper kernel (hopper_plan.h) on the host,
// with no GPU: the batch tally that the cost model prices against a plain
// tile-by-tile sum on fresh random batches, and the choices the model makes
// for the shapes whose choice was measured on an H100 (docs/BENCHMARKS.md:
// tile widths and the split-K tail of single problems, pairs of CTAs for
// batches whose pairs of tile-rows are whole and for single problems whose
// rows start off 32-byte sectors). The GPU tests (grouped_gemm_test:
// ChosenPairs, ChosenTileWidths, SplitKTails) run the same choices.
#include "kernels/cuda/hopper_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace matmul::cuda {
namespace {

constexpr int kSms = 132;       // H100 SXM and H200.
constexpr int kClusters = 66;   // Pairs that fit at once on those.
constexpr uintptr_t kBase = 1 << 20;  // A 256-byte aligned placeholder address.

// A row-major problem m x n x k of `input` elements, A stored m x k and B
// k x n with rows `pad` elements longer than needed; pointers are never
// dereferenced.
DeviceGemmProblem Problem(int64_t m, int64_t n, int64_t k, int64_t pad = 0) {
  DeviceGemmProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = k + pad;
  p.ldb = n + pad;
  p.ldc = p.ldd = n;
  p.a = reinterpret_cast<const void*>(kBase);
  p.b = reinterpret_cast<const void*>(kBase * 64);
  p.d = reinterpret_cast<void*>(kBase * 128);
  return p;
}

GroupedGemmOptions Options(DType input = DType::kBFloat16) {
  GroupedGemmOptions o;
  o.input = input;
  o.output = input;
  if (input == DType::kFloat32) o.precision = Precision::kTF32;
  return o;
}

// TallyBatch sums tiles and tiles times k-blocks and prices them at the end;
// the same tallies summed one tile's cost at a time, from first principles.
TEST(HopperPlanTest, TallyBatchMatchesATileByTileSum) {
  std::mt19937_64 rng(std::random_device{}());
  const std::array<int, 3> widths = {kHopperWideN, kHopperNarrowN, kHopperSmallN};
  for (int trial = 0; trial < 200; ++trial) {
    const DType input = trial % 3 == 0 ? DType::kFloat32 : DType::kBFloat16;
    const int count = 1 + static_cast<int>(rng() % 1024);
    // Mostly small and mid-sized; a few problems of 2^30 in every dimension
    // (the sums must not overflow).
    const int64_t hi = trial % 10 == 9 ? (int64_t{1} << 30) : 1 + static_cast<int64_t>(rng() % 8192);
    std::vector<DeviceGemmProblem> batch;
    for (int i = 0; i < count; ++i) {
      auto dim = [&] { return 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi)); };
      batch.push_back(Problem(dim(), dim(), dim()));
    }
    const std::array<BatchTally, 3> got = TallyBatch(batch, input, widths);
    for (size_t w = 0; w < widths.size(); ++w) {
      const int64_t bk = 128 / static_cast<int64_t>(ElementSize(input));
      int64_t tiles = 0;
      double work = 0, pair_work = 0, longest = 0;
      for (const DeviceGemmProblem& p : batch) {
        const int64_t rows = (p.m + 127) / 128;
        const int64_t columns = (p.n + widths[w] - 1) / widths[w];
        const int64_t kblocks = (p.k + bk - 1) / bk;
        const double cost = static_cast<double>(kblocks) * KBlockCost(widths[w]) + kPerTile;
        tiles += rows * columns;
        work += static_cast<double>(rows * columns) * cost;
        pair_work += static_cast<double>((rows + 1) / 2 * 2 * columns) * cost;
        longest = std::max(longest, cost);
      }
      const std::string what = "trial " + std::to_string(trial) + " width " +
                               std::to_string(widths[w]) + " problems " + std::to_string(count);
      EXPECT_EQ(got[w].tiles, tiles) << what;
      EXPECT_NEAR(got[w].work, work, 1e-12 * work) << what;
      EXPECT_NEAR(got[w].pair_work, pair_work, 1e-12 * pair_work) << what;
      EXPECT_EQ(got[w].longest, longest) << what;
      EXPECT_GE(got[w].pair_work, got[w].work) << what;
    }
  }
  const std::array<BatchTally, 3> none = TallyBatch({}, DType::kBFloat16, widths);
  for (const BatchTally& t : none) {
    EXPECT_EQ(t.tiles, 0);
    EXPECT_EQ(t.work, 0);
    EXPECT_EQ(t.longest, 0);
  }
}

// Single bf16 problems whose shapes the headline benchmark runs, with the
// tiles the model chose there (docs/BENCHMARKS.md, "Kernels now").
TEST(HopperPlanTest, SingleProblemsTakeTheMeasuredTiles) {
  struct Case {
    int64_t m, n, k;
    int tile_n, splits, split_tiles;
  };
  for (const Case& c : {Case{1024, 1024, 1024, kHopperSmallN, 1, 0},
                        Case{2048, 2048, 2048, kHopperWideN, 1, 0},
                        Case{4096, 4096, 4096, kHopperWideN, 1, 0},
                        Case{8192, 8192, 8192, kHopperWideN, 1, 0},
                        Case{4096, 11008, 4096, kHopperWideN, 2, 56}}) {
    const DeviceGemmProblem p = Problem(c.m, c.n, c.k);
    const HopperShape shape = ChooseHopperShape({&p, 1}, Options(), kSms, kClusters);
    const std::string what = std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
                             std::to_string(c.k);
    EXPECT_EQ(shape.tile_n, c.tile_n) << what;
    EXPECT_EQ(shape.cluster, 1) << what;
    EXPECT_EQ(shape.split.splits, c.splits) << what;
    EXPECT_EQ(shape.split.tiles, c.split_tiles) << what;
    if (c.splits > 1) {
      EXPECT_EQ(shape.split.first_tile, HopperTiles(p, c.tile_n) - c.split_tiles) << what;
    }
  }
}

// One problem: the estimate is the exact list schedule of whole waves.
TEST(HopperPlanTest, EstimateOfOneProblemCountsWaves) {
  // 2 x 2 tiles of 128 x 256, 4 k-blocks each: one wave.
  const DeviceGemmProblem small = Problem(256, 512, 256);
  EXPECT_DOUBLE_EQ(EstimateHopperTime({&small, 1}, DType::kBFloat16, kHopperWideN, kSms,
                                      /*split_tail=*/false, BatchTally()),
                   4 * KBlockCost(kHopperWideN) + kPerTile);
  // 32 x 16 = 512 tiles of 8 k-blocks on 132 SMs: four waves.
  const DeviceGemmProblem large = Problem(4096, 4096, 512);
  EXPECT_DOUBLE_EQ(EstimateHopperTime({&large, 1}, DType::kBFloat16, kHopperWideN, kSms,
                                      /*split_tail=*/false, BatchTally()),
                   4 * (8 * KBlockCost(kHopperWideN) + kPerTile));
}

// Pairs of CTAs where the launcher has the choice (hopper_cluster 0): a
// batch of several 16-bit problems whose tile-rows pair up runs in pairs; a
// batch of one-tile-row problems does not (half of each pair would be
// empty); nor do TF32 batches (not measured in pairs), the one-CTA-per-tile
// grid, or narrower tiles.
TEST(HopperPlanTest, PairsForBatchesWhosePairsAreWhole) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<DeviceGemmProblem> even, short_rows;
  for (int i = 0; i < 64; ++i) {
    // An even number of tile-rows, N and K multiples of 8.
    even.push_back(Problem(256 * (1 + static_cast<int64_t>(rng() % 16)),
                           8 * (128 + static_cast<int64_t>(rng() % 384)),
                           8 * (128 + static_cast<int64_t>(rng() % 384))));
    short_rows.push_back(Problem(1 + static_cast<int64_t>(rng() % 128),
                                 8 * (64 + static_cast<int64_t>(rng() % 64)), 512));
  }
  for (DType in : {DType::kBFloat16, DType::kFloat16}) {
    const HopperShape shape = ChooseHopperShape(even, Options(in), kSms, kClusters);
    EXPECT_EQ(shape.tile_n, kHopperWideN) << DTypeName(in);
    EXPECT_EQ(shape.cluster, 2) << DTypeName(in);
    EXPECT_EQ(ChooseHopperShape(short_rows, Options(in), kSms, kClusters).cluster, 1)
        << DTypeName(in);
  }
  EXPECT_EQ(ChooseHopperShape(even, Options(DType::kFloat32), kSms, kClusters).cluster, 1);
  GroupedGemmOptions o = Options();
  o.family = KernelFamily::kNonPersistent;
  EXPECT_EQ(ChooseHopperShape(even, o, kSms, kClusters).cluster, 1);
  o = Options();
  o.hopper_tile_n = kHopperNarrowN;
  EXPECT_EQ(ChooseHopperShape(even, o, kSms, kClusters).cluster, 1);
  // No clusters fit (max_clusters 0): single CTAs even where asked for.
  o = Options();
  o.hopper_cluster = 2;
  o.hopper_tile_n = kHopperWideN;  // Only wide tiles run in pairs.
  EXPECT_EQ(ChooseHopperShape(even, o, kSms, 0).cluster, 1);
  // Asked for: pairs, and single CTAs.
  EXPECT_EQ(ChooseHopperShape(short_rows, o, kSms, kClusters).cluster, 2);
  o.hopper_cluster = 1;
  EXPECT_EQ(ChooseHopperShape(even, o, kSms, kClusters).cluster, 1);
}

// A single 16-bit problem runs in pairs only where its rows start off
// 32-byte sectors and it has two waves of single tiles or more, and no
// split was asked for (docs/BENCHMARKS.md, twenty-second round, call D).
TEST(HopperPlanTest, PairsForSingleProblemsWithRowsOffSectors) {
  struct Case {
    DeviceGemmProblem p;
    int split_k;
    int cluster;
    const char* what;
  };
  DeviceGemmProblem shifted = Problem(4096, 4096, 4096);
  shifted.a = reinterpret_cast<const void*>(kBase + 16);  // A's rows 16 bytes off.
  for (const Case& c : {Case{Problem(3000, 3000, 3000), 0, 2, "3000^3: rows 6000 B apart"},
                        Case{Problem(4104, 4104, 4104), 0, 2, "4104^3: rows 8208 B apart"},
                        Case{Problem(2056, 2056, 2056), 0, 1, "2056^3: 1.2 waves"},
                        Case{Problem(1032, 4096, 4096), 0, 1, "1032x4096x4096: on sectors"},
                        Case{Problem(4096, 4096, 4096), 0, 1, "4096^3: on sectors"},
                        Case{shifted, 0, 2, "4096^3 with A 16 bytes off"},
                        Case{Problem(3000, 3000, 3000), 2, 1, "3000^3, split asked for"}}) {
    GroupedGemmOptions o = Options();
    o.hopper_split_k = c.split_k;
    const HopperShape shape = ChooseHopperShape({&c.p, 1}, o, kSms, kClusters);
    EXPECT_EQ(shape.cluster, c.cluster) << c.what;
    if (shape.cluster == 2) EXPECT_EQ(shape.split.splits, 1) << c.what << ": pairs never split";
  }
}

// Options the model must follow as given.
TEST(HopperPlanTest, AskedWidthsSplitsAndPingPong) {
  const DeviceGemmProblem p = Problem(4096, 11008, 4096);
  for (int width : {kHopperWideN, kHopperNarrowN, kHopperSmallN}) {
    GroupedGemmOptions o = Options();
    o.hopper_tile_n = width;
    EXPECT_EQ(ChooseHopperShape({&p, 1}, o, kSms, kClusters).tile_n, width);
  }
  GroupedGemmOptions o = Options();
  o.hopper_split_k = 1;  // Never split.
  EXPECT_EQ(ChooseHopperShape({&p, 1}, o, kSms, kClusters).split.splits, 1);
  o.hopper_split_k = 3;
  EXPECT_EQ(ChooseHopperShape({&p, 1}, o, kSms, kClusters).split.splits, 3);
  // More splits than k-blocks: as many as there are.
  const DeviceGemmProblem short_k = Problem(4096, 11008, 128);
  EXPECT_EQ(ChooseHopperShape({&short_k, 1}, o, kSms, kClusters).split.splits, 2);
  // Batches of several problems never split.
  const std::vector<DeviceGemmProblem> two = {p, p};
  EXPECT_EQ(ChooseHopperShape(two, o, kSms, kClusters).split.splits, 1);
  o = Options();
  o.hopper_pingpong = true;
  const HopperShape ping = ChooseHopperShape({&p, 1}, o, kSms, kClusters);
  EXPECT_EQ(ping.tile_n, kHopperNarrowN);
  EXPECT_EQ(ping.cluster, 1);
  EXPECT_EQ(ping.split.splits, 1);
}

TEST(HopperPlanTest, RowsAlignedTo) {
  DeviceGemmProblem p = Problem(100, 3000, 3000);  // bf16 rows of 6000 bytes.
  EXPECT_TRUE(RowsAlignedTo(p, DType::kBFloat16, 16));
  EXPECT_FALSE(RowsAlignedTo(p, DType::kBFloat16, 32));
  EXPECT_TRUE(RowsAlignedTo(p, DType::kFloat32, 32));  // 12000 bytes.
  p.b = reinterpret_cast<const void*>(kBase + 8);
  EXPECT_FALSE(RowsAlignedTo(p, DType::kFloat32, 16));
  p = Problem(100, 100, 100, /*pad=*/4);  // 208-byte bf16 rows.
  EXPECT_TRUE(RowsAlignedTo(p, DType::kBFloat16, 16));
  EXPECT_FALSE(RowsAlignedTo(p, DType::kBFloat16, 32));
}

// The mask it takes for powers of two gives what each operand's address and
// row pitch modulo `bytes` say, on fresh random problems, for the widths the
// launcher asks and for one that is not a power of two.
TEST(HopperPlanTest, RowsAlignedToAgreesWithDivision) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> ld(1, 1 << 20), offset(0, 255);
  for (int i = 0; i < 20000; ++i) {
    DeviceGemmProblem p = Problem(64, 64, 64);
    p.lda = ld(rng);
    p.ldb = ld(rng);
    // Mostly aligned addresses and pitches, so that both answers occur.
    if (rng() % 2) p.lda = (p.lda + 15) / 16 * 16;
    if (rng() % 2) p.ldb = (p.ldb + 15) / 16 * 16;
    p.a = reinterpret_cast<const void*>(kBase + (rng() % 2 ? 0 : offset(rng)));
    p.b = reinterpret_cast<const void*>(kBase + 4096 + (rng() % 2 ? 0 : offset(rng)));
    for (DType input : {DType::kBFloat16, DType::kFloat32}) {
      const int64_t size = static_cast<int64_t>(ElementSize(input));
      for (int64_t bytes : {16, 32, 24}) {
        const bool want = (p.lda * size) % bytes == 0 && (p.ldb * size) % bytes == 0 &&
                          reinterpret_cast<uintptr_t>(p.a) % bytes == 0 &&
                          reinterpret_cast<uintptr_t>(p.b) % bytes == 0;
        ASSERT_EQ(RowsAlignedTo(p, input, bytes), want)
            << "lda " << p.lda << " ldb " << p.ldb << " a " << p.a << " b " << p.b << " bytes "
            << bytes << " " << DTypeName(input);
      }
    }
  }
}

}  // namespace
}  // namespace matmul::cuda
