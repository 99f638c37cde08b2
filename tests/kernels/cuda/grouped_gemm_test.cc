// The grouped GEMM kernels on a real GPU against a float64 reference.
// Without a GPU every test skips with a message.
#include "kernels/cuda/grouped_gemm.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/cuda/kernels.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace matmul::cuda {
namespace {

using testing::CheckAgainstReference;
using testing::DeviceBatch;
using testing::HostProblem;
using testing::MakeHostProblem;

class GroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MATMUL_REQUIRE_GPU();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto launcher = GroupedGemmLauncher::Create(0);
    ASSERT_TRUE(launcher.ok()) << launcher.status();
    launcher_ = *std::move(launcher);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Runs `host` as one batch and checks every problem; returns the report.
  LaunchReport RunAndCheck(const std::vector<HostProblem>& host, DType in, DType out,
                           Precision precision = Precision::kDefault,
                           KernelFamily family = KernelFamily::kPersistent, size_t samples = 0,
                           const std::string& what = "") {
    DeviceBatch batch(host, in, out);
    GroupedGemmOptions o;
    o.input = in;
    o.output = out;
    o.precision = precision;
    o.family = family;
    o.hopper_tile_n = tile_n_;
    o.hopper_cluster = cluster_;
    o.hopper_inline_problems = inline_;
    o.hopper_split_k = split_k_;
    o.hopper_edge_tiles = edge_tiles_;
    o.hopper_pingpong = pingpong_;
    o.hopper_tf32_register_a = tf32_register_a_;
    o.simt_tile = simt_tile_;
    o.cublas_min_flops = cublas_min_flops_;
    LaunchReport report;
    Run(batch, o, &report);
    const double bound = ErrorBound(in, out, precision);
    for (size_t i = 0; i < host.size(); ++i) {
      const double err = CheckAgainstReference(host[i], batch.Download(i), in, out, samples);
      EXPECT_LE(err, bound) << what << " problem " << i << ": " << host[i].m << "x" << host[i].n
                            << "x" << host[i].k << " ta=" << host[i].transpose_a
                            << " tb=" << host[i].transpose_b << " " << DTypeName(in) << "->"
                            << DTypeName(out);
    }
    return report;
  }

  void Run(DeviceBatch& batch, const GroupedGemmOptions& o, LaunchReport* report) {
    const size_t bytes = launcher_->WorkspaceBytes(batch.problems(), o);
    if (bytes > workspace_bytes_) {
      if (workspace_ != nullptr) cudaFree(workspace_);
      ASSERT_EQ(cudaMalloc(&workspace_, bytes), cudaSuccess);
      workspace_bytes_ = bytes;
    }
    const absl::Status s = launcher_->Run(batch.problems(), o, workspace_, workspace_bytes_, stream_, report);
    ASSERT_TRUE(s.ok()) << s;
    const cudaError_t e = cudaStreamSynchronize(stream_);
    ASSERT_EQ(e, cudaSuccess) << CudaErrorString(e);
  }

  // Runs `batch` once (filling `first_report` when given) and checks every
  // result against the float64 reference within `bound`, then `repeats`
  // more times, each on a poisoned output: every launch must give the first
  // one's bits (a race in the tile hand-out, the pipeline or a counter left
  // behind moves or poisons a result). `what` names the case in messages.
  void ExpectRepeatsBitIdentical(DeviceBatch& batch, const std::vector<HostProblem>& host,
                                 const GroupedGemmOptions& o, int repeats, double bound,
                                 const std::string& what, LaunchReport* first_report = nullptr) {
    Run(batch, o, first_report);
    std::vector<std::vector<uint8_t>> first;
    for (size_t i = 0; i < host.size(); ++i) {
      first.push_back(batch.Download(i));
      EXPECT_LE(CheckAgainstReference(host[i], first.back(), o.input, o.output), bound)
          << what << " problem " << i;
    }
    for (int rep = 0; rep < repeats; ++rep) {
      ASSERT_TRUE(batch.Poison());
      Run(batch, o, nullptr);
      for (size_t i = 0; i < host.size(); ++i) {
        ASSERT_EQ(batch.Download(i), first[i])
            << what << " problem " << i << " moved at launch " << rep + 2;
      }
    }
  }

  std::mt19937_64 rng_{std::random_device{}()};
  // Hopper tile width RunAndCheck asks for (0: the launcher's choice).
  int tile_n_ = 0;
  // CTAs per cluster RunAndCheck asks for (0: the launcher's choice).
  int cluster_ = 0;
  // Largest batch RunAndCheck lets go in the launch parameters (-1: the
  // launcher's limit).
  int inline_ = -1;
  // GroupedGemmOptions::hopper_split_k for RunAndCheck (0: the launcher's choice).
  int split_k_ = 0;
  // GroupedGemmOptions::hopper_edge_tiles for RunAndCheck (default: the
  // launcher's).
  bool edge_tiles_ = GroupedGemmOptions().hopper_edge_tiles;
  // GroupedGemmOptions::hopper_pingpong for RunAndCheck.
  bool pingpong_ = false;
  // GroupedGemmOptions::hopper_tf32_register_a for RunAndCheck.
  bool tf32_register_a_ = GroupedGemmOptions().hopper_tf32_register_a;
  // GroupedGemmOptions::simt_tile for RunAndCheck (0: the launcher's choice).
  int simt_tile_ = 0;
  // GroupedGemmOptions::cublas_min_flops for RunAndCheck (0: exact float32
  // of any size stays on the SIMT kernel).
  double cublas_min_flops_ = GroupedGemmOptions().cublas_min_flops;
  std::unique_ptr<GroupedGemmLauncher> launcher_;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

struct TypeCase {
  DType in, out;
  Precision precision;
};

const TypeCase kTypes[] = {
    {DType::kBFloat16, DType::kBFloat16, Precision::kDefault},
    {DType::kFloat16, DType::kFloat16, Precision::kDefault},
    {DType::kFloat32, DType::kFloat32, Precision::kTF32},
    {DType::kFloat32, DType::kFloat32, Precision::kDefault},
    {DType::kFloat64, DType::kFloat64, Precision::kDefault},
};

TEST_F(GroupedGemmTest, SquareSizesEveryDType) {
  for (const TypeCase& t : kTypes) {
    for (int64_t s : {64, 128, 256, 512, 1024, 2048}) {
      if (t.in == DType::kFloat64 && s > 1024) continue;
      RunAndCheck({MakeHostProblem(s, s, s, t.in, t.out, rng_)}, t.in, t.out, t.precision,
                  KernelFamily::kPersistent, 0, absl::StrCat("square ", s));
    }
  }
}

TEST_F(GroupedGemmTest, LargeSquaresSampled) {
  for (const TypeCase& t : {kTypes[0], kTypes[1], kTypes[2]}) {
    for (int64_t s : {4096, 8192}) {
      RunAndCheck({MakeHostProblem(s, s, s, t.in, t.out, rng_)}, t.in, t.out, t.precision,
                  KernelFamily::kPersistent, 4096, absl::StrCat("square ", s));
    }
  }
}

TEST_F(GroupedGemmTest, SkinnyProblems) {
  for (const TypeCase& t : kTypes) {
    if (t.in == DType::kFloat64) continue;
    for (int64_t m : {1, 16, 128}) {
      RunAndCheck({MakeHostProblem(m, 4096, 4096, t.in, t.out, rng_)}, t.in, t.out, t.precision,
                  KernelFamily::kPersistent, 0, absl::StrCat("skinny m=", m));
    }
  }
}

TEST_F(GroupedGemmTest, OddShapesTransposesAndScalars) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1, 1}, {1, 4097, 3}, {333, 1, 777}, {1000, 1000, 1000}, {17, 33, 65}, {130, 260, 72}};
  for (const TypeCase& t : kTypes) {
    std::vector<HostProblem> batch;
    for (const auto& s : shapes) {
      for (int v = 0; v < 4; ++v) {
        batch.push_back(MakeHostProblem(s[0], s[1], s[2], t.in, t.out, rng_, v & 1, v & 2,
                                        v == 3 ? -0.75 : 1.5, v >= 2 ? 0.5 : 0.0));
      }
    }
    RunAndCheck(batch, t.in, t.out, t.precision, KernelFamily::kPersistent, 0,
                absl::StrCat("odd ", DTypeName(t.in)));
  }
}

