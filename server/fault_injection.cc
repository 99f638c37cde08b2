#include "server/fault_injection.h"

#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace matmul::server {
namespace {

class FailingEngine final : public Engine {
 public:
  FailingEngine(std::unique_ptr<Engine> inner, int after) : inner_(std::move(inner)), left_(after) {}

  const DeviceDescription& Device() const override { return inner_->Device(); }
  absl::string_view Name() const override { return inner_->Name(); }
  uint64_t MaxProblemBytes() const override { return inner_->MaxProblemBytes(); }
  EngineStats Stats() const override { return inner_->Stats(); }
  bool Healthy() const override { return !failed_.load() && inner_->Healthy(); }
  absl::StatusOr<std::unique_ptr<ResidentMatrix>> CreateResident(int64_t rows, int64_t cols,
                                                                 DType dtype,
                                                                 const void* host) override {
    return inner_->CreateResident(rows, cols, dtype, host);
  }
  uint64_t ResidentFootprint(int64_t rows, int64_t cols, DType dtype) const override {
    return inner_->ResidentFootprint(rows, cols, dtype);
  }
  absl::Status ReadResident(const ResidentMatrix& matrix, void* host) override {
    return inner_->ReadResident(matrix, host);
  }

  void Run(absl::Span<const GemmProblem> problems, absl::Span<absl::Status> status) override {
    if (left_.fetch_sub(1) > 0 && !failed_.load()) {
      inner_->Run(problems, status);
      return;
    }
    failed_.store(true);
    for (absl::Status& s : status) {
      s = absl::InternalError(
          absl::StrCat(inner_->Device().id, ": injected device failure (--inject_device_failure)"));
    }
  }

 private:
  const std::unique_ptr<Engine> inner_;
  // Batches left before the failure.
  std::atomic<int> left_;
  std::atomic<bool> failed_{false};
};

}  // namespace

absl::StatusOr<FaultSpec> ParseFaultSpec(absl::string_view text) {
  FaultSpec spec;
  const size_t at = text.find('@');
  spec.device = std::string(text.substr(0, at));
  if (spec.device.empty()) {
    return absl::InvalidArgumentError("--inject_device_failure: expected DEVICE[@N], e.g. cuda:1@5");
  }
  if (at != absl::string_view::npos &&
      (!absl::SimpleAtoi(text.substr(at + 1), &spec.after_batches) || spec.after_batches < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--inject_device_failure: \"", text.substr(at + 1),
                     "\" is not a batch count"));
  }
  return spec;
}

absl::Status WrapFailingDevice(std::vector<std::unique_ptr<Engine>>& engines,
                               const FaultSpec& spec) {
  for (std::unique_ptr<Engine>& engine : engines) {
    if (engine->Device().id == spec.device) {
      engine = std::make_unique<FailingEngine>(std::move(engine), spec.after_batches);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(
      absl::StrCat("--inject_device_failure: no device \"", spec.device, "\""));
}

}  // namespace matmul::server
