// engine-bench: the CUDA engine's latency for small batches, set beside the
// floors of a GPU round trip measured on the same device in the same run.
//
//   engine-bench [--reps=N] [--json=FILE]
//
// A small batch's time in the engine (Engine::Run, from the call to its
// return) is the service's engine time for requests that are not
// bandwidth-bound: the server's Timing reports it per request. Beside it,
// each row prints what a GPU round trip costs on this device at least:
//  * "sync": one empty kernel and cudaStreamSynchronize;
//  * "copies": the row's operand bytes copied up from pinned memory, an
//    empty kernel, the result bytes copied back, and the synchronize;
//  * "launcher": the grouped launcher (GroupedGemmLauncher::Run) on the
//    same problems with operands already in device memory, and the
//    synchronize: the kernel with its planning and launch.
// The engine's own host work is roughly engine - launcher - (copies -
// sync). Two more floors, once per run: an empty kernel whose parameters
// are as large as the Hopper kernel's (about 9 KiB: its inline batch) and
// one of 64 bytes, each launch timed on the host and as a round trip.
// Last, the host's writes into pinned staging (what the launcher does with
// a large batch's table, and the engine with operands it packs): memcpy
// into a heap buffer, into a pinned buffer that the device reads after
// every write, and the same with non-temporal (streaming) stores.
//
// Inputs are random every run; every engine result of a row is checked
// against a float64 reference (relative error, per-dtype bound). Medians
// and 90th percentiles of --reps timed runs after warm-up, on the host's
// steady clock.
#include <cuda_runtime.h>
#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/cuda_engine.h"
#include "kernels/bench/check_cuda.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/reference_gemm.h"

namespace matmul {
namespace {

// Parameters as large as the Hopper kernel's (templates and an inline
// batch of 16 problems with their maps: about 9 KiB).
struct LargeParams {
  int* sink;
  unsigned char bytes[9216 - sizeof(int*)];
};
struct SmallParams {
  int* sink;
  unsigned char bytes[64 - sizeof(int*)];
};

// Reads its parameters in place (as the Hopper kernel does: a
// __grid_constant__ that is never written, so no thread copies it).
template <typename P>
__global__ void EmptyKernel(const __grid_constant__ P p) {
  if (p.bytes[threadIdx.x] == 0xab && p.sink != nullptr) *p.sink = 1;
}

// Copies `bytes` (a multiple of 16, both 16-byte aligned) with streaming
// stores that bypass the cache.
void StreamCopy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<__m128i*>(dst);
  const auto* s = static_cast<const __m128i*>(src);
  for (size_t i = 0; i < bytes / 16; ++i) _mm_stream_si128(d + i, _mm_load_si128(s + i));
  _mm_sfence();
}

struct Stats {
  double p50 = 0, p90 = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[v.size() * 9 / 10]};
}

// Host µs of `body`, `reps` timed calls after `warmup` untimed ones.
Stats Time(int warmup, int reps, const std::function<void()>& body) {
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> us;
  us.reserve(reps);
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return Summarize(std::move(us));
}

struct Row {
  std::string dtype;
  std::string shape;
  int batch = 0;
  size_t in_bytes = 0, out_bytes = 0;
  Stats engine, copies, launcher;
  double error = 0;  // Largest relative error of the engine's results.
  double bound = 0;
};

// One problem's host operands and result.
struct HostProblem {
  std::vector<uint8_t> a, b, d;
};

