#include "client/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace matmul::client {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return "/tmp/npy_test_" + std::to_string(getpid()) + "_" + name;
}

TEST(NpyTest, WriteThenReadRoundTripsEveryDType) {
  std::mt19937 rng(std::random_device{}());
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    NpyMatrix m{.rows = 3, .cols = 5, .descr = NpyDescr(t)};
    m.data.resize(15 * ElementSize(t));
    for (char& ch : m.data) ch = static_cast<char>(rng());
    const std::string path = TempPath("rt.npy");
    ASSERT_TRUE(WriteNpy(path, m).ok());
    absl::StatusOr<NpyMatrix> back = ReadNpy(path);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->rows, 3u);
    EXPECT_EQ(back->cols, 5u);
    EXPECT_EQ(back->descr, m.descr);
    EXPECT_EQ(back->data, m.data);
    EXPECT_EQ(DTypeOfDescr(back->descr), t);
    unlink(path.c_str());
  }
}

TEST(NpyTest, FortranOrderComesBackRowMajor) {
  // A 2x3 float32 matrix [[1 2 3] [4 5 6]] stored column-major.
  std::string header = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(header.size()));
  file.push_back(0);
  file += header;
  for (float v : {1.f, 4.f, 2.f, 5.f, 3.f, 6.f}) file.append(reinterpret_cast<char*>(&v), 4);
  const std::string path = TempPath("f.npy");
  std::ofstream(path, std::ios::binary) << file;
  absl::StatusOr<NpyMatrix> m = ReadNpy(path);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<float> values(6);
  std::memcpy(values.data(), m->data.data(), 24);
  EXPECT_EQ(values, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  unlink(path.c_str());
}

// A version-1 .npy file with `header` (padded as NumPy pads it) and `data`.
std::string NpyBytes(std::string header, const std::string& data) {
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(header.size() & 0xff));
  file.push_back(static_cast<char>(header.size() >> 8));
  return file + header + data;
}

TEST(NpyTest, ShapesWhoseSizeWrapsAreRefused) {
  // rows x cols x element wraps to 0 or to the bytes present; the Fortran
  // copy of such a shape wrote far past the data before.
  for (const char* shape : {"(4294967296, 4294967296)", "(4611686018427387904, 4)",
                            "(4611686018427387905, 4)"}) {
    for (const char* order : {"True", "False"}) {
      SCOPED_TRACE(absl::StrCat(shape, " fortran_order ", order));
      const std::string header =
          absl::StrCat("{'descr': '<f4', 'fortran_order': ", order, ", 'shape': ", shape, ", }");
      // 4611686018427387905 x 4 x 4 wraps to 16: give it 16 bytes.
      const std::string data(absl::StrContains(shape, "905") ? 16 : 0, '\x01');
      absl::StatusOr<NpyMatrix> m = ParseNpy(NpyBytes(header, data), "x.npy");
      ASSERT_FALSE(m.ok());
      EXPECT_THAT(m.status().message(), HasSubstr("too large"));
    }
  }
  // An empty matrix with a huge side reads at once (found by the fuzzer: its
  // Fortran copy looped over 2^32 rows of nothing).
  for (const char* order : {"True", "False"}) {
    const std::string header = absl::StrCat(
        "{'descr': '<f4', 'fortran_order': ", order, ", 'shape': (4294967296, 0), }");
    absl::StatusOr<NpyMatrix> empty = ParseNpy(NpyBytes(header, ""), "empty.npy");
    ASSERT_TRUE(empty.ok()) << empty.status();
    EXPECT_EQ(empty->rows, uint64_t{1} << 32);
    EXPECT_EQ(empty->cols, 0u);
    EXPECT_TRUE(empty->data.empty());
  }
  // An ordinary shape still reads.
  const std::string header = "{'descr': '<f2', 'fortran_order': True, 'shape': (2, 2), }";
  EXPECT_TRUE(ParseNpy(NpyBytes(header, std::string(8, '\x02')), "ok.npy").ok());
}

TEST(NpyTest, RejectsWhatItCannotUse) {
  const std::string path = TempPath("bad.npy");
  std::ofstream(path, std::ios::binary) << "not numpy at all";
  EXPECT_THAT(ReadNpy(path).status().message(), HasSubstr("no NUMPY magic"));
  NpyMatrix m{.rows = 2, .cols = 2, .descr = "<i4", .data = std::string(16, '\0')};
  ASSERT_TRUE(WriteNpy(path, m).ok());
  EXPECT_THAT(ReadNpy(path).status().message(), HasSubstr("dtype <i4"));
  m.descr = "<f4";
  m.data.resize(15);
  ASSERT_TRUE(WriteNpy(path, m).ok());
  EXPECT_THAT(ReadNpy(path).status().message(), HasSubstr("expected 16 data bytes"));
  EXPECT_EQ(ReadNpy(TempPath("missing.npy")).status().code(), absl::StatusCode::kNotFound);
  unlink(path.c_str());
}

}  // namespace
}  // namespace matmul::client
