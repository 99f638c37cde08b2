// Matrices kept on the server, end to end over loopback gRPC on the CPU
// engine: PutMatrix and chunked UploadMatrix, operands by handle, results
// kept with store_result and chained, GetMatrix, DeleteMatrix,
// ListMatrices, expiry, the store's budget, and the errors of each.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/matmul_client.h"
#include "client/requests.h"
#include "kernels/reference_gemm.h"
#include "server/server.h"
#include "tests/util/test_util.h"

namespace matmul::server {
namespace {

using matmul::testing::Connect;
using matmul::testing::Rng;

using client::MatmulClient;
using client::ProblemSpec;
using ::testing::HasSubstr;
using matmul::testing::HttpGet;
using matmul::testing::MetricSum;

// MATMUL_TEST_BACKEND=cuda runs these against the GPU engine (on the GPU
// machine); the default is the CPU engine.
std::string Backend() {
  const char* b = std::getenv("MATMUL_TEST_BACKEND");
  return b != nullptr && *b != '\0' ? b : "cpu";
}

// The device id the first kept matrix lands on.
std::string FirstDevice() { return Backend() + ":0"; }

// Bytes a kept matrix of `bytes` holds on its device: the CUDA engine pads
// rows to 16 bytes and allocations to 256.
double Held(uint64_t rows, uint64_t row_bytes) {
  if (Backend() != "cuda") return static_cast<double>(rows * row_bytes);
  const uint64_t padded = (row_bytes + 15) / 16 * 16;
  return static_cast<double>((rows * padded + 255) / 256 * 256);
}

// The CPU or CUDA engine with a small store and resident pool.
ServerConfig LoopbackConfig() {
  ServerConfig config;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "127.0.0.1:0";
  config.engine.backend = Backend();
  config.engine.gpu_memory_fraction = 0.2;
  config.resident.max_bytes = 64 << 20;
  config.engine.gpu_resident_bytes = 72 << 20;
  return config;
}

std::unique_ptr<MatmulServer> StartServer(ServerConfig config = LoopbackConfig()) {
  return matmul::testing::StartServer(std::move(config));
}

// `response` checked against the float64 reference of the inline `request`.
void ExpectCorrect(const v1::MultiplyRequest& request, const v1::MultiplyResponse& response,
                   const std::string& what) {
  absl::StatusOr<double> err = client::CheckResponse(request, response);
  ASSERT_TRUE(err.ok()) << what << ": " << err.status();
  absl::StatusOr<GemmProblem> p = client::ProblemOf(request);
  EXPECT_LE(*err, ErrorBound(p->input_type, p->output_type, p->precision)) << what;
}

// The matrix named by handle `id`, as a request operand (no shape given).
v1::Matrix ByHandle(const std::string& id) {
  v1::Matrix m;
  m.set_handle(id);
  return m;
}

// A random rows x cols matrix of `dtype` (never zeros).
v1::Matrix RandomMatrix(uint64_t rows, uint64_t cols, DType dtype) {
  ProblemSpec spec{.m = static_cast<int64_t>(rows), .n = 1, .k = static_cast<int64_t>(cols),
                   .dtype = dtype};
  return client::RandomRequest(spec, Rng()).a();
}

double Metric(const MatmulServer& server, const std::string& prefix) {
  return MetricSum(HttpGet(server.metrics_port(), "/metrics"), prefix);
}

TEST(ResidentTest, OperandsByHandleGiveTheInlineResultForEveryDType) {
  auto server = StartServer();
  auto c = Connect(*server);
  int checked = 0;
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (int variant = 0; variant < 4; ++variant) {
      ProblemSpec spec{.m = 37, .n = 129, .k = 65, .dtype = dtype};
      spec.transpose_a = variant & 1;
      spec.transpose_b = variant & 2;
      if (variant == 3) {
        spec.alpha = 0.5;
        spec.beta = -1.25;
      }
      const v1::MultiplyRequest inline_request = client::RandomRequest(spec, Rng());
      absl::StatusOr<v1::MultiplyResponse> inline_response = c->Multiply(inline_request);
      ASSERT_TRUE(inline_response.ok()) << inline_response.status();
      ExpectCorrect(inline_request, *inline_response, "inline");

      // B by handle; then A and B; then A, B and C.
      absl::StatusOr<v1::MatrixHandle> a = c->PutMatrix(inline_request.a());
      absl::StatusOr<v1::MatrixHandle> b = c->PutMatrix(inline_request.b());
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      EXPECT_EQ(b->rows(), inline_request.b().rows());
      EXPECT_EQ(b->cols(), inline_request.b().cols());
      EXPECT_EQ(b->dtype(), inline_request.b().dtype());
      EXPECT_EQ(b->bytes(), inline_request.b().data().size());
      EXPECT_EQ(b->device(), FirstDevice());
      EXPECT_GT(b->expire_time_ms(), 0);
      for (int operands = 0; operands < 3; ++operands) {
        v1::MultiplyRequest request = inline_request;
        *request.mutable_b() = ByHandle(b->id());
        if (operands >= 1) *request.mutable_a() = ByHandle(a->id());
        if (operands >= 2 && request.has_c()) {
          absl::StatusOr<v1::MatrixHandle> kept_c = c->PutMatrix(inline_request.c());
          ASSERT_TRUE(kept_c.ok()) << kept_c.status();
          *request.mutable_c() = ByHandle(kept_c->id());
        }
        absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
        ASSERT_TRUE(response.ok()) << response.status();
        const std::string what = absl::StrCat(DTypeName(dtype), " variant ", variant, " operands ", operands);
        ExpectCorrect(inline_request, *response, what);
        // Same engine, same inputs: the same bytes as the inline call.
        EXPECT_EQ(response->c().data(), inline_response->c().data()) << what;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 4 * 3);
}

TEST(ResidentTest, BadHandlesAreClearErrorsAndServingGoesOn) {
  auto server = StartServer();
  auto c = Connect(*server);
  ProblemSpec spec{.m = 16, .n = 24, .k = 32, .dtype = DType::kFloat32};
  const v1::MultiplyRequest good = client::RandomRequest(spec, Rng());
  absl::StatusOr<v1::MatrixHandle> b = c->PutMatrix(good.b());
  ASSERT_TRUE(b.ok()) << b.status();

  v1::MultiplyRequest r = good;
  *r.mutable_b() = ByHandle("m-00000000000000000000000000000000");
  absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(response.status().message(), HasSubstr("b.handle"));
  EXPECT_THAT(response.status().message(), HasSubstr("m-00000000000000000000000000000000"));

  r = good;
  *r.mutable_b() = ByHandle(b->id());
  r.mutable_b()->set_rows(good.b().rows() + 1);
  r.mutable_b()->set_cols(good.b().cols());
  response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("b: handle"));

  r = good;
  r.mutable_b()->set_handle(b->id());  // Data and handle both.
  response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("b: give exactly one of data, handle and shm"));