// TF32 operands stored MN-major, both ways (hopper_tf32_register_a): read
// through registers (A) or as the A of D^T = B^T A^T (B), or copied K-major
// before the launch into rows padded to 16 bytes. Every stored layout, with
// and without padding of the caller's own rows (widths that are not
// multiples of 4 either way: unaligned rows are copied on the register
// path too).
TEST_F(GroupedGemmTest, Tf32EveryStoredLayoutBothWays) {
  const std::vector<std::array<int64_t, 3>> shapes = {{37, 45, 70}, {130, 6, 33}, {1, 1027, 5}};
  std::vector<HostProblem> batch;
  for (const auto& s : shapes) {
    const int64_t pad_m = (4 - s[0] % 4) % 4, pad_n = (4 - s[1] % 4) % 4;
    for (int v = 0; v < 4; ++v) {
      for (bool padded : {false, true}) {
        batch.push_back(MakeHostProblem(s[0], s[1], s[2], DType::kFloat32, DType::kFloat32, rng_,
                                        v & 1, v & 2, 1.25, v == 3 ? 0.5 : 0.0,
                                        padded && (v & 1) ? pad_m : 0,
                                        padded && !(v & 2) ? pad_n : 0));
      }
    }
  }
  // Both ways take the same problems to the Hopper kernel (those whose
  // K-major operands have aligned rows; the others go to the SIMT kernel).
  int hopper_problems[2] = {0, 0};
  for (bool register_a : {true, false}) {
    tf32_register_a_ = register_a;
    const LaunchReport report =
        RunAndCheck(batch, DType::kFloat32, DType::kFloat32, Precision::kTF32,
                    KernelFamily::kPersistent, 0,
                    register_a ? "TF32 through registers" : "TF32 copies");
    hopper_problems[register_a] = report.hopper_problems;
  }
  if (launcher_->has_hopper_kernels()) {
    EXPECT_GT(hopper_problems[1], 0);
    EXPECT_EQ(hopper_problems[1], hopper_problems[0]);
  }
  tf32_register_a_ = GroupedGemmOptions().hopper_tf32_register_a;
}

// The register path copies nothing where the rows are aligned, except a B
// stored k x n beside an A stored k x m: one launch for a batch of the
// other three layouts, against one more (the copies) with the copies way;
// multi-tile problems of every tile width, on both grids, with C (the
// register epilogue, writing D transposed for a B stored k x n) and
// without (TMA stores, transposed), and with D's rows not 16-byte aligned.
TEST_F(GroupedGemmTest, Tf32RegisterPathLargeAndOdd) {
  if (!launcher_->has_hopper_kernels()) GTEST_SKIP() << "no sm_90a GPU: no TF32 register path";
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    double beta;
    int64_t pad_b;  // Extra elements in each stored row of B.
  };
  // Rows of A and B stay 16-byte aligned; D's rows do but for the last two
  // problems (n = 518; the first of them pads B's rows to 520).
  const Case cases[] = {{300, 520, 200, false, false, 0.0, 0}, {300, 520, 200, false, false, 0.5, 0},
                        {260, 384, 96, true, true, 0.0, 0},    {260, 384, 96, true, true, -1.0, 0},
                        {1000, 1032, 1000, false, true, 0.0, 0}, {520, 300, 64, false, false, 0.0, 0},
                        {64, 2048, 512, true, true, 0.0, 0},   {515, 518, 132, false, false, 0.0, 2},
                        {516, 518, 132, true, true, 0.25, 0}};
  for (KernelFamily family : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
    for (int width : {256, 128, 64}) {
      tile_n_ = width;
      std::vector<HostProblem> batch;
      for (const Case& c : cases) {
        batch.push_back(MakeHostProblem(c.m, c.n, c.k, DType::kFloat32, DType::kFloat32, rng_,
                                        c.ta, c.tb, 1.5, c.beta, 0, c.pad_b));
      }
      for (bool register_a : {true, false}) {
        tf32_register_a_ = register_a;
        const std::string what = absl::StrCat("width ", width, register_a ? " registers" : " copies",
                                              family == KernelFamily::kPersistent ? " persistent"
                                                                                  : " one CTA/tile");
        const LaunchReport report = RunAndCheck(batch, DType::kFloat32, DType::kFloat32,
                                                Precision::kTF32, family, 0, what);
        EXPECT_EQ(report.hopper_problems, static_cast<int>(batch.size())) << what;
        EXPECT_EQ(report.launches, register_a ? 1 : 2) << what;
      }
    }
  }
  // Both operands stored MN-major: B alone is copied.
  tf32_register_a_ = true;
  tile_n_ = 0;
  const LaunchReport report = RunAndCheck(
      {MakeHostProblem(400, 300, 200, DType::kFloat32, DType::kFloat32, rng_, true, false, 1.0, 0.5)},
      DType::kFloat32, DType::kFloat32, Precision::kTF32, KernelFamily::kPersistent, 0,
      "A k x m, B k x n");
  EXPECT_EQ(report.launches, 2);
  tf32_register_a_ = GroupedGemmOptions().hopper_tf32_register_a;
}

// A batch's TF32 copies go in a few launches (kTransposesPerLaunch matrices
// each), not one an operand: 70 problems with both operands stored
// MN-major make 140 copies with the copies way, in 5 launches, then the
// Hopper kernel's; 70 (B only) on the register path.
TEST_F(GroupedGemmTest, Tf32CopiesOfABatchTakeFewLaunches) {
  std::uniform_int_distribution<int64_t> dim(1, 40);
  std::vector<HostProblem> batch;
  for (int i = 0; i < 70; ++i) {
    // Multiples of 4 keep the stored rows 16-byte aligned (Hopper path).
    batch.push_back(MakeHostProblem(4 * dim(rng_), 4 * dim(rng_), 4 * dim(rng_), DType::kFloat32,
                                    DType::kFloat32, rng_, true, false, 1.0, i % 3 == 0 ? 0.5 : 0.0));
  }
  for (bool register_a : {false, true}) {
    tf32_register_a_ = register_a;
    const LaunchReport report = RunAndCheck(batch, DType::kFloat32, DType::kFloat32,
                                            Precision::kTF32, KernelFamily::kPersistent, 0,
                                            "70 TF32 problems stored MN-major");
    if (!launcher_->has_hopper_kernels()) break;
    EXPECT_EQ(report.hopper_problems, 70);
    const int copies = register_a ? 70 : 140;
    EXPECT_EQ(report.launches, (copies + kTransposesPerLaunch - 1) / kTransposesPerLaunch + 1)
        << register_a;
  }
  tf32_register_a_ = GroupedGemmOptions().hopper_tf32_register_a;
}

