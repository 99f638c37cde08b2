// matmul-server: the matrix-multiply service.
//
// Every flag can also come from the environment as MATMUL_<FLAG NAME IN
// CAPITALS> (e.g. MATMUL_BACKEND=cpu); a command-line flag wins over the
// environment.
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "matmul/build_info.h"
#include "server/fault_injection.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC address to serve on (host:port; port 0 picks a free one).");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9090",
          "Address of the Prometheus /metrics endpoint (plain HTTP); empty turns it off.");
ABSL_FLAG(std::string, backend, "auto",
          "Engine: auto (CUDA when a usable GPU is present, CPU otherwise), cpu or cuda.");
ABSL_FLAG(std::string, devices, "",
          "CUDA device ordinals to serve from, comma-separated (default: all). Repeating an "
          "ordinal (0,0) runs several workers on one GPU.");
ABSL_FLAG(double, gpu_memory_fraction, 0.8,
          "Share of each GPU's free memory taken for the engine's pool at start-up, in (0, 0.95].");
ABSL_FLAG(int64_t, pinned_host_bytes, -1,
          "Most bytes of pinned (page-locked) host memory, shared by all GPUs, that large "
          "operands (256 KiB and up) are parsed into and results written to, so that they reach "
          "the GPU without a staging copy; pinned on demand and kept for reuse. Past it requests "
          "use ordinary memory and are staged. -1 (default): the smaller of 4 GiB and an eighth "
          "of the memory this process may use (host memory or its cgroup's limit); 0: none.");
ABSL_FLAG(std::string, cuda_kernels, "persistent",
          "CUDA kernels: persistent (grouped persistent kernels), nonpersistent, or cublas.");
ABSL_FLAG(std::string, cuda_host_wait, "auto",
          "How a worker thread waits for its GPU batch: spin (lowest latency, a core busy per "
          "batch in flight), yield, block (sleeps; the core serves gRPC meanwhile), or auto "
          "(CUDA's choice: spin unless contexts outnumber cores).");
ABSL_FLAG(int32_t, cuda_resident_row_align, 32,
          "Byte alignment of rows of 1 KiB or more of matrices kept on a GPU: 16, 32 (a "
          "sector, the default), 64 or 128 (a line); rows on sectors spare the kernels split "
          "sectors on odd widths (2056^3 and 3000^3 ran 25-38% faster) for at most 16 bytes "
          "a row.");
ABSL_FLAG(std::vector<std::string>, grpc_arg, {},
          "Extra gRPC server channel arguments, name=value, comma separated (e.g. "
          "grpc.http2.max_frame_size=1048576); integer values are passed as integers. gRPC "
          "ignores names it does not know.");
ABSL_FLAG(int, cpu_workers, 1, "CPU engine workers (each runs whole batches with OpenBLAS).");
ABSL_FLAG(int, cpu_threads, 0, "OpenBLAS threads; 0 uses every core.");
ABSL_FLAG(int, lanes_per_device, 0,
          "Batches running at once per device; 0 picks 1 on the CPU, 4 on a GPU (staging and "
          "copies of some overlap the compute of others).");
ABSL_FLAG(int, max_batch_size, 64, "Most problems in one batch (one engine launch).");
ABSL_FLAG(int64_t, max_queue_delay_us, 25,
          "Longest the oldest queued job waits for companions before its batch goes; 0 sends "
          "whatever is queued as soon as a worker is free. Longer delays make larger batches "
          "at saturation and slow callers below it.");
ABSL_FLAG(int64_t, max_queue_gap_us, 0,
          "When positive, a partial batch also goes once no request has joined the queue for "
          "this long: callers that send in bursts have all arrived, so waiting out the rest of "
          "--max_queue_delay_us gathers nobody. 0 turns it off.");
ABSL_FLAG(bool, dispatch_when_idle, true,
          "A device with no batch running takes queued jobs at once instead of waiting "
          "--max_queue_delay_us for companions; batches still form while devices are busy.");
ABSL_FLAG(int, dispatch_below_running, 0,
          "While fewer than this many batches run on a device, queued jobs go to it at once (1 "
          "is --dispatch_when_idle); 0 leaves it to --dispatch_when_idle.");
