#include "server/matrix_store.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/request_validation.h"

namespace matmul::server {

v1::MatrixHandle StoredMatrix::Handle() const {
  v1::MatrixHandle h;
  h.set_id(id_);
  h.set_rows(static_cast<uint64_t>(rows_));
  h.set_cols(static_cast<uint64_t>(cols_));
  h.set_dtype(ToProto(dtype_));
  h.set_bytes(bytes());
  h.set_expire_time_ms(expires_ == absl::InfiniteFuture() ? 0 : absl::ToUnixMillis(expires_));
  h.set_device(home_device_);
  return h;
}

StoredMatrix::Copy::Copy(std::unique_ptr<ResidentMatrix> m, int device, Metrics* metrics,
                         std::shared_ptr<std::vector<std::atomic<int64_t>>> device_bytes)
    : matrix(std::move(m)), device(device), metrics(metrics), device_bytes(std::move(device_bytes)) {
  const int64_t bytes = static_cast<int64_t>(matrix->footprint());
  (*this->device_bytes)[device] += bytes;
  if (metrics != nullptr) metrics->AddResidentBytes(device, bytes);
}

StoredMatrix::Copy::~Copy() {
  const int64_t bytes = static_cast<int64_t>(matrix->footprint());
  (*device_bytes)[device] -= bytes;
  if (metrics != nullptr) metrics->AddResidentBytes(device, -bytes);
}

// The ResidentOperands of one product.
class MatrixStore::Operands final : public ResidentOperands {
 public:
  Operands(MatrixStore* store, std::string owner, std::shared_ptr<StoredMatrix> a,
           std::shared_ptr<StoredMatrix> b, std::shared_ptr<StoredMatrix> c)
      : store_(store), owner_(std::move(owner)), a_(std::move(a)), b_(std::move(b)), c_(std::move(c)) {}

  ~Operands() override {
    // A result that was reserved and never kept (the job failed, was
    // cancelled or expired in the queue) gives its bytes back.
    if (result_reserved_ > 0) store_->Release(owner_, result_reserved_);
  }

  void KeepResult(int64_t rows, int64_t cols, DType dtype, absl::Duration ttl,
                  v1::MatrixHandle* handle, uint64_t reserved) {
    keep_result_ = true;
    rows_ = rows;
    cols_ = cols;
    dtype_ = dtype;
    ttl_ = ttl;
    handle_ = handle;
    result_reserved_ = reserved;
  }

  uint64_t BytesOn(int device) const override {
    uint64_t bytes = 0;
    for (const StoredMatrix* m : {a_.get(), b_.get(), c_.get()}) {
      if (m == nullptr) continue;
      absl::MutexLock lock(&m->mu_);
      if (m->copies_.contains(device)) bytes += m->bytes();
    }
    return bytes;
  }

  absl::Status Bind(int device, Engine& engine, GemmProblem& problem) override {
    struct Slot {
      StoredMatrix* matrix;
      const ResidentMatrix** target;
    };
    for (const Slot& slot : {Slot{a_.get(), &problem.a_resident}, Slot{b_.get(), &problem.b_resident},
                             Slot{c_.get(), &problem.c_resident}}) {
      if (slot.matrix == nullptr) continue;
      absl::StatusOr<std::shared_ptr<StoredMatrix::Copy>> copy = store_->CopyOn(*slot.matrix, device);
      if (!copy.ok()) return copy.status();
      *slot.target = (*copy)->matrix.get();
      used_.push_back(*std::move(copy));
    }
    if (keep_result_) {
      absl::StatusOr<std::unique_ptr<ResidentMatrix>> result =
          engine.CreateResident(rows_, cols_, dtype_, nullptr);
      if (!result.ok()) return result.status();
      result_ = std::make_shared<StoredMatrix::Copy>(*std::move(result), device, store_->metrics_,
                                                     store_->device_bytes_);
      result_device_ = engine.Device().id;
      problem.d_resident = result_->matrix.get();
    }
    return absl::OkStatus();
  }

