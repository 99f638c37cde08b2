// The matrix store: matrices kept on the server between requests, so that a
// fixed operand (a weight matrix) crosses the wire once and a chain of
// products (C = A*B, then D = C*E) never crosses it.
//
//   auto store = MatrixStore::Create(options, engines, &metrics);
//   absl::StatusOr<v1::MatrixHandle> h =
//       (*store)->Put("alice", 4096, 4096, DType::kBFloat16, bytes, absl::Hours(1));
//   // ... a MultiplyRequest names h->id() as b.handle ...
//   (*store)->Delete("alice", h->id());
//
// Each matrix lives on one device first (the one holding the fewest kept
// bytes when it arrived, or the one that computed it) in that engine's
// memory: device memory for the CUDA engine, host memory for the CPU
// engine. A batch that needs it on another device copies it there on
// demand (device -> host -> device) and the copy stays until the matrix is
// deleted, so each device reads it from its own memory afterwards.
//
// Budget: `max_bytes` of matrices in all (each counted once, however many
// devices hold copies, at the memory its engine would give it: padding
// included, BudgetBytes), `max_bytes_per_client` per owner. A full store
// answers RESOURCE_EXHAUSTED with the sizes; nothing is evicted before it
// expires or is deleted. Expired matrices are removed by a sweeper thread
// (within a second) and are NOT_FOUND from their expiry on. Products that
// are running keep what they use alive until they finish.
//
// Owners: with authentication, a matrix belongs to the token's name and
// other clients get NOT_FOUND for it; without, every caller may use any id
// (ids are 128-bit random, so only those told an id can name it).
#ifndef MATMUL_SERVER_MATRIX_STORE_H_
#define MATMUL_SERVER_MATRIX_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/engine.h"
#include "matmul/v1/matmul.pb.h"
#include "server/job.h"
#include "server/metrics.h"

namespace matmul::server {

class MatrixStore;

// One kept matrix. Shared by the store and the products using it.
class StoredMatrix {
 public:
  const std::string& id() const { return id_; }
  const std::string& owner() const { return owner_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  DType dtype() const { return dtype_; }
  uint64_t bytes() const {
    return static_cast<uint64_t>(rows_) * static_cast<uint64_t>(cols_) * ElementSize(dtype_);
  }
  // What it counts against the store's budgets (MatrixStore::BudgetBytes).
  uint64_t budget_bytes() const { return budget_bytes_; }
  absl::Time expires() const { return expires_; }
  // The wire form.
  v1::MatrixHandle Handle() const;

 private:
  friend class MatrixStore;
  // A copy in one engine's memory; counts itself in matmul_resident_bytes.
  struct Copy {
    Copy(std::unique_ptr<ResidentMatrix> m, int device, Metrics* metrics,
         std::shared_ptr<std::vector<std::atomic<int64_t>>> device_bytes);
    ~Copy();
    std::unique_ptr<ResidentMatrix> matrix;
    int device;
    Metrics* metrics;
    // The store's per-device totals (shared: a copy may outlive the store).
    std::shared_ptr<std::vector<std::atomic<int64_t>>> device_bytes;
  };

  std::string id_;
  std::string owner_;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  DType dtype_ = DType::kFloat32;
  // Counted against the budgets while it is kept (BudgetBytes).
  uint64_t budget_bytes_ = 0;
  absl::Time expires_ = absl::InfiniteFuture();
  // Device id of the first copy, e.g. "cuda:0".
  std::string home_device_;
  mutable absl::Mutex mu_;
  // Copies by device index. Never empty once stored.
  std::map<int, std::shared_ptr<Copy>> copies_ ABSL_GUARDED_BY(mu_);
};

class MatrixStore {
 public:
  struct Options {
    // Most bytes kept in all; 0 turns storing off (every call is refused).
    uint64_t max_bytes = 4ull << 30;
    // Most bytes one owner may keep; 0 = no per-owner cap.
    uint64_t max_bytes_per_client = 0;
    // Lifetime when a request gives none, and the longest allowed.
    absl::Duration default_ttl = absl::Hours(1);
    absl::Duration max_ttl = absl::Hours(24);
    // Whether owners are enforced (authentication is on).
    bool enforce_owner = false;
  };

  // `engines` (one per device, in the scheduler's order) and `metrics` must
  // outlive the store.
  static absl::StatusOr<std::unique_ptr<MatrixStore>> Create(const Options& options,
                                                             std::vector<Engine*> engines,
                                                             Metrics* metrics);
  ~MatrixStore();