int Main(int argc, char** argv) {
  int reps = 300;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--reps=", 0) == 0) {
      reps = std::atoi(arg.c_str() + 7);
    } else if (arg.rfind("--json=", 0) == 0) {
      json = arg.substr(7);
    } else {
      std::fprintf(stderr, "engine-bench: unknown argument %s (--reps=N, --json=FILE)\n",
                   arg.c_str());
      return 2;
    }
  }
  if (reps < 10) {
    std::fprintf(stderr, "engine-bench: --reps must be at least 10\n");
    return 2;
  }
  CudaEngineOptions options;
  options.devices = {0};
  options.memory_fraction = 0.2;
  absl::StatusOr<CudaEngineSet> set = CreateCudaEngines(options);
  if (!set.ok()) {
    std::fprintf(stderr, "engine-bench: no CUDA engine: %s\n", std::string(set.status().message()).c_str());
    return 1;
  }
  for (const std::string& note : set->notes) std::printf("# %s\n", note.c_str());
  Engine& engine = *set->engines[0];
  std::printf("# device %s (%s)\n", engine.Device().id.c_str(), engine.Device().name.c_str());
  absl::StatusOr<std::unique_ptr<cuda::GroupedGemmLauncher>> launcher =
      cuda::GroupedGemmLauncher::Create(0);
  if (!launcher.ok()) {
    std::fprintf(stderr, "engine-bench: %s\n", std::string(launcher.status().message()).c_str());
    return 1;
  }
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Once per run: an empty launch's host cost and round trip, by parameter size.
  const int warmup = std::max(20, reps / 10);
  const Stats launch_small = Time(warmup, reps, [&] { EmptyKernel<<<1, 32, 0, stream>>>(SmallParams{}); });
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const Stats launch_large = Time(warmup, reps, [&] { EmptyKernel<<<1, 32, 0, stream>>>(LargeParams{}); });
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const Stats sync_small = Time(warmup, reps, [&] {
    EmptyKernel<<<1, 32, 0, stream>>>(SmallParams{});
    CHECK_CUDA(cudaStreamSynchronize(stream));
  });
  const Stats sync_large = Time(warmup, reps, [&] {
    EmptyKernel<<<1, 32, 0, stream>>>(LargeParams{});
    CHECK_CUDA(cudaStreamSynchronize(stream));
  });

  std::mt19937_64 rng(std::random_device{}());
  std::vector<Row> rows;
  struct Case {
    DType dtype;
    const char* shape;
    int batch;
  };
  const std::vector<Case> cases = {
      {DType::kBFloat16, "16x16x16", 1}, {DType::kBFloat16, "small", 1},
      {DType::kBFloat16, "small", 4},    {DType::kBFloat16, "small", 16},
      {DType::kBFloat16, "small", 64},   {DType::kFloat32, "16x16x16", 1},
      {DType::kFloat32, "small", 1},     {DType::kFloat32, "small", 4},
      {DType::kFloat32, "small", 16},    {DType::kFloat32, "small", 64},
  };
  std::uniform_int_distribution<int64_t> dim(64, 256);
  for (const Case& c : cases) {
    Row row;
    row.dtype = std::string(DTypeName(c.dtype));
    row.shape = c.shape;
    row.batch = c.batch;
    const size_t elem = ElementSize(c.dtype);
    std::vector<GemmProblem> problems(c.batch);
    std::vector<HostProblem> host(c.batch);
    for (int i = 0; i < c.batch; ++i) {
      GemmProblem& p = problems[i];
      p.input_type = p.output_type = c.dtype;
      if (std::string(c.shape) == "small") {
        p.m = dim(rng);
        p.n = dim(rng);
        p.k = dim(rng);
      } else {
        p.m = p.n = p.k = 16;
      }
      host[i].a = RandomMatrix(c.dtype, p.m * p.k, rng);
      host[i].b = RandomMatrix(c.dtype, p.k * p.n, rng);
      host[i].d.assign(p.m * p.n * elem, 0xff);
      p.a = host[i].a.data();
      p.b = host[i].b.data();
      p.d = host[i].d.data();
      row.in_bytes += (p.m * p.k + p.k * p.n) * elem;
      row.out_bytes += p.m * p.n * elem;
    }
    std::vector<absl::Status> status(c.batch);
    auto run_engine = [&] {
      engine.Run(problems, absl::MakeSpan(status));
      for (const absl::Status& s : status) {
        if (!s.ok()) {
          std::fprintf(stderr, "engine-bench: %s\n", std::string(s.message()).c_str());
          std::exit(1);
        }
      }
    };
    row.engine = Time(warmup, reps, run_engine);
    row.bound = ErrorBound(c.dtype, c.dtype, Precision::kDefault);
    for (int i = 0; i < c.batch; ++i) {
      row.error = std::max(row.error, GemmRelativeError(problems[i], host[i].d.data()));
    }

    // The same bytes up, an empty kernel, the results back.
    void *pinned_in, *pinned_out, *device_in, *device_out;
    CHECK_CUDA(cudaHostAlloc(&pinned_in, row.in_bytes, cudaHostAllocPortable));
    CHECK_CUDA(cudaHostAlloc(&pinned_out, row.out_bytes, cudaHostAllocPortable));
    // Room for the launcher's padded rows below as well.
    CHECK_CUDA(cudaMalloc(&device_in, 2 * row.in_bytes + c.batch * 1024));
    CHECK_CUDA(cudaMalloc(&device_out, 2 * row.out_bytes + c.batch * 1024));
    std::memset(pinned_in, 0x3c, row.in_bytes);
    row.copies = Time(warmup, reps, [&] {
      CHECK_CUDA(cudaMemcpyAsync(device_in, pinned_in, row.in_bytes, cudaMemcpyHostToDevice, stream));
      EmptyKernel<<<1, 32, 0, stream>>>(SmallParams{});
      CHECK_CUDA(cudaMemcpyAsync(pinned_out, device_out, row.out_bytes, cudaMemcpyDeviceToHost, stream));
      CHECK_CUDA(cudaStreamSynchronize(stream));
    });

    // The launcher on the same problems, operands in device memory.
    std::vector<cuda::DeviceGemmProblem> device(c.batch);
    size_t in_at = 0, out_at = 0;
    for (int i = 0; i < c.batch; ++i) {
      const GemmProblem& p = problems[i];
      cuda::DeviceGemmProblem& dp = device[i];
      dp.m = p.m;
      dp.n = p.n;
      dp.k = p.k;
      // Rows padded to 16 bytes, as the engine lays them out (so that the
      // problem takes the engine's path).
      const int64_t align = static_cast<int64_t>(16 / elem);
      dp.lda = (p.k + align - 1) / align * align;
      dp.ldb = (p.n + align - 1) / align * align;
      dp.ldc = dp.ldd = dp.ldb;
      const size_t a_bytes = (p.m * dp.lda * elem + 255) / 256 * 256;
      const size_t b_bytes = (p.k * dp.ldb * elem + 255) / 256 * 256;
      dp.a = static_cast<uint8_t*>(device_in) + in_at;
      dp.b = static_cast<uint8_t*>(device_in) + in_at + a_bytes;
      dp.d = static_cast<uint8_t*>(device_out) + out_at;
      CHECK_CUDA(cudaMemcpy2D(const_cast<void*>(dp.a), dp.lda * elem, p.a, p.k * elem, p.k * elem,
                              p.m, cudaMemcpyHostToDevice));
      CHECK_CUDA(cudaMemcpy2D(const_cast<void*>(dp.b), dp.ldb * elem, p.b, p.n * elem, p.n * elem,
                              p.k, cudaMemcpyHostToDevice));
      in_at += a_bytes + b_bytes;
      out_at += (p.m * dp.ldd * elem + 255) / 256 * 256;
    }
    cuda::GroupedGemmOptions go;
    go.input = go.output = c.dtype;
    const size_t ws_bytes = (*launcher)->WorkspaceBytes(device, go);
    void* ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 256)));
    row.launcher = Time(warmup, reps, [&] {
      const absl::Status s = (*launcher)->Run(device, go, ws, ws_bytes, stream);
      if (!s.ok()) {
        std::fprintf(stderr, "engine-bench: %s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
    });
    CHECK_CUDA(cudaFree(ws));
    CHECK_CUDA(cudaFree(device_in));
    CHECK_CUDA(cudaFree(device_out));
    CHECK_CUDA(cudaFreeHost(pinned_in));
    CHECK_CUDA(cudaFreeHost(pinned_out));
    rows.push_back(row);
  }

  // Writes into staging, by size: heap, pinned and sent, pinned and sent
  // with streaming stores.
  std::printf("\nwrites into staging, host us (p50): bytes, heap memcpy, pinned memcpy, "
              "pinned streaming; then the host time of the copy's enqueue and an event's\n");
  for (size_t bytes : {size_t{16} << 10, size_t{128} << 10, size_t{1} << 20, size_t{8} << 20}) {
    std::vector<uint8_t> source = RandomMatrix(DType::kFloat32, bytes / 4, rng);
    std::vector<uint8_t> heap(bytes);
    void *pinned, *device;
    CHECK_CUDA(cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable));
    CHECK_CUDA(cudaMalloc(&device, bytes));
    const Stats to_heap = Time(warmup, reps, [&] { std::memcpy(heap.data(), source.data(), bytes); });
    // Also the host time of the copy's enqueue and of an event recorded
    // after it (what the launcher's Send does).
    std::vector<double> send_us, record_us;
    cudaEvent_t event;
    CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    auto sent = [&](bool streaming) {
      std::vector<double> us;
      for (int i = 0; i < warmup + reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        if (streaming) {
          StreamCopy(pinned, source.data(), bytes);
        } else {
          std::memcpy(pinned, source.data(), bytes);
        }
        const auto t1 = std::chrono::steady_clock::now();
        CHECK_CUDA(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, stream));
        const auto t2 = std::chrono::steady_clock::now();
        CHECK_CUDA(cudaEventRecord(event, stream));
        const auto t3 = std::chrono::steady_clock::now();
        if (i >= warmup) {
          us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          send_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
          record_us.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
        }
        CHECK_CUDA(cudaStreamSynchronize(stream));
      }
      return Summarize(std::move(us));
    };
    const Stats to_pinned = sent(false);
    const Stats streamed = sent(true);
    CHECK_CUDA(cudaEventDestroy(event));
    std::printf("%9zu %10.2f %10.2f %10.2f   enqueue copy %.2f, record event %.2f\n", bytes,
                to_heap.p50, to_pinned.p50, streamed.p50, Summarize(send_us).p50,
                Summarize(record_us).p50);
    CHECK_CUDA(cudaFree(device));
    CHECK_CUDA(cudaFreeHost(pinned));
  }

  std::printf("\nempty launch, host us (p50/p90): 64 B of parameters %.2f/%.2f, 9 KiB %.2f/%.2f\n",
              launch_small.p50, launch_small.p90, launch_large.p50, launch_large.p90);
  std::printf("empty kernel + synchronize, us (p50/p90): 64 B %.2f/%.2f, 9 KiB %.2f/%.2f\n\n",
              sync_small.p50, sync_small.p90, sync_large.p50, sync_large.p90);
  std::printf("%-9s %-9s %5s %9s %9s %10s %10s %10s %10s %9s %9s\n", "dtype", "shape", "batch",
              "in KiB", "out KiB", "engine", "engine p90", "copies", "launcher", "own host",
              "error");
  for (const Row& r : rows) {
    const double own = r.engine.p50 - r.launcher.p50 - (r.copies.p50 - sync_small.p50);
    std::printf("%-9s %-9s %5d %9.1f %9.1f %10.1f %10.1f %10.1f %10.1f %9.1f %9.1e%s\n",
                r.dtype.c_str(), r.shape.c_str(), r.batch, r.in_bytes / 1024.0,
                r.out_bytes / 1024.0, r.engine.p50, r.engine.p90, r.copies.p50, r.launcher.p50,
                own, r.error, r.error <= r.bound ? "" : " OVER BOUND");
  }
  bool ok = true;
  for (const Row& r : rows) ok = ok && r.error <= r.bound;
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "engine-bench: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"launch_us\": {\"params_64\": %.2f, \"params_9k\": %.2f}, "
                 "\"sync_us\": {\"params_64\": %.2f, \"params_9k\": %.2f}, \"rows\": [\n",
                 launch_small.p50, launch_large.p50, sync_small.p50, sync_large.p50);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "  {\"dtype\": \"%s\", \"shape\": \"%s\", \"batch\": %d, \"in_bytes\": %zu, "
                   "\"out_bytes\": %zu, \"engine_p50_us\": %.2f, \"engine_p90_us\": %.2f, "
                   "\"copies_p50_us\": %.2f, \"launcher_p50_us\": %.2f, \"error\": %.3g}%s\n",
                   r.dtype.c_str(), r.shape.c_str(), r.batch, r.in_bytes, r.out_bytes,
                   r.engine.p50, r.engine.p90, r.copies.p50, r.launcher.p50, r.error,
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (!ok) std::fprintf(stderr, "engine-bench: a result is over its error bound\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace matmul

int main(int argc, char** argv) { return matmul::Main(argc, argv); }
