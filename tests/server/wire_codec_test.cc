// The raw-bytes codec of Multiply and MultiplyStream: responses carry the
// result's bytes as their own slice yet decode as ordinary protobuf, and a
// request that is not a MultiplyRequest is refused with INVALID_ARGUMENT by
// a server that keeps serving.
#include "server/wire_codec.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"
#include "server/server.h"
#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using matmul::testing::FakeEngine;
using matmul::testing::LoopbackConfig;
using matmul::testing::Rng;
using matmul::testing::StartServer;

using ::testing::HasSubstr;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(Rng()() & 0xff);
  return s;
}

v1::MultiplyResponse SampleResponse() {
  v1::MultiplyResponse r;
  r.set_request_id(absl::StrCat("id-", Rng()() % 1000));
  r.mutable_c()->set_rows(1 + Rng()() % 300);
  r.mutable_c()->set_cols(1 + Rng()() % 300);
  r.mutable_c()->set_dtype(v1::DTYPE_BFLOAT16);
  r.mutable_timing()->set_queue_us(Rng()() % 100000);
  r.mutable_timing()->set_batch_size(7);
  r.mutable_timing()->set_device("cuda:0");
  return r;
}

TEST(WireCodecTest, ResultBytesDecodeAsCData) {
  // Sizes around the varint boundaries of the length prefixes.
  for (size_t bytes : {size_t{1}, size_t{127}, size_t{128}, size_t{16383}, size_t{16384},
                       size_t{(1 << 21) + 3}, size_t{1 + Rng()() % 5000000}}) {
    v1::MultiplyResponse response = SampleResponse();
    const std::string payload = RandomBytes(bytes);
    ResultBuffer result;
    ASSERT_TRUE(result.Allocate(bytes).ok());
    std::copy(payload.begin(), payload.end(), result.data());
    grpc::ByteBuffer wire = EncodeMultiplyResponse(response, &result);
    EXPECT_EQ(result.size(), 0u) << "the bytes belong to the slice now";
    EXPECT_EQ(result.data(), nullptr);

    v1::MultiplyResponse decoded;
    ASSERT_TRUE(decoded.ParseFromString(Flatten(wire))) << bytes;
    EXPECT_EQ(decoded.c().data(), payload) << bytes;
    response.mutable_c()->set_data(payload);
    EXPECT_EQ(decoded.SerializeAsString(), response.SerializeAsString()) << bytes;
    EXPECT_EQ(wire.Length(), response.ByteSizeLong()) << "same size as protobuf's own encoding";
  }
}

TEST(WireCodecTest, ResponsesWithoutResultBytesAreProtobufsOwn) {
  v1::MultiplyResponse response = SampleResponse();
  response.mutable_result_handle()->set_id("m-123");
  grpc::ByteBuffer wire = EncodeMultiplyResponse(response, nullptr);
  EXPECT_EQ(Flatten(wire), response.SerializeAsString());

  v1::MultiplyResponse error;
  error.set_request_id("x");
  error.mutable_error()->set_code(3);
  error.mutable_error()->set_message("a: expected 12 bytes");
  ResultBuffer empty;
  EXPECT_EQ(Flatten(EncodeMultiplyResponse(error, &empty)), error.SerializeAsString());
}

TEST(WireCodecTest, ParsesRequestsAndRefusesGarbage) {
  v1::MultiplyRequest request =
      client::RandomRequest({.m = 5, .n = 7, .k = 3, .dtype = DType::kFloat32}, Rng());
  const std::string bytes = request.SerializeAsString();
  // Split over several slices, as gRPC delivers big messages.
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += 17) {
    slices.emplace_back(bytes.data() + at, std::min<size_t>(17, bytes.size() - at));
  }
  grpc::ByteBuffer wire(slices.data(), slices.size());
  v1::MultiplyRequest parsed;
  ASSERT_TRUE(ParseMultiplyRequest(wire, nullptr, &parsed, nullptr).ok());
  EXPECT_EQ(parsed.SerializeAsString(), bytes);
  EXPECT_EQ(wire.Length(), bytes.size()) << "parsing leaves the caller's buffer alone";

  grpc::ByteBuffer none;
  EXPECT_EQ(ParseMultiplyRequest(none, nullptr, &parsed, nullptr).code(), absl::StatusCode::kCancelled)
      << "no message at all: the call ended first";
  grpc::ByteBuffer empty(nullptr, 0);
  ASSERT_TRUE(empty.Valid());
  ASSERT_TRUE(ParseMultiplyRequest(empty, nullptr, &parsed, nullptr).ok()) << "an empty message is a valid one";
  EXPECT_EQ(parsed.a().rows(), 0u);

  grpc::Slice junk(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  grpc::ByteBuffer bad(&junk, 1);
  absl::Status s = ParseMultiplyRequest(bad, nullptr, &parsed, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("MultiplyRequest"));
}

