// The request parser that moves large payloads into host buffers: for any
// bytes, it accepts exactly what protobuf accepts and gives the same
// message once the moved payloads are put back; payloads land in pinned
// buffers whole, across any slicing of the input.
#include "server/request_parser.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "server/request_validation.h"
#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using google::protobuf::io::ArrayInputStream;
using matmul::testing::Rng;

// Equal messages serialise to equal bytes; on a difference, says where
// (not the bytes: they are megabytes of payload).
::testing::AssertionResult SameBytes(const std::string& got, const std::string& want) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t at = 0;
  while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
  return ::testing::AssertionFailure() << "serialised " << got.size() << " bytes, expected "
                                       << want.size() << "; first difference at byte " << at;
}

void* Pin(size_t bytes) { return std::malloc(bytes); }
void Unpin(void* p) { std::free(p); }

constexpr size_t kMin = 4096;

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(Rng()() & 0xff);
  return s;
}

// Payload sizes on both sides of the pool's threshold (and of varint
// length boundaries).
size_t RandomPayloadSize() {
  static constexpr size_t kSizes[] = {0, 1, 127, 128, kMin - 1, kMin, kMin + 1, 16383, 16384,
                                      100000};
  return kSizes[Rng()() % (sizeof(kSizes) / sizeof(kSizes[0]))];
}

void RandomMatrix(v1::Matrix* m) {
  if (Rng()() % 4) m->set_rows(1 + Rng()() % 5000);
  if (Rng()() % 4) m->set_cols(1 + Rng()() % 5000);
  if (Rng()() % 4) m->set_dtype(static_cast<v1::DType>(Rng()() % 5));
  m->set_data(RandomBytes(RandomPayloadSize()));
  if (Rng()() % 5 == 0) m->set_handle("h" + std::to_string(Rng()() % 100));
  if (Rng()() % 7 == 0) {
    m->mutable_shm()->set_region("r");
    m->mutable_shm()->set_bytes(Rng()() % 1000);
  }
}

v1::MultiplyRequest RandomRequest() {
  v1::MultiplyRequest r;
  if (Rng()() % 8) RandomMatrix(r.mutable_a());
  if (Rng()() % 8) RandomMatrix(r.mutable_b());
  if (Rng()() % 2) RandomMatrix(r.mutable_c());
  r.set_transpose_a(Rng()() % 2);
  r.set_transpose_b(Rng()() % 2);
  r.set_request_id(RandomBytes(Rng()() % 3) == "" ? "" : "id" + std::to_string(Rng()() % 1000));
  if (Rng()() % 2) r.set_alpha(0.5);
  if (Rng()() % 2) r.set_beta(-2.0);
  r.set_priority(static_cast<int32_t>(Rng()() % 10) - 5);
  if (Rng()() % 3 == 0) r.mutable_output_shm()->set_region("out");
  return r;
}

// Parses `bytes` with the payload-moving parser, `block` bytes per input
// chunk, and puts the moved payloads back into the message.
absl::Status ParseBack(const std::string& bytes, int block, HostBufferPool& pool,
                       v1::MultiplyRequest* out, int* moved) {
  ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()), block);
  InlineOperands operands;
  absl::Status s = ParseMultiplyRequest(&input, bytes.size(), &pool, out, &operands);
  if (!s.ok()) return s;
  *moved = 0;
  using Field = v1::Matrix* (v1::MultiplyRequest::*)();
  for (auto [buffer, field] : {std::pair<HostBuffer*, Field>{&operands.a, &v1::MultiplyRequest::mutable_a},
                               std::pair<HostBuffer*, Field>{&operands.b, &v1::MultiplyRequest::mutable_b},
                               std::pair<HostBuffer*, Field>{&operands.c, &v1::MultiplyRequest::mutable_c}}) {
    if (buffer->data() == nullptr) continue;
    // (mutable_* would add an absent matrix.)
    v1::Matrix* matrix = (out->*field)();
    ++*moved;
    EXPECT_TRUE(buffer->pinned());
    EXPECT_GE(buffer->size(), kMin);
    EXPECT_TRUE(matrix->data().empty()) << "a moved payload leaves an empty data field";
    matrix->set_data(std::string(static_cast<const char*>(buffer->data()), buffer->size()));
  }
  return absl::OkStatus();
}