TEST_F(GroupedGemmTest, OutputTypes) {
  for (DType in : {DType::kBFloat16, DType::kFloat16}) {
    for (DType out : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      std::vector<HostProblem> batch = {MakeHostProblem(300, 200, 100, in, out, rng_, false, false, 1, 0.25),
                                        MakeHostProblem(64, 520, 128, in, out, rng_, true, true)};
      RunAndCheck(batch, in, out);
    }
  }
}

TEST_F(GroupedGemmTest, UnalignedRowsTakeTheSimtPath) {
  std::vector<HostProblem> batch = {
      MakeHostProblem(100, 90, 80, DType::kBFloat16, DType::kBFloat16, rng_, false, false, 1, 0, 1, 3),
      MakeHostProblem(64, 64, 64, DType::kBFloat16, DType::kBFloat16, rng_)};
  const LaunchReport report = RunAndCheck(batch, DType::kBFloat16, DType::kBFloat16);
  if (launcher_->has_hopper_kernels()) {
    EXPECT_EQ(report.simt_problems, 1);
    EXPECT_EQ(report.hopper_problems, 1);
  }
}

std::vector<HostProblem> MixedBatch(int count, int max_dim, DType in, DType out,
                                    std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> dim(1, max_dim);
  std::vector<HostProblem> batch;
  for (int i = 0; i < count; ++i) {
    batch.push_back(MakeHostProblem(dim(rng), dim(rng), dim(rng), in, out, rng, rng() % 2,
                                    rng() % 2, 1.0, rng() % 4 == 0 ? 1.0 : 0.0));
  }
  return batch;
}

TEST_F(GroupedGemmTest, GroupedBatchesOfManySizes) {
  for (int count : {1, 7, 256, 1024}) {
    const int max_dim = count >= 256 ? 160 : 700;
    const LaunchReport report =
        RunAndCheck(MixedBatch(count, max_dim, DType::kBFloat16, DType::kBFloat16, rng_),
                    DType::kBFloat16, DType::kBFloat16, Precision::kDefault,
                    KernelFamily::kPersistent, 0, absl::StrCat("batch of ", count));
    if (launcher_->has_hopper_kernels()) EXPECT_LE(report.launches, 2) << "batch of " << count;
  }
}

TEST_F(GroupedGemmTest, AllFamiliesAgree) {
  for (const TypeCase& t : kTypes) {
    const auto batch = MixedBatch(24, 300, t.in, t.out, rng_);
    for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent, KernelFamily::kCublas}) {
      RunAndCheck(batch, t.in, t.out, t.precision, f, 0,
                  absl::StrCat("family ", static_cast<int>(f), " ", DTypeName(t.in)));
    }
  }
}

// Every tile width the Hopper kernel has, on odd shapes, transposes, alpha
// and beta, in both grid modes; the batch has more tiles than SMs, of
// unequal depth, so the persistent grid hands most of them out from its
// tile counter.
TEST_F(GroupedGemmTest, EveryTileWidthBothGrids) {
  for (const TypeCase& t : {kTypes[0], kTypes[1], kTypes[2]}) {
    std::vector<HostProblem> batch;
    const std::vector<std::array<int64_t, 3>> shapes = {
        {1, 1, 1}, {333, 1, 777}, {130, 260, 72}, {700, 900, 40}, {1000, 1000, 1000}, {64, 64, 2000}};
    for (const auto& s : shapes) {
      for (int v = 0; v < 4; ++v) {
        batch.push_back(MakeHostProblem(s[0], s[1], s[2], t.in, t.out, rng_, v & 1, v & 2,
                                        v == 3 ? -0.75 : 1.5, v >= 2 ? 0.5 : 0.0));
      }
    }
    for (auto [width, cluster] : {std::pair{256, 1}, std::pair{256, 2}, std::pair{128, 1},
                                  std::pair{64, 1}}) {
      tile_n_ = width;
      cluster_ = cluster;
      for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
        const LaunchReport report =
            RunAndCheck(batch, t.in, t.out, t.precision, f, 0,
                        absl::StrCat("width ", width, " cluster ", cluster, " family ",
                                     static_cast<int>(f), " ", DTypeName(t.in)));
        if (launcher_->has_hopper_kernels()) {
          EXPECT_EQ(report.hopper_tile,
                    absl::StrCat("128x", width, cluster == 2 ? " x2 cluster" : ""));
        }
      }
    }
  }
  tile_n_ = 0;
  cluster_ = 0;
}

// Small batches travel in the launch's parameters (problems, tile offsets
// and tensor maps encoded on the host); the same batches through the table
// in device memory, every tile width, both grids, odd shapes, transposes,
// alpha and beta; a batch one over the limit always takes the table.
TEST_F(GroupedGemmTest, BatchesInTheLaunchParameters) {
  // Every dimension a multiple of 8, so that every layout is 16-byte aligned
  // and the whole batch goes to the Hopper kernel; sizes off the tile grid.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {8, 8, 8}, {336, 8, 776}, {136, 264, 72}, {704, 904, 40}, {24, 40, 64}, {296, 520, 200}};
  for (const TypeCase& t : {kTypes[0], kTypes[1], kTypes[2]}) {
    for (int count : {1, 5, kHopperInlineProblems, kHopperInlineProblems + 1}) {
      std::vector<HostProblem> batch;
      for (int i = 0; i < count; ++i) {
        const auto& s = shapes[i % shapes.size()];
        const int v = (i / static_cast<int>(shapes.size()) + i) % 4;
        batch.push_back(MakeHostProblem(s[0], s[1], s[2], t.in, t.out, rng_, v & 1, v & 2,
                                        v == 3 ? -0.75 : 1.5, v >= 2 ? 0.5 : 0.0));
      }
      for (auto [width, cluster] : {std::pair{0, 0}, std::pair{256, 2}, std::pair{128, 1},
                                    std::pair{64, 1}}) {
        for (int limit : {-1, 0}) {
          tile_n_ = width;
          cluster_ = cluster;
          inline_ = limit;
          const KernelFamily family =
              width == 128 ? KernelFamily::kNonPersistent : KernelFamily::kPersistent;
          const std::string what = absl::StrCat(DTypeName(t.in), " batch of ", count, " width ",
                                                width, " cluster ", cluster, " inline ", limit);
          const LaunchReport report =
              RunAndCheck(batch, t.in, t.out, t.precision, family, 0, what);
          if (launcher_->has_hopper_kernels()) {
            EXPECT_EQ(report.hopper_problems, count) << what;
            EXPECT_EQ(report.hopper_inline, limit != 0 && count <= kHopperInlineProblems)
                << what;
          }
        }
      }
    }
  }
  tile_n_ = 0;
  cluster_ = 0;
  inline_ = -1;
}

