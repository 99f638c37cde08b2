// libFuzzer target: raw bytes -> ParseNpy (client/npy.h), the reader of the
// .npy files matmul-cli sends. Must never crash, hang or read or write out
// of bounds; what it accepts must be a consistent 2-D matrix.
#include <cstddef>
#include <cstdint>

#include "client/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<matmul::client::NpyMatrix> m = matmul::client::ParseNpy(
      absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  const std::optional<matmul::DType> type = matmul::client::DTypeOfDescr(m->descr);
  if (!type.has_value()) __builtin_trap();
  if (m->data.size() != m->rows * m->cols * matmul::ElementSize(*type)) __builtin_trap();
  return 0;
}
