#include "kernels/cuda/grouped_gemm.h"

#include <cublas_v2.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/tf32_layout.h"

namespace matmul::cuda {
namespace {

constexpr size_t kAlign = 256;
// Batches whose zeroed tensor-map slots are at most this many bytes send
// them with the problem table instead of zeroing them on the device
// (ZeroMapSlots).
constexpr size_t kMapsInCopyBytes = 16 << 10;

// Whether a table batch's tensor-map slots are zeroed before the kernel
// writes them. The kernel never reads a slot before it is written (readers
// wait for the problem's flag), so zeroing serves only compute-sanitizer's
// initcheck, which models the kernel's tensormap publish as a read of the
// destination and would report it as a read of uninitialised memory.
// Zeroed where a tool is injected into CUDA (compute-sanitizer and the
// Nsight tools set CUDA_INJECTION64_PATH) or MATMUL_ZERO_MAP_SLOTS=1 asks
// for it; otherwise left out: for 1024 problems it was a 384 KiB memset,
// one more operation ahead of the kernel on the stream and a few µs of
// the launcher's host time.
bool ZeroMapSlots() {
  static const bool zero = [] {
    const char* injected = std::getenv("CUDA_INJECTION64_PATH");
    const char* asked = std::getenv("MATMUL_ZERO_MAP_SLOTS");
    return (injected != nullptr && injected[0] != '\0') ||
           (asked != nullptr && std::string_view(asked) == "1");
  }();
  return zero;
}

size_t AlignUp(size_t v, size_t a = kAlign) { return (v + a - 1) / a * a; }

double Flops(const DeviceGemmProblem& p) {
  return 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// CeilDiv by a power of two `b`, as a shift: the launcher divides by tile
// widths, k-block depths and cluster sizes for every problem of a batch,
// several times over, and a 64-bit division costs tens of cycles.
int64_t CeilDivPow2(int64_t a, int64_t b) { return (a + b - 1) >> __builtin_ctzll(b); }

// Writes the prefix sums of `units(p)` over `problems` to `offsets`
// (problems.size() + 1 entries) and returns the total: the tile list of a
// launch. An error when the batch has more tiles than an int32 counts.
template <typename Units>
absl::StatusOr<int32_t> WriteTileOffsets(absl::Span<const DeviceGemmProblem> problems,
                                         Units units, int32_t* offsets) {
  int64_t at = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    offsets[i] = static_cast<int32_t>(at);
    at += units(problems[i]);
    if (at > INT32_MAX) return absl::InvalidArgumentError("batch has too many tiles");
  }
  offsets[problems.size()] = static_cast<int32_t>(at);
  return static_cast<int32_t>(at);
}

// Which engine runs a problem.
enum class Path { kHopper, kSimt, kCublas };

// The pieces of a Run's workspace, in order.
struct WorkspaceLayout {
  // Hopper: table, tile offsets, map flags and the tile counter (zeroed with
  // the table), the problem of each tile (sized for the smallest tiles, the
  // largest count), maps.
  size_t hopper_table = 0, hopper_offsets = 0, hopper_flags = 0, hopper_tile_problem = 0,
         hopper_maps = 0;
  // The split-K tail's float32 partial tiles (HopperSplit; 0 bytes when none).
  size_t hopper_partials = 0;
  // SIMT: table and tile offsets.
  size_t simt_table = 0, simt_offsets = 0;
  // TF32 transposed operand copies.
  size_t transposes = 0;
  size_t total = 0;
};

// Problem `p` as the Hopper kernel takes it (Tf32AsRun for TF32 inputs),
// for sizing: tiles, the split-K tail and eligibility.
DeviceGemmProblem HopperAsRun(const DeviceGemmProblem& p, const GroupedGemmOptions& o) {
  if (o.input != DType::kFloat32) return p;
  return Tf32AsRun(p, Tf32CopiesOf(p, o.hopper_tf32_register_a), nullptr, nullptr);
}

using Encoder = PFN_cuTensorMapEncodeTiled_v12000;

// The driver's cuTensorMapEncodeTiled, or null where the driver lacks it.
Encoder TensorMapEncoder() {
  static const Encoder encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult result;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<Encoder>(fn);
  }();
  return encode;
}

bool MapType(DType t, CUtensorMapDataType* out) {
  switch (t) {
    case DType::kBFloat16: *out = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; return true;
    case DType::kFloat16: *out = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; return true;
    case DType::kFloat32: *out = CU_TENSOR_MAP_DATA_TYPE_FLOAT32; return true;
    default: return false;
  }
}

// A 2-D map of the kernel's kind (128-byte swizzle, 256-byte L2 promotion,
// zero fill): extents {dim0 (innermost), dim1}, `stride` bytes between
// dim-1 rows, boxes of box0 x box1 elements.
CUresult Encode2d(Encoder encode, CUtensorMap* map, CUtensorMapDataType type, const void* base,
                  uint64_t dim0, uint64_t dim1, uint64_t stride, uint32_t box0, uint32_t box1) {
  const cuuint64_t dims[2] = {dim0, dim1};
  const cuuint64_t strides[1] = {stride};
  const cuuint32_t box[2] = {box0, box1};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// True when A and B of `p` and every one of their rows start on a multiple
// of `bytes` (elements of `input`).
bool RowsAlignedTo(const DeviceGemmProblem& p, DType input, int64_t bytes) {
  const int64_t size = static_cast<int64_t>(ElementSize(input));
  auto aligned = [bytes](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
  };
  return (p.lda * size) % bytes == 0 && (p.ldb * size) % bytes == 0 && aligned(p.a) &&
         aligned(p.b);
}

}  // namespace

std::string CudaErrorString(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

struct GroupedGemmLauncher::Impl {
  // Tensor-map templates by (input dtype, tile width).
  std::map<std::pair<DType, int>, HopperTemplates> templates;
  // Placeholder device buffer the templates were encoded with.
  void* scratch = nullptr;
  // cuBLAS handles by stream (a handle's stream is per handle).
  std::mutex mu;
  std::map<cudaStream_t, cublasHandle_t> cublas;
  // Pinned host buffers for problem tables, two per stream used in turn; an
  // event marks when a buffer's copy has been consumed by the device.
  struct Staging {
    uint8_t* ptr[2] = {nullptr, nullptr};
    size_t bytes[2] = {0, 0};
    cudaEvent_t done[2] = {nullptr, nullptr};
    int next = 0;
  };
  std::map<cudaStream_t, Staging> staging;
  // Per stream: the tile counter pair of launches whose batch goes in the
  // parameters, then a pair per split tile (HopperSplit), zeroed once; each
  // launch sets the ones it uses back to zero.
  std::map<cudaStream_t, unsigned int*> counters;

  ~Impl() {
    for (auto& [stream, c] : counters) cudaFree(c);
    for (auto& [stream, handle] : cublas) cublasDestroy(handle);
    for (auto& [stream, s] : staging) {
      for (int i = 0; i < 2; ++i) {
        if (s.ptr[i] != nullptr) cudaFreeHost(s.ptr[i]);
        if (s.done[i] != nullptr) cudaEventDestroy(s.done[i]);
      }
    }
    if (scratch != nullptr) cudaFree(scratch);
  }

  // One pinned buffer handed out by Stage(), to be filled and given to Send().
  struct Staged {
    uint8_t* host = nullptr;  // `bytes` bytes, filled by the caller (not zeroed).
    size_t bytes = 0;
    Staging* staging = nullptr;  // Whose buffer it is...
    int index = 0;               // ...and which of its two.
  };

  // A pinned buffer of `bytes` for the next upload on `stream`, to be
  // filled in place and sent with Send(): the table is built where the copy
  // reads it, with no host allocation per launch (a fresh buffer of a few
  // hundred KB costs page faults on every call). Waits until the device has
  // read what was last sent from this buffer.
  absl::StatusOr<Staged> Stage(cudaStream_t stream, size_t bytes) {
    Staging* s;
    {
      std::lock_guard<std::mutex> lock(mu);
      s = &staging[stream];
    }
    const int i = s->next;
    s->next ^= 1;
    if (s->done[i] == nullptr) {
      cudaError_t e = cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming);
      if (e != cudaSuccess) return Error("creating a staging event", e);
    } else {
      // The copy that last used this buffer must have been read.
      cudaError_t e = cudaEventSynchronize(s->done[i]);
      if (e != cudaSuccess) return Error("waiting for a staging buffer", e);
    }
    if (s->bytes[i] < bytes) {
      if (s->ptr[i] != nullptr) cudaFreeHost(s->ptr[i]);
      s->ptr[i] = nullptr;
      s->bytes[i] = 0;
      const size_t size = std::max<size_t>(bytes, 1 << 16);
      cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&s->ptr[i]), size, cudaHostAllocPortable);
      if (e != cudaSuccess) return Error("allocating pinned staging", e);
      s->bytes[i] = size;
    }
    return Staged{s->ptr[i], bytes, s, i};
  }

  // Copies `staged` to `device`, asynchronously on `stream` (the stream it
  // was staged for), and marks when the copy has read it.
  static cudaError_t Send(const Staged& staged, void* device, cudaStream_t stream) {
    cudaError_t e =
        cudaMemcpyAsync(device, staged.host, staged.bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return e;
    return cudaEventRecord(staged.staging->done[staged.index], stream);
  }

  static constexpr size_t kCounters = 2 + 2 * kHopperMaxSplitTiles + 2;
  static constexpr size_t kSimtCounters = kCounters - 2;  // The SIMT kernels' pair.

  // `stream`'s self-resetting counters (kCounters, allocated and zeroed on
  // the stream the first time): the Hopper kernel's tile counter pair, the
  // split tiles' pairs, then the SIMT kernels' tile counter pair.
  absl::StatusOr<unsigned int*> Counters(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = counters.find(stream);
    if (it != counters.end()) return it->second;
    unsigned int* c = nullptr;
    cudaError_t e = cudaMalloc(&c, kCounters * sizeof(unsigned int));
    if (e != cudaSuccess) return Error("allocating tile counters", e);
    e = cudaMemsetAsync(c, 0, kCounters * sizeof(unsigned int), stream);
    if (e != cudaSuccess) {
      cudaFree(c);
      return Error("zeroing tile counters", e);
    }
    counters.emplace(stream, c);
    return c;
  }

  static absl::Status Error(absl::string_view what, cudaError_t e) {
    return absl::InternalError(absl::StrCat(what, ": ", CudaErrorString(e)));
  }

  absl::StatusOr<cublasHandle_t> Cublas(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cublas.find(stream);
    if (it != cublas.end()) return it->second;
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
      return absl::InternalError("cublasCreate failed");
    }
    cublasSetStream(handle, stream);
    cublas.emplace(stream, handle);
    return handle;
  }
};

