// gemm-bench: our grouped kernels against cuBLAS on the GPU, one table.
//
//   gemm-bench [--json=FILE] [--quick] [--timing=isolated|back-to-back]
//              [--order=interleaved|blocked]
//              [--only=single|grouped] [--size=LABEL]... [--dtype=NAME]...
//              [--tile_n=256|128|64] [--cluster=1|2] [--b_stored=kxn|nxk]
//              [--inline=N] [--split_k=N] [--edge_tiles=0|1] [--reps=N]
//              [--row_align=BYTES] [--pingpong=0|1] [--simt_tile=0|64|128]
//              [--tf32_register_a=0|1]
//
// --size picks single-problem rows by label (4096^3) and grouped batches by
// their problem count (256, 1024, 64); a label MxNxK not in the table (such
// as 4096x4096x1024) adds that single problem; --dtype picks bfloat16, float16,
// tf32 or float32 rows (grouped batches: bfloat16 only unless --dtype asks
// for float16 or tf32 ones too). --b_stored=nxk stores the single problems' B as
// n x k (K-major) instead of k x n. --inline=N sends batches of at most N
// problems in the launch's parameters (0: always through a table in device
// memory; default: the launcher's limit). --split_k=N sets
// GroupedGemmOptions::hopper_split_k for the single problems (0, the
// default: the launcher's cost model; 1: no split-K tail; N: N k-ranges).
// --row_align=BYTES starts every row of A, B and D on a multiple of BYTES
// (16, 32, 128...; default 0: rows packed, as a caller's matrices come), as
// an engine that lays out its own copies can (the padding is random data,
// never read). --pingpong=1 sets GroupedGemmOptions::hopper_pingpong for
// every row of ours (experimental ping-pong consumers, 16-bit inputs,
// 128x128 tiles). --simt_tile=N sets GroupedGemmOptions::simt_tile for the
// exact float32 rows (0, the default: the launcher picks). --edge_tiles=0|1 sets GroupedGemmOptions::hopper_edge_tiles
// for every row of ours (edge tiles run narrower MMAs; on by default), so
// that one build measures both ways. --tf32_register_a=0|1 sets
// GroupedGemmOptions::hopper_tf32_register_a for the TF32 rows (1, the
// default: A stored k x m through registers, B stored k x n by D^T = B^T A^T;
// 0: copies of both K-major first). --reps=N times every row N times instead of the
// default count (for a host profile of the launcher, say: CPUPROFILE with
// many repetitions).
//
// Timing: CUDA events around each run, after warm-up; the median of many
// runs; inputs rotated over several buffer sets (more than twice the L2) so
// that no run reads the previous run's operands from cache; random data.
// The variants of a row (cuBLAS and ours) run interleaved, repetition by
// repetition, so that each meets the same clocks: large products run at
// the GPU's power limit, where the clocks fall within a second of load and
// rise again over any pause (see Order). --order=blocked times each
// variant's runs one after the other instead, as rounds before 2026-12-06
// did.
//
// The "host us" column is the median host time of one call into the
// launcher (or cuBLAS): its planning, table building and enqueueing, which
// isolated timing adds to the device time and back-to-back timing hides.
// The JSON splits our grouped rows' host time into the launcher's phases
// (host_plan_us, host_build_us, host_enqueue_us: LaunchReport).
//
// Rows:
//  * single problems (bf16, fp16, TF32, float32; 1024^3 ... 8192^3 and
//    4096 x 11008 x 4096): ours persistent, ours one CTA per tile, cuBLAS;
//  * grouped batches (256 problems of 64..1024, 1024 of 64..256, 64 of
//    1024..4096; bf16, and fp16 or TF32 where --dtype asks): ours in one launch,
//    one cublasGemmEx per problem, cublasGemmGroupedBatchedEx.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/bench/check_cuda.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/half.h"
#include "kernels/reference_gemm.h"