TEST(RequestParserTest, SameMessageAsProtobufForRandomRequests) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  int moved_total = 0;
  for (int i = 0; i < 400; ++i) {
    const v1::MultiplyRequest sent = RandomRequest();
    const std::string bytes = sent.SerializeAsString();
    v1::MultiplyRequest parsed;
    int moved = 0;
    const int block = 1 + static_cast<int>(Rng()() % 9000);
    ASSERT_TRUE(ParseBack(bytes, block, pool, &parsed, &moved).ok());
    moved_total += moved;
    // Messages with equal fields serialise to equal bytes.
    ASSERT_TRUE(SameBytes(parsed.SerializeAsString(), bytes)) << "request " << i << ", block " << block;
  }
  EXPECT_GT(moved_total, 100) << "the large payloads were moved";
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
}

TEST(RequestParserTest, RepeatedFieldsMergeAsProtobufMerges) {
  // Concatenated messages merge: the last data of each matrix wins, moved
  // or not, and other fields merge field by field.
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  for (int i = 0; i < 300; ++i) {
    std::string bytes;
    const int parts = 2 + static_cast<int>(Rng()() % 3);
    for (int p = 0; p < parts; ++p) bytes += RandomRequest().SerializeAsString();
    v1::MultiplyRequest expected;
    ASSERT_TRUE(expected.ParseFromString(bytes));
    v1::MultiplyRequest parsed;
    int moved = 0;
    ASSERT_TRUE(ParseBack(bytes, 1 + static_cast<int>(Rng()() % 5000), pool, &parsed, &moved).ok());
    ASSERT_TRUE(SameBytes(parsed.SerializeAsString(), expected.SerializeAsString())) << "case " << i;
  }
}

TEST(RequestParserTest, RejectsWhatProtobufRejects) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  int rejected = 0;
  for (int i = 0; i < 5000; ++i) {
    std::string bytes = RandomRequest().SerializeAsString();
    // Damage it: truncate, flip bytes, or append garbage.
    switch (Rng()() % 3) {
      case 0:
        if (!bytes.empty()) bytes.resize(Rng()() % bytes.size());
        break;
      case 1:
        for (int k = 0; k < 3 && !bytes.empty(); ++k) bytes[Rng()() % bytes.size()] ^= 0xff;
        break;
      default:
        bytes += RandomBytes(1 + Rng()() % 8);
    }
    v1::MultiplyRequest expected;
    const bool ok = expected.ParseFromString(bytes);
    v1::MultiplyRequest parsed;
    int moved = 0;
    absl::Status s = ParseBack(bytes, 1 + static_cast<int>(Rng()() % 4000), pool, &parsed, &moved);
    ASSERT_EQ(s.ok(), ok) << "case " << i << ": " << s;
    if (ok) {
      ASSERT_TRUE(SameBytes(parsed.SerializeAsString(), expected.SerializeAsString())) << "case " << i;
    } else {
      ++rejected;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(rejected, 200);
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
}

TEST(RequestParserTest, ScanFindsEveryPayloadTheParserMoves) {
  // The scan decides whether a request takes protobuf's own parse: it may
  // say yes for a request the parser ends up moving nothing from (a later
  // small data replaces a moved one; damaged bytes), never no for one it
  // moves from, and no for a request whose payloads are all small.
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  int yes = 0, no = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes;
    const int parts = 1 + static_cast<int>(Rng()() % 2);
    bool all_small = true;
    for (int p = 0; p < parts; ++p) {
      v1::MultiplyRequest r = RandomRequest();
      for (const v1::Matrix* m : {&r.a(), &r.b(), &r.c()}) all_small &= m->data().size() < kMin;
      bytes += r.SerializeAsString();
    }
    if (i % 3 == 0 && !bytes.empty()) bytes.resize(Rng()() % bytes.size());
    const int block = 1 + static_cast<int>(Rng()() % 5000);
    ArrayInputStream scan(bytes.data(), static_cast<int>(bytes.size()), block);
    const bool found = HasPayloadToMove(&scan, bytes.size(), kMin);
    yes += found;
    no += !found;
    v1::MultiplyRequest parsed;
    int moved = 0;
    if (ParseBack(bytes, block, pool, &parsed, &moved).ok()) {
      if (moved > 0) ASSERT_TRUE(found) << "case " << i << ": the scan missed a payload";
      if (all_small) ASSERT_FALSE(found) << "case " << i << ": only small payloads";
    }
  }
  EXPECT_GT(yes, 300);
  EXPECT_GT(no, 300);
  // Short messages are not read at all.
  ArrayInputStream empty(nullptr, 0);
  EXPECT_FALSE(HasPayloadToMove(&empty, kMin - 1, kMin));
}

