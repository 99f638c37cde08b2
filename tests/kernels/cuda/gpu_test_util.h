// Helpers for the GPU tests: skipping without a GPU, device buffers from
// random host data, and a multi-threaded float64 reference on the host.
#ifndef MATMUL_TESTS_KERNELS_CUDA_GPU_TEST_UTIL_H_
#define MATMUL_TESTS_KERNELS_CUDA_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/reference_gemm.h"

namespace matmul::cuda::testing {

// Empty when a CUDA GPU is usable, else why not.
inline std::string NoGpuReason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return absl::StrCat("no usable CUDA GPU (", cudaGetErrorString(e), ")");
  if (count == 0) return "no CUDA GPU present";
  return "";
}

#define MATMUL_REQUIRE_GPU()                                                   \
  do {                                                                         \
    const std::string reason = ::matmul::cuda::testing::NoGpuReason();         \
    if (!reason.empty()) GTEST_SKIP() << "GPU test skipped: " << reason;       \
  } while (0)

// A problem with its host data (row-major, explicit leading dimensions).
struct HostProblem {
  int64_t m = 1, n = 1, k = 1;
  bool transpose_a = false, transpose_b = false;
  double alpha = 1.0, beta = 0.0;
  // Extra elements per row beyond the dense width (unaligned rows when odd).
  int64_t pad_a = 0, pad_b = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  std::vector<uint8_t> a, b, c;
};

inline HostProblem MakeHostProblem(int64_t m, int64_t n, int64_t k, DType in, DType out,
                                   std::mt19937_64& rng, bool ta = false, bool tb = false,
                                   double alpha = 1.0, double beta = 0.0, int64_t pad_a = 0,
                                   int64_t pad_b = 0) {
  HostProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.transpose_a = ta;
  p.transpose_b = tb;
  p.alpha = alpha;
  p.beta = beta;
  p.lda = (ta ? m : k) + pad_a;
  p.ldb = (tb ? k : n) + pad_b;
  p.ldc = n;
  p.a = RandomMatrix(in, (ta ? k : m) * p.lda, rng);
  p.b = RandomMatrix(in, (tb ? n : k) * p.ldb, rng);
  if (beta != 0.0) p.c = RandomMatrix(out, m * n, rng);
  return p;
}

// Device copies of a batch; results come back with Download().
class DeviceBatch {
 public:
  DeviceBatch(const std::vector<HostProblem>& host, DType in, DType out) : out_(out) {
    for (const HostProblem& h : host) {
      DeviceGemmProblem p;
      p.m = h.m;
      p.n = h.n;
      p.k = h.k;
      p.lda = h.lda;
      p.ldb = h.ldb;
      p.ldc = p.ldd = h.n;
      p.alpha = h.alpha;
      p.beta = h.beta;
      p.transpose_a = h.transpose_a;
      p.transpose_b = h.transpose_b;
      p.a = Upload(h.a);
      p.b = Upload(h.b);
      if (h.beta != 0.0) p.c = Upload(h.c);
      // Poison: 0xff bytes are NaN in every format, so unwritten outputs fail.
      p.d = Upload(std::vector<uint8_t>(h.m * h.n * ElementSize(out), 0xff));
      problems_.push_back(p);
    }
  }
  ~DeviceBatch() {
    for (void* p : allocations_) cudaFree(p);
  }
  std::vector<DeviceGemmProblem>& problems() { return problems_; }
  // Poisons every output again (0xff bytes, as at upload), so that a
  // launch that leaves an element unwritten shows; false if a memset failed.
  bool Poison() {
    bool ok = true;
    for (const DeviceGemmProblem& p : problems_) {
      ok = ok && cudaMemset(p.d, 0xff, p.m * p.n * ElementSize(out_)) == cudaSuccess;
    }
    return ok;
  }
  std::vector<uint8_t> Download(size_t i) const {
    const DeviceGemmProblem& p = problems_[i];
    std::vector<uint8_t> host(p.m * p.n * ElementSize(out_));
    EXPECT_EQ(cudaMemcpy(host.data(), p.d, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* Upload(const std::vector<uint8_t>& host) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(host.size(), 16)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    allocations_.push_back(p);
    return p;
  }
  DType out_;
  std::vector<DeviceGemmProblem> problems_;
  std::vector<void*> allocations_;
};

// Relative error ||out - ref|| / ||ref|| of `out` against a float64
// reference, over every element (when `samples` is 0) or `samples` random
// elements. +inf when `out` has a non-finite value where the reference is
// finite. Rows are spread over the host's cores.
inline double CheckAgainstReference(const HostProblem& h, const std::vector<uint8_t>& out,
                                    DType in, DType out_type, size_t samples = 0) {
  const std::vector<double> a = ToDouble(h.a.data(), in, h.a.size() / ElementSize(in));
  const std::vector<double> b = ToDouble(h.b.data(), in, h.b.size() / ElementSize(in));
  const std::vector<double> c =
      h.beta != 0.0 ? ToDouble(h.c.data(), out_type, h.m * h.n) : std::vector<double>();
  const std::vector<double> got = ToDouble(out.data(), out_type, h.m * h.n);
  std::vector<std::pair<int64_t, int64_t>> points;
  if (samples > 0) {
    std::mt19937_64 rng(std::random_device{}());
    for (size_t s = 0; s < samples; ++s) points.push_back({rng() % h.m, rng() % h.n});
    // Every element must at least be finite.
    for (double v : got) {
      if (!std::isfinite(v)) return std::numeric_limits<double>::infinity();
    }
  }
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<double> diff(threads, 0.0), norm(threads, 0.0);
  std::vector<char> bad(threads, 0);
  auto element = [&](int64_t i, int64_t j) {
    double s = 0;
    for (int64_t l = 0; l < h.k; ++l) {
      const double av = h.transpose_a ? a[l * h.lda + i] : a[i * h.lda + l];
      const double bv = h.transpose_b ? b[j * h.ldb + l] : b[l * h.ldb + j];
      s += av * bv;
    }
    s *= h.alpha;
    if (h.beta != 0.0) s += h.beta * c[i * h.n + j];
    return s;
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto add = [&](int64_t i, int64_t j) {
        const double ref = element(i, j);
        const double v = got[i * h.n + j];
        if (!std::isfinite(v)) bad[t] = 1;
        diff[t] += (v - ref) * (v - ref);
        norm[t] += ref * ref;
      };
      if (samples > 0) {
        for (size_t s = t; s < points.size(); s += threads) add(points[s].first, points[s].second);
      } else {
        for (int64_t i = t; i < h.m; i += threads) {
          for (int64_t j = 0; j < h.n; ++j) add(i, j);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  double d = 0, r = 0;
  for (int t = 0; t < threads; ++t) {
    if (bad[t]) return std::numeric_limits<double>::infinity();
    d += diff[t];
    r += norm[t];
  }
  if (std::isnan(d)) return std::numeric_limits<double>::infinity();
  return r > 0 ? std::sqrt(d / r) : std::sqrt(d);
}

}  // namespace matmul::cuda::testing

#endif  // MATMUL_TESTS_KERNELS_CUDA_GPU_TEST_UTIL_H_