  r = good;
  *r.mutable_b() = ByHandle(b->id());
  r.mutable_b()->set_dtype(v1::DTYPE_FLOAT64);
  response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("b.dtype"));

  // A kept B whose rows do not match op(A)'s columns.
  r = good;
  r.set_transpose_a(true);
  *r.mutable_b() = ByHandle(b->id());
  response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);

  // Deleted: NOT_FOUND for use, for GetMatrix and for a second delete.
  ASSERT_TRUE(c->DeleteMatrix(b->id()).ok());
  r = good;
  *r.mutable_b() = ByHandle(b->id());
  EXPECT_EQ(c->Multiply(r).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->GetMatrix(b->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->DeleteMatrix(b->id()).code(), absl::StatusCode::kNotFound);

  // PutMatrix errors name the field.
  v1::Matrix bad = good.b();
  bad.mutable_data()->pop_back();
  absl::StatusOr<v1::MatrixHandle> put = c->PutMatrix(bad);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("matrix.data: expected"));
  bad = good.b();
  bad.set_rows(0);
  put = c->PutMatrix(bad);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("matrix.rows"));
  put = c->PutMatrix(good.b(), /*ttl_seconds=*/10 * 86400);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("ttl_seconds"));

  // Still serving.
  absl::StatusOr<v1::MultiplyResponse> ok = c->Multiply(good);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ExpectCorrect(good, *ok, "after errors");
}

TEST(ResidentTest, ExpiredMatricesAreNotFoundAndFreed) {
  auto server = StartServer();
  auto c = Connect(*server);
  const v1::Matrix m = RandomMatrix(64, 64, DType::kFloat32);
  absl::StatusOr<v1::MatrixHandle> short_lived = c->PutMatrix(m, /*ttl_seconds=*/1);
  absl::StatusOr<v1::MatrixHandle> long_lived = c->PutMatrix(m);
  ASSERT_TRUE(short_lived.ok() && long_lived.ok());
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  EXPECT_NEAR(short_lived->expire_time_ms() - now_ms, 1000, 500);
  absl::StatusOr<v1::Matrix> got = c->GetMatrix(short_lived->id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->data(), m.data());
  EXPECT_EQ(Metric(*server, "matmul_resident_matrices"), 2);

  // Wait past the expiry (bounded by the ttl, not a test time limit).
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_EQ(c->GetMatrix(short_lived->id()).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<v1::MatrixHandle>> list = c->ListMatrices();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].id(), long_lived->id());
  // The sweeper freed it (within a second of expiry).
  while (Metric(*server, "matmul_resident_matrices") != 1) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(Metric(*server, "matmul_resident_bytes"), Held(64, 64 * 4));
}