  absl::Status Complete(const absl::Status& status) override {
    used_.clear();
    if (!keep_result_ || !status.ok()) return status;
    auto matrix = std::shared_ptr<StoredMatrix>(new StoredMatrix());
    matrix->id_ = store_->NewId();
    matrix->owner_ = owner_;
    matrix->rows_ = rows_;
    matrix->cols_ = cols_;
    matrix->dtype_ = dtype_;
    matrix->budget_bytes_ = result_reserved_;
    matrix->expires_ = absl::Now() + ttl_;
    matrix->home_device_ = result_device_;
    {
      absl::MutexLock lock(&matrix->mu_);
      matrix->copies_[result_->device] = std::move(result_);
    }
    result_reserved_ = 0;  // Now the matrix's.
    if (store_->metrics_ != nullptr) store_->metrics_->ResidentStored(matrix->bytes());
    *handle_ = store_->Insert(std::move(matrix));
    return status;
  }

 private:
  MatrixStore* const store_;
  const std::string owner_;
  const std::shared_ptr<StoredMatrix> a_, b_, c_;
  // Copies bound for the running product; held until it completes.
  std::vector<std::shared_ptr<StoredMatrix::Copy>> used_;
  bool keep_result_ = false;
  int64_t rows_ = 0, cols_ = 0;
  DType dtype_ = DType::kFloat32;
  absl::Duration ttl_;
  v1::MatrixHandle* handle_ = nullptr;
  uint64_t result_reserved_ = 0;
  std::shared_ptr<StoredMatrix::Copy> result_;
  std::string result_device_;
};

absl::StatusOr<std::unique_ptr<MatrixStore>> MatrixStore::Create(const Options& options,
                                                                 std::vector<Engine*> engines,
                                                                 Metrics* metrics) {
  if (engines.empty()) return absl::InvalidArgumentError("the matrix store needs an engine");
  if (options.default_ttl <= absl::ZeroDuration() || options.max_ttl < options.default_ttl) {
    return absl::InvalidArgumentError(
        "resident ttl: the default must be positive and at most the maximum");
  }
  return std::unique_ptr<MatrixStore>(new MatrixStore(options, std::move(engines), metrics));
}

MatrixStore::MatrixStore(const Options& options, std::vector<Engine*> engines, Metrics* metrics)
    : options_(options),
      engines_(std::move(engines)),
      metrics_(metrics),
      device_bytes_(std::make_shared<std::vector<std::atomic<int64_t>>>(engines_.size())) {
  sweeper_ = std::thread([this] { SweepLoop(); });
}

MatrixStore::~MatrixStore() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    sweep_cv_.SignalAll();
  }
  sweeper_.join();
  absl::MutexLock lock(&mu_);
  while (!matrices_.empty()) RemoveLocked(matrices_.begin());
}

std::string MatrixStore::NewId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("m-%016x%016x", rng(), rng());
}

absl::StatusOr<absl::Duration> MatrixStore::TtlFor(uint64_t seconds, absl::string_view field) const {
  if (seconds == 0) return options_.default_ttl;
  const absl::Duration ttl = absl::Seconds(static_cast<double>(seconds));
  if (ttl > options_.max_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", seconds,
                                                   " s is over the server's maximum of ",
                                                   absl::ToInt64Seconds(options_.max_ttl), " s"));
  }
  return ttl;
}

absl::Status MatrixStore::Reserve(const std::string& owner, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (options_.max_bytes == 0) {
    return absl::FailedPreconditionError(
        "this server keeps no matrices (started with --resident_bytes=0)");
  }
  if (bytes_ + bytes > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "matrix store full: %d bytes needed, %d of %d in use (--resident_bytes); delete "
        "matrices or wait for them to expire",
        bytes, bytes_, options_.max_bytes));
  }
  uint64_t& mine = bytes_by_owner_[owner];
  if (options_.max_bytes_per_client > 0 && mine + bytes > options_.max_bytes_per_client) {
    const uint64_t held = mine;
    if (mine == 0) bytes_by_owner_.erase(owner);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "this client's share of the matrix store is full: %d bytes needed, %d of %d in use "
        "(--resident_bytes_per_client)",
        bytes, held, options_.max_bytes_per_client));
  }
  mine += bytes;
  bytes_ += bytes;
  return absl::OkStatus();
}

void MatrixStore::Release(const std::string& owner, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  bytes_ -= std::min(bytes_, bytes);
  auto it = bytes_by_owner_.find(owner);
  if (it == bytes_by_owner_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) bytes_by_owner_.erase(it);
}