GroupedGemmLauncher::~GroupedGemmLauncher() = default;

bool GroupedGemmLauncher::HopperEligible(const DeviceGemmProblem& p, DType input) {
  return RowsAlignedTo(p, input, 16) && p.m < (int64_t{1} << 31) && p.n < (int64_t{1} << 31) &&
         p.k < (int64_t{1} << 31);
}

absl::StatusOr<std::unique_ptr<GroupedGemmLauncher>> GroupedGemmLauncher::Create(int device) {
  std::unique_ptr<GroupedGemmLauncher> launcher(new GroupedGemmLauncher());
  launcher->device_ = device;
  launcher->impl_ = std::make_unique<Impl>();
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return absl::UnavailableError(CudaErrorString(e));
  launcher->num_sms_ = prop.multiProcessorCount;
  launcher->hopper_ = prop.major == 9 && prop.minor == 0;
  if (!launcher->hopper_) return launcher;

  e = PrepareHopperGemm();
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("preparing the Hopper kernels: ", CudaErrorString(e)));
  }
  e = HopperMaxActiveClusters(&launcher->max_clusters_);
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("querying cluster occupancy: ", CudaErrorString(e)));
  }
  launcher->max_clusters_ = std::min(launcher->max_clusters_, launcher->num_sms_ / 2);
  e = cudaMalloc(&launcher->impl_->scratch, 256 * 128);
  if (e != cudaSuccess) return absl::ResourceExhaustedError(CudaErrorString(e));
  for (DType t : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int n : {kHopperWideN, kHopperNarrowN, kHopperSmallN}) {
      HopperTemplates templates;
      e = EncodeHopperTemplates(t, n, launcher->impl_->scratch, &templates);
      if (e != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("encoding tensor-map templates: ", CudaErrorString(e)));
      }
      launcher->impl_->templates[{t, n}] = templates;
    }
  }
  return launcher;
}