ABSL_FLAG(int64_t, lane_spin_us, -1,
          "How long a worker lane that finds no batch waiting polls for the next one before it "
          "sleeps (one lane per device at a time, a core busy meanwhile): the next batch then "
          "starts without a thread wake-up. 0 sleeps at once; -1 (default) picks 200 on a GPU "
          "and 0 on the CPU.");
ABSL_FLAG(double, max_batch_flops, 0,
          "Work budget of one batch in FLOPs (2*M*N*K summed); a larger problem runs alone. 0 "
          "picks 2e10 on the CPU, 1e12 on a GPU.");
ABSL_FLAG(int64_t, max_batch_bytes, int64_t{256} << 20,
          "Byte budget of one batch (operands and results); a larger problem runs alone. 0 "
          "means no byte budget.");
ABSL_FLAG(int, queue_capacity, 1024,
          "Most jobs waiting in the queue; more are refused at once with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_queued_bytes, int64_t{4} << 30,
          "Most operand bytes waiting in the queue; more are refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{256} << 20,
          "Largest request message accepted (the default fits 4096x4096 float32 A, B and C).");
ABSL_FLAG(int64_t, max_response_bytes, int64_t{256} << 20, "Largest result matrix, in bytes.");
ABSL_FLAG(int64_t, max_dim, 65536, "Largest rows or cols of any matrix.");
ABSL_FLAG(int64_t, default_timeout_ms, 0,
          "Deadline for calls that carry none, in ms; 0 means none.");
ABSL_FLAG(int64_t, priority_aging_ms, 100,
          "A queued job gains one priority level per this many ms of waiting, so low priorities "
          "still progress; 0 turns aging off.");
ABSL_FLAG(int64_t, resident_bytes, int64_t{4} << 30,
          "Most bytes of matrices kept on the server (PutMatrix, UploadMatrix, store_result), "
          "each counted once; on a GPU each device also sets this much memory apart for them. 0 "
          "turns keeping matrices off.");
ABSL_FLAG(int64_t, resident_bytes_per_client, 0,
          "Most bytes of kept matrices per client (token name, or peer address); 0 = no cap.");
ABSL_FLAG(int64_t, resident_default_ttl_s, 3600,
          "Lifetime of a kept matrix whose request names none, in seconds.");
ABSL_FLAG(int64_t, resident_max_ttl_s, 86400, "Longest lifetime a request may ask for, in seconds.");
ABSL_FLAG(bool, shared_memory, false,
          "Let same-host clients pass operands and results through POSIX shared memory "
          "(RegisterSharedMemory); each region is usable only by the client that registered it.");
ABSL_FLAG(int, max_stream_inflight, 128,
          "Most items of one MultiplyStream queued or running at once.");
ABSL_FLAG(double, shutdown_grace_s, 30,
          "On SIGTERM/SIGINT: seconds to answer accepted requests before exiting.");
ABSL_FLAG(std::string, inject_device_failure, "",
          "Testing aid: make device DEVICE fail after N batches (\"cuda:1@5\"); its batches then "
          "end INTERNAL and it is marked unhealthy.");
ABSL_FLAG(double, drain_delay_s, 1.0,
          "On SIGTERM/SIGINT: seconds between health turning NOT_SERVING and the listener "
          "closing (new calls meanwhile get UNAVAILABLE), so balancers stop routing here first.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for TLS on the gRPC port (with --tls_key); empty: plain text.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS).");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of bearer tokens (\"NAME TOKEN\" or \"TOKEN\" per line); when set, every "
          "MatmulService call needs \"authorization: Bearer <token>\" (health and reflection stay "
          "open). Re-read on SIGHUP and when the file changes.");
ABSL_FLAG(int, max_inflight_per_client, 0,
          "Most requests one client (token name, or peer address without tokens) may have queued "
          "or running; more get RESOURCE_EXHAUSTED. 0 means no limit.");
ABSL_FLAG(std::string, port_file, "",
          "If set, write \"<grpc port> <metrics port>\" to this file once serving.");
ABSL_FLAG(bool, mutex_deadlock_detection, false,
          "Check every absl::Mutex acquisition in the process (gRPC's own locks included) for "
          "lock-order cycles, aborting on one. A debugging aid: Debian's Abseil is built with "
          "the check on, and it takes one process-wide lock per acquisition.");

