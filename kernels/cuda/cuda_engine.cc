#include "kernels/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/device_pool.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/parallel_copy.h"
#include "kernels/reference_gemm.h"

namespace matmul {
namespace {

using cuda::CudaErrorString;
using cuda::DeviceGemmProblem;
using cuda::GroupedGemmLauncher;
using cuda::GroupedGemmOptions;
using cuda::KernelFamily;

constexpr size_t kAlign = 256;
size_t AlignUp(size_t v, size_t a = kAlign) { return (v + a - 1) / a * a; }

// Errors after which the CUDA context cannot be trusted again.
bool IsSticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
    case cudaErrorDevicesUnavailable:
    case cudaErrorLaunchTimeout:
      return true;
    default:
      return false;
  }
}

// Elements per row once padded to a multiple of 16 bytes.
int64_t PaddedLd(int64_t cols, DType t) {
  const int64_t size = static_cast<int64_t>(ElementSize(t));
  return static_cast<int64_t>(AlignUp(cols * size, 16)) / size;
}

// Rows of a resident matrix at least this long start on
// CudaEngineOptions::resident_row_align (ResidentLd): the padding is then
// at most 1/8 of a row.
constexpr int64_t kAlignedRowBytes = 1024;

// Elements per row of a resident matrix. Rows that are 16 bytes but not a
// 32-byte sector off a line make every 128-byte TMA box row touch five
// sectors instead of four: on the H200 a k-block of 2056^3 (4112-byte
// rows) took 0.94 µs against 0.63 with all SMs loading (docs/BENCHMARKS.md,
// eighth round). A resident matrix is uploaded once and read by every
// product that names it, so its long rows can start on `align` bytes for
// free. Operands sent with each request keep 16-byte rows: those parsed
// straight into pinned memory go to the device in one 1-D copy, which
// wider rows would turn into a 2-D copy or a host-side repack.
int64_t ResidentLd(int64_t cols, DType t, int align) {
  const int64_t size = static_cast<int64_t>(ElementSize(t));
  if (cols * size < kAlignedRowBytes) return PaddedLd(cols, t);
  return static_cast<int64_t>(AlignUp(cols * size, align)) / size;
}

// Where one problem's padded operands sit in a chunk.
struct Placement {
  // Offsets: a, b (and c: C staged for a resident D) in the upload region,
  // d in the result region. Unused for resident operands.
  size_t a = 0, b = 0, c = 0, d = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
};

// One host <-> device copy that skips staging: `host` is pinned and laid
// out as the device wants it; `offset` is into the chunk's upload or result
// region.
struct DirectCopy {
  size_t offset;
  const void* host;
  size_t bytes;
};