TEST(ResidentTest, ChunkedUploadOfAMatrixLargerThanTheMessageLimit) {
  ServerConfig config = LoopbackConfig();
  config.max_request_bytes = 1 << 20;
  auto server = StartServer(config);
  auto c = Connect(*server);
  // 3 MiB of float32: three times what one message may carry.
  const v1::Matrix big = RandomMatrix(768, 1024, DType::kFloat32);
  ASSERT_EQ(big.data().size(), 3u << 20);
  // In one message it is refused by gRPC's own limit...
  absl::StatusOr<v1::MatrixHandle> one = c->PutMatrix(big, 0, /*chunk_bytes=*/0);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kResourceExhausted);
  // ...in chunks it goes.
  absl::StatusOr<v1::MatrixHandle> h = c->PutMatrix(big, 0, /*chunk_bytes=*/256 << 10);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->bytes(), big.data().size());
  absl::StatusOr<v1::Matrix> back = c->GetMatrix(h->id());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rows(), 768u);
  EXPECT_EQ(back->cols(), 1024u);
  EXPECT_EQ(back->data(), big.data());

  // Used as B (1024 x 768 after transposing) by a small request.
  ProblemSpec spec{.m = 8, .n = 768, .k = 1024, .dtype = DType::kFloat32, .transpose_b = true};
  v1::MultiplyRequest inline_request = client::RandomRequest(spec, Rng());
  *inline_request.mutable_b() = big;
  v1::MultiplyRequest request = inline_request;
  *request.mutable_b() = ByHandle(h->id());
  absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ExpectCorrect(inline_request, *response, "uploaded B");
}

TEST(ResidentTest, UploadsThatBreakTheirShapeAreRefused) {
  auto server = StartServer();
  auto c = Connect(*server);
  auto stub = v1::MatmulService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()), grpc::InsecureChannelCredentials()));
  auto upload = [&](std::vector<v1::UploadMatrixChunk> chunks) {
    grpc::ClientContext context;
    v1::MatrixHandle handle;
    auto writer = stub->UploadMatrix(&context, &handle);
    for (const auto& chunk : chunks) {
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::UploadMatrixChunk first;
  first.set_rows(4);
  first.set_cols(4);
  first.set_dtype(v1::DTYPE_FLOAT32);
  first.set_data(std::string(32, '\x01'));
  v1::UploadMatrixChunk rest;
  rest.set_data(std::string(32, '\x01'));
  EXPECT_TRUE(upload({first, rest}).ok());
  grpc::Status s = upload({first});  // Short.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("expected 64 bytes"));
  s = upload({first, rest, rest});  // Long.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("more than the 64 bytes"));
  s = upload({});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::UploadMatrixChunk huge = first;
  huge.set_rows(uint64_t{1} << 40);
  huge.set_cols(uint64_t{1} << 40);
  s = upload({huge});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Refused uploads gave their reservations back: only the good one holds bytes.
  absl::StatusOr<std::vector<v1::MatrixHandle>> list = c->ListMatrices();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 1u);
  EXPECT_EQ(Metric(*server, "matmul_resident_bytes"), Held(4, 16));
}

TEST(ResidentTest, AFullStoreRefusesWithTheSizesAndDeletingMakesRoom) {
  ServerConfig config = LoopbackConfig();
  config.resident.max_bytes = 1 << 20;
  auto server = StartServer(config);
  auto c = Connect(*server);
  const v1::Matrix m = RandomMatrix(384, 384, DType::kFloat32);  // 576 KiB.
  absl::StatusOr<v1::MatrixHandle> first = c->PutMatrix(m);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::MatrixHandle> second = c->PutMatrix(m);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("589824 bytes needed, 589824 of 1048576"));
  // A kept result that would not fit is refused before it runs.
  ProblemSpec spec{.m = 384, .n = 384, .k = 8, .dtype = DType::kFloat32};
  v1::MultiplyRequest request = client::RandomRequest(spec, Rng());
  request.set_store_result(true);
  EXPECT_EQ(c->Multiply(request).status().code(), absl::StatusCode::kResourceExhausted);
  // Inline work is not affected.
  request.set_store_result(false);
  EXPECT_TRUE(c->Multiply(request).ok());
  ASSERT_TRUE(c->DeleteMatrix(first->id()).ok());
  second = c->PutMatrix(m);
  EXPECT_TRUE(second.ok()) << second.status();
}