extern char** environ;

namespace {

// Applies MATMUL_<NAME> environment variables to flags of that name.
void ApplyEnvironment() {
  for (char** env = environ; *env != nullptr; ++env) {
    const absl::string_view entry(*env);
    if (!absl::StartsWith(entry, "MATMUL_")) continue;
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    const std::string name = absl::AsciiStrToLower(entry.substr(7, eq - 7));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(entry.substr(eq + 1), &error)) {
      LOG(FATAL) << "environment " << entry.substr(0, eq) << ": " << error;
    }
  }
}

absl::StatusOr<std::vector<int>> ParseDevices(const std::string& text) {
  std::vector<int> devices;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int ordinal;
    if (!absl::SimpleAtoi(part, &ordinal) || ordinal < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: \"", part, "\" is not a device ordinal (0, 1, ...)"));
    }
    devices.push_back(ordinal);
  }
  return devices;
}

// Bytes of memory this process may use: the host's, or less where its
// cgroup (v2, or v1) sets a limit, as in a container.
uint64_t UsableMemoryBytes() {
  uint64_t bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    uint64_t limit;
    // "max" (v2) or a huge number (v1) when unlimited.
    if (in >> text && absl::SimpleAtoi(text, &limit) && limit > 0 && limit < bytes) bytes = limit;
  }
  return bytes;
}

// --pinned_host_bytes=-1: enough pinned memory for the operands of a few
// full batches in flight, and never a large share of a small container.
uint64_t DefaultPinnedHostBytes() { return std::min(uint64_t{4} << 30, UsableMemoryBytes() / 8); }

