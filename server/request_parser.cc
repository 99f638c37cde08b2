#include "server/request_parser.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include <climits>
#include <string>

#include "absl/strings/str_cat.h"

namespace matmul::server {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using google::protobuf::internal::WireFormatLite;

constexpr uint32_t TagOf(int field, WireFormatLite::WireType type) {
  return (static_cast<uint32_t>(field) << 3) | static_cast<uint32_t>(type);
}

constexpr uint32_t kDataTag =
    TagOf(v1::Matrix::kDataFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

absl::Status NotARequest() {
  return absl::InvalidArgumentError(
      "request: not a valid matmul.v1.MultiplyRequest message (protobuf parse failed)");
}

// Reads a length as protobuf's own parser does: at most five bytes, and a
// value that fits 32 bits (CodedInputStream's ReadVarint32 alone would take
// ten bytes and drop the high bits, so that a fifth byte of 0x40 read as a
// length of 0 where protobuf refuses the message; callers refuse lengths
// over INT_MAX as protobuf does); NextTag holds tags to five bytes too.
bool ReadVarint32Strict(CodedInputStream& in, uint32_t* value) {
  const int before = in.CurrentPosition();
  uint64_t wide;
  if (!in.ReadVarint64(&wide) || in.CurrentPosition() - before > 5 || wide > UINT32_MAX) {
    return false;
  }
  *value = static_cast<uint32_t>(wide);
  return true;
}

// Copies the `length` bytes of a length-delimited field (tag and length
// already read) to `out`, with its tag.
bool CopyBytes(CodedInputStream& in, uint32_t tag, uint32_t length, CodedOutputStream& out) {
  if (length > static_cast<uint32_t>(INT_MAX)) return false;
  std::string bytes;
  if (!in.ReadString(&bytes, static_cast<int>(length))) return false;
  out.WriteTag(tag);
  out.WriteVarint32(length);
  out.WriteString(bytes);
  return true;
}

// The next tag into `*tag`: true with 0 at a proper end of the message (or
// of the pushed limit), false when the input is not a message.
bool NextTag(CodedInputStream& in, uint32_t* tag) {
  const int before = in.CurrentPosition();
  *tag = in.ReadTag();
  if (in.CurrentPosition() - before > 5) return false;
  return *tag != 0 || in.ConsumedEntireMessage();
}

// Copies one field (its tag already read) from `in` to `out`, rejecting
// what protobuf's parser rejects. Groups are walked here, not by
// WireFormatLite::SkipField, which would take (and rewrite shorter) the
// over-long tags and lengths inside them that protobuf refuses.
bool CopyField(CodedInputStream& in, uint32_t tag, CodedOutputStream& out) {
  switch (WireFormatLite::GetTagWireType(tag)) {
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
      uint32_t length;
      return ReadVarint32Strict(in, &length) && CopyBytes(in, tag, length, out);
    }
    case WireFormatLite::WIRETYPE_START_GROUP: {
      if (!in.IncrementRecursionDepth()) return false;
      out.WriteTag(tag);
      while (true) {
        uint32_t inner;
        // The message may not end inside the group.
        if (!NextTag(in, &inner) || inner == 0) return false;
        if (WireFormatLite::GetTagWireType(inner) == WireFormatLite::WIRETYPE_END_GROUP) {
          if (WireFormatLite::GetTagFieldNumber(inner) != WireFormatLite::GetTagFieldNumber(tag)) {
            return false;
          }
          out.WriteTag(inner);
          in.DecrementRecursionDepth();
          return true;
        }
        if (!CopyField(in, inner, out)) return false;
      }
    }
    default:
      return WireFormatLite::SkipField(&in, tag, &out);
  }
}

// Copies one Matrix message (the input is limited to it) to `out` as it is,
// but for a data payload of at least `min_bytes`, which goes to `*payload`
// and is replaced by an empty data field. Protobuf keeps the last of
// repeated singular fields, and so does this: a later data field, moved out
// or not, replaces an earlier one.
absl::Status CopyMatrix(CodedInputStream& in, absl::string_view field, HostBufferPool* pool,
                        std::string* out, HostBuffer* payload) {
  StringOutputStream sink(out);
  CodedOutputStream copy(&sink);
  while (true) {
    uint32_t tag;
    if (!NextTag(in, &tag)) return NotARequest();
    if (tag == 0) return absl::OkStatus();
    if (tag == kDataTag) {
      uint32_t length;
      if (!ReadVarint32Strict(in, &length)) return NotARequest();
      if (length >= pool->min_bytes() && length <= static_cast<uint32_t>(INT_MAX)) {
        // The length must be there before anything is allocated for it.
        if (static_cast<int64_t>(length) > in.BytesUntilLimit()) return NotARequest();
        HostBuffer bytes = HostBuffer::Allocate(pool, length);
        if (bytes.data() == nullptr) {
          return absl::ResourceExhaustedError(
              absl::StrCat(field, ".data: cannot allocate ", length, " bytes"));
        }
        if (!in.ReadRaw(bytes.data(), static_cast<int>(length))) return NotARequest();
        *payload = std::move(bytes);
        copy.WriteTag(kDataTag);
        copy.WriteVarint32(0);
        continue;
      }
      // A small payload stays in the message (and displaces a moved one).
      payload->Reset();
      if (!CopyBytes(in, kDataTag, length, copy)) return NotARequest();
      continue;
    }
    if (!CopyField(in, tag, copy)) return NotARequest();
  }
}

// Walks the fields of a MultiplyRequest (in_matrix false) or of one of its
// a/b/c matrices (in_matrix true, the input limited to it): true at a data
// payload of at least `min_bytes`, or where the bytes are malformed.
bool FindPayload(CodedInputStream& in, size_t min_bytes, bool in_matrix) {
  while (true) {
    uint32_t tag;
    if (!NextTag(in, &tag)) return true;
    if (tag == 0) return false;
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return true;
      continue;
    }
    uint32_t length;
    if (!ReadVarint32Strict(in, &length) || static_cast<int64_t>(length) > in.BytesUntilLimit()) {
      return true;
    }
    if (length >= min_bytes) {
      if (in_matrix && tag == kDataTag) return true;
      const int field = static_cast<int>(tag >> 3);
      if (!in_matrix && (field == v1::MultiplyRequest::kAFieldNumber ||
                         field == v1::MultiplyRequest::kBFieldNumber ||
                         field == v1::MultiplyRequest::kCFieldNumber)) {
        const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
        if (FindPayload(in, min_bytes, /*in_matrix=*/true)) return true;
        in.PopLimit(limit);
        continue;
      }
    }
    if (!in.Skip(static_cast<int>(length))) return true;
  }
}

}  // namespace