TEST(ResidentTest, ChainsOfKeptResultsNeverCrossTheWire) {
  auto server = StartServer();
  auto c = Connect(*server);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    // C = A * B, D = C * E, F = D * G (+ 0.5 C-shaped? no: F = D * G), each kept.
    const v1::Matrix a = RandomMatrix(48, 64, dtype);
    const v1::Matrix b = RandomMatrix(64, 40, dtype);
    const v1::Matrix e = RandomMatrix(40, 56, dtype);
    absl::StatusOr<v1::MatrixHandle> ha = c->PutMatrix(a);
    absl::StatusOr<v1::MatrixHandle> hb = c->PutMatrix(b);
    absl::StatusOr<v1::MatrixHandle> he = c->PutMatrix(e);
    ASSERT_TRUE(ha.ok() && hb.ok() && he.ok());

    v1::MultiplyRequest first;
    *first.mutable_a() = ByHandle(ha->id());
    *first.mutable_b() = ByHandle(hb->id());
    first.set_store_result(true);
    absl::StatusOr<v1::MultiplyResponse> r1 = c->Multiply(first);
    ASSERT_TRUE(r1.ok()) << r1.status();
    EXPECT_TRUE(r1->c().data().empty());
    EXPECT_EQ(r1->c().rows(), 48u);
    EXPECT_EQ(r1->c().cols(), 40u);
    ASSERT_FALSE(r1->result_handle().id().empty());
    EXPECT_EQ(r1->result_handle().rows(), 48u);
    EXPECT_EQ(r1->result_handle().cols(), 40u);

    v1::MultiplyRequest second;
    *second.mutable_a() = ByHandle(r1->result_handle().id());
    *second.mutable_b() = ByHandle(he->id());
    second.set_store_result(true);
    absl::StatusOr<v1::MultiplyResponse> r2 = c->Multiply(second);
    ASSERT_TRUE(r2.ok()) << r2.status();

    // Each link checked against the reference of its own (downloaded) inputs.
    absl::StatusOr<v1::Matrix> kept_c = c->GetMatrix(r1->result_handle().id());
    absl::StatusOr<v1::Matrix> kept_d = c->GetMatrix(r2->result_handle().id());
    ASSERT_TRUE(kept_c.ok() && kept_d.ok());
    v1::MultiplyRequest check1;
    *check1.mutable_a() = a;
    *check1.mutable_b() = b;
    v1::MultiplyResponse got1;
    *got1.mutable_c() = *kept_c;
    ExpectCorrect(check1, got1, absl::StrCat(DTypeName(dtype), " C = A B"));
    v1::MultiplyRequest check2;
    *check2.mutable_a() = *kept_c;
    *check2.mutable_b() = e;
    v1::MultiplyResponse got2;
    *got2.mutable_c() = *kept_d;
    ExpectCorrect(check2, got2, absl::StrCat(DTypeName(dtype), " D = C E"));
  }
  EXPECT_GE(Metric(*server, "matmul_resident_stored_bytes_total"), 1);
  EXPECT_GE(Metric(*server, "matmul_resident_downloaded_bytes_total"), 1);
}

TEST(ResidentTest, StreamsTakeHandlesAndKeepResults) {
  auto server = StartServer();
  auto c = Connect(*server);
  ProblemSpec spec{.m = 32, .n = 32, .k = 32, .dtype = DType::kFloat16};
  const v1::MultiplyRequest base = client::RandomRequest(spec, Rng());
  absl::StatusOr<v1::MatrixHandle> b = c->PutMatrix(base.b());
  ASSERT_TRUE(b.ok());
  std::vector<v1::MultiplyRequest> requests;
  std::vector<v1::MultiplyRequest> inline_requests;
  for (int i = 0; i < 24; ++i) {
    v1::MultiplyRequest inline_request = client::RandomRequest(spec, Rng());
    *inline_request.mutable_b() = base.b();
    inline_request.set_request_id(absl::StrCat("item-", i));
    v1::MultiplyRequest r = inline_request;
    *r.mutable_b() = ByHandle(b->id());
    if (i % 3 == 0) r.set_store_result(true);
    if (i == 5) *r.mutable_b() = ByHandle("m-nope");
    requests.push_back(r);
    inline_requests.push_back(inline_request);
  }
  absl::StatusOr<std::vector<v1::MultiplyResponse>> responses = c->MultiplyStream(requests);
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), requests.size());
  for (const v1::MultiplyResponse& response : *responses) {
    const int i = std::stoi(response.request_id().substr(5));
    if (i == 5) {
      EXPECT_EQ(response.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
      continue;
    }
    ASSERT_EQ(response.error().code(), 0) << response.error().message();
    if (i % 3 == 0) {
      absl::StatusOr<v1::Matrix> kept = c->GetMatrix(response.result_handle().id());
      ASSERT_TRUE(kept.ok()) << kept.status();
      v1::MultiplyResponse as_inline = response;
      *as_inline.mutable_c() = *kept;
      ExpectCorrect(inline_requests[i], as_inline, response.request_id());
    } else {
      ExpectCorrect(inline_requests[i], response, response.request_id());
    }
  }
}