cudaError_t EncodeHopperTemplates(DType input, int tile_n, void* scratch, HopperTemplates* out) {
  const Encoder encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  CUtensorMapDataType type;
  if (!MapType(input, &type)) return cudaErrorInvalidValue;
  const uint32_t row = 128 / static_cast<uint32_t>(ElementSize(input));  // BK
  // Placeholder extents: one 128-byte row wide, 256 rows; patched on device.
  auto make_typed = [&](CUtensorMap* map, CUtensorMapDataType element, uint32_t width,
                        uint32_t box0, uint32_t box1) {
    return Encode2d(encode, map, element, scratch, width, 256, 128, box0, box1);
  };
  auto make = [&](CUtensorMap* map, uint32_t box0, uint32_t box1) {
    return make_typed(map, type, row, box0, box1);
  };
  // Output boxes: 128 bytes of a row by 64 rows.
  if (make_typed(&out->d_bf16, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 64, 64, 64) != CUDA_SUCCESS ||
      make_typed(&out->d_f16, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 64, 64, 64) != CUDA_SUCCESS ||
      make_typed(&out->d_f32, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 32, 32, 64) != CUDA_SUCCESS) {
    return cudaErrorInvalidValue;
  }
  if (make(&out->a_kmajor, row, kHopperTileM) != CUDA_SUCCESS ||
      make(&out->a_mnmajor, row, row) != CUDA_SUCCESS ||
      make(&out->b_kmajor, row, static_cast<uint32_t>(tile_n)) != CUDA_SUCCESS ||
      make(&out->b_kmajor_half, row, static_cast<uint32_t>(tile_n / 2)) != CUDA_SUCCESS ||
      make(&out->b_mnmajor, row, row) != CUDA_SUCCESS) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t EncodeHopperMaps(DType input, DType output, int tile_n, int cluster,
                             const DeviceGemmProblem& p, CUtensorMap maps[3]) {
  const Encoder encode = TensorMapEncoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  CUtensorMapDataType type, out_type;
  if (!MapType(input, &type) || !MapType(output, &out_type)) return cudaErrorInvalidValue;
  // The same boxes as the templates, with the problem's address, extents
  // (innermost first) and row stride, as the kernel's own patching sets.
  const uint64_t size = ElementSize(input);
  const uint32_t row = 128 / static_cast<uint32_t>(size);
  const uint32_t b_rows = static_cast<uint32_t>(cluster > 1 ? tile_n / 2 : tile_n);
  const CUresult a =
      p.transpose_a  // Stored k x m, or m x k.
          ? Encode2d(encode, &maps[0], type, p.a, p.m, p.k, p.lda * size, row, row)
          : Encode2d(encode, &maps[0], type, p.a, p.k, p.m, p.lda * size, row, kHopperTileM);
  const CUresult b =
      p.transpose_b  // Stored n x k, or k x n.
          ? Encode2d(encode, &maps[1], type, p.b, p.k, p.n, p.ldb * size, row, b_rows)
          : Encode2d(encode, &maps[1], type, p.b, p.n, p.k, p.ldb * size, row, row);
  if (a != CUDA_SUCCESS || b != CUDA_SUCCESS) return cudaErrorInvalidValue;
  const uint64_t out_size = ElementSize(output);
  if (reinterpret_cast<uintptr_t>(p.d) % 16 == 0 && (p.ldd * out_size) % 16 == 0) {
    // Boxes of 128 bytes of a row by 64 rows; D stored m x n, or n x m.
    const uint32_t box0 = 128 / static_cast<uint32_t>(out_size);
    const uint64_t rows = static_cast<uint64_t>(p.transpose_d ? p.n : p.m);
    const uint64_t cols = static_cast<uint64_t>(p.transpose_d ? p.m : p.n);
    if (Encode2d(encode, &maps[2], out_type, p.d, cols, rows, p.ldd * out_size, box0, 64) !=
        CUDA_SUCCESS) {
      return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

namespace {

// True when the Hopper kernel can take `p` as the launcher lays it out for
// it (HopperAsRun: TF32 copies and transposed problems).
bool HopperReady(const DeviceGemmProblem& p, const GroupedGemmOptions& o) {
  // 16-bit problems run as given: no copy of each (Plan walks every problem).
  if (o.input != DType::kFloat32) return GroupedGemmLauncher::HopperEligible(p, o.input);
  return GroupedGemmLauncher::HopperEligible(HopperAsRun(p, o), o.input);
}

// The SIMT launch's tile side: the option where set; else 128 x 128 tiles
// for float32 inputs (SimtWideGemm) when there are at least as many of them
// as SMs, so that the wider tiles' fewer loads per FMA do not cost idle SMs.
int SimtTile(absl::Span<const DeviceGemmProblem> simt, const GroupedGemmOptions& o, int num_sms) {
  if (o.simt_tile != 0) return o.simt_tile;
  if (o.input != DType::kFloat32) return kSimtTile;
  int64_t wide_tiles = 0;
  for (const DeviceGemmProblem& p : simt) {
    wide_tiles += CeilDiv(p.m, kSimtWideTile) * CeilDiv(p.n, kSimtWideTile);
    if (wide_tiles >= num_sms) return kSimtWideTile;
  }
  return kSimtTile;
}

// Decides each problem's path.
std::vector<Path> Plan(absl::Span<const DeviceGemmProblem> problems,
                       const GroupedGemmOptions& o, bool hopper) {
  std::vector<Path> paths(problems.size(), Path::kSimt);
  const bool tensor_core_type = o.input == DType::kBFloat16 || o.input == DType::kFloat16 ||
                                (o.input == DType::kFloat32 && o.precision == Precision::kTF32);
  for (size_t i = 0; i < problems.size(); ++i) {
    const DeviceGemmProblem& p = problems[i];
    if (o.family == KernelFamily::kCublas) {
      // cuBLAS has no bfloat16 x bfloat16 -> float16 (or the reverse).
      const bool mixed16 = (o.input == DType::kBFloat16 && o.output == DType::kFloat16) ||
                           (o.input == DType::kFloat16 && o.output == DType::kBFloat16);
      paths[i] = mixed16 ? Path::kSimt : Path::kCublas;
    } else if (tensor_core_type && hopper && p.k > 0 && HopperReady(p, o)) {
      paths[i] = Path::kHopper;
    } else if (tensor_core_type && !hopper && o.output != DType::kFloat16 &&
               o.output != DType::kBFloat16) {
      paths[i] = Path::kCublas;  // No sm_90a: cuBLAS's tensor cores.
    } else if (!tensor_core_type && o.cublas_min_flops > 0 && Flops(p) >= o.cublas_min_flops) {
      paths[i] = Path::kCublas;
    }
  }
  return paths;
}

// Relative rate per FLOP of the narrower tiles (less reuse of each loaded
// byte, shorter wgmma instructions). Fitted to single bf16 problems on the
// H200 (docs/BENCHMARKS.md, split-K round): a wave of 128x128 tiles took
// 0.79x the time of a wave of 128x256 tiles on 2056^3, and 128x64 tiles
// ran 1024^3 at 0.675 of the wide tile's time per k-block; the earlier
// 0.85 and 0.65 chose 128x128 for 2056^3, 18% slower than 128x256.
double TileRate(int tile_n) {
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

int64_t KBlocks(const DeviceGemmProblem& p, DType input) {
  return CeilDivPow2(p.k, 128 / static_cast<int64_t>(ElementSize(input)));
}

// Tiles of width `tile_n` (single CTAs) that cover `p`.
int64_t HopperTiles(const DeviceGemmProblem& p, int tile_n) {
  return CeilDiv(p.m, kHopperTileM) * CeilDivPow2(p.n, tile_n);
}

// Time of one k-block of a tile of width `tile_n`, in the units of
// EstimateHopperTime.
double KBlockCost(int tile_n) { return tile_n / 256.0 / TileRate(tile_n); }

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
                                        int num_sms, int splits) {
  const double per_kblock = KBlockCost(tile_n);
  const int64_t tiles = HopperTiles(p, tile_n);
  const int64_t kblocks = KBlocks(p, input);
  const double tile_cost = static_cast<double>(kblocks) * per_kblock + kPerTile;
  const int64_t waves = tiles / num_sms, tail = tiles % num_sms;
  // A unit of a tile split `s` ways.
  auto unit_cost = [&](int64_t s) {
    return static_cast<double>(CeilDiv(kblocks, s)) * per_kblock + kPerTile +
           kPerPartial * static_cast<double>(1 + s) * tile_n / 256.0;
  };
  SplitPlan plan;
  double best = static_cast<double>(waves + (tail > 0 ? 1 : 0)) * tile_cost;
  if (splits >= 2) {
    plan.splits = static_cast<int>(std::min<int64_t>({splits, kblocks, kHopperMaxSplits}));
    plan.tiles = std::min<int64_t>(tail > 0 ? tail : std::min<int64_t>(tiles, num_sms),
                                   kHopperMaxSplitTiles);
    if (plan.splits < 2 || plan.tiles == 0) return {best, SplitPlan()};
    plan.first_tile = tiles - plan.tiles;
    const double rest = static_cast<double>(CeilDiv(plan.first_tile, num_sms)) * tile_cost;
    return {rest + static_cast<double>(CeilDiv(plan.tiles * plan.splits, num_sms)) *
                       unit_cost(plan.splits),
            plan};
  }
  if (splits == 1 || tail == 0) return {best, plan};
  // The tail's units fit one wave: `s` up to num_sms / tail.
  const int64_t most = std::min<int64_t>({num_sms / tail, kblocks, kHopperMaxSplits});
  for (int64_t s = 2; s <= most; ++s) {
    const double t = static_cast<double>(waves) * tile_cost + unit_cost(s);
    if (t < best) {
      best = t;
      plan.splits = static_cast<int>(s);
      plan.tiles = tail;
      plan.first_tile = tiles - tail;
    }
  }
  return {best, plan};
}

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
std::array<BatchTally, kWidths> TallyBatch(absl::Span<const DeviceGemmProblem> problems,
                                           DType input, const std::array<int, kWidths>& widths) {
  std::array<int, kWidths> shift;
  for (size_t w = 0; w < kWidths; ++w) shift[w] = __builtin_ctz(static_cast<unsigned>(widths[w]));
  // Per width: tiles and pair tiles (integers), and each times its
  // k-blocks (doubles: a problem of 2^31 rows, columns and k-blocks
  // would overflow 64 bits).
  std::array<int64_t, kWidths> tiles{}, pair_tiles{};
  std::array<double, kWidths> tile_kblocks{}, pair_kblocks{};
  int64_t most_kblocks = -1;
  const int64_t bk = 128 / static_cast<int64_t>(ElementSize(input));  // KBlocks, divided once.
  const int bk_shift = __builtin_ctzll(static_cast<uint64_t>(bk));
  for (const DeviceGemmProblem& p : problems) {
    const int64_t kblocks = (p.k + bk - 1) >> bk_shift;  // KBlocks(p, input)
    const int64_t rows = CeilDiv(p.m, kHopperTileM);
    const int64_t pair_rows = (rows + 1) / 2 * 2;  // A pair's second tile below its problem counts.
    const double kb = static_cast<double>(kblocks);
    most_kblocks = std::max(most_kblocks, kblocks);
    // Unrolled, so that the accumulators stay in registers.
#pragma GCC unroll 4
    for (size_t w = 0; w < kWidths; ++w) {
      const int64_t columns = (p.n + widths[w] - 1) >> shift[w];
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
                          int num_sms, bool split_tail, const BatchTally& tally) {
  if (problems.size() == 1) {
    return PlanSingle(problems[0], input, tile_n, num_sms, split_tail ? 0 : 1).first;
  }
  if (tally.tiles > 4 * static_cast<int64_t>(num_sms)) {
    return tally.work / num_sms + tally.longest;
  }
  const double per_kblock = KBlockCost(tile_n);
  std::vector<double> free_at(num_sms, 0.0);  // A min-heap of SM finish times.
  for (const DeviceGemmProblem& p : problems) {
    const int64_t n = HopperTiles(p, tile_n);
    const double cost = static_cast<double>(KBlocks(p, input)) * per_kblock + kPerTile;
    for (int64_t i = 0; i < n; ++i) {
      std::pop_heap(free_at.begin(), free_at.end(), std::greater<>());
      free_at.back() += cost;
      std::push_heap(free_at.begin(), free_at.end(), std::greater<>());
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

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
              const BatchTally& wide, int num_sms) {
  if (hopper.empty() || o.family != KernelFamily::kPersistent ||
      (o.input != DType::kBFloat16 && o.input != DType::kFloat16)) {
    return false;
  }
  if (hopper.size() == 1 && (o.hopper_split_k >= 2 || wide.tiles < 2 * int64_t{num_sms} ||
                             // Rows on 32-byte sectors (each 128-byte row of a TMA
                             // box spans four sectors, not five).
                             RowsAlignedTo(hopper[0], o.input, 32))) {
    return false;
  }
  return wide.work >= kPairsMinShare * wide.pair_work;
}

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
                              const GroupedGemmOptions& o, int num_sms, int max_clusters) {
  HopperShape shape;
  if (o.hopper_pingpong) {  // 128-wide tiles, single CTAs, no split (ValidHopperOptions).
    shape.tile_n = kHopperNarrowN;
    return shape;
  }
  const bool may_split = hopper.size() == 1 && o.family == KernelFamily::kPersistent &&
                         o.hopper_split_k != 1 && o.hopper_inline_problems != 0 &&
                         o.hopper_cluster != 2;
  shape.tile_n = o.hopper_tile_n;
  std::optional<BatchTally> wide;  // TallyBatch for wide tiles, once needed.
  if (shape.tile_n == 0) {
    constexpr std::array<int, 3> kWidths = {kHopperWideN, kHopperNarrowN, kHopperSmallN};
    const std::array<BatchTally, 3> tally =
        hopper.size() > 1 ? TallyBatch(hopper, o.input, kWidths) : std::array<BatchTally, 3>{};
    if (hopper.size() > 1) wide = tally[0];
    shape.tile_n = kWidths[0];
    double best = EstimateHopperTime(hopper, o.input, kWidths[0], num_sms, may_split, tally[0]);
    for (size_t w = 1; w < kWidths.size(); ++w) {
      const double t =
          EstimateHopperTime(hopper, o.input, kWidths[w], num_sms, may_split, tally[w]);
      if (t < best) {  // Ties keep the wider.
        best = t;
        shape.tile_n = kWidths[w];
      }
    }
  }
  // Pairs where asked for, or where the launcher has the choice and they
  // pay (PairsPay); only wide tiles run in pairs.
  if (shape.tile_n == kHopperWideN && max_clusters > 0) {
    if (o.hopper_cluster == 0 && !wide) {
      wide = TallyBatch(hopper, o.input, std::array<int, 1>{kHopperWideN})[0];
    }
    shape.cluster =
        o.hopper_cluster == 2 || (o.hopper_cluster == 0 && wide && PairsPay(hopper, o, *wide, num_sms))
            ? 2
            : 1;
  }
  if (may_split && shape.cluster == 1) {
    shape.split =
        PlanSingle(hopper[0], o.input, shape.tile_n, num_sms, o.hopper_split_k).second;
  }
  return shape;
}

// Bytes of the partial tiles of `split` with tiles of width `tile_n`.
size_t PartialBytes(const SplitPlan& split, int tile_n) {
  if (split.splits < 2) return 0;
  return static_cast<size_t>(split.tiles) * split.splits * kHopperTileM * tile_n * sizeof(float);
}

WorkspaceLayout Layout(absl::Span<const DeviceGemmProblem> problems, const std::vector<Path>& paths,
                       const GroupedGemmOptions& o, size_t partial_bytes) {
  size_t hopper = 0, simt = 0, transposes = 0, hopper_tiles = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (paths[i] == Path::kHopper) {
      ++hopper;
      if (o.input == DType::kFloat32) {
        const DeviceGemmProblem run = HopperAsRun(problems[i], o);
        hopper_tiles += CeilDiv(run.m, kHopperTileM) * CeilDivPow2(run.n, kHopperSmallN);
        transposes += Tf32TransposeBytes(problems[i], o.hopper_tf32_register_a);
      } else {  // As given (HopperAsRun), without a copy of each problem.
        hopper_tiles +=
            CeilDiv(problems[i].m, kHopperTileM) * CeilDivPow2(problems[i].n, kHopperSmallN);
      }
    } else if (paths[i] == Path::kSimt) {
      ++simt;
    }
  }
  WorkspaceLayout l;
  size_t at = 0;
  l.hopper_table = at;
  at += AlignUp(hopper * sizeof(DeviceGemmProblem));
  l.hopper_offsets = at;
  at += AlignUp((hopper + 1) * sizeof(int32_t));
  l.hopper_flags = at;  // One flag per problem, then the tile counter.
  at += AlignUp((hopper + 1) * sizeof(unsigned long long));
  l.hopper_tile_problem = at;
  at += AlignUp(hopper_tiles * sizeof(int32_t));
  l.hopper_maps = at;
  at += AlignUp(hopper * 3 * sizeof(CUtensorMap));
  l.hopper_partials = at;
  at += AlignUp(partial_bytes);
  l.simt_table = at;
  at += AlignUp(simt * sizeof(DeviceGemmProblem));
  l.simt_offsets = at;
  at += AlignUp((simt + 1) * sizeof(int32_t));
  l.transposes = at;
  at += transposes;
  l.total = at;
  return l;
}

cublasComputeType_t ComputeType(const GroupedGemmOptions& o) {
  if (o.input == DType::kFloat64) return CUBLAS_COMPUTE_64F;
  if (o.input == DType::kFloat32 && o.precision == Precision::kTF32) {
    return CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  return CUBLAS_COMPUTE_32F;
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

// D = alpha op(A) op(B) + beta C through cuBLAS (column-major: D^T = op(B)^T op(A)^T).
absl::Status RunCublas(cublasHandle_t handle, const DeviceGemmProblem& p,
                       const GroupedGemmOptions& o, cudaStream_t stream) {
  const size_t out_size = ElementSize(o.output);
  if (p.beta != 0.0 && p.c != p.d) {
    cudaError_t e = cudaMemcpy2DAsync(p.d, p.ldd * out_size, p.c, p.ldc * out_size,
                                      p.n * out_size, p.m, cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return absl::InternalError(CudaErrorString(e));
  }
  const float alpha_f = static_cast<float>(p.alpha), beta_f = static_cast<float>(p.beta);
  const double alpha_d = p.alpha, beta_d = p.beta;
  const bool f64 = o.input == DType::kFloat64;
  const cublasStatus_t s = cublasGemmEx(
      handle, p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k),
      f64 ? static_cast<const void*>(&alpha_d) : &alpha_f, p.b, CudaType(o.input),
      static_cast<int>(p.ldb), p.a, CudaType(o.input), static_cast<int>(p.lda),
      f64 ? static_cast<const void*>(&beta_d) : &beta_f, p.d, CudaType(o.output),
      static_cast<int>(p.ldd), ComputeType(o), CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasGemmEx failed: ", cublasGetStatusString(s)));
  }
  return absl::OkStatus();
}

// An error naming the first Hopper option out of range.
absl::Status ValidHopperOptions(const GroupedGemmOptions& o) {
  if (o.hopper_tile_n != 0 && o.hopper_tile_n != kHopperWideN &&
      o.hopper_tile_n != kHopperNarrowN && o.hopper_tile_n != kHopperSmallN) {
    return absl::InvalidArgumentError(
        absl::StrCat("hopper_tile_n must be 0, 64, 128 or 256, not ", o.hopper_tile_n));
  }
  if (o.hopper_cluster != 0 && o.hopper_cluster != 1 && o.hopper_cluster != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("hopper_cluster must be 0, 1 or 2, not ", o.hopper_cluster));
  }
  if (o.hopper_split_k < 0 || o.hopper_split_k > kHopperMaxSplits) {
    return absl::InvalidArgumentError(absl::StrCat("hopper_split_k must be 0 to ",
                                                   kHopperMaxSplits, ", not ", o.hopper_split_k));
  }
  if (o.hopper_pingpong) {
    if (o.input != DType::kBFloat16 && o.input != DType::kFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hopper_pingpong needs bfloat16 or float16 inputs, not ", DTypeName(o.input)));
    }
    if ((o.hopper_tile_n != 0 && o.hopper_tile_n != kHopperNarrowN) || o.hopper_cluster == 2 ||
        o.hopper_split_k > 1) {
      return absl::InvalidArgumentError(
          "hopper_pingpong runs 128x128 tiles on single CTAs without split-K: hopper_tile_n must "
          "be 0 or 128, hopper_cluster 0 or 1 and hopper_split_k 0 or 1");
    }
  }
  return absl::OkStatus();
}

// GroupedGemmOptions::simt_tile: 0, kSimtTile, or kSimtWideTile with
// float32 inputs.
absl::Status ValidSimtOptions(const GroupedGemmOptions& o) {
  if (o.simt_tile != 0 && o.simt_tile != kSimtTile && o.simt_tile != kSimtWideTile) {
    return absl::InvalidArgumentError(absl::StrCat("simt_tile must be 0, ", kSimtTile, " or ",
                                                   kSimtWideTile, ", not ", o.simt_tile));
  }
  if (o.simt_tile == kSimtWideTile && o.input != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat("simt_tile ", kSimtWideTile,
                                                   " needs float32 inputs, not ",
                                                   DTypeName(o.input)));
  }
  return absl::OkStatus();
}

// Workspace bytes of the split-K tail's partial tiles for this batch: none
// unless it has exactly one Hopper problem (ChooseHopperShape).
size_t SplitPartialBytes(absl::Span<const DeviceGemmProblem> problems,
                         const std::vector<Path>& paths, const GroupedGemmOptions& o, int num_sms,
                         int max_clusters) {
  const DeviceGemmProblem* lone = nullptr;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (paths[i] != Path::kHopper) continue;
    if (lone != nullptr) return 0;
    lone = &problems[i];
  }
  if (lone == nullptr || !ValidHopperOptions(o).ok()) return 0;
  const DeviceGemmProblem run = HopperAsRun(*lone, o);  // As Run plans it.
  const HopperShape shape =
      ChooseHopperShape(absl::MakeConstSpan(&run, 1), o, num_sms, max_clusters);
  return PartialBytes(shape.split, shape.tile_n);
}

}  // namespace

size_t GroupedGemmLauncher::WorkspaceBytes(absl::Span<const DeviceGemmProblem> problems,
                                           const GroupedGemmOptions& options) const {
  const std::vector<Path> paths = Plan(problems, options, hopper_);
  return Layout(problems, paths, options,
                SplitPartialBytes(problems, paths, options, num_sms_, max_clusters_))
      .total;
}


absl::Status GroupedGemmLauncher::Run(absl::Span<const DeviceGemmProblem> problems,
                                      const GroupedGemmOptions& options, void* workspace,
                                      size_t workspace_bytes, cudaStream_t stream,
                                      LaunchReport* report) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  auto us = [](Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double, std::micro>(to - from).count();
  };
  if (!IsSupportedOutput(options.input, options.output)) {
    return absl::InvalidArgumentError(absl::StrCat("output ", DTypeName(options.output),
                                                   " not supported for ", DTypeName(options.input)));
  }
  for (const DeviceGemmProblem& p : problems) {
    if (p.m < 0 || p.n < 0 || p.k < 0 || p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) {
      return absl::InvalidArgumentError("problem dimensions out of range");
    }
    if (p.transpose_d) {
      return absl::InvalidArgumentError("transpose_d is set by the launcher only, not by callers");
    }
  }
  if (absl::Status s = ValidHopperOptions(options); !s.ok()) return s;
  if (absl::Status s = ValidSimtOptions(options); !s.ok()) return s;
  const std::vector<Path> paths = Plan(problems, options, hopper_);
  const WorkspaceLayout layout = Layout(
      problems, paths, options, SplitPartialBytes(problems, paths, options, num_sms_, max_clusters_));
  if (workspace_bytes < layout.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("workspace of ", workspace_bytes, " bytes, need ", layout.total));
  }
  LaunchReport local;
  LaunchReport& r = report != nullptr ? *report : local;
  r = LaunchReport();
  auto* ws = static_cast<uint8_t*>(workspace);
  auto check = [](cudaError_t e) -> absl::Status {
    if (e != cudaSuccess) return absl::InternalError(CudaErrorString(e));
    return absl::OkStatus();
  };

  // ---- Hopper problems --------------------------------------------------------
  // `hopper`: the batch's Hopper problems as the kernel takes them. Where
  // that is every problem as given (16-bit inputs, no other path), it is the
  // caller's span: copying 1,024 problems cost a few µs of the plan phase.
  // Otherwise `selected` holds the Hopper problems, TF32 ones re-laid out.
  std::vector<DeviceGemmProblem> selected;
  absl::Span<const DeviceGemmProblem> hopper;
  const bool as_given = options.input != DType::kFloat32 &&
                        std::all_of(paths.begin(), paths.end(),
                                    [](Path path) { return path == Path::kHopper; });
  if (as_given) {
    hopper = problems;
  } else {
    selected.reserve(problems.size());
  }
  size_t transpose_at = layout.transposes;
  // TF32: the operands Tf32CopiesOf names are copied K-major into the
  // workspace, all of the batch's copies in as few launches as
  // LaunchTransposes32 needs; Tf32AsRun lays out the rest.
  std::vector<TransposeJob> copies;
  for (size_t i = 0; i < problems.size() && !as_given; ++i) {
    if (paths[i] != Path::kHopper) continue;
    DeviceGemmProblem p = problems[i];
    if (options.input == DType::kFloat32) {
      // An operand stored k x `cols` (leading dimension `ld`) into `cols`
      // rows of k.
      auto copy = [&](const void* stored, int64_t cols, int64_t ld) {
        auto* dst = reinterpret_cast<float*>(ws + transpose_at);
        copies.push_back({static_cast<const float*>(stored), dst, p.k, cols, ld, Tf32CopyLd(p.k)});
        transpose_at += Tf32CopyBytes(cols, p.k);
        return dst;
      };
      const Tf32Copies c = Tf32CopiesOf(p, options.hopper_tf32_register_a);
      const float* copy_a = c.a ? copy(p.a, p.m, p.lda) : nullptr;
      const float* copy_b = c.b ? copy(p.b, p.n, p.ldb) : nullptr;
      p = Tf32AsRun(p, c, copy_a, copy_b);
      if (!HopperEligible(p, DType::kFloat32)) {
        return absl::InvalidArgumentError("TF32 operands must be 16-byte aligned");
      }
    }
    selected.push_back(p);
  }
  if (!copies.empty()) {
    if (auto s = check(LaunchTransposes32(copies.data(), static_cast<int>(copies.size()), stream,
                                          &r.launches));
        !s.ok()) {
      return s;
    }
  }
  if (!as_given) hopper = selected;
  if (!hopper.empty()) {
    const HopperShape shape = ChooseHopperShape(hopper, options, num_sms_, max_clusters_);
    const int tile_n = shape.tile_n;
    const int cluster = shape.cluster;
    SplitPlan split = shape.split;
    auto tiles_of = [&](const DeviceGemmProblem& p) {
      return CeilDivPow2(CeilDiv(p.m, kHopperTileM), cluster) * CeilDivPow2(p.n, tile_n);
    };
    // The split tiles of a lone problem count `splits` units each.
    auto units_of = [&](const DeviceGemmProblem& p) {
      return tiles_of(p) + (split.splits > 1 ? split.tiles * (split.splits - 1) : 0);
    };
    std::vector<int32_t> offsets(hopper.size() + 1);
    absl::StatusOr<int32_t> total = WriteTileOffsets(hopper, units_of, offsets.data());
    if (!total.ok()) return total.status();
    const Clock::time_point planned = Clock::now();
    Clock::time_point built = planned;  // Set where each way has written its batch.
    HopperLaunch l;
    // Small batches: everything in the launch's parameters.
    const int inline_limit = options.hopper_inline_problems < 0
                                 ? kHopperInlineProblems
                                 : std::min(options.hopper_inline_problems, kHopperInlineProblems);
    HopperInlineBatch inline_batch;
    bool use_inline = static_cast<int>(hopper.size()) <= inline_limit;
    if (use_inline) {
      std::copy(offsets.begin(), offsets.end(), inline_batch.tile_offsets);
      for (size_t i = 0; i < hopper.size() && use_inline; ++i) {
        inline_batch.problems[i] = hopper[i];
        // A map TMA cannot describe sends the batch the table's way, where
        // the kernel patches its maps.
        use_inline = offsets[i + 1] == offsets[i] ||
                     EncodeHopperMaps(options.input, options.output, tile_n, cluster, hopper[i],
                                      inline_batch.maps[i]) == cudaSuccess;
      }
      inline_batch.count = static_cast<int>(hopper.size());
    }
    if (!use_inline && split.splits > 1) {
      // Only batches in the parameters split (the table sizes its tile
      // owners for whole tiles): the tile list without the split.
      split = SplitPlan();
      total = WriteTileOffsets(hopper, units_of, offsets.data());
      if (!total.ok()) return total.status();
    }
    if (use_inline) {
      built = Clock::now();
      absl::StatusOr<unsigned int*> counters = impl_->Counters(stream);
      if (!counters.ok()) return counters.status();
      l.inline_batch = &inline_batch;
      l.tile_counter = *counters;
      if (split.splits > 1) {
        l.split.problem = 0;
        l.split.first_tile = static_cast<int>(split.first_tile);
        l.split.tiles = static_cast<int>(split.tiles);
        l.split.splits = split.splits;
        l.split.partials = reinterpret_cast<float*>(ws + layout.hopper_partials);
        l.split.counters = *counters + 2;
      }
    } else {
      // Table, offsets, zeroed flags and tile owners, built in pinned
      // staging and sent in one copy. The tensor-map slots after them are
      // written by the kernel, and zeroed first only under tools
      // (ZeroMapSlots): for small batches the zeroed slots ride along in the
      // same copy (a few KiB over PCIe cost less than another operation on
      // the stream); for large ones (384 bytes a problem) they are zeroed on
      // the device.
      const bool zero_maps = ZeroMapSlots();
      const size_t maps_bytes = hopper.size() * 3 * sizeof(CUtensorMap);
      const bool maps_in_copy = zero_maps && maps_bytes <= kMapsInCopyBytes;
      const size_t table_bytes =
          layout.hopper_maps - layout.hopper_table + (maps_in_copy ? maps_bytes : 0);
      absl::StatusOr<Impl::Staged> staged = impl_->Stage(stream, table_bytes);
      if (!staged.ok()) return staged.status();
      uint8_t* host = staged->host;
      std::memcpy(host, hopper.data(), hopper.size() * sizeof(DeviceGemmProblem));
      std::memcpy(host + layout.hopper_offsets - layout.hopper_table, offsets.data(),
                  offsets.size() * sizeof(int32_t));
      // The staging is not zeroed: the flags (and the map slots when they
      // ride along) must be. Padding between the regions and tile owners
      // past the batch's tiles are sent as they are and never read.
      std::memset(host + layout.hopper_flags - layout.hopper_table, 0,
                  (hopper.size() + 1) * sizeof(unsigned long long));
      if (maps_in_copy) {
        std::memset(host + layout.hopper_maps - layout.hopper_table, 0, maps_bytes);
      }
      auto* tile_problem =
          reinterpret_cast<int32_t*>(host + layout.hopper_tile_problem - layout.hopper_table);
      for (size_t i = 0; i < hopper.size(); ++i) {
        std::fill(tile_problem + offsets[i], tile_problem + offsets[i + 1],
                  static_cast<int32_t>(i));
      }
      built = Clock::now();
      if (auto s = check(Impl::Send(*staged, ws + layout.hopper_table, stream)); !s.ok()) {
        return s;
      }
      if (zero_maps && !maps_in_copy) {
        if (auto s = check(cudaMemsetAsync(ws + layout.hopper_maps, 0, maps_bytes, stream));
            !s.ok()) {
          return s;
        }
      }
      l.problems = reinterpret_cast<const DeviceGemmProblem*>(ws + layout.hopper_table);
      l.tile_offsets = reinterpret_cast<const int32_t*>(ws + layout.hopper_offsets);
      l.tile_problem = reinterpret_cast<const int32_t*>(ws + layout.hopper_tile_problem);
      l.maps = reinterpret_cast<CUtensorMap*>(ws + layout.hopper_maps);
      l.map_flags = reinterpret_cast<unsigned long long*>(ws + layout.hopper_flags);
      l.tile_counter = reinterpret_cast<unsigned int*>(l.map_flags + hopper.size());
      l.epoch = 1;  // Flags were zeroed by the copy above.
    }
    l.input = options.input;
    l.output = options.output;
    l.edge_tiles = options.hopper_edge_tiles;
    l.pingpong = options.hopper_pingpong;
    l.tile_n = tile_n;
    l.num_problems = static_cast<int>(hopper.size());
    l.total_tiles = *total;
    l.cluster = cluster;
    l.grid = options.family == KernelFamily::kNonPersistent
                 ? *total * cluster
                 : (cluster == 2 ? 2 * std::min(*total, max_clusters_)
                                 : std::min(*total, num_sms_));
    l.templates = &impl_->templates.at({options.input, tile_n});
    l.stream = stream;
    if (auto s = check(LaunchHopperGemm(l)); !s.ok()) return s;
    ++r.launches;
    r.hopper_problems = static_cast<int>(hopper.size());
    r.hopper_tile = absl::StrCat(kHopperTileM, "x", tile_n, cluster == 2 ? " x2 cluster" : "",
                                 options.hopper_pingpong ? " ping-pong" : "");
    r.hopper_grid = l.grid;
    r.hopper_inline = use_inline;
    r.hopper_split_k = split.splits;
    r.hopper_split_tiles = static_cast<int>(split.tiles);
    r.hopper_plan_us = us(start, planned);
    r.hopper_build_us = us(planned, built);
    r.hopper_enqueue_us = us(built, Clock::now());
  }

  // ---- SIMT problems ------------------------------------------------------------
  std::vector<DeviceGemmProblem> simt;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (paths[i] == Path::kSimt) simt.push_back(problems[i]);
  }
  if (!simt.empty()) {
    const size_t table_bytes = layout.transposes - layout.simt_table;
    absl::StatusOr<Impl::Staged> staged = impl_->Stage(stream, table_bytes);
    if (!staged.ok()) return staged.status();
    uint8_t* host = staged->host;
    std::memcpy(host, simt.data(), simt.size() * sizeof(DeviceGemmProblem));
    const int tile = SimtTile(simt, options, num_sms_);
    absl::StatusOr<int32_t> tiles = WriteTileOffsets(
        simt, [tile](const DeviceGemmProblem& p) { return CeilDiv(p.m, tile) * CeilDiv(p.n, tile); },
        reinterpret_cast<int32_t*>(host + layout.simt_offsets - layout.simt_table));
    if (!tiles.ok()) return tiles.status();
    if (auto s = check(Impl::Send(*staged, ws + layout.simt_table, stream)); !s.ok()) {
      return s;
    }
    SimtLaunch l;
    l.input = options.input;
    l.output = options.output;
    l.problems = reinterpret_cast<const DeviceGemmProblem*>(ws + layout.simt_table);
    l.tile_offsets = reinterpret_cast<const int32_t*>(ws + layout.simt_offsets);
    l.num_problems = static_cast<int>(simt.size());
    l.tile = tile;
    l.total_tiles = *tiles;
    // Persistent: blocks claim tiles from a counter. Two 256-thread blocks
    // fit an SM at 128 registers a thread (both kernels); a 64 x 64 launch
    // asks for four an SM, and those that start late take what is left.
    if (options.family == KernelFamily::kNonPersistent) {
      l.grid = l.total_tiles;
    } else {
      l.grid = std::min(*tiles, (tile == kSimtWideTile ? 2 : 4) * num_sms_);
      absl::StatusOr<unsigned int*> counters = impl_->Counters(stream);
      if (!counters.ok()) return counters.status();
      l.tile_counter = *counters + Impl::kSimtCounters;
    }
    l.stream = stream;
    if (auto s = check(LaunchSimtGemm(l)); !s.ok()) return s;
    ++r.launches;
    r.simt_problems = static_cast<int>(simt.size());
    r.simt_tile = tile;
  }

  // ---- cuBLAS problems ----------------------------------------------------------
  for (size_t i = 0; i < problems.size(); ++i) {
    if (paths[i] != Path::kCublas) continue;
    absl::StatusOr<cublasHandle_t> handle = impl_->Cublas(stream);
    if (!handle.ok()) return handle.status();
    if (auto s = RunCublas(*handle, problems[i], options, stream); !s.ok()) return s;
    ++r.launches;
    ++r.cublas_problems;
  }
  return absl::OkStatus();
}

}  // namespace matmul::cuda