// The ranges sorted, with touching ones merged (one copy each).
std::vector<std::pair<size_t, size_t>> Coalesce(std::vector<std::pair<size_t, size_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<size_t, size_t>> merged;
  for (const auto& r : ranges) {
    // Ranges end at their data, so the 256-byte alignment gap before the
    // next one is bridged too: one copy beats two.
    if (!merged.empty() && AlignUp(merged.back().second) >= r.first) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

// A CUDA stream with its pinned staging buffer; one per concurrent Run.
struct Context {
  cudaStream_t stream = nullptr;
  uint8_t* pinned = nullptr;
  size_t pinned_bytes = 0;
};

// A resident matrix in device memory, rows padded to 16 bytes (what the
// TMA path needs), from the engine's resident pool.
class CudaResidentMatrix final : public ResidentMatrix {
 public:
  CudaResidentMatrix(int64_t rows, int64_t cols, DType dtype, int64_t ld, void* data,
                     uint64_t footprint, std::shared_ptr<cuda::DevicePool> pool)
      : ResidentMatrix(rows, cols, dtype),
        ld_(ld),
        data_(data),
        footprint_(footprint),
        pool_(std::move(pool)) {}
  ~CudaResidentMatrix() override { pool_->Free(data_); }
  uint64_t footprint() const override { return footprint_; }
  // Leading dimension in elements.
  int64_t ld() const { return ld_; }
  void* data() const { return data_; }

 private:
  const int64_t ld_;
  void* const data_;
  const uint64_t footprint_;
  // Keeps the pool alive as long as any matrix in it.
  const std::shared_ptr<cuda::DevicePool> pool_;
};

const CudaResidentMatrix* AsCuda(const ResidentMatrix* r) {
  return static_cast<const CudaResidentMatrix*>(r);
}

class CudaEngine final : public Engine {
 public:
  CudaEngine(int ordinal, DeviceDescription device, std::unique_ptr<GroupedGemmLauncher> launcher,
             std::unique_ptr<cuda::DevicePool> pool, std::shared_ptr<cuda::DevicePool> resident_pool,
             KernelFamily family, std::map<DType, bool> hopper_ok, HostBufferPool* host_buffers,
             int resident_row_align)
      : ordinal_(ordinal),
        device_(std::move(device)),
        launcher_(std::move(launcher)),
        pool_(std::move(pool)),
        resident_pool_(std::move(resident_pool)),
        family_(family),
        hopper_ok_(std::move(hopper_ok)),
        host_buffers_(host_buffers),
        resident_row_align_(resident_row_align) {}

  ~CudaEngine() override {
    cudaSetDevice(ordinal_);
    for (Context& c : contexts_) {
      if (c.stream != nullptr) cudaStreamDestroy(c.stream);
      if (c.pinned != nullptr) cudaFreeHost(c.pinned);
    }
  }

  const DeviceDescription& Device() const override { return device_; }
  absl::string_view Name() const override {
    switch (family_) {
      case KernelFamily::kPersistent: return "cuda-persistent-sm90";
      case KernelFamily::kNonPersistent: return "cuda-nonpersistent-sm90";
      case KernelFamily::kCublas: return "cuda-cublas";
    }
    return "cuda";
  }
  bool Healthy() const override { return healthy_.load(); }
  HostBufferPool* HostBuffers() const override { return host_buffers_; }
  uint64_t MaxProblemBytes() const override { return pool_->capacity() / 2; }
  EngineStats Stats() const override {
    const uint64_t resident_in_use = resident_pool_ ? resident_pool_->in_use() : 0;
    const uint64_t resident_capacity = resident_pool_ ? resident_pool_->capacity() : 0;
    return {.memory_in_use_bytes = pool_->in_use() + resident_in_use,
            .memory_capacity_bytes = pool_->capacity() + resident_capacity};
  }

  absl::StatusOr<std::unique_ptr<ResidentMatrix>> CreateResident(int64_t rows, int64_t cols,
                                                                 DType dtype,
                                                                 const void* host) override {
    if (!healthy_.load()) return absl::UnavailableError(absl::StrCat(device_.id, " is unhealthy"));
    if (resident_pool_ == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat(device_.id, " keeps no resident matrices (no resident memory reserved)"));
    }
    const int64_t ld = ResidentLd(cols, dtype, resident_row_align_);
    const size_t size = ElementSize(dtype);
    const uint64_t footprint = ResidentFootprint(rows, cols, dtype);
    absl::StatusOr<void*> memory = resident_pool_->TryAllocate(footprint);
    if (!memory.ok()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: no room for a %d x %d %s resident matrix (%d bytes): %d of %d resident bytes in "
          "use",
          device_.id, rows, cols, DTypeName(dtype), footprint, resident_pool_->in_use(),
          resident_pool_->capacity()));
    }
    auto matrix = std::make_unique<CudaResidentMatrix>(rows, cols, dtype, ld, *memory, footprint,
                                                       resident_pool_);
    if (host != nullptr) {
      cudaSetDevice(ordinal_);
      const cudaError_t e = cudaMemcpy2D(*memory, ld * size, host, cols * size, cols * size, rows,
                                         cudaMemcpyHostToDevice);
      if (e != cudaSuccess) return Failed(e, "copying a resident matrix to the device");
    }
    return matrix;
  }

  uint64_t ResidentFootprint(int64_t rows, int64_t cols, DType dtype) const override {
    return AlignUp(static_cast<size_t>(rows) * ResidentLd(cols, dtype, resident_row_align_) *
                   ElementSize(dtype));
  }

  absl::Status ReadResident(const ResidentMatrix& matrix, void* host) override {
    const CudaResidentMatrix* m = AsCuda(&matrix);
    const size_t size = ElementSize(m->dtype());
    cudaSetDevice(ordinal_);
    const cudaError_t e = cudaMemcpy2D(host, m->cols() * size, m->data(), m->ld() * size,
                                       m->cols() * size, m->rows(), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return Failed(e, "copying a resident matrix from the device");
    return absl::OkStatus();
  }

  void Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) override {
    if (!healthy_.load()) {
      for (auto& s : status) s = absl::UnavailableError(absl::StrCat(device_.id, " is unhealthy"));
      return;
    }
    cudaSetDevice(ordinal_);
    // Group by what one launch can carry.
    std::map<std::tuple<DType, DType, Precision>, std::vector<size_t>> groups;
    for (size_t i = 0; i < problems.size(); ++i) {
      const GemmProblem& p = problems[i];
      const Precision precision = p.input_type == DType::kFloat32 ? p.precision : Precision::kDefault;
      groups[{p.input_type, p.output_type, precision}].push_back(i);
    }
    Context context = AcquireContext();
    for (auto& [key, members] : groups) RunGroup(problems, members, status, context);
    ReleaseContext(context);
  }

 private:
  Context AcquireContext() {
    absl::MutexLock lock(&contexts_mu_);
    if (!free_contexts_.empty()) {
      const size_t i = free_contexts_.back();
      free_contexts_.pop_back();
      return contexts_[i];
    }
    Context c;
    cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking);
    return c;
  }

  void ReleaseContext(const Context& c) {
    absl::MutexLock lock(&contexts_mu_);
    for (size_t i = 0; i < contexts_.size(); ++i) {
      if (contexts_[i].stream == c.stream) {
        contexts_[i] = c;
        free_contexts_.push_back(i);
        return;
      }
    }
    contexts_.push_back(c);
    free_contexts_.push_back(contexts_.size() - 1);
  }

  // Device bytes of one problem's padded A, B and D.
  static Placement Place(const GemmProblem& p) {
    Placement pl;
    pl.a_rows = p.transpose_a ? p.k : p.m;
    pl.a_cols = p.transpose_a ? p.m : p.k;
    pl.b_rows = p.transpose_b ? p.n : p.k;
    pl.b_cols = p.transpose_b ? p.k : p.n;
    pl.lda = PaddedLd(pl.a_cols, p.input_type);
    pl.ldb = PaddedLd(pl.b_cols, p.input_type);
    pl.ldd = PaddedLd(p.n, p.output_type);
    return pl;
  }
  // Whether host matrix `bit` of `p` (pinned, `cols` wide) is copied to or
  // from the device as it is: it must need no padding to `ld`.
  static bool Direct(const GemmProblem& p, uint32_t bit, int64_t ld, int64_t cols) {
    return (p.host_pinned & bit) != 0 && ld == cols;
  }
  static size_t Bytes(int64_t rows, int64_t ld, DType t) {
    return AlignUp(static_cast<size_t>(rows) * ld * ElementSize(t));
  }

  // An inline C for a result kept on the device: staged in the upload
  // region, then copied into the resident D.
  static bool StagesCIntoResidentD(const GemmProblem& p) {
    return p.d_resident != nullptr && p.beta != 0.0 && p.c_resident == nullptr;
  }

  void Fail(absl::Span<absl::Status> status, const std::vector<size_t>& which,
            const absl::Status& s) {
    for (size_t i : which) status[i] = s;
  }

  void RunGroup(absl::Span<const GemmProblem> problems, const std::vector<size_t>& members,
                absl::Span<absl::Status> status, Context& context) {
    const GemmProblem& first = problems[members.front()];
    GroupedGemmOptions options;
    options.input = first.input_type;
    options.output = first.output_type;
    options.precision = first.precision;
    options.family = family_;
    if (family_ != KernelFamily::kCublas) {
      const DType hopper_type =
          first.input_type == DType::kFloat32 && first.precision == Precision::kTF32
              ? DType::kFloat32
              : first.input_type;
      auto ok = hopper_ok_.find(hopper_type);
      if (ok != hopper_ok_.end() && !ok->second) options.family = KernelFamily::kCublas;
    }
    // Chunks that fit half the pool (so two lanes overlap); a bigger problem
    // runs alone if it fits the pool at all.
    const size_t budget = pool_->capacity() / 2;
    std::vector<size_t> chunk;
    size_t chunk_bytes = 0;
    for (size_t i : members) {
      const GemmProblem& p = problems[i];
      const Placement pl = Place(p);
      // Staged operands, result, and room for TF32's re-laid-out copies.
      size_t bytes = 4096;
      if (p.a_resident == nullptr) bytes += Bytes(pl.a_rows, pl.lda, p.input_type);
      if (p.b_resident == nullptr) bytes += Bytes(pl.b_rows, pl.ldb, p.input_type);
      if (p.d_resident == nullptr || (p.beta != 0.0 && p.c_resident == nullptr)) {
        bytes += Bytes(p.m, pl.ldd, p.output_type);
      }
      if (p.input_type == DType::kFloat32) bytes *= 2;
      if (bytes > pool_->capacity()) {
        status[i] = absl::ResourceExhaustedError(absl::StrFormat(
            "problem %d x %d x %d needs %d bytes of device memory; %s holds %d", p.m, p.n, p.k,
            bytes, device_.id, pool_->capacity()));
        continue;
      }
      if (!chunk.empty() && chunk_bytes + bytes > budget) {
        RunChunk(problems, chunk, status, context, options);
        chunk.clear();
        chunk_bytes = 0;
      }
      chunk.push_back(i);
      chunk_bytes += bytes;
    }
    if (!chunk.empty()) RunChunk(problems, chunk, status, context, options);
  }

  void RunChunk(absl::Span<const GemmProblem> problems, const std::vector<size_t>& chunk,
                absl::Span<absl::Status> status, Context& context,
                const GroupedGemmOptions& options) {
    if (!healthy_.load()) {
      Fail(status, chunk, absl::UnavailableError(absl::StrCat(device_.id, " is unhealthy")));
      return;
    }
    // Layout: [A's, B's] uploaded in one copy, [D's] (C staged into its D
    // slot when beta != 0) downloaded in one copy, then the launcher's
    // workspace.
    std::vector<Placement> placements;
    size_t upload = 0;
    for (size_t i : chunk) {
      const GemmProblem& p = problems[i];
      Placement pl = Place(p);
      pl.a = upload;
      if (p.a_resident == nullptr) upload += Bytes(pl.a_rows, pl.lda, p.input_type);
      placements.push_back(pl);
    }
    for (size_t j = 0; j < chunk.size(); ++j) {
      const GemmProblem& p = problems[chunk[j]];
      placements[j].b = upload;
      if (p.b_resident == nullptr) upload += Bytes(placements[j].b_rows, placements[j].ldb, p.input_type);
    }
    for (size_t j = 0; j < chunk.size(); ++j) {
      const GemmProblem& p = problems[chunk[j]];
      placements[j].c = upload;
      if (StagesCIntoResidentD(p)) upload += Bytes(p.m, placements[j].ldd, p.output_type);
    }
    size_t result = 0;
    for (size_t j = 0; j < chunk.size(); ++j) {
      const GemmProblem& p = problems[chunk[j]];
      placements[j].d = result;
      if (p.d_resident == nullptr) result += Bytes(p.m, placements[j].ldd, p.output_type);
    }
    // Device problems point into the chunk once its base is known.
    std::vector<DeviceGemmProblem> device_problems(chunk.size());
    const size_t workspace = launcher_->WorkspaceBytes(
        [&] {
          for (size_t j = 0; j < chunk.size(); ++j) {
            const GemmProblem& p = problems[chunk[j]];
            DeviceGemmProblem& dp = device_problems[j];
            dp.m = p.m;
            dp.n = p.n;
            dp.k = p.k;
            dp.lda = placements[j].lda;
            dp.ldb = placements[j].ldb;
            dp.ldc = dp.ldd = placements[j].ldd;
            dp.alpha = p.alpha;
            dp.beta = p.beta;
            dp.transpose_a = p.transpose_a;
            dp.transpose_b = p.transpose_b;
            // Placeholder aligned addresses for planning.
            dp.a = dp.b = reinterpret_cast<const void*>(kAlign);
            dp.d = reinterpret_cast<void*>(kAlign);
          }
          return absl::MakeConstSpan(device_problems);
        }(),
        options);
    const size_t total = upload + result + AlignUp(workspace);

    absl::StatusOr<void*> memory = pool_->Allocate(total);
    if (!memory.ok()) {
      Fail(status, chunk, memory.status());
      return;
    }
    uint8_t* base = static_cast<uint8_t*>(*memory);
    uint8_t* results = base + upload;
    void* ws = results + result;
    const absl::Status outcome = Execute(problems, chunk, placements, device_problems, base, results,
                                         upload, result, ws, workspace, context, options);
    pool_->Free(*memory);
    for (size_t i : chunk) status[i] = outcome;
  }

  absl::Status Execute(absl::Span<const GemmProblem> problems, const std::vector<size_t>& chunk,
                       const std::vector<Placement>& placements,
                       std::vector<DeviceGemmProblem>& device_problems, uint8_t* base,
                       uint8_t* results, size_t upload, size_t result, void* ws,
                       size_t workspace, Context& context, const GroupedGemmOptions& options) {
    // Pinned staging: [upload | results].
    const size_t pinned_needed = upload + result;
    if (context.pinned_bytes < pinned_needed) {
      if (context.pinned != nullptr) cudaFreeHost(context.pinned);
      context.pinned = nullptr;
      context.pinned_bytes = 0;
      const size_t bytes = std::max(pinned_needed, size_t{64} << 20);
      cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&context.pinned), bytes,
                                    cudaHostAllocPortable);
      if (e != cudaSuccess) return Failed(e, "allocating pinned staging memory");
      context.pinned_bytes = bytes;
    }
    uint8_t* pinned_results = context.pinned + upload;
    // Host operands in pinned memory with the device's row pitch go to the
    // device as they are; the others are packed into staging first. The
    // same for results. `staged_*` are the ranges of the upload and result
    // regions that travel through staging.
    std::vector<cuda::CopyJob> copies;
    std::vector<DirectCopy> direct_in, direct_out;
    std::vector<std::pair<size_t, size_t>> staged_in, staged_out;
    for (size_t j = 0; j < chunk.size(); ++j) {
      const GemmProblem& p = problems[chunk[j]];
      const Placement& pl = placements[j];
      const size_t in = ElementSize(p.input_type), out = ElementSize(p.output_type);
      DeviceGemmProblem& dp = device_problems[j];
      // An inline operand at `offset` of the upload region: direct, or
      // packed into staging.
      auto upload_operand = [&](uint32_t bit, const void* host, size_t offset, int64_t rows,
                                int64_t cols, int64_t ld) {
        const size_t bytes = static_cast<size_t>(rows) * ld * in;
        if (Direct(p, bit, ld, cols)) {
          direct_in.push_back({offset, host, bytes});
        } else {
          copies.push_back({context.pinned + offset, ld * in, host, cols * in, cols * in,
                            static_cast<size_t>(rows)});
          staged_in.emplace_back(offset, offset + bytes);
        }
      };
      if (p.a_resident != nullptr) {
        dp.a = AsCuda(p.a_resident)->data();
        dp.lda = AsCuda(p.a_resident)->ld();
      } else {
        upload_operand(kResidentA, p.a, pl.a, pl.a_rows, pl.a_cols, pl.lda);
        dp.a = base + pl.a;
      }
      if (p.b_resident != nullptr) {
        dp.b = AsCuda(p.b_resident)->data();
        dp.ldb = AsCuda(p.b_resident)->ld();
      } else {
        upload_operand(kResidentB, p.b, pl.b, pl.b_rows, pl.b_cols, pl.ldb);
        dp.b = base + pl.b;
      }
      const size_t d_bytes = static_cast<size_t>(p.m) * pl.ldd * out;
      if (p.d_resident != nullptr) {
        dp.d = AsCuda(p.d_resident)->data();
        dp.ldc = dp.ldd = AsCuda(p.d_resident)->ld();
      } else {
        dp.d = results + pl.d;
        if (Direct(p, kResidentD, pl.ldd, p.n)) {
          direct_out.push_back({pl.d, p.d, d_bytes});
        } else {
          staged_out.emplace_back(pl.d, pl.d + d_bytes);
        }
      }
      // C is copied into D's slot and read from there (for a resident D,
      // through the upload region).
      if (p.beta != 0.0 && p.c_resident == nullptr) {
        const bool direct = Direct(p, kResidentC, pl.ldd, p.n);
        if (p.d_resident != nullptr) {
          if (direct) {
            direct_in.push_back({pl.c, p.c, d_bytes});
          } else {
            staged_in.emplace_back(pl.c, pl.c + d_bytes);
          }
        }
        if (!direct) {
          uint8_t* staging = p.d_resident != nullptr ? context.pinned + pl.c : pinned_results + pl.d;
          copies.push_back(
              {staging, pl.ldd * out, p.c, p.n * out, p.n * out, static_cast<size_t>(p.m)});
        }
      }
      dp.c = p.beta != 0.0 ? dp.d : nullptr;
    }
    cuda::RunCopies(copies);
    cudaStream_t stream = context.stream;
    cudaError_t e = cudaSuccess;
    if (direct_in.empty()) {
      // Everything was staged: one copy of the whole region.
      if (upload > 0) staged_in.assign(1, {0, upload});
    }
    for (const auto& [begin, end] : Coalesce(staged_in)) {
      e = cudaMemcpyAsync(base + begin, context.pinned + begin, end - begin, cudaMemcpyHostToDevice,
                          stream);
      if (e != cudaSuccess) return Failed(e, "copying operands to the device");
    }
    for (const DirectCopy& c : direct_in) {
      e = cudaMemcpyAsync(base + c.offset, c.host, c.bytes, cudaMemcpyHostToDevice, stream);
      if (e != cudaSuccess) return Failed(e, "copying operands to the device");
    }
    for (size_t j = 0; j < chunk.size(); ++j) {
      const GemmProblem& p = problems[chunk[j]];
      if (p.beta == 0.0) continue;
      const Placement& pl = placements[j];
      const DeviceGemmProblem& dp = device_problems[j];
      const size_t out = ElementSize(p.output_type);
      if (p.c_resident != nullptr) {
        const CudaResidentMatrix* c = AsCuda(p.c_resident);
        e = cudaMemcpy2DAsync(dp.d, dp.ldd * out, c->data(), c->ld() * out, p.n * out, p.m,
                              cudaMemcpyDeviceToDevice, stream);
      } else if (p.d_resident != nullptr) {
        e = cudaMemcpy2DAsync(dp.d, dp.ldd * out, base + pl.c, pl.ldd * out, p.n * out, p.m,
                              cudaMemcpyDeviceToDevice, stream);
      } else {
        const bool direct = Direct(p, kResidentC, pl.ldd, p.n);
        e = cudaMemcpyAsync(results + pl.d, direct ? p.c : pinned_results + pl.d,
                            static_cast<size_t>(p.m) * pl.ldd * out, cudaMemcpyHostToDevice, stream);
      }
      if (e != cudaSuccess) return Failed(e, "copying C to the device");
    }
    absl::Status launched = launcher_->Run(device_problems, options, ws, workspace, stream);
    if (!launched.ok()) {
      CheckSticky();
      return absl::InternalError(absl::StrCat(device_.id, ": ", launched.message()));
    }
    if (direct_out.empty()) {
      if (result > 0) staged_out.assign(1, {0, result});
    }
    for (const auto& [begin, end] : Coalesce(staged_out)) {
      e = cudaMemcpyAsync(pinned_results + begin, results + begin, end - begin,
                          cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) return Failed(e, "copying results from the device");
    }
    for (const DirectCopy& c : direct_out) {
      e = cudaMemcpyAsync(const_cast<void*>(c.host), results + c.offset, c.bytes,
                          cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) return Failed(e, "copying results from the device");
    }
    e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return Failed(e, "running the batch");
    copies.clear();
    for (size_t j = 0; j < chunk.size(); ++j) {
      const GemmProblem& p = problems[chunk[j]];
      if (p.d_resident != nullptr) continue;
      if (Direct(p, kResidentD, placements[j].ldd, p.n)) continue;  // Already there.
      const size_t out = ElementSize(p.output_type);
      copies.push_back({p.d, p.n * out, pinned_results + placements[j].d, placements[j].ldd * out,
                        p.n * out, static_cast<size_t>(p.m)});
    }
    cuda::RunCopies(copies);
    return absl::OkStatus();
  }

  absl::Status Failed(cudaError_t e, absl::string_view what) {
    if (IsSticky(e)) healthy_.store(false);
    return absl::InternalError(
        absl::StrCat(device_.id, ": CUDA error while ", what, ": ", CudaErrorString(e),
                     IsSticky(e) ? " (device marked unhealthy)" : ""));
  }

  void CheckSticky() {
    const cudaError_t e = cudaGetLastError();
    if (IsSticky(e)) healthy_.store(false);
  }

  // CUDA device ordinal.
  const int ordinal_;
  const DeviceDescription device_;
  const std::unique_ptr<GroupedGemmLauncher> launcher_;
  const std::unique_ptr<cuda::DevicePool> pool_;
  // Resident matrices' memory (null when none is reserved); shared with the
  // matrices so that it outlives them.
  const std::shared_ptr<cuda::DevicePool> resident_pool_;
  // Kernels this engine was asked to use.
  const KernelFamily family_;
  // Input dtype -> whether our tensor-core kernel passed the self-test.
  const std::map<DType, bool> hopper_ok_;
  // Pinned host buffers for callers' operands and results (process-wide;
  // null when off).
  HostBufferPool* const host_buffers_;
  // CudaEngineOptions::resident_row_align.
  const int resident_row_align_;
  std::atomic<bool> healthy_{true};
  absl::Mutex contexts_mu_;
  std::vector<Context> contexts_ ABSL_GUARDED_BY(contexts_mu_);
  std::vector<size_t> free_contexts_ ABSL_GUARDED_BY(contexts_mu_);
};