void* CountingPin(size_t bytes) { return std::malloc(bytes); }
void CountingUnpin(void* p) { std::free(p); }

// Payloads moved out of the message while parsing, over gRPC's real
// slicing: a, b and c land whole in pool buffers, across slice borders.
TEST(WireCodecTest, PayloadsMoveIntoPoolBuffersAcrossSlices) {
  HostBufferPool pool(&CountingPin, &CountingUnpin, 1 << 30, 4096);
  for (int i = 0; i < 20; ++i) {
    v1::MultiplyRequest request = client::RandomRequest(
        {.m = 40 + static_cast<int64_t>(Rng()() % 60), .n = 50, .k = 70, .dtype = DType::kFloat32,
         .beta = 0.5},
        Rng());
    const std::string bytes = request.SerializeAsString();
    const size_t piece = 1 + Rng()() % 20000;
    std::vector<grpc::Slice> slices;
    for (size_t at = 0; at < bytes.size(); at += piece) {
      slices.emplace_back(bytes.data() + at, std::min(piece, bytes.size() - at));
    }
    grpc::ByteBuffer wire(slices.data(), slices.size());
    v1::MultiplyRequest parsed;
    InlineOperands operands;
    ASSERT_TRUE(ParseMultiplyRequest(wire, &pool, &parsed, &operands).ok());
    for (auto [buffer, matrix, sent] :
         {std::tuple{&operands.a, parsed.mutable_a(), &request.a()},
          std::tuple{&operands.b, parsed.mutable_b(), &request.b()},
          std::tuple{&operands.c, parsed.mutable_c(), &request.c()}}) {
      ASSERT_NE(buffer->data(), nullptr);
      EXPECT_TRUE(buffer->pinned());
      ASSERT_EQ(buffer->size(), sent->data().size());
      EXPECT_EQ(std::memcmp(buffer->data(), sent->data().data(), buffer->size()), 0);
      EXPECT_TRUE(matrix->data().empty());
      matrix->set_data(sent->data());
    }
    EXPECT_EQ(parsed.SerializeAsString(), bytes);
  }
}

// A server whose engine offers a pool (as the CUDA engine offers pinned
// memory): large operands and results travel in pool buffers and are
// marked so for the engine, small ones do not, every answer is correct,
// and every buffer goes back to the pool.
TEST(WireCodecTest, ServerParsesIntoTheEnginesPoolAndAnswersCorrectly) {
  HostBufferPool pool(&CountingPin, &CountingUnpin, 1 << 30, 16 << 10);
  FakeEngine* engine;
  {
    EngineSet set;
    set.backend = "cpu";
    auto fake = std::make_unique<FakeEngine>("fake:0");
    engine = fake.get();
    engine->UseHostBuffers(&pool);
    set.engines.push_back(std::move(fake));
    absl::StatusOr<std::unique_ptr<MatmulServer>> server =
        MatmulServer::Create(LoopbackConfig(), std::move(set));
    ASSERT_TRUE(server.ok()) << server.status();
    auto c = matmul::testing::Connect(**server);
    std::vector<v1::MultiplyRequest> requests;
    for (int i = 0; i < 24; ++i) {
      // Large (every matrix over 16 KiB) and small, with and without C,
      // transposed or not, each dtype.
      const bool large = i % 2 == 0;
      const DType dtype = std::array{DType::kFloat32, DType::kBFloat16, DType::kFloat64,
                                     DType::kFloat16}[i / 2 % 4];
      client::ProblemSpec spec{.m = large ? 150 + static_cast<int64_t>(Rng()() % 50) : 9,
                               .n = large ? 130 : 5,
                               .k = large ? 140 : 7,
                               .dtype = dtype,
                               .transpose_a = i % 3 == 0,
                               .transpose_b = i % 5 == 0};
      if (i % 4 < 2) spec.beta = -0.75;
      spec.request_id = absl::StrCat("r", i);
      requests.push_back(client::RandomRequest(spec, Rng()));
    }
    for (int i = 0; i < 12; ++i) {
      absl::StatusOr<v1::MultiplyResponse> r = c->Multiply(requests[i]);
      ASSERT_TRUE(r.ok()) << r.status();
      absl::StatusOr<double> err = client::CheckResponse(requests[i], *r);
      ASSERT_TRUE(err.ok()) << err.status();
      absl::StatusOr<GemmProblem> p = client::ProblemOf(requests[i]);
      EXPECT_LE(*err, ErrorBound(p->input_type, p->output_type, p->precision)) << i;
    }
    absl::StatusOr<std::vector<v1::MultiplyResponse>> streamed =
        c->MultiplyStream(absl::MakeConstSpan(requests).subspan(12));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(streamed->size(), 12u);
    for (const v1::MultiplyResponse& r : *streamed) {
      const int i = std::stoi(r.request_id().substr(1));
      absl::StatusOr<double> err = client::CheckResponse(requests[i], r);
      ASSERT_TRUE(err.ok()) << err.status();
      absl::StatusOr<GemmProblem> p = client::ProblemOf(requests[i]);
      EXPECT_LE(*err, ErrorBound(p->input_type, p->output_type, p->precision)) << i;
    }
    // 12 large requests: each A, B and result is pooled, and C for the 6
    // with beta; none of the small ones.
    EXPECT_EQ(engine->pinned_counts(), (std::vector<int>{12, 12, 6, 12}));
    EXPECT_GT(pool.GetStats().pinned_allocations, 0u);
  }
  EXPECT_EQ(pool.GetStats().in_use_bytes, 0u) << "every pooled buffer was given back";
}