namespace matmul::cuda {
namespace {

#define CHECK_OK(expr)                                                                      \
  do {                                                                                      \
    absl::Status s_ = (expr);                                                               \
    if (!s_.ok()) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, std::string(s_.message()).c_str()); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

struct Shape {
  int64_t m, n, k;
};

double FlopsOf(const std::vector<Shape>& shapes) {
  double f = 0;
  for (const Shape& s : shapes) f += 2.0 * s.m * s.n * s.k;
  return f;
}

// Device buffers for one batch, `sets` copies rotated between runs.
struct Buffers {
  std::vector<std::vector<DeviceGemmProblem>> sets;
  std::vector<void*> allocations;
  ~Buffers() {
    for (void* p : allocations) cudaFree(p);
  }
};

// Fills `n` elements at `device` with random, finite, nonzero values. One
// slab of kSlabElements random values per dtype is drawn per process (the
// generator is seeded afresh each run) and every matrix is copied out of it
// from a random starting point, wrapping around. Drawing every element
// afresh ran at about 24 M elements/s, so setting up the 64 x [1024,4096]
// batch (some 840 M input elements) took longer than timing it; the
// values' only jobs are to be random and never zero, which the slab's are.
void FillRandom(void* device, DType type, size_t n, std::mt19937_64& rng) {
  constexpr size_t kSlabElements = size_t{1} << 22;
  static std::map<DType, std::vector<uint8_t>> slabs;
  std::vector<uint8_t>& slab = slabs[type];
  if (slab.empty()) slab = RandomMatrix(type, kSlabElements, rng);
  const size_t size = ElementSize(type);
  const size_t bytes = n * size;
  size_t from = std::uniform_int_distribution<size_t>(0, kSlabElements - 1)(rng) * size;
  for (size_t at = 0; at < bytes;) {
    const size_t chunk = std::min(slab.size() - from, bytes - at);
    CHECK_CUDA(cudaMemcpy(static_cast<uint8_t*>(device) + at, slab.data() + from, chunk,
                          cudaMemcpyHostToDevice));
    at += chunk;
    from = 0;  // The next chunk starts at the slab's beginning.
  }
}

// Row starts of every matrix on a multiple of this many bytes (--row_align;
// 0: rows packed).
int64_t g_row_align = 0;

// Elements per row of a matrix `cols` wide: packed, or padded to
// --row_align.
int64_t Ld(int64_t cols, DType type) {
  const int64_t size = static_cast<int64_t>(ElementSize(type));
  if (g_row_align <= 0) return cols;
  return (cols * size + g_row_align - 1) / g_row_align * g_row_align / size;
}

// Copies D of `from` (m x n, its own pitch) to D of `to`, on the device.
void CopyD(const DeviceGemmProblem& to, const DeviceGemmProblem& from, DType out) {
  const size_t size = ElementSize(out);
  CHECK_CUDA(cudaMemcpy2D(to.d, to.ldd * size, from.d, from.ldd * size, from.n * size, from.m,
                          cudaMemcpyDeviceToDevice));
}

// B is stored k x n (row-major) unless `b_nxk`, where it is stored n x k
// (the kernel's K-major B, what a weight matrix kept as [out, in] gives).
std::unique_ptr<Buffers> MakeBuffers(const std::vector<Shape>& shapes, DType in, DType out,
                                     std::mt19937_64& rng, bool b_nxk = false) {
  auto b = std::make_unique<Buffers>();
  size_t bytes_per_set = 0;
  for (const Shape& s : shapes) {
    bytes_per_set += (s.m * s.k + s.k * s.n) * ElementSize(in) + s.m * s.n * ElementSize(out);
  }
  // More than 2x the L2 (60 MB on an H200) in total, at most 32 sets.
  const size_t target = 160ull << 20;
  const int sets = static_cast<int>(std::clamp<size_t>(target / std::max<size_t>(bytes_per_set, 1) + 1, 1, 32));
  for (int set = 0; set < sets; ++set) {
    std::vector<DeviceGemmProblem> problems;
    for (const Shape& s : shapes) {
      DeviceGemmProblem p;
      p.m = s.m;
      p.n = s.n;
      p.k = s.k;
      p.lda = Ld(s.k, in);
      p.ldb = b_nxk ? Ld(s.k, in) : Ld(s.n, in);
      p.transpose_b = b_nxk;
      p.ldc = p.ldd = Ld(s.n, out);
      const int64_t a_elements = s.m * p.lda, b_elements = (b_nxk ? s.n : s.k) * p.ldb;
      void *a, *bb, *d;
      CHECK_CUDA(cudaMalloc(&a, a_elements * ElementSize(in)));
      CHECK_CUDA(cudaMalloc(&bb, b_elements * ElementSize(in)));
      CHECK_CUDA(cudaMalloc(&d, s.m * p.ldd * ElementSize(out)));
      b->allocations.insert(b->allocations.end(), {a, bb, d});
      FillRandom(a, in, a_elements, rng);
      FillRandom(bb, in, b_elements, rng);
      p.a = a;
      p.b = bb;
      p.d = d;
      problems.push_back(p);
    }
    b->sets.push_back(std::move(problems));
  }
  return b;
}

// How a run is timed.
//  * kIsolated: one run between two events on an idle stream, so the time
//    includes the host's enqueue work for that run (what one lone call costs).
//  * kBackToBack: kBatch runs enqueued between two events, time divided by
//    kBatch: the host's enqueue work overlaps the GPU's previous run (what a
//    busy server sees, and how GEMM libraries are usually timed).
enum class Timing { kIsolated, kBackToBack };
Timing g_timing = Timing::kIsolated;
// How the variants of one row share the GPU (--order). Interleaved: each
// repetition runs every variant once, in the next of all their orders
// (permutations, cycled), so that all of them meet the same clocks and each
// follows each other one about equally often. (Until 2026-12-06 the first
// variant rotated, which had ours persistent follow cuBLAS in two
// repetitions of three and ours one CTA per tile follow ours persistent
// in two of three.) A large product draws the H100's whole
// power limit within a second, after which its clocks fall by a quarter or
// more; timed one after the other (blocked), a variant that follows a pause
// (such as the previous variant's result check) gets higher clocks than one
// that follows another variant's load.
enum class Order { kInterleaved, kBlocked };
Order g_order = Order::kInterleaved;
// Hopper tile width for our rows (0: the launcher's choice).
int g_tile_n = 0;
// CTAs per cluster for our rows (0: the launcher's choice).
int g_cluster = 0;
// GroupedGemmOptions::hopper_inline_problems (--inline).
int g_inline = -1;
// GroupedGemmOptions::hopper_split_k (--split_k).
int g_split_k = 0;
// Single-problem rows with B stored n x k instead of k x n (--b_stored=nxk).
bool g_b_nxk = false;
// GroupedGemmOptions::hopper_edge_tiles (--edge_tiles).
bool g_edge_tiles = GroupedGemmOptions().hopper_edge_tiles;
// GroupedGemmOptions::hopper_tf32_register_a (--tf32_register_a).
bool g_tf32_register_a = GroupedGemmOptions().hopper_tf32_register_a;
// Timed runs per row (--reps); 0: the default for the row and mode.
int g_reps = 0;
// GroupedGemmOptions::hopper_pingpong (--pingpong).
bool g_pingpong = false;
// GroupedGemmOptions::simt_tile for exact float32 rows (--simt_tile).
int g_simt_tile = 0;
constexpr int kBatch = 8;

// The dtype column and --dtype name of rows with inputs `in` at `precision`:
// bfloat16, float16, tf32 or float32.
std::string DTypeLabel(DType in, Precision precision) {
  if (in != DType::kFloat32) return std::string(DTypeName(in));
  return precision == Precision::kTF32 ? "tf32" : "float32";
}

// The median of `v` (0 when empty).
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What TimeVariants measured of one variant.
struct Timed {
  double ms = 0;       // Median device time of one run (CUDA events).
  double host_us = 0;  // Median host time of one run() call: the launcher's
                       // own planning, table building and enqueueing.
};

// Median device and host times of each function of `runs`, called with a
// buffer set, over `reps` timed runs after warm-up, interleaved: repetition
// i runs every function once, the (i mod size)-th first (see Order).
std::vector<Timed> TimeInterleaved(cudaStream_t stream, int sets, int reps,
                                   const std::vector<std::function<void(int)>>& runs) {
  const int variants = static_cast<int>(runs.size());
  for (const auto& run : runs) {
    for (int i = 0; i < 3; ++i) run(i % sets);
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<std::vector<double>> ms(variants), host_us(variants);
  const int per = g_timing == Timing::kBackToBack ? kBatch : 1;
  // Every order of the variants, in lexicographic order.
  std::vector<std::vector<int>> orders;
  std::vector<int> order(variants);
  std::iota(order.begin(), order.end(), 0);
  do {
    orders.push_back(order);
  } while (std::next_permutation(order.begin(), order.end()));
  for (int i = 0; i < reps; ++i) {
    for (int j = 0; j < variants; ++j) {
      const int v = orders[i % orders.size()][j];
      cudaEventRecord(start, stream);
      for (int q = 0; q < per; ++q) {
        const auto t0 = std::chrono::steady_clock::now();
        runs[v]((i * per + q) % sets);
        host_us[v].push_back(std::chrono::duration<double, std::micro>(
                                 std::chrono::steady_clock::now() - t0)
                                 .count());
      }
      cudaEventRecord(stop, stream);
      CHECK_CUDA(cudaEventSynchronize(stop));
      float t;
      cudaEventElapsedTime(&t, start, stop);
      ms[v].push_back(t / per);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<Timed> timed;
  for (int v = 0; v < variants; ++v) timed.push_back({Median(ms[v]), Median(host_us[v])});
  return timed;
}

// Times every function of `runs`, `reps` timed runs each: interleaved (the
// default) or one function's runs after the other's (--order=blocked).
std::vector<Timed> TimeVariants(cudaStream_t stream, int sets, int reps,
                                const std::vector<std::function<void(int)>>& runs) {
  if (g_order == Order::kInterleaved) return TimeInterleaved(stream, sets, reps, runs);
  std::vector<Timed> timed;
  for (const auto& run : runs) timed.push_back(TimeInterleaved(stream, sets, reps, {run})[0]);
  return timed;
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kFloat32: return CUDA_R_32F;
    case DType::kFloat64: return CUDA_R_64F;
    case DType::kFloat16: return CUDA_R_16F;
    case DType::kBFloat16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// Max relative error of `ours` against `ref` over the whole batch (device
// results compared on the host), to make sure the timed kernels are right.
double Compare(const std::vector<DeviceGemmProblem>& ours, const std::vector<DeviceGemmProblem>& ref,
               DType out) {
  double worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    const size_t n = ours[i].m * ours[i].n, size = ElementSize(out), row = ours[i].n * size;
    std::vector<uint8_t> a(n * size), b(a.size());
    cudaMemcpy2D(a.data(), row, ours[i].d, ours[i].ldd * size, row, ours[i].m,
                 cudaMemcpyDeviceToHost);
    cudaMemcpy2D(b.data(), row, ref[i].d, ref[i].ldd * size, row, ref[i].m,
                 cudaMemcpyDeviceToHost);
    worst = std::max(worst, RelativeError(ToDouble(b.data(), out, n), a.data(), out));
  }
  return worst;
}

struct Row {
  std::string group, name, dtype, variant;
  double us = 0, tflops = 0, ratio = 0, error = -1;
  double host_us = 0;  // Median host time of one call (TimeVariants).
  // Medians of the launcher's own phases of our grouped rows
  // (LaunchReport::hopper_*_us; JSON only).
  double plan_us = 0, build_us = 0, enqueue_us = 0;
  std::string tile = "-";  // Our Hopper tiles ("128x256 x2 cluster"), when they ran.
};

class Bench {
 public:
  Bench(bool quick) : quick_(quick) {
    CHECK_CUDA(cudaStreamCreate(&stream_));
    auto launcher = GroupedGemmLauncher::Create(0);
    CHECK_OK(launcher.status());
    launcher_ = *std::move(launcher);
    cublasCreate(&cublas_);
    cublasSetStream(cublas_, stream_);
    CHECK_CUDA(cudaMalloc(&workspace_, workspace_bytes_));
  }
  ~Bench() {
    cudaFree(workspace_);
    cublasDestroy(cublas_);
  }

  void Single(DType in, Precision precision, const Shape& shape, const std::string& label) {
    const DType out = in;
    const std::vector<Shape> shapes = {shape};
    auto buffers = MakeBuffers(shapes, in, out, rng_, g_b_nxk);
    auto ref = MakeBuffers(shapes, in, out, rng_, g_b_nxk);  // Output copies for the check.
    const double flops = FlopsOf(shapes);
    const int reps = g_reps > 0 ? g_reps : (quick_ ? 10 : (flops > 1e12 ? 20 : 50));
    const std::string dtype = DTypeLabel(in, precision);
    const KernelFamily families[] = {KernelFamily::kCublas, KernelFamily::kPersistent,
                                     KernelFamily::kNonPersistent};
    std::vector<GroupedGemmOptions> options;
    std::vector<std::function<void(int)>> runs;
    for (auto family : families) {
      GroupedGemmOptions o;
      o.input = in;
      o.output = out;
      o.precision = precision;
      o.family = family;
      o.cublas_min_flops = 0;  // Exact float32: time our SIMT kernel, not cuBLAS.
      o.hopper_tile_n = g_tile_n;
      o.hopper_cluster = g_cluster;
      o.hopper_inline_problems = g_inline;
      o.hopper_split_k = g_split_k;
      o.hopper_edge_tiles = g_edge_tiles;
      o.hopper_tf32_register_a = g_tf32_register_a;
      o.hopper_pingpong = g_pingpong && family != KernelFamily::kCublas &&
                          (in == DType::kBFloat16 || in == DType::kFloat16);
      if (in == DType::kFloat32 && precision == Precision::kDefault) o.simt_tile = g_simt_tile;
      options.push_back(o);
      runs.push_back([&, o](int set) {
        CHECK_OK(launcher_->Run(buffers->sets[set], o, workspace_, workspace_bytes_, stream_));
      });
    }
    const std::vector<Timed> timed =
        TimeVariants(stream_, static_cast<int>(buffers->sets.size()), reps, runs);
    const double cublas_ms = timed[0].ms;
    std::vector<Row> rows;
    for (size_t v = 0; v < options.size(); ++v) {
      const GroupedGemmOptions& o = options[v];
      const KernelFamily family = o.family;
      const double ms = timed[v].ms;
      // TF32 rows with the copies K-major instead of the register path say so.
      const std::string copies = dtype == "tf32" && !g_tf32_register_a ? " copies" : "";
      Row r{"single", (g_b_nxk ? label + " B nxk" : label) + copies, dtype,
            family == KernelFamily::kCublas ? "cuBLAS"
                                            : (family == KernelFamily::kPersistent ? "ours persistent"
                                                                                   : "ours one CTA/tile")};
      r.us = ms * 1e3;
      r.host_us = timed[v].host_us;
      r.tflops = flops / (ms * 1e-3) / 1e12;
      if (family == KernelFamily::kCublas) {
        // cuBLAS's result, run once more on the first set, is the reference
        // for the check below.
        runs[v](0);
        CHECK_CUDA(cudaStreamSynchronize(stream_));
        for (size_t i = 0; i < shapes.size(); ++i) {
          CopyD(ref->sets[0][i], buffers->sets[0][i], out);
        }
      } else {
        LaunchReport report;
        CHECK_OK(launcher_->Run(buffers->sets[0], o, workspace_, workspace_bytes_, stream_, &report));
        CHECK_CUDA(cudaStreamSynchronize(stream_));
        r.error = Compare(buffers->sets[0], ref->sets[0], out);
        if (!report.hopper_tile.empty()) {
          r.tile = absl::StrCat(report.hopper_tile, ", ", report.hopper_grid, " CTAs",
                                report.hopper_inline ? ", in parameters" : "");
          if (report.hopper_split_k > 1) {
            absl::StrAppend(&r.tile, ", split-K ", report.hopper_split_k, " on ",
                            report.hopper_split_tiles, " tiles");
          }
        } else if (report.simt_tile != 0) {
          r.tile = absl::StrCat("SIMT ", report.simt_tile, "x", report.simt_tile);
        }
      }
      r.ratio = cublas_ms / ms;
      rows.push_back(r);
    }
    for (Row& r : rows) Emit(r);
  }

  // A batch of `count` problems with M, N, K uniform in [lo, hi], inputs
  // and outputs of type `in` (float32 with `precision` TF32: tf32 rows).
  void Grouped(const std::string& label, int count, int lo, int hi, DType in = DType::kBFloat16,
               Precision precision = Precision::kDefault) {
    const DType out = in;
    const std::string dtype = DTypeLabel(in, precision);
    std::uniform_int_distribution<int> dim(lo, hi);
    std::vector<Shape> shapes;
    for (int i = 0; i < count; ++i) shapes.push_back({dim(rng_), dim(rng_), dim(rng_)});
    // Leading dimensions must be multiples of 8 for our TMA path and for
    // fair cuBLAS tensor-core use: round the column counts up.
    for (Shape& s : shapes) {
      s.k = (s.k + 7) / 8 * 8;
      s.n = (s.n + 7) / 8 * 8;
    }
    auto buffers = MakeBuffers(shapes, in, out, rng_);
    auto ref = MakeBuffers(shapes, in, out, rng_);
    const double flops = FlopsOf(shapes);
    const int sets = static_cast<int>(buffers->sets.size());
    const int reps = g_reps > 0 ? g_reps : (quick_ ? 10 : 30);
    // cuBLAS, one call per problem; cuBLAS grouped; ours, persistent and one
    // CTA per tile, each with the launcher's phases of every timed run.
    GroupedGemmOptions loop_options;
    loop_options.input = in;
    loop_options.output = out;
    loop_options.precision = precision;
    loop_options.family = KernelFamily::kCublas;
    std::vector<void**> grouped_ptrs;
    const KernelFamily ours[] = {KernelFamily::kPersistent, KernelFamily::kNonPersistent};
    std::vector<GroupedGemmOptions> options;
    for (auto family : ours) {
      GroupedGemmOptions o = loop_options;
      o.family = family;
      o.hopper_tile_n = g_tile_n;
      o.hopper_cluster = g_cluster;
      o.hopper_inline_problems = g_inline;
      o.hopper_edge_tiles = g_edge_tiles;
      o.hopper_tf32_register_a = g_tf32_register_a;
      o.hopper_pingpong = g_pingpong && in != DType::kFloat32;  // 16-bit inputs only.
      options.push_back(o);
    }
    LaunchReport reports[2];
    std::vector<double> plan[2], build[2], enqueue[2];
    std::vector<std::function<void(int)>> runs = {
        [&](int set) {
          CHECK_OK(launcher_->Run(buffers->sets[set], loop_options, workspace_, workspace_bytes_,
                                  stream_));
        },
        CublasGroupedRun(*buffers, in, out, precision, &grouped_ptrs)};
    for (int f = 0; f < 2; ++f) {
      runs.push_back([&, f](int set) {
        CHECK_OK(launcher_->Run(buffers->sets[set], options[f], workspace_, workspace_bytes_,
                                stream_, &reports[f]));
        plan[f].push_back(reports[f].hopper_plan_us);
        build[f].push_back(reports[f].hopper_build_us);
        enqueue[f].push_back(reports[f].hopper_enqueue_us);
      });
    }
    const std::vector<Timed> timed = TimeVariants(stream_, sets, reps, runs);
    for (void** p : grouped_ptrs) cudaFree(p);
    const double loop_ms = timed[0].ms, grouped_ms = timed[1].ms;
    // The per-problem loop's result, run once more on the first set, is the
    // reference for the check of ours.
    runs[0](0);
    CHECK_CUDA(cudaStreamSynchronize(stream_));
    for (size_t i = 0; i < shapes.size(); ++i) CopyD(ref->sets[0][i], buffers->sets[0][i], out);
    const double best_cublas = std::min(loop_ms, grouped_ms);
    std::vector<Row> rows;
    rows.push_back({"grouped", label, dtype, "cuBLAS per problem", loop_ms * 1e3,
                    flops / (loop_ms * 1e-3) / 1e12, best_cublas / loop_ms});
    rows.back().host_us = timed[0].host_us;
    rows.push_back({"grouped", label, dtype, "cublasGemmGroupedBatchedEx", grouped_ms * 1e3,
                    flops / (grouped_ms * 1e-3) / 1e12, best_cublas / grouped_ms});
    rows.back().host_us = timed[1].host_us;
    for (int f = 0; f < 2; ++f) {
      const double ms = timed[2 + f].ms;
      LaunchReport report;
      CHECK_OK(launcher_->Run(buffers->sets[0], options[f], workspace_, workspace_bytes_, stream_,
                              &report));
      CHECK_CUDA(cudaStreamSynchronize(stream_));
      Row r{"grouped", label, dtype,
            absl::StrCat(ours[f] == KernelFamily::kPersistent ? "ours persistent" : "ours one CTA/tile",
                         " (", report.launches, " launch, ", report.hopper_tile, ")")};
      r.us = ms * 1e3;
      r.host_us = timed[2 + f].host_us;
      r.plan_us = Median(plan[f]);
      r.build_us = Median(build[f]);
      r.enqueue_us = Median(enqueue[f]);
      r.tflops = flops / (ms * 1e-3) / 1e12;
      r.ratio = best_cublas / ms;
      r.error = Compare(buffers->sets[0], ref->sets[0], out);
      if (!report.hopper_tile.empty()) {
        r.tile = absl::StrCat(report.hopper_tile, report.hopper_inline ? ", in parameters" : "");
      }
      rows.push_back(r);
    }
    for (Row& r : rows) Emit(r);
  }

  void WriteJson(const std::string& path) {
    std::ofstream out(path);
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    out << "{\n  \"gpu\": \"" << prop.name << "\", \"sms\": " << prop.multiProcessorCount
        << ", \"cuda_runtime\": " << runtime << ", \"driver\": " << driver << ",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows_.size(); ++i) {
      const Row& r = rows_[i];
      out << absl::StrFormat(
          "    {\"group\": \"%s\", \"name\": \"%s\", \"dtype\": \"%s\", \"variant\": \"%s\", "
          "\"us\": %.2f, \"tflops\": %.2f, \"ratio_to_cublas\": %.3f, \"max_rel_error\": %.3g, "
          "\"tile\": \"%s\", \"host_us\": %.2f, \"host_plan_us\": %.2f, "
          "\"host_build_us\": %.2f, \"host_enqueue_us\": %.2f}%s\n",
          r.group, r.name, r.dtype, r.variant, r.us, r.tflops, r.ratio, r.error, r.tile, r.host_us,
          r.plan_us, r.build_us, r.enqueue_us, i + 1 < rows_.size() ? "," : "");
    }
    out << "  ]\n}\n";
  }

 private:
  // One cublasGemmGroupedBatchedEx call over a buffer set of `buffers`, as
  // a function of the set for TimeVariants. The device arrays of pointers
  // it reads are added to `device_ptrs`, for the caller to free.
  std::function<void(int)> CublasGroupedRun(const Buffers& buffers, DType in, DType out,
                                            Precision precision,
                                            std::vector<void**>* device_ptrs) {
    const cublasComputeType_t compute = in == DType::kFloat32 && precision == Precision::kTF32
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    struct Call {
      std::vector<cublasOperation_t> ops;
      std::vector<int> m, n, k, lda, ldb, ldc, size;
      std::vector<float> alpha, beta;
    };
    const int count = static_cast<int>(buffers.sets[0].size());
    auto call = std::make_shared<Call>();
    call->ops.assign(count, CUBLAS_OP_N);
    for (auto* v : {&call->m, &call->n, &call->k, &call->lda, &call->ldb, &call->ldc}) {
      v->resize(count);
    }
    call->size.assign(count, 1);
    call->alpha.assign(count, 1.0f);
    call->beta.assign(count, 0.0f);
    const size_t first = device_ptrs->size();
    for (const auto& set : buffers.sets) {
      std::vector<const void*> host(3 * count);
      for (int i = 0; i < count; ++i) {
        const DeviceGemmProblem& p = set[i];
        // Column-major: D^T = B^T A^T.
        call->m[i] = static_cast<int>(p.n);
        call->n[i] = static_cast<int>(p.m);
        call->k[i] = static_cast<int>(p.k);
        call->lda[i] = static_cast<int>(p.ldb);
        call->ldb[i] = static_cast<int>(p.lda);
        call->ldc[i] = static_cast<int>(p.ldd);
        host[i] = p.b;
        host[count + i] = p.a;
        host[2 * count + i] = p.d;
      }
      void** ptrs;
      CHECK_CUDA(cudaMalloc(&ptrs, host.size() * sizeof(void*)));
      CHECK_CUDA(cudaMemcpy(ptrs, host.data(), host.size() * sizeof(void*), cudaMemcpyHostToDevice));
      device_ptrs->push_back(ptrs);
    }
    return [this, call, count, in, out, compute, device_ptrs, first](int set) {
      void** ptrs = (*device_ptrs)[first + set];
      const cublasStatus_t s = cublasGemmGroupedBatchedEx(
          cublas_, call->ops.data(), call->ops.data(), call->m.data(), call->n.data(),
          call->k.data(), call->alpha.data(), const_cast<const void* const*>(ptrs), CudaType(in),
          call->lda.data(), const_cast<const void* const*>(ptrs + count), CudaType(in),
          call->ldb.data(), call->beta.data(), ptrs + 2 * count, CudaType(out), call->ldc.data(),
          count, call->size.data(), compute);
      if (s != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmGroupedBatchedEx: %s\n", cublasGetStatusString(s));
        std::exit(1);
      }
    };
  }

  void Emit(const Row& r) {
    std::printf("%-8s %-22s %-9s %-44s %11.1f %8.1f %9.1f %7.3f %10s  %s\n", r.group.c_str(),
                r.name.c_str(), r.dtype.c_str(), r.variant.c_str(), r.us, r.host_us, r.tflops, r.ratio,
                r.error < 0 ? "-" : absl::StrFormat("%.2e", r.error).c_str(), r.tile.c_str());
    std::fflush(stdout);
    rows_.push_back(r);
  }

  bool quick_;
  cudaStream_t stream_;
  std::unique_ptr<GroupedGemmLauncher> launcher_;
  cublasHandle_t cublas_;
  size_t workspace_bytes_ = size_t{1} << 30;
  void* workspace_ = nullptr;
  std::mt19937_64 rng_{std::random_device{}()};
  std::vector<Row> rows_;
};

int Main(int argc, char** argv) {
  std::string json = "gemm_bench.json";
  bool quick = false;
  std::vector<std::string> only, sizes_wanted, dtypes_wanted;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--json=", 0) == 0) json = a.substr(7);
    else if (a == "--quick") quick = true;
    else if (a.rfind("--only=", 0) == 0) only.push_back(a.substr(7));
    else if (a.rfind("--size=", 0) == 0) sizes_wanted.push_back(a.substr(7));
    else if (a.rfind("--dtype=", 0) == 0) dtypes_wanted.push_back(a.substr(8));
    else if (a == "--timing=isolated") g_timing = Timing::kIsolated;
    else if (a == "--timing=back-to-back") g_timing = Timing::kBackToBack;
    else if (a == "--order=interleaved") g_order = Order::kInterleaved;
    else if (a == "--order=blocked") g_order = Order::kBlocked;
    else if (a.rfind("--tile_n=", 0) == 0) g_tile_n = std::atoi(a.c_str() + 9);
    else if (a.rfind("--cluster=", 0) == 0) g_cluster = std::atoi(a.c_str() + 10);
    else if (a.rfind("--inline=", 0) == 0) g_inline = std::atoi(a.c_str() + 9);
    else if (a.rfind("--split_k=", 0) == 0) g_split_k = std::atoi(a.c_str() + 10);
    else if (a == "--edge_tiles=1") g_edge_tiles = true;
    else if (a == "--edge_tiles=0") g_edge_tiles = false;
    else if (a == "--pingpong=1") g_pingpong = true;
    else if (a == "--pingpong=0") g_pingpong = false;
    else if (a == "--tf32_register_a=1") g_tf32_register_a = true;
    else if (a == "--tf32_register_a=0") g_tf32_register_a = false;
    else if (a.rfind("--simt_tile=", 0) == 0) g_simt_tile = std::atoi(a.c_str() + 12);
    else if (a.rfind("--reps=", 0) == 0) g_reps = std::atoi(a.c_str() + 7);
    else if (a.rfind("--row_align=", 0) == 0) g_row_align = std::atoll(a.c_str() + 12);
    else if (a == "--b_stored=nxk") g_b_nxk = true;
    else if (a == "--b_stored=kxn") g_b_nxk = false;
    else {
      std::fprintf(stderr, "gemm-bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto listed = [](const std::vector<std::string>& list, const std::string& v) {
    return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
  };
  auto want = [&](const std::string& section) {
    return only.empty() || std::find(only.begin(), only.end(), section) != only.end();
  };
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "gemm-bench: no CUDA GPU\n");
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("gemm-bench on %s (%d SMs), median of repeated runs, CUDA events, %s timing, %s\n",
              prop.name, prop.multiProcessorCount,
              g_timing == Timing::kBackToBack ? "back-to-back" : "isolated",
              g_order == Order::kBlocked ? "variants one after the other" : "variants interleaved");
  std::printf("%-8s %-22s %-9s %-44s %11s %8s %9s %7s %10s  %s\n", "group", "problem", "dtype",
              "variant", "us", "host us", "TFLOP/s", "x cuBLAS", "rel.err", "tiles");
  Bench bench(quick);
  std::vector<std::pair<Shape, std::string>> sizes = {
      {{1024, 1024, 1024}, "1024^3"}, {{2048, 2048, 2048}, "2048^3"},
      {{4096, 4096, 4096}, "4096^3"}, {{8192, 8192, 8192}, "8192^3"},
      {{4096, 11008, 4096}, "4096x11008x4096"}};
  // Shapes asked for by MxNxK that the table lacks (for cost models: the
  // same M and N over several K, and so on).
  for (const std::string& label : sizes_wanted) {
    Shape s{};
    char x1 = 0, x2 = 0, rest = 0;
    const bool known = std::any_of(sizes.begin(), sizes.end(),
                                   [&](const auto& entry) { return entry.second == label; });
    if (!known &&
        std::sscanf(label.c_str(), "%ld%c%ld%c%ld%c", &s.m, &x1, &s.n, &x2, &s.k, &rest) == 5 &&
        x1 == 'x' && x2 == 'x' && s.m > 0 && s.n > 0 && s.k > 0) {
      sizes.push_back({s, label});
    }
  }
  if (want("single")) {
    for (auto [in, precision] : {std::pair{DType::kBFloat16, Precision::kDefault},
                                 std::pair{DType::kFloat16, Precision::kDefault},
                                 std::pair{DType::kFloat32, Precision::kTF32},
                                 std::pair{DType::kFloat32, Precision::kDefault}}) {
      const std::string dtype = DTypeLabel(in, precision);
      if (!listed(dtypes_wanted, dtype)) continue;
      for (const auto& [shape, label] : sizes) {
        if (quick && shape.m > 4096 && sizes_wanted.empty()) continue;
        if (!listed(sizes_wanted, label)) continue;
        bench.Single(in, precision, shape, label);
      }
    }
  }
  if (want("grouped")) {
    // bfloat16 batches, or those of each --dtype asked for among bfloat16,
    // float16 and tf32 (exact float32 batches are not in the table).
    for (auto [in, precision] : {std::pair{DType::kBFloat16, Precision::kDefault},
                                 std::pair{DType::kFloat16, Precision::kDefault},
                                 std::pair{DType::kFloat32, Precision::kTF32}}) {
      const std::string dtype = DTypeLabel(in, precision);
      if (dtypes_wanted.empty() ? in != DType::kBFloat16 : !listed(dtypes_wanted, dtype)) continue;
      if (listed(sizes_wanted, "256")) bench.Grouped("256 x [64,1024]", 256, 64, 1024, in, precision);
      if (listed(sizes_wanted, "1024")) bench.Grouped("1024 x [64,256]", 1024, 64, 256, in, precision);
      if (listed(sizes_wanted, "64")) bench.Grouped("64 x [1024,4096]", 64, 1024, 4096, in, precision);
    }
  }
  bench.WriteJson(json);
  return 0;
}

}  // namespace
}  // namespace matmul::cuda

int main(int argc, char** argv) { return matmul::cuda::Main(argc, argv); }
