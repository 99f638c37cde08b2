// Microbenchmark of the request parse paths (server/wire_codec.h): the
// typed protobuf parse gRPC would do, against the parser that moves large
// payloads into pool buffers. The pool here "pins" with malloc, so the
// figures are the parser's CPU cost alone, without cudaHostAlloc.
//
//   wire-codec-bench --benchmark_filter=bf16
#include <benchmark/benchmark.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/host_buffer.h"
#include "matmul/v1/matmul.pb.h"
#include "server/wire_codec.h"

namespace matmul::server {
namespace {

void* HeapPin(size_t bytes) { return std::malloc(bytes); }
void HeapUnpin(void* p) { std::free(p); }

// A request for an n x n by n x n product of `element` byte elements, as
// gRPC hands it over: the wire bytes cut into 16 KiB slices.
grpc::ByteBuffer MakeRequest(int n, int element) {
  std::mt19937_64 rng(std::random_device{}());
  v1::MultiplyRequest request;
  const v1::DType dtype = element == 2 ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
  for (v1::Matrix* m : {request.mutable_a(), request.mutable_b()}) {
    m->set_rows(n);
    m->set_cols(n);
    m->set_dtype(dtype);
    std::string data(static_cast<size_t>(n) * n * element, '\0');
    for (char& c : data) c = static_cast<char>(rng() | 1);
    m->set_data(std::move(data));
  }
  request.set_request_id("bench");
  const std::string wire = request.SerializeAsString();
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += 16384) {
    slices.emplace_back(wire.data() + at, std::min<size_t>(16384, wire.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

void Protobuf(benchmark::State& state) {
  const grpc::ByteBuffer buffer = MakeRequest(state.range(0), state.range(1));
  for (auto _ : state) {
    grpc::ByteBuffer shared(buffer);
    grpc::ProtoBufferReader reader(&shared);
    v1::MultiplyRequest request;
    if (!request.ParseFromZeroCopyStream(&reader)) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(request.a().data().data());
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

void Pooled(benchmark::State& state) {
  const grpc::ByteBuffer buffer = MakeRequest(state.range(0), state.range(1));
  HostBufferPool pool(&HeapPin, &HeapUnpin, uint64_t{1} << 30, state.range(2));
  for (auto _ : state) {
    v1::MultiplyRequest request;
    InlineOperands operands;
    if (!ParseMultiplyRequest(buffer, &pool, &request, &operands).ok()) {
      state.SkipWithError("parse failed");
    }
    benchmark::DoNotOptimize(operands.a.data());
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int element : {2, 4}) {
    for (int n : {64, 128, 256, 1024}) b->Args({n, element, 256 << 10});
  }
}

BENCHMARK(Protobuf)->Apply(Shapes);
BENCHMARK(Pooled)->Apply(Shapes);

}  // namespace
}  // namespace matmul::server

BENCHMARK_MAIN();