TEST(RequestParserTest, GroupsAreCheckedAsProtobufChecksThem) {
  // Inside a group (field 8 as wire type 3), protobuf refuses a tag longer
  // than five bytes, a length varint longer than five bytes, a group left
  // open and an end of another field's group; it takes a proper one.
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  int rejected = 0;
  const std::string cases[] = {
      // A 6-byte tag of a fixed64 field, its 8 bytes, the group's end.
      std::string("\x43\xd9\xec\xd2\xd3\xcb\x33" "12345678" "\x44", 16),
      // A field whose length 1 takes 6 bytes, its byte, the group's end.
      std::string("\x43\x0a\x81\x80\x80\x80\x80\x00" "x" "\x44", 10),
      std::string("\x43\x08\x01", 3),                              // never closed
      std::string("\x43\x08\x01\x4c", 4),                          // ends field 9's group
      std::string("\x43\x08\x01\x0a\x02hi\x44\x38\x05", 10),    // proper, then request_id
  };
  for (const std::string& bytes : cases) {
    v1::MultiplyRequest expected;
    const bool ok = expected.ParseFromString(bytes);
    v1::MultiplyRequest parsed;
    int moved = 0;
    absl::Status s = ParseBack(bytes, 1 + static_cast<int>(Rng()() % 4), pool, &parsed, &moved);
    EXPECT_EQ(s.ok(), ok) << "case of " << bytes.size() << " bytes: " << s;
    rejected += !ok;
    if (ok) EXPECT_TRUE(SameBytes(parsed.SerializeAsString(), expected.SerializeAsString()));
  }
  EXPECT_EQ(rejected, 4) << "protobuf refuses the first four cases and takes the last";
}

TEST(RequestParserTest, LengthsPast32BitsAreRefusedAsProtobufRefusesThem) {
  // A five-byte length whose fifth byte carries bits past 32 (found by the
  // fuzzer: 0x40 there read as a length of 0, and the rest of the bytes as
  // fields, where protobuf refuses the message), on an unknown-typed field,
  // on a matrix and on a matrix's data; and the largest five-byte lengths
  // that fit 32 bits, which are past the message's end.
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  const std::string cases[] = {
      std::string("\x42\x80\x80\x80\x80\x40" "\x38\x05", 8),  // priority as bytes
      std::string("\x0a\x80\x80\x80\x80\x10", 6),              // a
      std::string("\x0a\x06\x22\x80\x80\x80\x80\x20", 8),      // a.data
      std::string("\x42\xff\xff\xff\xff\x0f" "\x38\x05", 8),  // 2^32 - 1
      std::string("\x42\xff\xff\xff\xff\x07" "\x38\x05", 8),  // 2^31 - 1
  };
  for (const std::string& bytes : cases) {
    v1::MultiplyRequest expected;
    ASSERT_FALSE(expected.ParseFromString(bytes)) << "protobuf takes case of " << bytes.size();
    v1::MultiplyRequest parsed;
    int moved = 0;
    for (int block : {1, 3, 64}) {
      absl::Status s = ParseBack(bytes, block, pool, &parsed, &moved);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
          << "case of " << bytes.size() << " bytes, blocks of " << block << ": " << s;
    }
  }
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u);
}

