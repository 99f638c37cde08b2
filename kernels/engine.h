// The engine interface: what the server hands a device, and what every
// backend (the OpenBLAS CPU engine, the CUDA persistent-kernel engine,
// cuBLAS) implements.
//
// An engine runs a batch of GEMM problems whose shapes may differ:
//
//   std::vector<matmul::GemmProblem> batch = ...;   // pointers into host memory
//   std::vector<absl::Status> status(batch.size());
//   engine->Run(batch, absl::MakeSpan(status));      // blocks until done
//
// Each problem computes D = alpha * op(A) * op(B) + beta * C on dense,
// row-major host matrices. An engine owns one device (or the host's cores);
// the server runs one worker per engine.
#ifndef MATMUL_KERNELS_ENGINE_H_
#define MATMUL_KERNELS_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "kernels/host_buffer.h"

namespace matmul {

// A matrix kept in an engine's memory between requests: an operand uploaded
// once and used by many products, or a result kept for a later product.
// Made by Engine::CreateResident and used only with the engine that made it
// (the CUDA engine keeps it in device memory, rows padded as its kernels
// like; the CPU engine in host memory). Freed when destroyed.
class ResidentMatrix {
 public:
  virtual ~ResidentMatrix() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  DType dtype() const { return dtype_; }
  // Dense size, rows * cols * element size.
  uint64_t bytes() const {
    return static_cast<uint64_t>(rows_) * static_cast<uint64_t>(cols_) * ElementSize(dtype_);
  }
  // Memory it holds on its engine (padding included).
  virtual uint64_t footprint() const { return bytes(); }

 protected:
  ResidentMatrix(int64_t rows, int64_t cols, DType dtype) : rows_(rows), cols_(cols), dtype_(dtype) {}

 private:
  const int64_t rows_;
  const int64_t cols_;
  const DType dtype_;
};

// Bits of GemmProblem::resident.
inline constexpr uint32_t kResidentA = 1, kResidentB = 2, kResidentC = 4, kResidentD = 8;

// One product D = alpha * op(A) * op(B) + beta * C. op(A) is m x k, op(B) is
// k x n, C and D are m x n. A is stored row-major as m x k, or as k x m when
// transpose_a is set (likewise B); matrices are dense (leading dimension =
// stored column count). A and B have `input_type`; C and D have
// `output_type`. C is read only when beta != 0 and may be null otherwise.
struct GemmProblem {
  DType input_type = DType::kFloat32;
  DType output_type = DType::kFloat32;
  Precision precision = Precision::kDefault;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  double alpha = 1.0;
  double beta = 0.0;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  // When set, that operand (or the result) is this resident matrix of the
  // engine that runs the problem, stored as the matching pointer's matrix
  // would be (A is m x k, or k x m when transposed), and the pointer is
  // ignored. A resident D keeps the result on the engine.
  // Which operands are (or will be, once bound) resident: kResidentA | ...
  // Staging budgets (ProblemBytes) leave those out.
  uint32_t resident = 0;
  const ResidentMatrix* a_resident = nullptr;
  const ResidentMatrix* b_resident = nullptr;
  const ResidentMatrix* c_resident = nullptr;
  ResidentMatrix* d_resident = nullptr;
  // Which host operands (and the host result d) live in page-locked
  // memory from this engine's HostBuffers() pool, with the same bits as
  // `resident`: an engine may copy them to or from its device directly
  // instead of staging them. A hint only; results are the same without it.
  uint32_t host_pinned = 0;
};

// Floating-point operations of one problem (2*m*n*k).
inline double ProblemFlops(const GemmProblem& p) {
  return 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) *
         static_cast<double>(p.k);
}

// Bytes the problem reads and writes (A, B, C when used, D), less its
// resident operands: what a batch stages to and from the device.
uint64_t ProblemBytes(const GemmProblem& p);

// Leading dimensions of the dense row-major storage.
inline int64_t LeadingDimA(const GemmProblem& p) { return p.transpose_a ? p.m : p.k; }
inline int64_t LeadingDimB(const GemmProblem& p) { return p.transpose_b ? p.k : p.n; }

// What a device is, for logs, metrics labels and GetServerInfo.
struct DeviceDescription {
  // Stable identifier, e.g. "cpu:0", "cuda:0"; used as the metrics label.
  std::string id;
  // Human name, e.g. "NVIDIA H200" or the CPU model.
  std::string name;
  // "cpu" or "cuda".
  std::string kind;
  // Device memory in bytes (host memory for the CPU).
  uint64_t memory_bytes = 0;
  // Streaming multiprocessors, or host threads used.
  uint32_t compute_units = 0;
  // "9.0" for a CUDA device, empty for the CPU.
  std::string compute_capability;
};

// Resource figures for metrics.
struct EngineStats {
  // Device memory held by batches now, and the pool's size (0 for the CPU).
  uint64_t memory_in_use_bytes = 0;
  uint64_t memory_capacity_bytes = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // The device this engine drives.
  virtual const DeviceDescription& Device() const = 0;

  // Engine family, e.g. "cpu-openblas" or "cuda-persistent-sm90".
  virtual absl::string_view Name() const = 0;

  // Runs every problem of `problems` and writes each one's outcome to the
  // matching element of `status` (same length). Blocks until the results
  // are in host memory. Safe to call from several threads at once; each call
  // is an independent batch.
  virtual void Run(absl::Span<const GemmProblem> problems,
                   absl::Span<absl::Status> status) = 0;

  // Largest ProblemBytes() one problem may ever have on this engine (its
  // device budget); 0 means no limit beyond host memory.
  virtual uint64_t MaxProblemBytes() const { return 0; }

  // False once the device failed beyond recovery; the server stops sending
  // it work and health reports it.
  virtual bool Healthy() const { return true; }

  virtual EngineStats Stats() const { return {}; }

  // Where callers should put large host operands and results for this
  // engine (see host_buffer.h); null when plain heap memory is as good (the
  // CPU engine). Lives as long as the process.
  virtual HostBufferPool* HostBuffers() const { return nullptr; }

  // Makes a rows x cols `dtype` matrix in this engine's memory, filled from
  // `host` (dense, row-major) unless `host` is null. RESOURCE_EXHAUSTED when
  // the engine's resident memory is full. The default keeps it in host
  // memory (what the CPU engine wants).
  virtual absl::StatusOr<std::unique_ptr<ResidentMatrix>> CreateResident(int64_t rows,
                                                                         int64_t cols, DType dtype,
                                                                         const void* host);
  // The footprint() that CreateResident(rows, cols, dtype, ...) would give
  // its matrix: the memory it would hold, padding included. The default:
  // the dense size.
  virtual uint64_t ResidentFootprint(int64_t rows, int64_t cols, DType dtype) const {
    return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * ElementSize(dtype);
  }
  // Copies `matrix` (made by this engine) to `host`, dense row-major,
  // matrix.bytes() long.
  virtual absl::Status ReadResident(const ResidentMatrix& matrix, void* host);
};

// The problem with every resident operand made by Engine's default
// CreateResident replaced by its host pointer (for engines that compute
// from host memory).
GemmProblem ResolveHostResident(const GemmProblem& problem);

}  // namespace matmul

#endif  // MATMUL_KERNELS_ENGINE_H_