// Batches in the launch parameters reuse one pair of tile counters per
// stream, which each grid sets back to zero when it is done: hundreds of
// such launches in a row (more tiles than SMs, so the counter hands most of
// them out; for pairs of CTAs, rank 0 claims and sends each unit to rank 1),
// with table launches between them, give the same result every time. A
// counter left non-zero would leave tiles unwritten (poisoned).
TEST_F(GroupedGemmTest, RepeatedLaunchesInTheParameters) {
  if (!launcher_->has_hopper_kernels()) GTEST_SKIP() << "no sm_90a GPU: nothing in parameters";
  const std::vector<HostProblem> host = {
      MakeHostProblem(1536, 1024, 64, DType::kBFloat16, DType::kBFloat16, rng_),
      MakeHostProblem(200, 3000, 130, DType::kBFloat16, DType::kBFloat16, rng_, true, true, 0.5),
      // 128 pairs of wide tiles: more than the clusters that fit at once, so
      // that pairs claim units from the counter too.
      MakeHostProblem(2048, 4096, 64, DType::kBFloat16, DType::kBFloat16, rng_)};
  DeviceBatch batch(host, DType::kBFloat16, DType::kBFloat16);
  GroupedGemmOptions o;
  const int widths[] = {64, 128, 0, 256};
  const int clusters[] = {1, 1, 0, 2};
  std::vector<std::vector<uint8_t>> first[4];
  for (int rep = 0; rep < 300; ++rep) {
    const int w = rep % 4;
    o.hopper_tile_n = widths[w];
    o.hopper_cluster = clusters[w];
    o.hopper_inline_problems = rep % 5 == 4 ? 0 : -1;  // Every variant through a table too.
    ASSERT_TRUE(batch.Poison());
    LaunchReport report;
    Run(batch, o, &report);
    ASSERT_EQ(report.hopper_inline, rep % 5 != 4);
    for (size_t i = 0; i < host.size(); ++i) {
      std::vector<uint8_t> d = batch.Download(i);
      if (first[w].size() <= i) {
        EXPECT_LE(CheckAgainstReference(host[i], d, o.input, o.output), 1e-2)
            << "width " << widths[w] << " cluster " << clusters[w] << " problem " << i;
        first[w].push_back(std::move(d));
      } else {
        ASSERT_EQ(d, first[w][i]) << "launch " << rep << " (width " << widths[w] << ", cluster "
                                  << clusters[w] << ", inline " << o.hopper_inline_problems
                                  << ") problem " << i
                                  << " differs from the first";
      }
    }
  }
}

// Pairs of tiles in 2-CTA clusters on large problems: odd tile-row counts
// (the pair's second tile lies below the problem), every layout, and more
// pairs than clusters fit at once.
TEST_F(GroupedGemmTest, ClusterPairsLargeAndOdd) {
  cluster_ = 2;
  tile_n_ = 256;
  for (const TypeCase& t : {kTypes[0], kTypes[2]}) {
    std::vector<HostProblem> batch;
    for (int v = 0; v < 4; ++v) {
      batch.push_back(MakeHostProblem(2000 + 128 * v, 1800, 1000, t.in, t.out, rng_, v & 1, v & 2,
                                      1.0, v == 3 ? 0.5 : 0.0));
    }
    batch.push_back(MakeHostProblem(4096, 4096, 4096, t.in, t.out, rng_));
    RunAndCheck(batch, t.in, t.out, t.precision, KernelFamily::kPersistent, 4096,
                absl::StrCat("cluster pairs ", DTypeName(t.in)));
  }
  cluster_ = 0;
  tile_n_ = 0;
}

// The launcher's own choice of pairs (hopper_cluster 0, hopper_plan.h's
// PairsPay) for wide tiles: batches of several 16-bit problems whose pairs of
// tile-rows are all whole run in pairs, and so does a single problem whose
// rows start off 32-byte sectors; a batch of one-tile-row problems (half of
// every pair would be empty) and a single problem with rows on sectors run
// single CTAs. Each result is checked whichever way it ran.
TEST_F(GroupedGemmTest, ChosenPairs) {
  tile_n_ = 256;
  cluster_ = 0;
  struct Case {
    std::string what;
    std::vector<HostProblem> batch;
    DType in;
    bool pairs;
  };
  std::vector<Case> cases;
  for (DType in : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<HostProblem> even;
    for (int i = 0; i < 6; ++i) {
      even.push_back(MakeHostProblem(512 + 256 * i, 1024 + 8 * i, 512 + 64 * i, in, in, rng_,
                                     i & 1, i & 2));
    }
    cases.push_back({absl::StrCat("whole pairs ", DTypeName(in)), std::move(even), in, true});
  }
  std::vector<HostProblem> short_rows;
  for (int i = 0; i < 32; ++i) {
    short_rows.push_back(MakeHostProblem(8 + 4 * i, 512, 256, DType::kBFloat16, DType::kBFloat16,
                                         rng_));
  }
  cases.push_back({"one tile-row each", std::move(short_rows), DType::kBFloat16, false});
  cases.push_back({"single problem, rows on sectors",
                   {MakeHostProblem(2048, 2048, 512, DType::kBFloat16, DType::kBFloat16, rng_)},
                   DType::kBFloat16, false});
  // Rows of 3000 bf16 elements: 6000 bytes, 16 off a sector.
  cases.push_back({"single problem, rows off sectors",
                   {MakeHostProblem(3000, 3000, 3000, DType::kBFloat16, DType::kBFloat16, rng_)},
                   DType::kBFloat16, true});
  for (const Case& c : cases) {
    const LaunchReport report = RunAndCheck(c.batch, c.in, c.in, Precision::kDefault,
                                            KernelFamily::kPersistent, 4096, c.what);
    if (launcher_->has_hopper_kernels()) {
      EXPECT_EQ(report.hopper_tile, c.pairs ? "128x256 x2 cluster" : "128x256") << c.what;
    }
  }
  tile_n_ = 0;
}

// The launcher's own choice of width (a cost model): every width it can pick
// for single problems of different sizes gives right results.
TEST_F(GroupedGemmTest, ChosenTileWidths) {
  for (int64_t s : {256, 1024, 1536, 2048, 3000}) {
    const LaunchReport report =
        RunAndCheck({MakeHostProblem(s, s, s, DType::kBFloat16, DType::kBFloat16, rng_)},
                    DType::kBFloat16, DType::kBFloat16, Precision::kDefault,
                    KernelFamily::kPersistent, 4096, absl::StrCat("square ", s));
    if (launcher_->has_hopper_kernels()) {
      EXPECT_FALSE(report.hopper_tile.empty()) << s;
      std::printf("square %lld: tiles %s\n", static_cast<long long>(s), report.hopper_tile.c_str());
    }
  }
}