  const Options& options() const { return options_; }

  // Keeps a rows x cols `dtype` matrix copied from `data` (dense row-major)
  // for `ttl` (zero: the default). INVALID_ARGUMENT for a ttl over the
  // maximum; RESOURCE_EXHAUSTED when it does not fit the budget.
  absl::StatusOr<v1::MatrixHandle> Put(const std::string& owner, int64_t rows, int64_t cols,
                                       DType dtype, const void* data, absl::Duration ttl);

  // What a rows x cols `dtype` matrix counts against the budgets: the most
  // memory any engine would hold for it (Engine::ResidentFootprint, rows
  // padded as its kernels need), so that the budget bounds device memory.
  uint64_t BudgetBytes(int64_t rows, int64_t cols, DType dtype) const;

  // Holds `bytes` of `owner`'s budget (e.g. for an upload still arriving);
  // Release gives it back. RESOURCE_EXHAUSTED when it does not fit.
  absl::Status Reserve(const std::string& owner, uint64_t bytes);
  void Release(const std::string& owner, uint64_t bytes);
  // Put for BudgetBytes() already Reserve()d: on success the reservation becomes
  // the matrix's; on failure it is released.
  absl::StatusOr<v1::MatrixHandle> PutReserved(const std::string& owner, int64_t rows,
                                               int64_t cols, DType dtype, const void* data,
                                               absl::Duration ttl);

  // The matrix `id` if `owner` may use it; NOT_FOUND (naming the id)
  // otherwise. `field` prefixes the message, e.g. "b.handle".
  absl::StatusOr<std::shared_ptr<StoredMatrix>> Find(const std::string& owner,
                                                     absl::string_view id,
                                                     absl::string_view field = "id") const;

  // Copies the matrix to `out` (dense row-major) from whichever device
  // holds it.
  absl::Status Read(const StoredMatrix& matrix, std::string* out);

  absl::Status Delete(const std::string& owner, absl::string_view id);
  // `owner`'s matrices (every one when owners are not enforced).
  std::vector<v1::MatrixHandle> List(const std::string& owner) const;

  // What a product needs to use kept matrices: `a`, `b`, `c` (any may be
  // null) as operands and, when `keep_result`, its rows x cols result of
  // `result_dtype` kept for `result_ttl` and described in `*result_handle`
  // (which must stay valid until the job ends). The result's bytes are
  // reserved now: RESOURCE_EXHAUSTED when they do not fit.
  absl::StatusOr<std::unique_ptr<ResidentOperands>> Bind(
      const std::string& owner, std::shared_ptr<StoredMatrix> a, std::shared_ptr<StoredMatrix> b,
      std::shared_ptr<StoredMatrix> c, bool keep_result, int64_t rows, int64_t cols,
      DType result_dtype, absl::Duration result_ttl, v1::MatrixHandle* result_handle);

  // The lifetime a request asked for, checked against the maximum.
  absl::StatusOr<absl::Duration> TtlFor(uint64_t seconds, absl::string_view field) const;

  // Bytes kept (or reserved) now.
  uint64_t bytes_in_use() const;

 private:
  class Operands;

  MatrixStore(const Options& options, std::vector<Engine*> engines, Metrics* metrics);
  std::string NewId();
  // Registers a matrix whose bytes are already reserved.
  v1::MatrixHandle Insert(std::shared_ptr<StoredMatrix> matrix);
  // The copy of `matrix` on `device`, made there from another copy when it
  // has none.
  absl::StatusOr<std::shared_ptr<StoredMatrix::Copy>> CopyOn(StoredMatrix& matrix, int device);
  // The healthy device with the fewest kept bytes.
  int PickHome() const;
  void SweepLoop();
  // Removes `id` (expired or deleted) and releases its bytes.
  void RemoveLocked(absl::flat_hash_map<std::string, std::shared_ptr<StoredMatrix>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::vector<Engine*> engines_;
  Metrics* const metrics_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<StoredMatrix>> matrices_ ABSL_GUARDED_BY(mu_);
  // Bytes kept or reserved, in all and per owner.
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, uint64_t> bytes_by_owner_ ABSL_GUARDED_BY(mu_);
  // Kept bytes per device (copies included), for placing new matrices.
  const std::shared_ptr<std::vector<std::atomic<int64_t>>> device_bytes_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar sweep_cv_;
  std::thread sweeper_;
};

}  // namespace matmul::server

#endif  // MATMUL_SERVER_MATRIX_STORE_H_
