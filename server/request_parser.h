// Parses a MultiplyRequest from its wire bytes, with the large operand
// payloads (a.data, b.data, c.data) going straight into host buffers from
// the engine's pool instead of into protobuf strings.
//
// A typed parse copies each payload out of gRPC's slices into a string, and
// the engine then copies it again into page-locked staging memory before
// the device can read it. Here the one copy out of the slices lands in
// pinned memory (see kernels/host_buffer.h) that the engine sends to the
// device as it is. Every other field is parsed by protobuf itself, so the
// result is the message a typed parse gives, less the payloads moved out.
//
//   InlineOperands operands;
//   absl::Status s = ParseMultiplyRequest(&stream, size, pool, &request, &operands);
//   // request.a().data() is empty when operands.a holds a's bytes.
//   ValidateMultiplyRequest(request, limits, lookup, shm, &operands);
#ifndef MATMUL_SERVER_REQUEST_PARSER_H_
#define MATMUL_SERVER_REQUEST_PARSER_H_

#include <google/protobuf/io/zero_copy_stream.h>

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/host_buffer.h"
#include "matmul/v1/matmul.pb.h"

namespace matmul::server {

// Operand payloads the parser took out of the message; an empty buffer
// means the payload, if any, is still in the message's data field.
struct InlineOperands {
  HostBuffer a, b, c;
};

// Parses the `size` bytes of `input` into `request`. Payloads of at least
// pool->min_bytes() go to `operands` (pool == null: nothing is moved out).
// INVALID_ARGUMENT when the bytes are not a MultiplyRequest;
// RESOURCE_EXHAUSTED when a payload's buffer cannot be allocated.
absl::Status ParseMultiplyRequest(google::protobuf::io::ZeroCopyInputStream* input, size_t size,
                                  HostBufferPool* pool, v1::MultiplyRequest* request,
                                  InlineOperands* operands);

// True when `input` (`size` bytes) holds an a, b or c data payload of at
// least `min_bytes`, i.e. when ParseMultiplyRequest would move something
// out; also true when the bytes are not a valid message, so that the
// parser reports them. Reads without copying: a request with only small
// payloads then costs protobuf's own parse and this walk over its tags.
bool HasPayloadToMove(google::protobuf::io::ZeroCopyInputStream* input, size_t size,
                      size_t min_bytes);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_REQUEST_PARSER_H_
