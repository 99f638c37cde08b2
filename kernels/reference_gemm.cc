#include "kernels/reference_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "kernels/half.h"

namespace matmul {
namespace {

// Element `i` of `data` (of `type`) as a double.
double ElementAt(const void* data, DType type, size_t i) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  switch (type) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, bytes + 4 * i, 4);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, bytes + 8 * i, 8);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, bytes + 2 * i, 2);
      return type == DType::kFloat16 ? HalfToFloat(v) : BFloat16ToFloat(v);
    }
  }
  return 0.0;
}

}  // namespace

std::vector<double> ToDouble(const void* data, DType type, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = ElementAt(data, type, i);
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

// The sums behind GemmRelativeError for problem `p`, element by element:
// ||out - ref||^2, ||ref||^2 and ||scale||^2, and whether `out` has a NaN or
// infinity where the reference is finite.
class ErrorSums {
 public:
  explicit ErrorSums(const GemmProblem& p) : alpha_(p.alpha), beta_(p.beta) {}
  // One element: the result `got`, sum_l a_il b_lj (`product`),
  // sum_l a_il^2 b_lj^2 (`squares`) and c_ij (read only when beta != 0).
  void Add(double got, double product, double squares, double c) {
    double ref = alpha_ * product;
    double scale = alpha_ * alpha_ * squares;
    if (beta_ != 0.0) {
      ref += beta_ * c;
      scale += beta_ * beta_ * c * c;
    }
    if (!std::isfinite(got) && std::isfinite(ref)) not_finite_ = true;
    diff_ += (got - ref) * (got - ref);
    norm_ += ref * ref;
    scale_ += scale;
  }
  // ||out - ref|| / max(||ref||, ||scale||); +infinity for a NaN or
  // infinity in `out`.
  double Relative() const {
    if (not_finite_ || std::isnan(diff_)) return std::numeric_limits<double>::infinity();
    const double denominator = std::sqrt(std::max(norm_, scale_));
    return denominator > 0.0 ? std::sqrt(diff_) / denominator : std::sqrt(diff_);
  }

 private:
  double alpha_, beta_;
  double diff_ = 0.0, norm_ = 0.0, scale_ = 0.0;
  bool not_finite_ = false;
};

// `count` distinct indices of [0, n), in increasing order (Floyd's
// sampling: `count` draws, no list of all n).
std::vector<size_t> Distinct(size_t n, size_t count, std::mt19937_64& rng) {
  std::vector<size_t> picked;
  if (count >= n) {
    picked.resize(n);
    for (size_t i = 0; i < n; ++i) picked[i] = i;
    return picked;
  }
  std::unordered_set<size_t> seen;
  seen.reserve(2 * count);
  for (size_t j = n - count; j < n; ++j) {
    const size_t t = std::uniform_int_distribution<size_t>(0, j)(rng);
    seen.insert(seen.count(t) ? j : t);
  }
  picked.assign(seen.begin(), seen.end());
  std::sort(picked.begin(), picked.end());
  return picked;
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
  const std::vector<double> got = ToDouble(out, p.output_type, m * n);
  ErrorSums sums(p);
  for (size_t i = 0; i < m * n; ++i) sums.Add(got[i], ref[i], squares[i], c.empty() ? 0.0 : c[i]);
  return sums.Relative();
}

double SampledGemmRelativeError(const GemmProblem& p, const void* out, size_t samples,
                                std::mt19937_64& rng) {
  const size_t m = p.m, n = p.n, k = p.k;
  if (samples == 0 || m * n <= samples) return GemmRelativeError(p, out);
  // A grid of rows x cols: both about sqrt(samples), or all of the shorter
  // side and more of the other.
  const size_t side = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(samples))));
  const size_t row_count = std::min(m, std::max(side, samples / std::min(n, side)));
  const size_t col_count = std::min(n, std::max<size_t>(1, samples / row_count));
  const std::vector<size_t> rows = Distinct(m, row_count, rng);
  const std::vector<size_t> cols = Distinct(n, col_count, rng);
  const size_t lda = LeadingDimA(p), ldb = LeadingDimB(p);
  // The picked columns of op(B), as k x cols (and their squares).
  std::vector<double> b(k * cols.size()), b2(k * cols.size());
  for (size_t l = 0; l < k; ++l) {
    for (size_t c = 0; c < cols.size(); ++c) {
      const size_t j = cols[c];
      const double v = ElementAt(p.b, p.input_type, p.transpose_b ? j * ldb + l : l * ldb + j);
      b[l * cols.size() + c] = v;
      b2[l * cols.size() + c] = v * v;
    }
  }
  const size_t ldd = n;  // Results are dense row-major m x n.
  std::vector<double> ref(cols.size()), squares(cols.size());
  ErrorSums sums(p);
  for (size_t i : rows) {
    std::fill(ref.begin(), ref.end(), 0.0);
    std::fill(squares.begin(), squares.end(), 0.0);
    for (size_t l = 0; l < k; ++l) {
      const double av = ElementAt(p.a, p.input_type, p.transpose_a ? l * lda + i : i * lda + l);
      const double* brow = &b[l * cols.size()];
      const double* b2row = &b2[l * cols.size()];
      for (size_t c = 0; c < cols.size(); ++c) {
        ref[c] += av * brow[c];
        squares[c] += av * av * b2row[c];
      }
    }
    for (size_t c = 0; c < cols.size(); ++c) {
      const size_t at = i * ldd + cols[c];
      const double cv = p.beta != 0.0 ? ElementAt(p.c, p.output_type, at) : 0.0;
      sums.Add(ElementAt(out, p.output_type, at), ref[c], squares[c], cv);
    }
  }
  return sums.Relative();
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