bool HasPayloadToMove(google::protobuf::io::ZeroCopyInputStream* input, size_t size,
                      size_t min_bytes) {
  if (size > static_cast<size_t>(INT_MAX)) return true;
  // Framing takes bytes too, so a smaller message cannot hold such a payload.
  if (size < min_bytes) return false;
  CodedInputStream in(input);
  in.PushLimit(static_cast<int>(size));
  return FindPayload(in, min_bytes, /*in_matrix=*/false);
}

absl::Status ParseMultiplyRequest(google::protobuf::io::ZeroCopyInputStream* input, size_t size,
                                  HostBufferPool* pool, v1::MultiplyRequest* request,
                                  InlineOperands* operands) {
  if (size > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: ", size, " bytes is over the 2 GiB a protobuf message may hold"));
  }
  if (pool == nullptr || operands == nullptr) {
    if (!request->ParseFromZeroCopyStream(input)) return NotARequest();
    return absl::OkStatus();
  }
  CodedInputStream in(input);
  in.PushLimit(static_cast<int>(size));
  // Every field but the moved payloads, re-encoded for protobuf to parse.
  std::string rest;
  {
    StringOutputStream sink(&rest);
    CodedOutputStream out(&sink);
    while (true) {
      uint32_t tag;
      if (!NextTag(in, &tag)) return NotARequest();
      if (tag == 0) break;
      const int field = static_cast<int>(tag >> 3);
      HostBuffer* payload = nullptr;
      absl::string_view name;
      if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        switch (field) {
          case v1::MultiplyRequest::kAFieldNumber: payload = &operands->a; name = "a"; break;
          case v1::MultiplyRequest::kBFieldNumber: payload = &operands->b; name = "b"; break;
          case v1::MultiplyRequest::kCFieldNumber: payload = &operands->c; name = "c"; break;
          default: break;
        }
      }
      if (payload == nullptr) {
        if (!CopyField(in, tag, out)) return NotARequest();
        continue;
      }
      uint32_t length;
      // (PushLimit would clamp a length past the end to the end.)
      if (!ReadVarint32Strict(in, &length) ||
          static_cast<int64_t>(length) > in.BytesUntilLimit()) {
        return NotARequest();
      }
      const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
      std::string matrix;
      if (absl::Status s = CopyMatrix(in, name, pool, &matrix, payload); !s.ok()) return s;
      // CopyMatrix stopped at the limit only if the matrix was all there.
      if (in.BytesUntilLimit() != 0) return NotARequest();
      in.PopLimit(limit);
      out.WriteTag(tag);
      out.WriteVarint32(static_cast<uint32_t>(matrix.size()));
      out.WriteString(matrix);
    }
  }
  if (!request->ParseFromString(rest)) return NotARequest();
  return absl::OkStatus();
}

}  // namespace matmul::server