// Garbage sent straight to the raw methods; the server answers it and keeps
// answering good requests correctly, unary and streamed.
TEST(WireCodecTest, ServerRefusesUnparsableRequestsAndKeepsServing) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const std::string target = absl::StrCat("127.0.0.1:", server->port());
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::Slice junk(std::string("\x0a\xff\xff\xff\xff\x0f garbage", 14));
  grpc::ByteBuffer request(&junk, 1);

  grpc::ClientContext unary_context;
  grpc::ByteBuffer unary_response;
  absl::Notification done;
  grpc::Status unary_status;
  stub.UnaryCall(&unary_context, "/matmul.v1.MatmulService/Multiply", grpc::StubOptions(),
                 &request, &unary_response, [&](grpc::Status s) {
                   unary_status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  EXPECT_EQ(unary_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(unary_status.error_message(), HasSubstr("MultiplyRequest"));

  auto c = *client::MatmulClient::Create({.target = target});
  // A stream: the bad item is answered with its error, the good one with
  // its result.
  grpc::ClientContext stream_context;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream =
      stub.PrepareCall(&stream_context, "/matmul.v1.MatmulService/MultiplyStream", &cq);
  void* tag;
  bool ok;
  stream->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  stream->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::ByteBuffer answer;
  stream->Read(&answer, reinterpret_cast<void*>(3));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  v1::MultiplyResponse item;
  ASSERT_TRUE(item.ParseFromString(Flatten(answer)));
  EXPECT_EQ(item.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(item.error().message(), HasSubstr("MultiplyRequest"));
  EXPECT_TRUE(item.c().data().empty());

  v1::MultiplyRequest good =
      client::RandomRequest({.m = 33, .n = 17, .k = 65, .dtype = DType::kFloat32}, Rng());
  good.set_request_id("good");
  std::string good_bytes = good.SerializeAsString();
  grpc::Slice good_slice(good_bytes);
  grpc::ByteBuffer good_wire(&good_slice, 1);
  stream->Write(good_wire, reinterpret_cast<void*>(4));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  stream->Read(&answer, reinterpret_cast<void*>(5));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  ASSERT_TRUE(item.ParseFromString(Flatten(answer)));
  EXPECT_EQ(item.request_id(), "good");
  absl::StatusOr<double> err = client::CheckResponse(good, item);
  ASSERT_TRUE(err.ok()) << err.status();
  EXPECT_LE(*err, 1e-5);
  stream->WritesDone(reinterpret_cast<void*>(6));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  grpc::Status stream_status;
  stream->Finish(&stream_status, reinterpret_cast<void*>(7));
  ASSERT_TRUE(cq.Next(&tag, &ok) && ok);
  EXPECT_TRUE(stream_status.ok()) << stream_status.error_message();

  // Unary through the ordinary client, still correct.
  for (int i = 0; i < 3; ++i) {
    v1::MultiplyRequest r = client::RandomRequest(
        {.m = 1 + static_cast<int64_t>(Rng()() % 90), .n = 64, .k = 31, .dtype = DType::kBFloat16},
        Rng());
    absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(r);
    ASSERT_TRUE(response.ok()) << response.status();
    absl::StatusOr<double> e = client::CheckResponse(r, *response);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_LE(*e, 1e-2);
  }
}

}  // namespace
}  // namespace matmul::server