// The split-K tail (GroupedGemmOptions::hopper_split_k): a lone problem's
// last tiles run as k-ranges whose float32 partials the last range to
// finish sums. Asked-for splits on every tile width, input and output type,
// with and without C (the register epilogue and TMA stores), transposed
// operands, K that does not divide evenly, and K too short to split; then
// the cost model's own choice on shapes whose last wave is nearly empty.
TEST_F(GroupedGemmTest, SplitKTails) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    double beta;
  };
  // Leading dimensions stay 16-byte aligned (a transposed A has m per
  // row, a transposed B k), so that every case takes the Hopper kernel.
  const Case cases[] = {{300, 520, 2000, false, false, 0.0},
                        {336, 264, 1000, true, false, 0.5},
                        {129, 264, 704, false, true, 0.0},
                        {2056, 136, 136, true, true, -1.0},
                        {65, 64, 40, false, false, 0.0}};  // One k-block: no split.
  for (const TypeCase& t : {kTypes[0], kTypes[1], kTypes[2]}) {
    std::vector<DType> outs = {t.out};
    if (t.out != DType::kFloat32) outs.push_back(DType::kFloat32);
    // Every split count for bf16; one (uneven k-ranges) for the others.
    const std::vector<int> all_splits =
        t.in == DType::kBFloat16 ? std::vector<int>{2, 3, 16} : std::vector<int>{3};
    for (DType out : outs) {
      for (int width : {256, 128, 64}) {
        for (int splits : all_splits) {
          tile_n_ = width;
          split_k_ = splits;
          for (const Case& c : cases) {
            const HostProblem h =
                MakeHostProblem(c.m, c.n, c.k, t.in, out, rng_, c.ta, c.tb, 1.25, c.beta);
            const std::string what = absl::StrCat(c.m, "x", c.n, "x", c.k, " ", DTypeName(t.in),
                                                  "->", DTypeName(out), " width ", width,
                                                  " splits ", splits);
            // Sampled where the reference is long (every element is still
            // checked to be finite: unwritten ones are NaN).
            const LaunchReport report =
                RunAndCheck({h}, t.in, out, t.precision, KernelFamily::kPersistent,
                            c.k >= 2000 ? 4096 : 0, what);
            if (!launcher_->has_hopper_kernels()) continue;
            ASSERT_EQ(report.hopper_problems, 1) << what;
            const int64_t bk = t.in == DType::kFloat32 ? 32 : 64;
            const int64_t most = std::min<int64_t>(splits, (c.k + bk - 1) / bk);
            EXPECT_EQ(report.hopper_split_k, most > 1 ? most : 1) << what;
            if (report.hopper_split_k > 1) EXPECT_GT(report.hopper_split_tiles, 0) << what;
          }
        }
      }
    }
  }
  // The cost model's choice, and splitting turned off, on shapes of a
  // nearly empty last wave (and one of fewer tiles than SMs).
  tile_n_ = 0;
  for (int splits : {0, 1}) {
    split_k_ = splits;
    for (const auto& s : std::vector<std::array<int64_t, 3>>{
             {2056, 2056, 2056}, {1032, 4096, 4096}, {1024, 1024, 1024}, {2600, 3400, 2200}}) {
      const LaunchReport report = RunAndCheck(
          {MakeHostProblem(s[0], s[1], s[2], DType::kBFloat16, DType::kBFloat16, rng_)},
          DType::kBFloat16, DType::kBFloat16, Precision::kDefault, KernelFamily::kPersistent, 4096,
          absl::StrCat(s[0], "x", s[1], "x", s[2], " split_k ", splits));
      if (!launcher_->has_hopper_kernels()) continue;
      if (splits == 1) EXPECT_EQ(report.hopper_split_k, 1);
      std::printf("%lldx%lldx%lld split_k option %d: tiles %s, split %d ways on %d tiles\n",
                  static_cast<long long>(s[0]), static_cast<long long>(s[1]),
                  static_cast<long long>(s[2]), splits, report.hopper_tile.c_str(),
                  report.hopper_split_k, report.hopper_split_tiles);
    }
  }
  tile_n_ = 0;
  split_k_ = 0;
}

// Split tiles count their units on per-stream counters that the launch
// sets back to zero, and the last unit sums the partials in a fixed order:
// hundreds of launches in a row, with different splits and batches through
// a table in between, give bit-identical results for each split. A counter
// left non-zero would make the wrong unit finish a tile (poison or a
// partial sum), and an order that depended on timing would move the bits.
TEST_F(GroupedGemmTest, SplitKRepeatsBitIdentical) {
  if (!launcher_->has_hopper_kernels()) GTEST_SKIP() << "no sm_90a GPU: no split-K tail";
  const std::vector<HostProblem> host = {
      MakeHostProblem(1000, 1100, 3000, DType::kBFloat16, DType::kFloat32, rng_, false, true)};
  DeviceBatch batch(host, DType::kBFloat16, DType::kFloat32);
  GroupedGemmOptions o;
  o.input = DType::kBFloat16;
  o.output = DType::kFloat32;
  o.hopper_tile_n = 128;
  const int splits[] = {3, 7, 16};
  std::vector<uint8_t> first[3];
  for (int rep = 0; rep < 240; ++rep) {
    const int w = rep % 3;
    o.hopper_split_k = splits[w];
    // Every tenth launch through a table: no split, and the counters untouched.
    o.hopper_inline_problems = rep % 10 == 9 ? 0 : -1;
    ASSERT_TRUE(batch.Poison());
    LaunchReport report;
    Run(batch, o, &report);
    ASSERT_EQ(report.hopper_split_k, rep % 10 == 9 ? 1 : splits[w]) << "launch " << rep;
    if (rep % 10 == 9) continue;
    std::vector<uint8_t> d = batch.Download(0);
    if (first[w].empty()) {
      EXPECT_LE(CheckAgainstReference(host[0], d, o.input, o.output), 1e-2)
          << "splits " << splits[w];
      first[w] = std::move(d);
    } else {
      ASSERT_EQ(d, first[w]) << "launch " << rep << " (splits " << splits[w]
                             << ") differs from the first";
    }
  }
}

// Tiles stored by TMA (beta 0, D rows 16-byte aligned) into a D whose rows
// are padded: every element of the m x n result is right and the padding
// and the rows below the matrix keep their poison, for every output type,
// tile width and grid, on edge tiles of every size.
TEST_F(GroupedGemmTest, TmaStoresStayInsideTheMatrix) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 8, 16}, {65, 264, 100}, {129, 520, 64}, {300, 40, 300}, {1000, 1000, 130}};
  for (DType out : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    const DType in = out == DType::kFloat16 ? DType::kFloat16 : DType::kBFloat16;
    const size_t osz = ElementSize(out);
    const int64_t pad = static_cast<int64_t>(32 / osz);  // Two 16-byte units a row.
    std::vector<HostProblem> host;
    for (const auto& s : shapes) host.push_back(MakeHostProblem(s[0], s[1], s[2], in, out, rng_));
    DeviceBatch batch(host, in, out);
    // Padded outputs with a poisoned guard of 64 rows below the matrix.
    std::vector<void*> padded;
    for (DeviceGemmProblem& p : batch.problems()) {
      p.ldd = p.n + pad;
      const size_t bytes = (p.m + 64) * p.ldd * osz;
      void* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
      padded.push_back(d);
      p.d = d;
    }
    for (int width : {256, 128, 64}) {
      for (bool edges : {false, true}) {
        for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
          for (size_t i = 0; i < host.size(); ++i) {
            const DeviceGemmProblem& p = batch.problems()[i];
            ASSERT_EQ(cudaMemset(p.d, 0xff, (p.m + 64) * p.ldd * osz), cudaSuccess);
          }
          GroupedGemmOptions o;
          o.input = in;
          o.output = out;
          o.family = f;
          o.hopper_tile_n = width;
          o.hopper_edge_tiles = edges;
          Run(batch, o, nullptr);
          for (size_t i = 0; i < host.size(); ++i) {
            const DeviceGemmProblem& p = batch.problems()[i];
            std::vector<uint8_t> all((p.m + 64) * p.ldd * osz);
            ASSERT_EQ(cudaMemcpy(all.data(), p.d, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
            std::vector<uint8_t> packed(p.m * p.n * osz);
            size_t untouched = 0, guard = 0;
            for (int64_t r = 0; r < p.m + 64; ++r) {
              for (int64_t c = 0; c < p.ldd; ++c) {
                const uint8_t* e = all.data() + (r * p.ldd + c) * osz;
                if (r < p.m && c < p.n) {
                  std::memcpy(packed.data() + (r * p.n + c) * osz, e, osz);
                } else {
                  ++guard;
                  bool poison = true;
                  for (size_t b = 0; b < osz; ++b) poison = poison && e[b] == 0xff;
                  untouched += poison;
                }
              }
            }
            const std::string what = absl::StrCat(p.m, "x", p.n, "x", p.k, " ", DTypeName(out),
                                                  " width ", width, " edges ", edges,
                                                  " family ", static_cast<int>(f));
            EXPECT_EQ(untouched, guard) << what << ": wrote outside the matrix";
            EXPECT_LE(CheckAgainstReference(host[i], packed, in, out), ErrorBound(in, out, Precision::kDefault))
                << what;
          }
        }
      }
    }
    for (void* d : padded) cudaFree(d);
  }
}