uint64_t MatrixStore::bytes_in_use() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

int MatrixStore::PickHome() const {
  int best = -1;
  for (int d = 0; d < static_cast<int>(engines_.size()); ++d) {
    if (!engines_[d]->Healthy()) continue;
    if (best < 0 || (*device_bytes_)[d].load() < (*device_bytes_)[best].load()) best = d;
  }
  return best;
}

absl::StatusOr<v1::MatrixHandle> MatrixStore::Put(const std::string& owner, int64_t rows,
                                                  int64_t cols, DType dtype, const void* data,
                                                  absl::Duration ttl) {
  if (absl::Status s = Reserve(owner, BudgetBytes(rows, cols, dtype)); !s.ok()) return s;
  return PutReserved(owner, rows, cols, dtype, data, ttl);
}

uint64_t MatrixStore::BudgetBytes(int64_t rows, int64_t cols, DType dtype) const {
  uint64_t most = 0;
  for (const Engine* engine : engines_) {
    most = std::max(most, engine->ResidentFootprint(rows, cols, dtype));
  }
  return most;
}

absl::StatusOr<v1::MatrixHandle> MatrixStore::PutReserved(const std::string& owner, int64_t rows,
                                                          int64_t cols, DType dtype,
                                                          const void* data, absl::Duration ttl) {
  const uint64_t bytes = BudgetBytes(rows, cols, dtype);
  const int device = PickHome();
  if (device < 0) {
    Release(owner, bytes);
    return absl::UnavailableError("no healthy device to keep the matrix on");
  }
  absl::StatusOr<std::unique_ptr<ResidentMatrix>> resident =
      engines_[device]->CreateResident(rows, cols, dtype, data);
  if (!resident.ok()) {
    Release(owner, bytes);
    return resident.status();
  }
  auto matrix = std::shared_ptr<StoredMatrix>(new StoredMatrix());
  matrix->id_ = NewId();
  matrix->owner_ = owner;
  matrix->rows_ = rows;
  matrix->cols_ = cols;
  matrix->dtype_ = dtype;
  matrix->budget_bytes_ = bytes;
  matrix->expires_ = absl::Now() + (ttl == absl::ZeroDuration() ? options_.default_ttl : ttl);
  matrix->home_device_ = engines_[device]->Device().id;
  {
    absl::MutexLock lock(&matrix->mu_);
    matrix->copies_[device] =
        std::make_shared<StoredMatrix::Copy>(*std::move(resident), device, metrics_, device_bytes_);
  }
  if (metrics_ != nullptr) metrics_->ResidentStored(matrix->bytes());
  return Insert(std::move(matrix));
}

v1::MatrixHandle MatrixStore::Insert(std::shared_ptr<StoredMatrix> matrix) {
  v1::MatrixHandle handle = matrix->Handle();
  absl::MutexLock lock(&mu_);
  matrices_[matrix->id()] = std::move(matrix);
  if (metrics_ != nullptr) metrics_->AddResidentMatrices(1);
  sweep_cv_.SignalAll();  // A new earliest expiry, perhaps.
  return handle;
}

absl::StatusOr<std::shared_ptr<StoredMatrix>> MatrixStore::Find(const std::string& owner,
                                                                absl::string_view id,
                                                                absl::string_view field) const {
  absl::MutexLock lock(&mu_);
  auto it = matrices_.find(id);
  if (it == matrices_.end() || it->second->expires() <= absl::Now() ||
      (options_.enforce_owner && it->second->owner() != owner)) {
    return absl::NotFoundError(
        absl::StrCat(field, ": no matrix \"", id, "\" (never stored, deleted or expired)"));
  }
  return it->second;
}

absl::Status MatrixStore::Read(const StoredMatrix& matrix, std::string* out) {
  std::shared_ptr<StoredMatrix::Copy> copy;
  {
    absl::MutexLock lock(&matrix.mu_);
    for (const auto& [device, c] : matrix.copies_) {
      if (engines_[device]->Healthy()) {
        copy = c;
        break;
      }
    }
  }
  if (copy == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("matrix ", matrix.id(), " is held only by a failed device"));
  }
  out->resize(matrix.bytes());
  return engines_[copy->device]->ReadResident(*copy->matrix, out->data());
}

