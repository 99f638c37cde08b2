#include "server/wire_codec.h"

#include <grpc/slice.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <string>
#include <utility>

namespace matmul::server {
namespace {

// Protobuf wire type of length-delimited fields (bytes, strings, messages).
constexpr uint32_t kLengthDelimited = 2;
// Field numbers: MultiplyResponse.c and Matrix.data.
constexpr uint32_t kResponseC = v1::MultiplyResponse::kCFieldNumber;
constexpr uint32_t kMatrixData = v1::Matrix::kDataFieldNumber;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

void AppendTag(uint32_t field, std::string* out) {
  AppendVarint((uint64_t{field} << 3) | kLengthDelimited, out);
}

}  // namespace

absl::Status ParseMultiplyRequest(const grpc::ByteBuffer& buffer, HostBufferPool* pool,
                                  v1::MultiplyRequest* request, InlineOperands* operands) {
  // gRPC hands a raw method no buffer at all when the call ended before its
  // message arrived (cancelled, or past its deadline); an empty message is a
  // valid buffer of no bytes.
  if (!buffer.Valid()) {
    return absl::CancelledError("the call ended before its request message arrived");
  }
  // A reader consumes its buffer; these copies share the slices, not bytes.
  if (pool != nullptr && operands != nullptr) {
    grpc::ByteBuffer scanned(buffer);
    grpc::ProtoBufferReader scan(&scanned);
    // Nothing to move out: protobuf's own parse is the cheapest.
    if (!HasPayloadToMove(&scan, buffer.Length(), pool->min_bytes())) pool = nullptr;
  }
  grpc::ByteBuffer shared(buffer);
  grpc::ProtoBufferReader reader(&shared);
  return ParseMultiplyRequest(&reader, buffer.Length(), pool, request, operands);
}

grpc::ByteBuffer EncodeMultiplyResponse(v1::MultiplyResponse response, ResultBuffer* result) {
  const size_t payload = result == nullptr ? 0 : result->size();
  if (payload == 0) {
    std::string bytes = response.SerializeAsString();
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  }
  // Everything but c, then c as its fields other than data, then data's
  // tag and length; the result's bytes follow as their own slice.
  const std::string c_fields = response.c().SerializeAsString();
  response.clear_c();
  std::string head = response.SerializeAsString();
  const size_t data_header = VarintSize((uint64_t{kMatrixData} << 3) | kLengthDelimited) +
                             VarintSize(payload);
  AppendTag(kResponseC, &head);
  AppendVarint(c_fields.size() + data_header + payload, &head);
  head += c_fields;
  AppendTag(kMatrixData, &head);
  AppendVarint(payload, &head);
  // The slice owns the result's buffer now, and frees it (back to its
  // pool) once gRPC has sent it.
  HostBuffer bytes = result->Release();
  void* data = bytes.data();
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(grpc_slice_new_with_user_data(data, payload, &HostBuffer::FreeToken,
                                                bytes.ReleaseToken()),
                  grpc::Slice::STEAL_REF)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace matmul::server
