#include "kernels/reference_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/half.h"

namespace matmul {

std::vector<double> ToDouble(const void* data, DType type, size_t n) {
  std::vector<double> out(n);
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    switch (type) {
      case DType::kFloat32: {
        float v;
        std::memcpy(&v, bytes + 4 * i, 4);
        out[i] = v;
        break;
      }
      case DType::kFloat64:
        std::memcpy(&out[i], bytes + 8 * i, 8);
        break;
      case DType::kFloat16:
      case DType::kBFloat16: {
        uint16_t v;
        std::memcpy(&v, bytes + 2 * i, 2);
        out[i] = type == DType::kFloat16 ? HalfToFloat(v) : BFloat16ToFloat(v);
        break;
      }
    }
  }
  return out;
}

void FromDouble(const std::vector<double>& in, DType type, void* out) {
  auto* bytes = static_cast<uint8_t*>(out);
  for (size_t i = 0; i < in.size(); ++i) {
    switch (type) {
      case DType::kFloat32: {
        const float v = static_cast<float>(in[i]);
        std::memcpy(bytes + 4 * i, &v, 4);
        break;
      }
      case DType::kFloat64:
        std::memcpy(bytes + 8 * i, &in[i], 8);
        break;
      case DType::kFloat16:
      case DType::kBFloat16: {
        // Round once from double through float: exact for these inputs'
        // purposes (float has far more precision than 16-bit formats).
        const float f = static_cast<float>(in[i]);
        const uint16_t v = type == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
        std::memcpy(bytes + 2 * i, &v, 2);
        break;
      }
    }
  }
}

std::vector<uint8_t> RandomMatrix(DType type, size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> values(n);
  for (double& v : values) {
    do {
      v = dist(rng);
      // Rounded to the target type, small values could become zero.
    } while (std::fabs(v) < 1e-3);
  }
  std::vector<uint8_t> out(n * ElementSize(type));
  FromDouble(values, type, out.data());
  return out;
}

namespace {

// op(A) * op(B) in float64 over dense row-major storage of `a` and `b`
// (already widened), m x n; row-wise so that B is read along its rows.
std::vector<double> Product(const GemmProblem& p, const std::vector<double>& a,
                            const std::vector<double>& b) {
  const size_t m = p.m, n = p.n, k = p.k;
  std::vector<double> out(m * n, 0.0);
  const size_t lda = LeadingDimA(p), ldb = LeadingDimB(p);
  std::vector<double> row(k);
  for (size_t i = 0; i < m; ++i) {
    for (size_t l = 0; l < k; ++l) row[l] = p.transpose_a ? a[l * lda + i] : a[i * lda + l];
    double* dst = &out[i * n];
    for (size_t l = 0; l < k; ++l) {
      const double av = row[l];
      if (p.transpose_b) {
        for (size_t j = 0; j < n; ++j) dst[j] += av * b[j * ldb + l];
      } else {
        const double* brow = &b[l * ldb];
        for (size_t j = 0; j < n; ++j) dst[j] += av * brow[j];
      }
    }
  }
  return out;
}

}  // namespace

std::vector<double> ReferenceGemm(const GemmProblem& p) {
  const size_t m = p.m, n = p.n, k = p.k;
  std::vector<double> out =
      Product(p, ToDouble(p.a, p.input_type, m * k), ToDouble(p.b, p.input_type, k * n));
  std::vector<double> c;
  if (p.beta != 0.0) c = ToDouble(p.c, p.output_type, m * n);
  for (size_t i = 0; i < m * n; ++i) {
    out[i] *= p.alpha;
    if (p.beta != 0.0) out[i] += p.beta * c[i];
  }
  return out;
}

double RelativeError(const std::vector<double>& ref, const void* out, DType type) {
  const std::vector<double> got = ToDouble(out, type, ref.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double d = got[i] - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

double GemmRelativeError(const GemmProblem& p, const void* out) {
  const size_t m = p.m, n = p.n, k = p.k;
  std::vector<double> a = ToDouble(p.a, p.input_type, m * k);
  std::vector<double> b = ToDouble(p.b, p.input_type, k * n);
  std::vector<double> ref = Product(p, a, b);
  for (double& v : a) v *= v;
  for (double& v : b) v *= v;
  const std::vector<double> squares = Product(p, a, b);  // sum_l a_il^2 b_lj^2
  std::vector<double> c;
  if (p.beta != 0.0) c = ToDouble(p.c, p.output_type, m * n);
  double scale = 0.0;
  for (size_t i = 0; i < m * n; ++i) {
    ref[i] *= p.alpha;
    scale += p.alpha * p.alpha * squares[i];
    if (p.beta != 0.0) {
      ref[i] += p.beta * c[i];
      scale += p.beta * p.beta * c[i] * c[i];
    }
  }
  const std::vector<double> got = ToDouble(out, p.output_type, m * n);
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
  const double denominator = std::sqrt(std::max(norm, scale));
  return denominator > 0.0 ? std::sqrt(diff) / denominator : std::sqrt(diff);
}

double ErrorBound(DType input, DType output, Precision precision) {
  if (output == DType::kFloat16 || output == DType::kBFloat16 ||
      input == DType::kFloat16 || input == DType::kBFloat16) {
    return 1e-2;
  }
  if (input == DType::kFloat64) return 1e-12;
  return precision == Precision::kTF32 ? 2e-3 : 1e-5;
}

}  // namespace matmul