// GroupedGemmOptions::hopper_edge_tiles: edge tiles of 16-bit inputs run
// narrower MMAs (half or a quarter of the tile's width, loading only those
// columns of B stored k x n and storing only those boxes) and leave the
// second consumer warpgroup idle when their rows fit the first's 64.
// Columns and rows just under, at and just over each of those bounds, every
// operand layout, C read (the register epilogue) or not (TMA stores), 16-bit
// and float32 outputs, every tile width, both grids; TF32 (never trimmed)
// with the option on; and split-K tails whose split tiles are edge tiles.
TEST_F(GroupedGemmTest, EdgeTilesAtEveryNarrowerWidth) {
  edge_tiles_ = true;
  const TypeCase types[] = {kTypes[0], {DType::kBFloat16, DType::kFloat32, Precision::kDefault},
                            kTypes[1], kTypes[2]};
  for (const TypeCase& t : types) {
    std::vector<HostProblem> batch;
    int i = 0;
    for (int64_t m : {8, 64, 72, 136, 200}) {
      for (int64_t n : {8, 64, 72, 128, 136, 256, 264}) {
        for (int v = 0; v < 4; ++v, ++i) {
          batch.push_back(MakeHostProblem(m, n, 72, t.in, t.out, rng_, v & 1, v & 2, 1.25,
                                          i % 3 == 0 ? 0.5 : 0.0));
        }
      }
    }
    for (int width : {256, 128, 64}) {
      tile_n_ = width;
      for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
        const LaunchReport report = RunAndCheck(
            batch, t.in, t.out, t.precision, f, 0,
            absl::StrCat("width ", width, " family ", static_cast<int>(f), " ", DTypeName(t.in),
                         "->", DTypeName(t.out)));
        if (launcher_->has_hopper_kernels()) {
          EXPECT_EQ(report.hopper_problems, static_cast<int>(batch.size()));
        }
      }
    }
  }
  // Split tails only go in the launch parameters, which need every map
  // encodable: rows of A stored k x m must be 16-byte multiples, so m is a
  // multiple of 8 (300 sent A k x m the table's way, unsplit).
  tile_n_ = kHopperWideN;
  split_k_ = 3;
  for (const auto& s : {std::array<int64_t, 3>{296, 520, 2000}, std::array<int64_t, 3>{136, 72, 1000},
                        std::array<int64_t, 3>{2056, 136, 136}}) {
    for (int v = 0; v < 4; ++v) {
      const LaunchReport report = RunAndCheck(
          {MakeHostProblem(s[0], s[1], s[2], DType::kBFloat16, DType::kBFloat16, rng_, v & 1,
                           v & 2, 1.0, v == 3 ? 0.5 : 0.0)},
          DType::kBFloat16, DType::kBFloat16, Precision::kDefault, KernelFamily::kPersistent, 0,
          absl::StrCat("split ", s[0], "x", s[1], "x", s[2], " layout ", v));
      if (launcher_->has_hopper_kernels()) EXPECT_GT(report.hopper_split_tiles, 0);
    }
  }
  split_k_ = 0;
  tile_n_ = 0;
  edge_tiles_ = GroupedGemmOptions().hopper_edge_tiles;
}

// Problems without tiles (no rows or no columns) among others in a batch
// too large for the launch parameters: the kernel's map builders, which
// walk every problem of the table, skip them, and every other problem is
// right, for every tile width and both grids.
TEST_F(GroupedGemmTest, EmptyProblemsInATable) {
  std::vector<HostProblem> host;
  for (int i = 0; i < 40; ++i) {
    const int64_t m = i % 5 == 1 ? 0 : 8 * (8 + (i * 7) % 37);
    const int64_t n = i % 5 == 3 ? 0 : 8 * (8 + (i * 11) % 31);
    const int64_t k = 8 * (4 + i % 20);
    host.push_back(MakeHostProblem(m, n, k, DType::kBFloat16, DType::kBFloat16, rng_, i & 1,
                                   i & 2, i % 7 == 0 ? -0.5 : 1.0, 0.0));
  }
  GroupedGemmOptions o;
  o.input = DType::kBFloat16;
  o.output = DType::kBFloat16;
  for (int width : {0, 256, 128, 64}) {
    for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
      DeviceBatch batch(host, o.input, o.output);
      o.hopper_tile_n = width;
      o.family = f;
      LaunchReport report;
      Run(batch, o, &report);
      if (launcher_->has_hopper_kernels()) {
        EXPECT_FALSE(report.hopper_inline);
        EXPECT_EQ(report.hopper_problems, static_cast<int>(host.size()));
      }
      for (size_t i = 0; i < host.size(); ++i) {
        if (host[i].m * host[i].n == 0) continue;
        EXPECT_LE(CheckAgainstReference(host[i], batch.Download(i), o.input, o.output),
                  ErrorBound(o.input, o.output, Precision::kDefault))
            << "problem " << i << " width " << width << " family " << static_cast<int>(f);
      }
    }
  }
}

TEST_F(GroupedGemmTest, RepeatedLaunchesGiveIdenticalResults) {
  const auto host = MixedBatch(64, 400, DType::kBFloat16, DType::kFloat32, rng_);
  DeviceBatch batch(host, DType::kBFloat16, DType::kFloat32);
  GroupedGemmOptions o;
  o.input = DType::kBFloat16;
  o.output = DType::kFloat32;
  // Every tile width, each against its own first result: a race in the
  // tile hand-out or the pipeline shows as a result that moves.
  for (auto [width, cluster] : {std::pair{0, 0}, std::pair{256, 1}, std::pair{256, 2},
                                std::pair{128, 1}, std::pair{64, 1}}) {
    o.hopper_tile_n = width;
    o.hopper_cluster = cluster;
    ExpectRepeatsBitIdentical(batch, host, o, width == 0 ? 200 : 50, 1e-2,
                              absl::StrCat("width ", width, " cluster ", cluster));
  }
}