TEST(RequestParserTest, LyingLengthAllocatesNothing) {
  // a = Matrix{data: length 1 GiB} with 10 bytes behind it.
  HostBufferPool pool(&Pin, &Unpin, uint64_t{4} << 30, kMin);
  std::string bytes = "\x0a\x90\x80\x80\x80\x04";  // a, length ~1 GiB
  bytes += "\x22\x80\x80\x80\x80\x04";              // data, length 1 GiB
  bytes += RandomBytes(10);
  ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()));
  v1::MultiplyRequest parsed;
  InlineOperands operands;
  absl::Status s = ParseMultiplyRequest(&input, bytes.size(), &pool, &parsed, &operands);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(pool.GetStats().pinned_allocations, 0u);
  EXPECT_EQ(pool.GetStats().heap_allocations, 0u);
}

TEST(RequestParserTest, WithoutAPoolNothingMoves) {
  const v1::MultiplyRequest sent = RandomRequest();
  const std::string bytes = sent.SerializeAsString();
  ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()), 100);
  v1::MultiplyRequest parsed;
  InlineOperands operands;
  ASSERT_TRUE(ParseMultiplyRequest(&input, bytes.size(), nullptr, &parsed, &operands).ok());
  EXPECT_TRUE(SameBytes(parsed.SerializeAsString(), bytes));
  EXPECT_EQ(operands.a.data(), nullptr);
}

TEST(RequestParserTest, ValidationPointsIntoMovedPayloads) {
  HostBufferPool pool(&Pin, &Unpin, 1 << 30, kMin);
  v1::MultiplyRequest sent;
  for (auto [m, rows, cols] : {std::tuple{sent.mutable_a(), 64, 100}, std::tuple{sent.mutable_b(), 100, 3},
                               std::tuple{sent.mutable_c(), 64, 3}}) {
    m->set_rows(rows);
    m->set_cols(cols);
    m->set_dtype(v1::DTYPE_FLOAT32);
    m->set_data(RandomBytes(static_cast<size_t>(rows) * cols * 4));
  }
  sent.set_beta(1.5);
  const std::string bytes = sent.SerializeAsString();
  ArrayInputStream input(bytes.data(), static_cast<int>(bytes.size()), 777);
  v1::MultiplyRequest parsed;
  InlineOperands operands;
  ASSERT_TRUE(ParseMultiplyRequest(&input, bytes.size(), &pool, &parsed, &operands).ok());
  // a (25,600 bytes) and b (1,200) cross the 4 KiB threshold differently:
  // a moves, b and c (768) stay in the message.
  ASSERT_NE(operands.a.data(), nullptr);
  EXPECT_EQ(operands.b.data(), nullptr);
  absl::StatusOr<ValidatedRequest> v = ValidateMultiplyRequest(parsed, {}, nullptr, nullptr, &operands);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->problem.a, operands.a.data());
  EXPECT_EQ(v->problem.host_pinned, kResidentA);
  EXPECT_EQ(std::memcmp(v->problem.a, sent.a().data().data(), sent.a().data().size()), 0);
  EXPECT_EQ(v->problem.b, parsed.b().data().data());
  EXPECT_EQ(v->problem.m, 64);
  EXPECT_EQ(v->problem.n, 3);

  // A moved payload counts as data: with a handle too, it is refused, and
  // a wrong size names its real length.
  parsed.mutable_a()->set_handle("k");
  v = ValidateMultiplyRequest(parsed, {}, nullptr, nullptr, &operands);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("exactly one of data, handle and shm"), std::string::npos)
      << v.status();
  parsed.mutable_a()->clear_handle();
  parsed.mutable_a()->set_rows(65);
  v = ValidateMultiplyRequest(parsed, {}, nullptr, nullptr, &operands);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("a.data: expected 26000 bytes (65 x 100 float32), got 25600"),
            std::string::npos)
      << v.status();
}

}  // namespace
}  // namespace matmul::server