absl::StatusOr<matmul::server::ServerConfig> ConfigFromFlags() {
  matmul::server::ServerConfig config;
  config.listen = absl::GetFlag(FLAGS_listen);
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.engine.backend = absl::GetFlag(FLAGS_backend);
  absl::StatusOr<std::vector<int>> devices = ParseDevices(absl::GetFlag(FLAGS_devices));
  if (!devices.ok()) return devices.status();
  config.engine.cuda_devices = *devices;
  config.engine.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  config.engine.cuda_kernels = absl::GetFlag(FLAGS_cuda_kernels);
  const int64_t pinned = absl::GetFlag(FLAGS_pinned_host_bytes);
  if (pinned < -1) return absl::InvalidArgumentError("--pinned_host_bytes must be >= -1");
  config.engine.pinned_host_bytes =
      pinned == -1 ? DefaultPinnedHostBytes() : static_cast<uint64_t>(pinned);
  config.engine.cuda_host_wait = absl::GetFlag(FLAGS_cuda_host_wait);
  config.engine.cuda_resident_row_align = absl::GetFlag(FLAGS_cuda_resident_row_align);
  config.engine.cpu_workers = absl::GetFlag(FLAGS_cpu_workers);
  config.engine.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  config.lanes_per_device = absl::GetFlag(FLAGS_lanes_per_device);
  config.dispatch_when_idle = absl::GetFlag(FLAGS_dispatch_when_idle);
  config.dispatch_below_running = absl::GetFlag(FLAGS_dispatch_below_running);
  config.lane_spin = absl::Microseconds(absl::GetFlag(FLAGS_lane_spin_us));
  auto non_negative = [](absl::string_view name, int64_t v) -> absl::Status {
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 0"));
    return absl::OkStatus();
  };
  // Flags whose out-of-range values used to be taken as "auto" or clamped
  // without a word; those for the GPU are checked on every backend, so that a
  // configuration tried on the CPU does not fail later on a GPU node.
  if (absl::GetFlag(FLAGS_lane_spin_us) < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lane_spin_us must be -1 (auto) or >= 0, got ", absl::GetFlag(FLAGS_lane_spin_us)));
  }
  if (const double f = absl::GetFlag(FLAGS_gpu_memory_fraction); !(f > 0 && f <= 0.95)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_memory_fraction must be in (0, 0.95], got ", f));
  }
  if (const std::string kernels = absl::GetFlag(FLAGS_cuda_kernels);
      kernels != "persistent" && kernels != "nonpersistent" && kernels != "cublas") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda_kernels must be persistent, nonpersistent or cublas, got \"", kernels, "\""));
  }
  if (const std::string wait = absl::GetFlag(FLAGS_cuda_host_wait);
      wait != "auto" && wait != "spin" && wait != "yield" && wait != "block") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cuda_host_wait must be auto, spin, yield or block, got \"", wait, "\""));
  }
  if (const int32_t align = absl::GetFlag(FLAGS_cuda_resident_row_align);
      align != 16 && align != 32 && align != 64 && align != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cuda_resident_row_align must be 16, 32, 64 or 128, got ", align));
  }
  if (const double flops = absl::GetFlag(FLAGS_max_batch_flops);
      !(flops >= 0 && std::isfinite(flops))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_batch_flops must be >= 0 (0: auto), got ", flops));
  }
  for (auto [name, seconds] :
       {std::pair<absl::string_view, double>{"shutdown_grace_s",
                                             absl::GetFlag(FLAGS_shutdown_grace_s)},
        {"drain_delay_s", absl::GetFlag(FLAGS_drain_delay_s)}}) {
    if (!(seconds >= 0 && std::isfinite(seconds))) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 0, got ", seconds));
    }
  }
  for (auto [name, value] :
       {std::pair<absl::string_view, int64_t>{"max_queue_delay_us",
                                              absl::GetFlag(FLAGS_max_queue_delay_us)},
        {"max_queue_gap_us", absl::GetFlag(FLAGS_max_queue_gap_us)},
        {"default_timeout_ms", absl::GetFlag(FLAGS_default_timeout_ms)},
        {"priority_aging_ms", absl::GetFlag(FLAGS_priority_aging_ms)},
        {"max_queued_bytes", absl::GetFlag(FLAGS_max_queued_bytes)},
        {"max_request_bytes", absl::GetFlag(FLAGS_max_request_bytes)},
        {"max_response_bytes", absl::GetFlag(FLAGS_max_response_bytes)},
        {"max_dim", absl::GetFlag(FLAGS_max_dim)},
        {"lanes_per_device", absl::GetFlag(FLAGS_lanes_per_device)},
        {"max_inflight_per_client", absl::GetFlag(FLAGS_max_inflight_per_client)},
        {"max_batch_size", absl::GetFlag(FLAGS_max_batch_size)},
        {"max_batch_bytes", absl::GetFlag(FLAGS_max_batch_bytes)},
        {"queue_capacity", absl::GetFlag(FLAGS_queue_capacity)},
        {"resident_bytes", absl::GetFlag(FLAGS_resident_bytes)},
        {"resident_bytes_per_client", absl::GetFlag(FLAGS_resident_bytes_per_client)},
        {"resident_default_ttl_s", absl::GetFlag(FLAGS_resident_default_ttl_s)},
        {"resident_max_ttl_s", absl::GetFlag(FLAGS_resident_max_ttl_s)}}) {
    if (absl::Status s = non_negative(name, value); !s.ok()) return s;
  }
  config.queue.max_batch_size = static_cast<size_t>(absl::GetFlag(FLAGS_max_batch_size));
  config.queue.max_queue_delay = absl::Microseconds(absl::GetFlag(FLAGS_max_queue_delay_us));
  config.queue.max_queue_gap = absl::Microseconds(absl::GetFlag(FLAGS_max_queue_gap_us));
  config.queue.max_batch_flops = absl::GetFlag(FLAGS_max_batch_flops);
  config.queue.max_batch_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_batch_bytes));
  config.queue.capacity = static_cast<size_t>(absl::GetFlag(FLAGS_queue_capacity));
  config.queue.max_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_queued_bytes));
  config.queue.priority_aging = absl::Milliseconds(absl::GetFlag(FLAGS_priority_aging_ms));
  config.max_request_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_request_bytes));
  for (const std::string& arg : absl::GetFlag(FLAGS_grpc_arg)) {
    const size_t eq = arg.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grpc_arg must be name=value, got \"", arg, "\""));
    }
    config.grpc_args.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
  }
  config.limits.max_response_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_response_bytes));
  config.limits.max_dim = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_dim));
  config.default_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_default_timeout_ms));
  config.max_stream_inflight = absl::GetFlag(FLAGS_max_stream_inflight);
  config.drain_delay = absl::Seconds(absl::GetFlag(FLAGS_drain_delay_s));
  config.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  config.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  config.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  config.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  config.max_inflight_per_client = absl::GetFlag(FLAGS_max_inflight_per_client);
  config.shared_memory = absl::GetFlag(FLAGS_shared_memory);
  config.resident.max_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_resident_bytes));
  config.resident.max_bytes_per_client =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_resident_bytes_per_client));
  config.resident.default_ttl = absl::Seconds(absl::GetFlag(FLAGS_resident_default_ttl_s));
  config.resident.max_ttl = absl::Seconds(absl::GetFlag(FLAGS_resident_max_ttl_s));
  // Padding (rows rounded to 16 bytes) and on-demand copies need a little
  // more device memory than the logical budget.
  config.engine.gpu_resident_bytes = config.resident.max_bytes + config.resident.max_bytes / 8;
  return config;
}