// 16-bit inputs keep each tile's last stage for its epilogue's store boxes
// and give it back during the next tile's first k-block (hopper_gemm.cu,
// MainLoop's kHold). Tiles of one k-block (the stage goes back right after
// it was held), tiles whose second warpgroup is idle (it holds a stage it
// never stores from), narrow edge tiles, float32 outputs (eight boxes a
// warpgroup: they wait for boxes of their own tile), every width and pairs
// of CTAs (whose peers write into the held stage once it is back): each of
// many launches must give the first launch's bits, and the first must be
// right.
TEST_F(GroupedGemmTest, HeldStageEpilogueRepeats) {
  // Multiples of 8, so that rows are 16-byte aligned and every problem takes
  // the Hopper path; every fourth problem has at most 45 rows (not
  // transposed), every third at most one k-block.
  std::uniform_int_distribution<int64_t> eighths(1, 75), kblock_eighths(1, 18);
  for (DType out : {DType::kBFloat16, DType::kFloat32}) {
    std::vector<HostProblem> host;
    for (int i = 0; i < 48; ++i) {
      host.push_back(MakeHostProblem(i % 4 == 0 ? 1 + i : 8 * ((eighths(rng_) + 1) / 2),
                                     8 * eighths(rng_),
                                     i % 3 == 0 ? 8 * (1 + i % 8) : 8 * kblock_eighths(rng_),
                                     DType::kBFloat16, out, rng_, i & 1, i & 2, 1.0,
                                     i % 11 == 0 ? 0.5 : 0.0));
    }
    host.push_back(MakeHostProblem(1024, 1024, 1024, DType::kBFloat16, out, rng_));
    DeviceBatch batch(host, DType::kBFloat16, out);
    GroupedGemmOptions o;
    o.input = DType::kBFloat16;
    o.output = out;
    for (auto [width, cluster] : {std::pair{256, 1}, std::pair{256, 2}, std::pair{128, 1},
                                  std::pair{64, 1}}) {
      o.hopper_tile_n = width;
      o.hopper_cluster = cluster;
      ExpectRepeatsBitIdentical(
          batch, host, o, 40, 1e-2,
          absl::StrCat("width ", width, " cluster ", cluster, " out ", DTypeName(out)));
    }
  }
}

// Tiles whose rows all fit the first consumer warpgroup leave the second
// idle; at the end of every tile both wait for each other before storing
// over the held stage (hopper_gemm.cu, kTileEndBarrier). Hundreds of short
// problems, most of them 64 rows or fewer, give each CTA runs of idle tiles
// of one to three k-blocks between busy ones, where an idle warpgroup that
// ran ahead would meet the barrier out of step (a hang or a race).
TEST_F(GroupedGemmTest, RunsOfIdleWarpgroupTiles) {
  std::uniform_int_distribution<int64_t> rows(1, 64), more_rows(65, 128), eighths(1, 32),
      k_eighths(1, 24);
  std::vector<HostProblem> host;
  for (int i = 0; i < 400; ++i) {
    host.push_back(MakeHostProblem(i % 4 == 3 ? more_rows(rng_) : rows(rng_), 8 * eighths(rng_),
                                   8 * k_eighths(rng_), DType::kBFloat16, DType::kBFloat16, rng_,
                                   false, i & 1));
  }
  DeviceBatch batch(host, DType::kBFloat16, DType::kBFloat16);
  GroupedGemmOptions o;
  o.input = DType::kBFloat16;
  o.output = DType::kBFloat16;
  for (int width : {256, 128}) {
    o.hopper_tile_n = width;
    ExpectRepeatsBitIdentical(batch, host, o, 30, 1e-2, absl::StrCat("width ", width));
  }
}

// The SIMT kernels' persistent blocks claim tiles from a counter that the
// last block sets back to zero: launched again and again, every tile is
// claimed once (a counter left behind would leave outputs poisoned, a tile
// claimed twice or raced would move a result). Both tile sides, with more
// tiles than blocks, float32 and float64 (any dtype takes the 64 x 64 kernel).
TEST_F(GroupedGemmTest, SimtClaimsEveryTileOnEveryLaunch) {
  for (auto [dtype, tile] : {std::pair{DType::kFloat32, kSimtWideTile},
                             std::pair{DType::kFloat32, kSimtTile},
                             std::pair{DType::kFloat64, kSimtTile}}) {
    const std::vector<HostProblem> host = {
        MakeHostProblem(2048, 4096, 20, dtype, dtype, rng_),
        MakeHostProblem(333, 777, 9, dtype, dtype, rng_, true, false, 1.5, 0.5)};
    DeviceBatch batch(host, dtype, dtype);
    GroupedGemmOptions o;
    o.input = o.output = dtype;
    o.simt_tile = tile;
    o.cublas_min_flops = 0;
    LaunchReport report;
    ExpectRepeatsBitIdentical(batch, host, o, 30, ErrorBound(dtype, dtype, Precision::kDefault),
                              absl::StrCat(DTypeName(dtype), " tile ", tile), &report);
    ASSERT_EQ(report.simt_problems, 2);
    ASSERT_EQ(report.simt_tile, tile);
  }
}

// The experimental ping-pong consumers (GroupedGemmOptions::hopper_pingpong):
// edge tiles of every kind (rows in the first half only, half-width
// columns), every layout, alpha and beta (register stores) and TMA stores,
// each 16-bit input and a float32 output, batches in the launch parameters
// and through the table, both grids; a 1,024-problem batch; long K; the
// same batch launched 100 times (a race between the warpgroups' turns shows
// as a result that moves); and the options it refuses.
TEST_F(GroupedGemmTest, PingPongConsumers) {
  pingpong_ = true;
  const TypeCase types[] = {kTypes[0], {DType::kBFloat16, DType::kFloat32, Precision::kDefault},
                            kTypes[1]};
  for (const TypeCase& t : types) {
    std::vector<HostProblem> batch;
    int i = 0;
    for (int64_t m : {1, 8, 64, 72, 136, 200}) {
      for (int64_t n : {8, 64, 72, 128, 136, 264}) {
        for (int v = 0; v < 4; ++v, ++i) {
          batch.push_back(MakeHostProblem(m, n, 72 + 8 * (i % 5), t.in, t.out, rng_, v & 1,
                                          v & 2, 1.25, i % 3 == 0 ? 0.5 : 0.0));
        }
      }
    }
    batch.push_back(MakeHostProblem(1000, 1000, 1000, t.in, t.out, rng_, false, false, 1.0, 0.0));
    batch.push_back(MakeHostProblem(300, 520, 2000, t.in, t.out, rng_, true, true, 1.0, 0.0));
    const std::vector<HostProblem> small(batch.begin(), batch.begin() + 12);
    const std::vector<HostProblem>* sets[] = {&batch, &small};
    for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
      for (const std::vector<HostProblem>* b : sets) {
        const LaunchReport report = RunAndCheck(
            *b, t.in, t.out, t.precision, f, 0,
            absl::StrCat("ping-pong ", b->size(), " problems, family ", static_cast<int>(f), " ",
                         DTypeName(t.in), "->", DTypeName(t.out)));
        if (launcher_->has_hopper_kernels()) {
          EXPECT_EQ(report.hopper_tile, "128x128 ping-pong");
        }
      }
    }
  }
  RunAndCheck(MixedBatch(1024, 160, DType::kBFloat16, DType::kBFloat16, rng_), DType::kBFloat16,
              DType::kBFloat16, Precision::kDefault, KernelFamily::kPersistent, 0,
              "ping-pong batch of 1024");

  const auto host = MixedBatch(64, 400, DType::kBFloat16, DType::kBFloat16, rng_);
  DeviceBatch device(host, DType::kBFloat16, DType::kBFloat16);
  GroupedGemmOptions o;
  o.hopper_pingpong = true;
  Run(device, o, nullptr);
  std::vector<std::vector<uint8_t>> first;
  for (size_t i = 0; i < host.size(); ++i) first.push_back(device.Download(i));
  for (int rep = 0; rep < 100; ++rep) {
    ASSERT_TRUE(device.Poison());
    Run(device, o, nullptr);
    for (size_t i = 0; i < host.size(); ++i) {
      ASSERT_EQ(device.Download(i), first[i]) << "problem " << i << " moved at launch " << rep;
    }
  }
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_LE(CheckAgainstReference(host[i], first[i], o.input, o.output), 1e-2) << i;
  }

  // Refused: other inputs, other widths, pairs, a split tail.
  GroupedGemmOptions bad;
  bad.hopper_pingpong = true;
  bad.input = bad.output = DType::kFloat32;
  bad.precision = Precision::kTF32;
  for (int which = 0; which < 4; ++which) {
    GroupedGemmOptions b = bad;
    if (which > 0) b.input = b.output = DType::kBFloat16;
    if (which == 1) b.hopper_tile_n = 256;
    if (which == 2) b.hopper_cluster = 2;
    if (which == 3) b.hopper_split_k = 2;
    const absl::Status s = launcher_->Run(device.problems(), b, workspace_, workspace_bytes_,
                                          stream_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << which << ": " << s;
    EXPECT_NE(s.message().find("hopper_pingpong"), std::string::npos) << s;
  }
  pingpong_ = false;
}

