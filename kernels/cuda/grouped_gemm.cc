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
#include "kernels/cuda/hopper_plan.h"
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
// Zeroed where MATMUL_ZERO_MAP_SLOTS=1 asks for it (sanitize_kernels.sh
// sets it) or a tool is loaded into CUDA through CUDA_INJECTION64_PATH (the
// driver's injection hook; whether compute-sanitizer sets it has not been
// checked on a GPU host); otherwise left out: for 1024 problems it was a
// 384 KiB memset, one more operation ahead of the kernel on the stream and
// a few µs of the launcher's host time.
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
  // TF32: HopperEligible(HopperAsRun(p, o)), without building the problem.
  constexpr int64_t kLimit = int64_t{1} << 31;
  return Tf32RunShapeOf(p, Tf32CopiesOf(p, o.hopper_tf32_register_a)).rows_aligned &&
         p.m < kLimit && p.n < kLimit && p.k < kLimit;
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
        const DeviceGemmProblem& p = problems[i];
        const Tf32Copies copies = Tf32CopiesOf(p, o.hopper_tf32_register_a);
        const Tf32RunShape run = Tf32RunShapeOf(p, copies);  // HopperAsRun's m and n.
        hopper_tiles += CeilDiv(run.m, kHopperTileM) * CeilDivPow2(run.n, kHopperSmallN);
        transposes += Tf32TransposeBytes(p, copies);
      } else {  // As given (HopperAsRun), without a copy of each problem.
        hopper_tiles += HopperTiles(problems[i], kHopperSmallN);
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
  // Otherwise the first `selected_count` of `selected` hold the Hopper
  // problems, TF32 ones re-laid out: this thread's buffer, kept between
  // calls (a fresh one of 112 KiB for 1,024 problems came from newly mapped
  // pages on every call, the heap having given them back to the system),
  // and never shrunk or reinitialised: every element used is overwritten.
  thread_local std::vector<DeviceGemmProblem> selected;
  size_t selected_count = 0;
  absl::Span<const DeviceGemmProblem> hopper;
  const bool as_given = options.input != DType::kFloat32 &&
                        std::all_of(paths.begin(), paths.end(),
                                    [](Path path) { return path == Path::kHopper; });
  if (as_given) {
    hopper = problems;
  } else {
    const size_t count = static_cast<size_t>(
        std::count(paths.begin(), paths.end(), Path::kHopper));
    if (selected.size() < count) selected.resize(count);
  }
  size_t transpose_at = layout.transposes;
  // TF32: the operands Tf32CopiesOf names are copied K-major into the
  // workspace, all of the batch's copies in as few launches as
  // LaunchTransposes32 needs; Tf32AsRun lays out the rest.
  std::vector<TransposeJob> copies;
  for (size_t i = 0; i < problems.size() && !as_given; ++i) {
    if (paths[i] != Path::kHopper) continue;
    const DeviceGemmProblem& p = problems[i];
    if (options.input != DType::kFloat32) {
      selected[selected_count++] = p;
      continue;
    }
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
    DeviceGemmProblem& run = selected[selected_count++];
    Tf32AsRunInto(p, c, copy_a, copy_b, &run);
    if (!HopperEligible(run, DType::kFloat32)) {
      return absl::InvalidArgumentError("TF32 operands must be 16-byte aligned");
    }
  }
  if (!copies.empty()) {
    if (auto s = check(LaunchTransposes32(copies.data(), static_cast<int>(copies.size()), stream,
                                          &r.launches));
        !s.ok()) {
      return s;
    }
  }
  if (!as_given) hopper = absl::MakeConstSpan(selected.data(), selected_count);
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
