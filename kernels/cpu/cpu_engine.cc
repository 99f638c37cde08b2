#include "kernels/cpu/cpu_engine.h"

#include <cblas.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/half.h"

namespace matmul {
namespace {

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "CPU";
}

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * page_size : 0;
}

// Widens `n` elements of a 16-bit float type to float32.
void Widen(DType type, const void* in, float* out, size_t n) {
  const auto* src = static_cast<const uint16_t*>(in);
  if (type == DType::kFloat16) {
    HalfToFloat(src, out, n);
  } else {
    BFloat16ToFloat(src, out, n);
  }
}

// A float buffer that is written before it is read: handed out without
// zeroing, and kept by its thread between calls while it is small, so that a
// stream of small and medium problems reuses warm pages instead of taking
// fresh ones from the kernel (page faults and page clearing were 7% of a CPU
// server's time on small bfloat16 requests, with as much again in zeroing
// std::vector storage that the widening then overwrote).
class Scratch {
 public:
  // Storage for `n` floats, contents unspecified.
  float* Get(size_t n) {
    if (n > size_) {
      data_ = std::make_unique_for_overwrite<float[]>(n);
      size_ = n;
    }
    return data_.get();
  }
  // Gives a large buffer back once the call that needed it is done.
  void Trim() {
    if (size_ * sizeof(float) > kKeepBytes) {
      data_.reset();
      size_ = 0;
    }
  }

 private:
  static constexpr size_t kKeepBytes = size_t{4} << 20;  // A 1024 x 1024 float matrix.
  std::unique_ptr<float[]> data_;
  size_t size_ = 0;  // Floats in data_.
};

// Per thread (workers run batches in parallel): the widened A and B and the
// float32 result before narrowing.
struct ThreadScratch {
  Scratch a, b, d;
  void Trim() {
    a.Trim();
    b.Trim();
    d.Trim();
  }
};
thread_local ThreadScratch t_scratch;

// Copies `n` elements to a buffer aligned for `T` when `p` is not aligned.
template <typename T>
const T* Aligned(const void* p, size_t n, std::vector<T>* storage) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) == 0) return static_cast<const T*>(p);
  storage->resize(n);
  std::memcpy(storage->data(), p, n * sizeof(T));
  return storage->data();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> CpuEngine::Create(const CpuEngineOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu threads must be >= 0, got ", options.threads));
  }
  if (options.threads > 0) openblas_set_num_threads(options.threads);
  DeviceDescription device;
  device.id = absl::StrCat("cpu:", options.index);
  device.name = CpuModelName();
  device.kind = "cpu";
  device.memory_bytes = HostMemoryBytes();
  device.compute_units = static_cast<uint32_t>(openblas_get_num_threads());
  return std::unique_ptr<Engine>(new CpuEngine(std::move(device)));
}

void CpuEngine::Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) {
  // Resident matrices of this engine live in host memory: use them in place.
  for (size_t i = 0; i < problems.size(); ++i) status[i] = RunOne(ResolveHostResident(problems[i]));
}

absl::Status CpuEngine::RunOne(const GemmProblem& p) {
  constexpr int64_t kMaxBlasInt = std::numeric_limits<blasint>::max();
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.m > kMaxBlasInt || p.n > kMaxBlasInt ||
      p.k > kMaxBlasInt) {
    return absl::InvalidArgumentError(
        absl::StrCat("dimensions out of range: m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (!IsSupportedOutput(p.input_type, p.output_type)) {
    return absl::InvalidArgumentError(absl::StrCat("output ", DTypeName(p.output_type),
                                                   " not supported for ",
                                                   DTypeName(p.input_type), " inputs"));
  }
  if (p.a == nullptr || p.b == nullptr || p.d == nullptr || (p.beta != 0.0 && p.c == nullptr)) {
    return absl::InvalidArgumentError("missing operand");
  }
  const auto ta = p.transpose_a ? CblasTrans : CblasNoTrans;
  const auto tb = p.transpose_b ? CblasTrans : CblasNoTrans;
  const blasint m = p.m, n = p.n, k = p.k;
  const blasint lda = LeadingDimA(p), ldb = LeadingDimB(p);
  const size_t a_elems = static_cast<size_t>(m) * k;
  const size_t b_elems = static_cast<size_t>(k) * n;
  const size_t d_elems = static_cast<size_t>(m) * n;
  const bool use_c = p.beta != 0.0;

  if (p.input_type == DType::kFloat64) {
    std::vector<double> sa, sb, sd;
    const double* a = Aligned<double>(p.a, a_elems, &sa);
    const double* b = Aligned<double>(p.b, b_elems, &sb);
    const bool d_aligned = reinterpret_cast<uintptr_t>(p.d) % alignof(double) == 0;
    if (!d_aligned) sd.resize(d_elems);
    double* d = d_aligned ? static_cast<double*>(p.d) : sd.data();
    if (use_c) std::memcpy(d, p.c, d_elems * sizeof(double));
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, p.alpha, a, lda, b, ldb, use_c ? p.beta : 0.0, d,
                n);
    if (!d_aligned) std::memcpy(p.d, sd.data(), d_elems * sizeof(double));
    return absl::OkStatus();
  }

  // float32 arithmetic for float32, float16 and bfloat16 inputs.
  std::vector<float> sa, sb;  // Aligned copies of float32 operands (rare).
  const float* a;
  const float* b;
  if (p.input_type == DType::kFloat32) {
    a = Aligned<float>(p.a, a_elems, &sa);
    b = Aligned<float>(p.b, b_elems, &sb);
  } else {
    float* wa = t_scratch.a.Get(a_elems);
    float* wb = t_scratch.b.Get(b_elems);
    Widen(p.input_type, p.a, wa, a_elems);
    Widen(p.input_type, p.b, wb, b_elems);
    a = wa;
    b = wb;
  }
  const bool direct = p.output_type == DType::kFloat32 &&
                      reinterpret_cast<uintptr_t>(p.d) % alignof(float) == 0;
  float* d = direct ? static_cast<float*>(p.d) : t_scratch.d.Get(d_elems);
  if (use_c) {
    if (p.output_type == DType::kFloat32) {
      std::memcpy(d, p.c, d_elems * sizeof(float));
    } else {
      Widen(p.output_type, p.c, d, d_elems);
    }
  }
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(p.alpha), a, lda, b, ldb,
              use_c ? static_cast<float>(p.beta) : 0.0f, d, n);
  if (!direct) {
    auto* out = static_cast<uint16_t*>(p.d);
    switch (p.output_type) {
      case DType::kFloat32: std::memcpy(p.d, d, d_elems * sizeof(float)); break;
      case DType::kFloat16: FloatToHalf(d, out, d_elems); break;
      case DType::kBFloat16: FloatToBFloat16(d, out, d_elems); break;
      case DType::kFloat64: break;  // Rejected above.
    }
  }
  t_scratch.Trim();
  return absl::OkStatus();
}

}  // namespace matmul