TEST(ResidentTest, ConcurrentCallersSharingAKeptOperandAcrossTwoWorkers) {
  ServerConfig config = LoopbackConfig();
  config.engine.cpu_workers = 2;  // Two devices: batches may copy B to cpu:1.
  config.engine.cuda_devices = {0, 0};  // On a GPU: two workers of one GPU.
  config.engine.cpu_threads = 1;
  auto server = StartServer(config);
  auto c = Connect(*server);
  const v1::Matrix b = RandomMatrix(96, 80, DType::kBFloat16);
  absl::StatusOr<v1::MatrixHandle> hb = c->PutMatrix(b);
  ASSERT_TRUE(hb.ok());
  std::vector<std::thread> callers;
  std::atomic<int> correct{0};
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&, t] {
      std::mt19937_64 rng(std::random_device{}() + t);
      for (int i = 0; i < 20; ++i) {
        ProblemSpec spec{.m = 1 + static_cast<int64_t>(rng() % 64), .n = 80, .k = 96,
                         .dtype = DType::kBFloat16};
        v1::MultiplyRequest inline_request = client::RandomRequest(spec, rng);
        *inline_request.mutable_b() = b;
        v1::MultiplyRequest request = inline_request;
        *request.mutable_b() = ByHandle(hb->id());
        absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(request);
        ASSERT_TRUE(response.ok()) << response.status();
        absl::StatusOr<double> err = client::CheckResponse(inline_request, *response);
        ASSERT_TRUE(err.ok());
        if (*err <= ErrorBound(DType::kBFloat16, DType::kBFloat16, Precision::kDefault)) ++correct;
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(correct.load(), 8 * 20);
  // However the batches spread, each device holds B at most once.
  const double held = Metric(*server, "matmul_resident_bytes");
  EXPECT_GE(held, Held(96, 80 * 2));
  EXPECT_LE(held, 2.0 * Held(96, 80 * 2));
}

TEST(ResidentTest, ServerInfoAndMetricsDescribeTheStore) {
  auto server = StartServer();
  auto c = Connect(*server);
  absl::StatusOr<v1::ServerInfo> info = c->GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->resident().max_bytes(), 64u << 20);
  EXPECT_EQ(info->resident().default_ttl_seconds(), 3600u);
  const v1::Matrix m = RandomMatrix(10, 30, DType::kFloat64);
  ASSERT_TRUE(c->PutMatrix(m).ok());
  ASSERT_TRUE(c->PutMatrix(m).ok());
  EXPECT_EQ(Metric(*server, "matmul_resident_matrices"), 2);
  EXPECT_EQ(Metric(*server, "matmul_resident_bytes{device=\"" + FirstDevice() + "\"}"),
            2 * Held(10, 30 * 8));
  EXPECT_EQ(Metric(*server, "matmul_resident_stored_bytes_total"), 2 * 10 * 30 * 8);
  EXPECT_GE(Metric(*server, "matmul_requests_total{code=\"OK\",method=\"PutMatrix\"}"), 2);
}

TEST(ResidentTest, WithoutAStoreHandlesAreRefusedClearly) {
  ServerConfig config = LoopbackConfig();
  config.resident.max_bytes = 0;
  auto server = StartServer(config);
  auto c = Connect(*server);
  ProblemSpec spec{.m = 8, .n = 8, .k = 8, .dtype = DType::kFloat32};
  v1::MultiplyRequest r = client::RandomRequest(spec, Rng());
  EXPECT_EQ(c->PutMatrix(r.b()).status().code(), absl::StatusCode::kFailedPrecondition);
  *r.mutable_b() = ByHandle("m-x");
  absl::StatusOr<v1::MultiplyResponse> response = c->Multiply(r);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(response.status().message(), HasSubstr("b.handle"));
}

}  // namespace
}  // namespace matmul::server