void LogStartup(const matmul::server::MatmulServer& server) {
  const matmul::server::ServerConfig& c = server.config();
  const matmul::v1::ServerInfo info = server.Info();
  LOG(INFO) << "matmul-server " << MATMUL_VERSION << " (" << MATMUL_BUILD_COMMIT
            << "), engine " << info.engine() << ", backend " << server.backend();
  for (const auto& d : info.devices()) {
    LOG(INFO) << "device " << d.id() << ": " << d.name() << ", "
              << d.memory_bytes() / (1 << 20) << " MiB, " << d.compute_units()
              << (d.kind() == "cuda" ? " SMs, compute capability " + d.compute_capability()
                                     : std::string(" threads"));
  }
#ifdef MATMUL_WITH_TCMALLOC
  LOG(INFO) << "allocator: tcmalloc";
#else
  LOG(INFO) << "allocator: glibc malloc";
#endif
  LOG(INFO) << "batching: max_batch_size=" << c.queue.max_batch_size
            << " max_queue_delay=" << c.queue.max_queue_delay
            << " max_queue_gap=" << c.queue.max_queue_gap
            << " max_batch_flops=" << c.queue.max_batch_flops
            << " max_batch_bytes=" << c.queue.max_batch_bytes
            << " queue_capacity=" << c.queue.capacity
            << " lanes_per_device=" << c.lanes_per_device
            << " dispatch_when_idle=" << (c.dispatch_when_idle ? "true" : "false")
            << " dispatch_below_running=" << c.dispatch_below_running
            << " lane_spin=" << c.lane_spin;
  if (server.backend() == "cpu") {
    // OpenBLAS reads this when it loads, before main(); all we can do here is
    // say what it is. Its default keeps idle BLAS threads spinning on
    // sched_yield for 2^28 cycles after every multi-threaded call, which took
    // ~20% of the server's CPU under small requests (docs/BENCHMARKS.md).
    const char* timeout = std::getenv("OPENBLAS_THREAD_TIMEOUT");
    if (timeout != nullptr) {
      LOG(INFO) << "OpenBLAS: OPENBLAS_THREAD_TIMEOUT=" << timeout;
    } else {
      LOG(INFO) << "OpenBLAS: OPENBLAS_THREAD_TIMEOUT unset, idle BLAS threads spin for 2^28 "
                   "cycles after each call; OPENBLAS_THREAD_TIMEOUT=4 (the container images' "
                   "setting) makes them sleep at once";
    }
  }
  LOG(INFO) << "limits: max_dim=" << c.limits.max_dim
            << " max_request_bytes=" << c.max_request_bytes
            << " max_response_bytes=" << c.limits.max_response_bytes
            << " default_timeout=" << c.default_timeout;
  LOG(INFO) << "resident matrices: "
            << (c.resident.max_bytes == 0
                    ? std::string("off")
                    : absl::StrCat("max_bytes=", c.resident.max_bytes,
                                   " per_client=", c.resident.max_bytes_per_client,
                                   " default_ttl=", absl::FormatDuration(c.resident.default_ttl),
                                   " max_ttl=", absl::FormatDuration(c.resident.max_ttl)));
  if (server.backend() == "cuda") {
    LOG(INFO) << "pinned host buffers: "
              << (c.engine.pinned_host_bytes == 0
                      ? std::string("off (--pinned_host_bytes=0)")
                      : absl::StrCat("up to ", c.engine.pinned_host_bytes >> 20, " MiB"));
  }
  LOG(INFO) << "serving gRPC on port " << server.port() << " (" << c.listen << ")"
            << (c.tls_cert_file.empty() ? ", plain text"
                                        : (c.tls_client_ca_file.empty() ? ", TLS" : ", mutual TLS"))
            << (c.auth_tokens_file.empty() ? "" : ", bearer tokens required")
            << (server.metrics_port() > 0
                    ? absl::StrCat(", metrics on http://", c.metrics_listen.substr(
                                                              0, c.metrics_listen.rfind(':')),
                                   ":", server.metrics_port(), "/metrics")
                    : std::string(", metrics endpoint off"));
}

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  // --help lists the flags of this file (absl's default looks for a file
  // named after the program, and none is). absl hands the filter each
  // flag's file without its leading slashes.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    absl::string_view self = __FILE__;
    self.remove_prefix(std::min(self.find_first_not_of('/'), self.size()));
    return file == self;
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "serves matrix multiplies over gRPC (matmul.v1.MatmulService) with "
      "dynamic batching, on CUDA GPUs or the CPU.\nEvery flag may also be set from the "
      "environment as MATMUL_<FLAG> (e.g. MATMUL_BACKEND=cpu).");
  ApplyEnvironment();
  absl::ParseCommandLine(argc, argv);
  // Off by default: with it on, two threads locking their own mutexes take
  // 144 ns a lock instead of 9 (measured on the development machine), and
  // every gRPC lock is an absl::Mutex.
  absl::SetMutexDeadlockDetectionMode(absl::GetFlag(FLAGS_mutex_deadlock_detection)
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);

  // Block the stop signals in every thread; one thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<matmul::server::ServerConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    LOG(ERROR) << config.status().message();
    return 2;
  }
  absl::StatusOr<matmul::EngineSet> engines = matmul::CreateEngines(config->engine);
  if (!engines.ok()) {
    LOG(ERROR) << "no engine: " << engines.status().message();
    return 1;
  }
  if (const std::string fault = absl::GetFlag(FLAGS_inject_device_failure); !fault.empty()) {
    absl::StatusOr<matmul::server::FaultSpec> spec = matmul::server::ParseFaultSpec(fault);
    absl::Status wrapped = spec.ok() ? matmul::server::WrapFailingDevice(engines->engines, *spec)
                                     : spec.status();
    if (!wrapped.ok()) {
      LOG(ERROR) << wrapped.message();
      return 2;
    }
    LOG(WARNING) << "fault injection: " << spec->device << " will fail after "
                 << spec->after_batches << " batch(es)";
  }
  if (!engines->fallback_reason.empty()) {
    LOG(INFO) << "using the CPU engine: " << engines->fallback_reason;
  }
  for (const std::string& note : engines->notes) LOG(INFO) << note;
  absl::StatusOr<std::unique_ptr<matmul::server::MatmulServer>> server =
      matmul::server::MatmulServer::Create(*config, *std::move(engines));
  if (!server.ok()) {
    LOG(ERROR) << "cannot start: " << server.status().message();
    return 1;
  }
  LogStartup(**server);
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << (*server)->port() << " " << (*server)->metrics_port() << "\n";
    std::rename(tmp.c_str(), path.c_str());
  }

  int signal_number = 0;
  while (sigwait(&stop_signals, &signal_number) == 0 && signal_number == SIGHUP) {
    const absl::Status reloaded = (*server)->ReloadTokens();
    if (!reloaded.ok()) LOG(WARNING) << "SIGHUP: " << reloaded.message();
  }
  const absl::Duration grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_s));
  LOG(INFO) << "received " << strsignal(signal_number) << "; draining for up to " << grace
            << " (send it again to stop at once)";
  std::thread([&stop_signals] {
    int again = SIGHUP;
    while (again == SIGHUP) sigwait(&stop_signals, &again);
    LOG(WARNING) << "second " << strsignal(again) << "; stopping without finishing the drain";
    _exit(1);
  }).detach();
  const bool drained = (*server)->Shutdown(grace);
  if (drained) {
    LOG(INFO) << "every accepted request answered; exiting";
  } else {
    LOG(WARNING) << "grace period over; requests still queued were answered UNAVAILABLE";
  }
  return 0;
}
