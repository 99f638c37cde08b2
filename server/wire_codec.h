// Multiply messages on the wire with as few copies of the matrix bytes as
// gRPC allows.
//
// Multiply and MultiplyStream are registered as raw methods, so gRPC hands
// the service byte buffers instead of parsed messages. Requests are parsed
// here: one copy of each operand out of gRPC's slices, into pinned memory
// the engine sends to the device as it is (request_parser.h). Responses
// are written as protobuf framing around the result's own bytes: the
// ResultBuffer the engine wrote becomes a slice that gRPC sends and then
// frees, so the result is never copied into a protobuf string or from one
// into a serialised message (the typed API costs two such passes over the
// result, plus zeroing the string first).
//
// The bytes are ordinary protobuf: any client decodes them as a
// MultiplyResponse whose c.data holds the result.
//
//   v1::MultiplyRequest request;
//   InlineOperands operands;
//   absl::Status parsed = ParseMultiplyRequest(raw_request, pool, &request, &operands);
//   ...
//   grpc::ByteBuffer out = EncodeMultiplyResponse(std::move(response), &result);
#ifndef MATMUL_SERVER_WIRE_CODEC_H_
#define MATMUL_SERVER_WIRE_CODEC_H_

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "matmul/v1/matmul.pb.h"
#include "server/job.h"
#include "server/request_parser.h"

namespace matmul::server {

// Parses `buffer` into `request`, with the large operand payloads moved
// into `operands`, in buffers from `pool` (see request_parser.h; pool or
// operands null: a plain protobuf parse). INVALID_ARGUMENT when it is not a
// MultiplyRequest; CANCELLED when there is no buffer (the call ended before
// its message came); RESOURCE_EXHAUSTED when a payload's buffer can't be had.
absl::Status ParseMultiplyRequest(const grpc::ByteBuffer& buffer, HostBufferPool* pool,
                                  v1::MultiplyRequest* request, InlineOperands* operands);

// Serialises `response`, with `*result` (when it holds bytes) as c.data;
// `response.c().data()` must be empty then. The result's bytes go to gRPC
// without a copy and `*result` is left empty.
grpc::ByteBuffer EncodeMultiplyResponse(v1::MultiplyResponse response, ResultBuffer* result);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_WIRE_CODEC_H_