// Runs a few problems through our kernels and cuBLAS and compares them.
absl::Status SelfTest(GroupedGemmLauncher& launcher, DType input, Precision precision,
                      cudaStream_t stream) {
  // float32 results show the kernel's own error, not output rounding.
  const DType output = DType::kFloat32;
  struct Shape {
    int64_t m, n, k;
    bool ta, tb;
    double beta;
  };
  const Shape shapes[] = {{256, 384, 320, false, false, 0.0}, {200, 136, 72, true, false, 0.5},
                          {129, 264, 200, false, true, 0.0}, {64, 72, 136, true, true, -1.0}};
  std::mt19937_64 rng(20261202);
  std::vector<DeviceGemmProblem> problems;
  std::vector<void*> buffers;
  std::vector<std::pair<size_t, size_t>> outputs;  // (index into buffers, elements)
  auto upload = [&](const std::vector<uint8_t>& host) {
    void* p = nullptr;
    cudaMalloc(&p, std::max<size_t>(host.size(), 16));
    cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice);
    buffers.push_back(p);
    return p;
  };
  for (const Shape& s : shapes) {
    DeviceGemmProblem p;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.transpose_a = s.ta;
    p.transpose_b = s.tb;
    p.lda = s.ta ? s.m : s.k;
    p.ldb = s.tb ? s.k : s.n;
    p.ldc = p.ldd = s.n;
    p.alpha = 1.25;
    p.beta = s.beta;
    p.a = upload(RandomMatrix(input, s.m * s.k, rng));
    p.b = upload(RandomMatrix(input, s.k * s.n, rng));
    p.c = upload(RandomMatrix(output, s.m * s.n, rng));
    problems.push_back(p);
  }
  GroupedGemmOptions options;
  options.input = input;
  options.output = output;
  options.precision = precision;
  std::vector<std::vector<double>> results[2];
  absl::Status status;
  for (int variant = 0; variant < 2 && status.ok(); ++variant) {
    options.family = variant == 0 ? KernelFamily::kPersistent : KernelFamily::kCublas;
    std::vector<DeviceGemmProblem> run = problems;
    for (DeviceGemmProblem& p : run) {
      p.d = upload(std::vector<uint8_t>(p.m * p.n * ElementSize(output), 0xff));
    }
    const size_t bytes = launcher.WorkspaceBytes(run, options);
    void* ws = nullptr;
    cudaMalloc(&ws, std::max<size_t>(bytes, 256));
    buffers.push_back(ws);
    status = launcher.Run(run, options, ws, bytes, stream);
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (status.ok() && e != cudaSuccess) status = absl::InternalError(CudaErrorString(e));
    for (const DeviceGemmProblem& p : run) {
      std::vector<uint8_t> host(p.m * p.n * ElementSize(output));
      cudaMemcpy(host.data(), p.d, host.size(), cudaMemcpyDeviceToHost);
      results[variant].push_back(ToDouble(host.data(), output, p.m * p.n));
    }
  }
  for (void* p : buffers) cudaFree(p);
  if (!status.ok()) return status;
  const double bound = input == DType::kFloat32 ? 5e-3 : 1e-2;
  for (size_t i = 0; i < problems.size(); ++i) {
    std::vector<uint8_t> ours(results[0][i].size() * sizeof(double));
    std::memcpy(ours.data(), results[0][i].data(), ours.size());
    const double err = RelativeError(results[1][i], ours.data(), DType::kFloat64);
    if (!(err <= bound)) {
      return absl::InternalError(absl::StrFormat(
          "%s self-test: problem %d (%dx%dx%d ta=%d tb=%d) differs from cuBLAS by %.3g",
          DTypeName(input), i, problems[i].m, problems[i].n, problems[i].k,
          problems[i].transpose_a, problems[i].transpose_b, err));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

void* PinHost(size_t bytes) {
  void* p = nullptr;
  // Portable: pinned for every GPU of the process, whichever runs the batch.
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void UnpinHost(void* p) { cudaFreeHost(p); }

// The process's pool of pinned host buffers with this budget. Never freed:
// gRPC may free a response's buffer after the engines are gone.
HostBufferPool* PinnedHostPool(uint64_t budget, size_t min_bytes) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* pools = new std::map<std::pair<uint64_t, size_t>, HostBufferPool*>;
  absl::MutexLock lock(&mu);
  HostBufferPool*& pool = (*pools)[{budget, min_bytes}];
  if (pool == nullptr) pool = new HostBufferPool(&PinHost, &UnpinHost, budget, min_bytes);
  return pool;
}

}  // namespace

absl::StatusOr<CudaEngineSet> CreateCudaEngines(const CudaEngineOptions& options) {
  // Options first: a bad value is reported the same with or without a GPU.
  KernelFamily family;
  if (options.kernels == "persistent") {
    family = KernelFamily::kPersistent;
  } else if (options.kernels == "nonpersistent") {
    family = KernelFamily::kNonPersistent;
  } else if (options.kernels == "cublas") {
    family = KernelFamily::kCublas;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda kernels must be persistent, nonpersistent or cublas, got \"", options.kernels, "\""));
  }
  unsigned wait_flag;
  if (options.host_wait == "auto") {
    wait_flag = cudaDeviceScheduleAuto;
  } else if (options.host_wait == "spin") {
    wait_flag = cudaDeviceScheduleSpin;
  } else if (options.host_wait == "yield") {
    wait_flag = cudaDeviceScheduleYield;
  } else if (options.host_wait == "block") {
    wait_flag = cudaDeviceScheduleBlockingSync;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda host wait must be auto, spin, yield or block, got \"", options.host_wait, "\""));
  }
  if (options.resident_row_align != 16 && options.resident_row_align != 32 &&
      options.resident_row_align != 64 && options.resident_row_align != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda resident row alignment must be 16, 32, 64 or 128 bytes, got ",
        options.resident_row_align));
  }
  if (!(options.memory_fraction > 0 && options.memory_fraction <= 0.95)) {
    return absl::InvalidArgumentError("gpu_memory_fraction must be in (0, 0.95]");
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no usable GPU: ", CudaErrorString(e)));
  }
  if (count == 0) return absl::UnavailableError("no usable GPU: no CUDA device found");
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int d = 0; d < count; ++d) devices.push_back(d);
  }
  std::map<int, int> instances;  // Engines per ordinal.
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d, " does not exist (", count, " CUDA device(s) visible)"));
    }
    ++instances[d];
  }
  HostBufferPool* host_buffers =
      options.pinned_host_bytes > 0
          ? PinnedHostPool(options.pinned_host_bytes, options.pinned_min_bytes)
          : nullptr;
  CudaEngineSet set;
  std::map<int, int> seen;
  // Self-test outcomes per ordinal, shared by repeated engines of one GPU.
  std::map<int, std::map<DType, bool>> tested;
  for (int d : devices) {
    e = cudaSetDevice(d);
    // Only before the context exists (a repeated ordinal shares it).
    if (e == cudaSuccess && seen[d] == 0) e = cudaSetDeviceFlags(wait_flag);
    if (e == cudaSuccess) e = cudaFree(nullptr);  // Creates the context.
    if (e != cudaSuccess) {
      return absl::UnavailableError(absl::StrCat("cuda:", d, " unusable: ", CudaErrorString(e)));
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, d);
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const int instance = seen[d]++;
    DeviceDescription device;
    device.id = instance == 0 ? absl::StrCat("cuda:", d) : absl::StrCat("cuda:", d, "/", instance);
    device.name = prop.name;
    device.kind = "cuda";
    device.memory_bytes = prop.totalGlobalMem;
    device.compute_units = static_cast<uint32_t>(prop.multiProcessorCount);
    device.compute_capability = absl::StrCat(prop.major, ".", prop.minor);

    absl::StatusOr<std::unique_ptr<GroupedGemmLauncher>> launcher = GroupedGemmLauncher::Create(d);
    if (!launcher.ok()) return launcher.status();
    std::map<DType, bool>& hopper_ok = tested[d];
    if (!(*launcher)->has_hopper_kernels()) {
      set.notes.push_back(absl::StrCat(device.id, " (", prop.name, ", compute capability ",
                                       device.compute_capability,
                                       ") has no sm_90a kernels: tensor-core work goes to cuBLAS"));
    } else if (options.self_test && family != KernelFamily::kCublas && instance == 0) {
      cudaStream_t stream;
      cudaStreamCreate(&stream);
      for (auto [type, precision] : {std::pair{DType::kBFloat16, Precision::kDefault},
                                     std::pair{DType::kFloat16, Precision::kDefault},
                                     std::pair{DType::kFloat32, Precision::kTF32}}) {
        absl::Status s = SelfTest(**launcher, type, precision, stream);
        hopper_ok[type] = s.ok();
        set.notes.push_back(s.ok() ? absl::StrCat(device.id, ": ", DTypeName(type),
                                                  " kernels agree with cuBLAS")
                                   : absl::StrCat(device.id, ": ", s.message(),
                                                  "; serving this dtype with cuBLAS instead"));
        if (!s.ok()) cudaGetLastError();
      }
      cudaStreamDestroy(stream);
    }
    const uint64_t share =
        static_cast<uint64_t>(static_cast<double>(free_bytes) * options.memory_fraction /
                              instances[d]);
    // Resident matrices get their own pool (long-lived allocations would
    // fragment the batch pool), at most half of this engine's share.
    const uint64_t resident_bytes = std::min<uint64_t>(options.resident_bytes, share / 2);
    std::shared_ptr<cuda::DevicePool> resident_pool;
    if (resident_bytes > 0) {
      absl::StatusOr<std::unique_ptr<cuda::DevicePool>> p = cuda::DevicePool::Create(d, resident_bytes);
      if (!p.ok()) return p.status();
      resident_pool = *std::move(p);
    }
    absl::StatusOr<std::unique_ptr<cuda::DevicePool>> pool =
        cuda::DevicePool::Create(d, share - resident_bytes);
    if (!pool.ok()) return pool.status();
    set.engines.push_back(std::make_unique<CudaEngine>(d, std::move(device), *std::move(launcher),
                                                       *std::move(pool), std::move(resident_pool),
                                                       family, hopper_ok, host_buffers,
                                                       options.resident_row_align));
  }
  return set;
}

}  // namespace matmul
