// Reading and writing 2-D NumPy .npy files (format versions 1-3), for
// matmul-cli.
//
//   absl::StatusOr<NpyMatrix> a = ReadNpy("a.npy");     // C or Fortran order
//   WriteNpy("c.npy", {.rows = 2, .cols = 3, .descr = "<f4", .data = bytes});
//
// dtypes: <f4, <f8, <f2, and <u2 (raw bfloat16 bits, since NumPy has no
// bfloat16). Data comes back row-major.
#ifndef MATMUL_CLIENT_NPY_H_
#define MATMUL_CLIENT_NPY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace matmul::client {

struct NpyMatrix {
  uint64_t rows = 0;
  uint64_t cols = 0;
  // NumPy type string, e.g. "<f4".
  std::string descr;
  // Row-major little-endian elements.
  std::string data;
};

absl::StatusOr<NpyMatrix> ReadNpy(const std::string& path);
// The matrix in the bytes of a .npy file; `name` (the path) prefixes errors.
absl::StatusOr<NpyMatrix> ParseNpy(absl::string_view bytes, absl::string_view name);
absl::Status WriteNpy(const std::string& path, const NpyMatrix& matrix);

// "<f4" for float32, ... "<u2" for bfloat16.
std::string NpyDescr(DType type);
// The dtype of a descr; "<u2" reads as bfloat16.
std::optional<DType> DTypeOfDescr(absl::string_view descr);

}  // namespace matmul::client

#endif  // MATMUL_CLIENT_NPY_H_
