// An engine decorator that makes one device fail on purpose, for testing the
// paths a real device failure takes (its batches fail INTERNAL, it turns
// unhealthy, the other devices keep serving, health and metrics say so).
//
//   // matmul-server --inject_device_failure=cuda:1@5
//   absl::StatusOr<FaultSpec> spec = ParseFaultSpec("cuda:1@5");
//   engines = WrapFailingDevice(std::move(engines), *spec);
#ifndef MATMUL_SERVER_FAULT_INJECTION_H_
#define MATMUL_SERVER_FAULT_INJECTION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/engine.h"

namespace matmul::server {

struct FaultSpec {
  // Device id to fail, e.g. "cuda:1" or "cpu:0".
  std::string device;
  // Batches that still succeed before the failure.
  int after_batches = 0;
};

// Parses "DEVICE@N" (N batches succeed first) or "DEVICE" (N = 0).
absl::StatusOr<FaultSpec> ParseFaultSpec(absl::string_view text);

// Wraps the engine whose id is spec.device; NOT_FOUND when there is none.
absl::Status WrapFailingDevice(std::vector<std::unique_ptr<Engine>>& engines,
                               const FaultSpec& spec);

}  // namespace matmul::server

#endif  // MATMUL_SERVER_FAULT_INJECTION_H_