absl::StatusOr<std::shared_ptr<StoredMatrix::Copy>> MatrixStore::CopyOn(StoredMatrix& matrix,
                                                                        int device) {
  std::shared_ptr<StoredMatrix::Copy> source;
  {
    absl::MutexLock lock(&matrix.mu_);
    auto found = matrix.copies_.find(device);
    if (found != matrix.copies_.end()) return found->second;
    for (const auto& [d, c] : matrix.copies_) {
      if (engines_[d]->Healthy()) {
        source = c;
        break;
      }
    }
  }
  if (source == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("matrix ", matrix.id(), " is held only by a failed device"));
  }
  // The copy is made without the matrix's lock (the scheduler reads it to
  // place batches); two batches racing here make one copy each and the
  // second is dropped.
  std::string host(matrix.bytes(), '\0');
  if (absl::Status s = engines_[source->device]->ReadResident(*source->matrix, host.data()); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<ResidentMatrix>> copy =
      engines_[device]->CreateResident(matrix.rows(), matrix.cols(), matrix.dtype(), host.data());
  if (!copy.ok()) return copy.status();
  auto made = std::make_shared<StoredMatrix::Copy>(*std::move(copy), device, metrics_, device_bytes_);
  absl::MutexLock lock(&matrix.mu_);
  auto [it, inserted] = matrix.copies_.emplace(device, made);
  return it->second;
}

absl::Status MatrixStore::Delete(const std::string& owner, absl::string_view id) {
  absl::MutexLock lock(&mu_);
  auto it = matrices_.find(id);
  if (it == matrices_.end() || (options_.enforce_owner && it->second->owner() != owner)) {
    return absl::NotFoundError(
        absl::StrCat("id: no matrix \"", id, "\" (never stored, deleted or expired)"));
  }
  RemoveLocked(it);
  return absl::OkStatus();
}

std::vector<v1::MatrixHandle> MatrixStore::List(const std::string& owner) const {
  std::vector<v1::MatrixHandle> out;
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (const auto& [id, m] : matrices_) {
    if (m->expires() <= now) continue;
    if (options_.enforce_owner && m->owner() != owner) continue;
    out.push_back(m->Handle());
  }
  return out;
}

void MatrixStore::RemoveLocked(
    absl::flat_hash_map<std::string, std::shared_ptr<StoredMatrix>>::iterator it) {
  const std::shared_ptr<StoredMatrix> m = it->second;
  matrices_.erase(it);
  bytes_ -= std::min(bytes_, m->budget_bytes());
  auto owner = bytes_by_owner_.find(m->owner());
  if (owner != bytes_by_owner_.end()) {
    owner->second -= std::min(owner->second, m->budget_bytes());
    if (owner->second == 0) bytes_by_owner_.erase(owner);
  }
  if (metrics_ != nullptr) metrics_->AddResidentMatrices(-1);
  // The copies go when the last product using them finishes.
}

absl::StatusOr<std::unique_ptr<ResidentOperands>> MatrixStore::Bind(
    const std::string& owner, std::shared_ptr<StoredMatrix> a, std::shared_ptr<StoredMatrix> b,
    std::shared_ptr<StoredMatrix> c, bool keep_result, int64_t rows, int64_t cols,
    DType result_dtype, absl::Duration result_ttl, v1::MatrixHandle* result_handle) {
  auto operands = std::make_unique<Operands>(this, owner, std::move(a), std::move(b), std::move(c));
  if (keep_result) {
    const uint64_t bytes = BudgetBytes(rows, cols, result_dtype);
    if (absl::Status s = Reserve(owner, bytes); !s.ok()) return s;
    operands->KeepResult(rows, cols, result_dtype, result_ttl, result_handle, bytes);
  }
  return operands;
}

void MatrixStore::SweepLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Seconds(1);
    for (auto it = matrices_.begin(); it != matrices_.end();) {
      auto current = it++;
      if (current->second->expires() <= now) {
        RemoveLocked(current);
      } else {
        next = std::min(next, current->second->expires());
      }
    }
    sweep_cv_.WaitWithDeadline(&mu_, next);
  }
}

}  // namespace matmul::server
