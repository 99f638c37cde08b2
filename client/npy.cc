#include "client/npy.h"

#include <fstream>
#include <iterator>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace matmul::client {

std::string NpyDescr(DType type) {
  switch (type) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kFloat16: return "<f2";
    case DType::kBFloat16: return "<u2";
  }
  return "";
}

std::optional<DType> DTypeOfDescr(absl::string_view descr) {
  if (descr == "<f4") return DType::kFloat32;
  if (descr == "<f8") return DType::kFloat64;
  if (descr == "<f2") return DType::kFloat16;
  if (descr == "<u2") return DType::kBFloat16;
  return std::nullopt;
}

absl::StatusOr<NpyMatrix> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseNpy(bytes, path);
}

absl::StatusOr<NpyMatrix> ParseNpy(absl::string_view bytes, absl::string_view name) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a usable .npy file: ", why));
  };
  if (bytes.size() < 10 || bytes.substr(0, 6) != absl::string_view("\x93NUMPY", 6)) {
    return bad("no NUMPY magic");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= size_t{static_cast<unsigned char>(bytes[8 + i])} << (8 * i);
    offset = 12;
  } else {
    return bad(absl::StrCat("format version ", major));
  }
  if (bytes.size() < offset + header_len) return bad("truncated header");
  const std::string header(bytes.substr(offset, header_len));
  std::smatch match;
  if (!std::regex_search(header, match, std::regex("'descr':\\s*'([^']*)'"))) return bad("no descr");
  NpyMatrix m;
  m.descr = match[1];
  if (!DTypeOfDescr(m.descr).has_value()) {
    return bad(absl::StrCat("dtype ", m.descr, " (expected <f4, <f8, <f2 or <u2 for bfloat16 bits)"));
  }
  const bool fortran = header.find("'fortran_order': True") != std::string::npos;
  if (!std::regex_search(header, match, std::regex("'shape':\\s*\\(([^)]*)\\)"))) return bad("no shape");
  std::vector<uint64_t> shape;
  for (absl::string_view part : absl::StrSplit(std::string(match[1]), ',', absl::SkipWhitespace())) {
    uint64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v)) return bad("bad shape");
    shape.push_back(v);
  }
  if (shape.size() != 2) return bad(absl::StrCat(shape.size(), "-D array; expected a 2-D matrix"));
  m.rows = shape[0];
  m.cols = shape[1];
  const size_t element = ElementSize(*DTypeOfDescr(m.descr));
  // rows x cols x element may not fit 64 bits: a shape whose product wraps
  // to the bytes present would pass the size check below and send the
  // Fortran-order copy far past the data.
  uint64_t expected;
  if (__builtin_mul_overflow(m.rows, m.cols, &expected) ||
      __builtin_mul_overflow(expected, uint64_t{element}, &expected)) {
    return bad(absl::StrCat("shape (", m.rows, ", ", m.cols, ") is too large"));
  }
  if (bytes.size() - offset - header_len != expected) {
    return bad(absl::StrCat("expected ", expected, " data bytes, found ", bytes.size() - offset - header_len));
  }
  m.data = std::string(bytes.substr(offset + header_len));
  // Column-major on disk: transpose into row-major. An empty matrix has
  // nothing to move (and a shape of (2^32, 0) would loop 2^32 times).
  if (fortran && !m.data.empty()) {
    std::string row_major(m.data.size(), '\0');
    for (uint64_t r = 0; r < m.rows; ++r) {
      for (uint64_t c = 0; c < m.cols; ++c) {
        std::copy_n(&m.data[(c * m.rows + r) * element], element, &row_major[(r * m.cols + c) * element]);
      }
    }
    m.data = std::move(row_major);
  }
  return m;
}

absl::Status WriteNpy(const std::string& path, const NpyMatrix& matrix) {
  std::string header = absl::StrCat("{'descr': '", matrix.descr, "', 'fortran_order': False, 'shape': (",
                                    matrix.rows, ", ", matrix.cols, "), }");
  // Pad so that the data starts on a 64-byte boundary; end with a newline.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.put(static_cast<char>(len & 0xff));
  out.put(static_cast<char>(len >> 8));
  out << header;
  out.write(matrix.data.data(), static_cast<std::streamsize>(matrix.data.size()));
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace matmul::client