// The SIMT kernel's 128 x 128 tiles (exact float32): odd shapes inside and
// across tile edges, every layout, rows off 16 bytes, alpha and beta, and
// more tiles than blocks; both fetches (float4 groups where operands are
// aligned, with edge tiles 4 wide; element by element elsewhere); then the
// launcher's choice of tile, and what it refuses.
TEST_F(GroupedGemmTest, SimtWideTiles) {
  cublas_min_flops_ = 0;
  simt_tile_ = kSimtWideTile;
  std::vector<HostProblem> batch;
  int i = 0;
  for (const auto& [m, n, k] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {1, 4097, 3}, {333, 1, 777}, {128, 128, 8}, {129, 257, 9},
           {127, 130, 1000}, {520, 384, 33}, {256, 260, 64}, {136, 388, 100}}) {
    for (int v = 0; v < 4; ++v, ++i) {
      batch.push_back(MakeHostProblem(m, n, k, DType::kFloat32, DType::kFloat32, rng_, v & 1,
                                      v & 2, i % 2 ? 1.25 : 1.0, i % 3 == 0 ? 0.5 : 0.0,
                                      i % 5 == 1, i % 7 == 2 ? 3 : 0));
    }
  }
  LaunchReport report = RunAndCheck(batch, DType::kFloat32, DType::kFloat32, Precision::kDefault,
                                    KernelFamily::kPersistent, 0, "SIMT 128x128");
  EXPECT_EQ(report.simt_problems, static_cast<int>(batch.size()));
  EXPECT_EQ(report.simt_tile, kSimtWideTile);
  // 1,024 tiles: blocks take several tiles each (persistent) or one.
  for (KernelFamily f : {KernelFamily::kPersistent, KernelFamily::kNonPersistent}) {
    RunAndCheck({MakeHostProblem(4096, 4096, 24, DType::kFloat32, DType::kFloat32, rng_)},
                DType::kFloat32, DType::kFloat32, Precision::kDefault, f, 4096, "SIMT 4096x4096x24");
  }

  // Chosen: 128 where there are as many such tiles as SMs, else 64.
  simt_tile_ = 0;
  report = RunAndCheck({MakeHostProblem(4096, 4096, 24, DType::kFloat32, DType::kFloat32, rng_)},
                       DType::kFloat32, DType::kFloat32, Precision::kDefault,
                       KernelFamily::kPersistent, 4096, "SIMT, chosen tile, large");
  EXPECT_EQ(report.simt_tile, kSimtWideTile);
  report = RunAndCheck({MakeHostProblem(200, 100, 50, DType::kFloat32, DType::kFloat32, rng_)},
                       DType::kFloat32, DType::kFloat32, Precision::kDefault,
                       KernelFamily::kPersistent, 0, "SIMT, chosen tile, small");
  EXPECT_EQ(report.simt_tile, kSimtTile);
  report = RunAndCheck({MakeHostProblem(300, 300, 30, DType::kFloat64, DType::kFloat64, rng_)},
                       DType::kFloat64, DType::kFloat64);
  EXPECT_EQ(report.simt_tile, kSimtTile);

  // Refused: other sides, and 128 for other inputs.
  for (int which = 0; which < 3; ++which) {
    const DType in = which == 2 ? DType::kFloat64 : DType::kBFloat16;
    DeviceBatch device({MakeHostProblem(64, 64, 64, in, in, rng_)}, in, in);
    GroupedGemmOptions o;
    o.simt_tile = which == 0 ? 32 : kSimtWideTile;
    o.input = o.output = in;
    const absl::Status s =
        launcher_->Run(device.problems(), o, workspace_, workspace_bytes_, stream_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << which << ": " << s;
    EXPECT_NE(s.message().find("simt_tile"), std::string::npos) << s;
  }
  cublas_min_flops_ = GroupedGemmOptions().cublas_min_flops;
}

// The ping-pong consumers' turns on a batch small enough for compute-sanitizer
// (tests/gpu/pingpong_check.sh runs it under racecheck and synccheck): about
// six 128x128 tiles per CTA, so each warpgroup waits for the other's turn
// several times, with edge tiles, every layout and beta.
TEST_F(GroupedGemmTest, PingPongTurnsOnASmallBatch) {
  pingpong_ = true;
  const LaunchReport report =
      RunAndCheck(MixedBatch(200, 400, DType::kBFloat16, DType::kBFloat16, rng_),
                  DType::kBFloat16, DType::kBFloat16, Precision::kDefault,
                  KernelFamily::kPersistent, 0, "ping-pong turns, 200 problems");
  if (launcher_->has_hopper_kernels()) EXPECT_EQ(report.hopper_tile, "128x128 ping-pong");
  pingpong_ = false;
}

// Runs everywhere: without a GPU, the engine reports why instead of crashing.
TEST(CudaEngineCreationTest, NoGpuIsACleanError) {
  if (testing::NoGpuReason().empty()) GTEST_SKIP() << "a GPU is present; nothing to check";
  absl::StatusOr<CudaEngineSet> engines = CreateCudaEngines({});
  ASSERT_FALSE(engines.ok());
  EXPECT_EQ(engines.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(engines.status().message().find("no usable GPU"), std::string::npos)
      << engines.status();
}

}  // namespace
}  // namespace matmul::cuda
