// CudaOps: construction, memory and the typed-pointer checks shared by every op file.
#include "cuda_common.cuh"
#include "cuda_context.cuh"
#include "cuda_ops.hpp"
#include "mxtrain/device_info.hpp"
#include "mxtrain/trace.hpp"

#include <cstdlib>
#include <cstring>

#include "stage_clock.hpp"

namespace mxt {
namespace cuda {

void fail(const char* op, const std::string& msg) { throw std::runtime_error(std::string(op) + ": " + msg); }

void check(cudaError_t err, const char* op, const char* what) {
  if (err != cudaSuccess) fail(op, std::string(what) + " failed: " + cudaGetErrorString(err));
}

static void expect(const Tensor& t, DType d, const char* op, const char* arg) {
  if (t.device != Device::CUDA && t.numel() > 0) fail(op, std::string(arg) + " is not a CUDA tensor");
  if (t.dtype != d)
    fail(op, std::string(arg) + " must be " + dtype_name(d) + ", got " + dtype_name(t.dtype) + " " + t.shape_str());
  if (t.numel() > 0 && t.data == nullptr) fail(op, std::string(arg) + " has no data");
}
float* f32(const Tensor& t, const char* op, const char* arg) {
  expect(t, DType::F32, op, arg);
  return static_cast<float*>(t.data);
}
bf16* bf16p(const Tensor& t, const char* op, const char* arg) {
  expect(t, DType::BF16, op, arg);
  return static_cast<bf16*>(t.data);
}
int32_t* i32(const Tensor& t, const char* op, const char* arg) {
  expect(t, DType::I32, op, arg);
  return static_cast<int32_t*>(t.data);
}
void expect_rows(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* arg) {
  const int64_t lead = t.ndim ? t.shape[0] : 0;
  if (lead != rows || t.numel() != rows * cols)
    fail(op, std::string(arg) + " has shape " + t.shape_str() + ", expected " + std::to_string(rows) + " rows of " +
                 std::to_string(cols) + " elements");
}

void expect_numel(const Tensor& t, int64_t n, const char* op, const char* arg) {
  if (t.numel() != n)
    fail(op, std::string(arg) + " must have " + std::to_string(n) + " elements, got " + t.shape_str());
}
void expect_dtype(const Tensor& t, DType d, const char* op, const char* arg) { expect(t, d, op, arg); }

}  // namespace cuda

void* CudaContext::scratch(const char* slot, size_t bytes) {
  for (Slot& s : slots_) {
    if (s.name != nullptr && std::strcmp(s.name, slot) != 0) continue;
    if (s.name == nullptr) s.name = slot;
    if (s.bytes < bytes) {
      cuda::check(cudaStreamSynchronize(stream), "scratch", "stream sync");
      cudaFree(s.ptr);
      note_alloc(-static_cast<long long>(s.bytes));
      s.ptr = nullptr;
      s.bytes = 0;
      cuda::check(cudaMalloc(&s.ptr, bytes), "scratch", slot);
      s.bytes = bytes;
      note_alloc(static_cast<long long>(bytes));
    }
    return s.ptr;
  }
  cuda::fail("scratch", "too many scratch slots");
}

cudaStream_t CudaContext::fork() {
  const char* op = "stream fork";
  if (side_ == nullptr) {
    cuda::check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), op, "cudaStreamCreate");
    cuda::check(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming), op, "event");
    cuda::check(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming), op, "event");
  }
  cuda::check(cudaEventRecord(fork_ev_, stream), op, "cudaEventRecord");
  cuda::check(cudaStreamWaitEvent(side_, fork_ev_, 0), op, "cudaStreamWaitEvent");
  return side_;
}

void CudaContext::join() {
  const char* op = "stream join";
  cuda::check(cudaEventRecord(join_ev_, side_), op, "cudaEventRecord");
  cuda::check(cudaStreamWaitEvent(stream, join_ev_, 0), op, "cudaStreamWaitEvent");
  // Op timing: the wait for the side stream is its own row, not part of the next launch's time (session 28: the
  // attention backward's dQ tail showed up as a 7x slower RoPE backward).
  stage_mark(op);
}

CudaContext::~CudaContext() {
  if (side_) cudaStreamSynchronize(side_);
  if (fork_ev_) cudaEventDestroy(fork_ev_);
  if (join_ev_) cudaEventDestroy(join_ev_);
  if (side_) cudaStreamDestroy(side_);
  for (Slot& s : slots_) cudaFree(s.ptr);
  for (Staging& s : staging) s.release();
  readback.release();
}

void CudaContext::Staging::reserve(size_t n, const char* op) {
  if (done == nullptr) cuda::check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), op, "event");
  cuda::check(cudaEventSynchronize(done), op, "wait for the staging buffer");  // no-op before its first use
  if (bytes >= n) return;
  if (host) cuda::check(cudaFreeHost(host), op, "cudaFreeHost");
  host = nullptr;
  bytes = 0;
  cuda::check(cudaMallocHost(&host, n), op, "cudaMallocHost");
  bytes = n;
}

void CudaContext::Staging::release() {
  if (done) cudaEventSynchronize(done);
  if (done) cudaEventDestroy(done);
  if (host) cudaFreeHost(host);
}

CudaOps::CudaOps(int device) : ctx_(new CudaContext) {
  const char* op = "CudaOps";
  ctx_->device = device;
  cuda::check(cudaSetDevice(device), op, "cudaSetDevice");
  cuda::check(cudaStreamCreateWithFlags(&ctx_->stream, cudaStreamNonBlocking), op, "cudaStreamCreate");
  if (cublasLtCreate(&ctx_->lt) != CUBLAS_STATUS_SUCCESS) cuda::fail(op, "cublasLtCreate failed");
  ctx_->workspace_bytes = 64ull << 20;  // cuBLASLt's recommendation for Hopper is >= 32 MiB
  cuda::check(cudaMalloc(&ctx_->workspace, ctx_->workspace_bytes), op, "cudaMalloc(workspace)");
  cuda::check(cudaDeviceGetAttribute(&ctx_->num_sms, cudaDevAttrMultiProcessorCount, device), op, "SM count");
  ctx_->compute_capability = cuda_compute_capability(device);
  const char* timing = std::getenv("MXTRAIN_STAGE_TIMING");
  if (timing && std::strcmp(timing, "0") != 0 && !stage_clock()) {
    ctx_->clock = make_cuda_stage_clock(ctx_->stream, std::strcmp(timing, "ops") == 0);
    install_stage_clock(ctx_->clock.get());
  }
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(ctx_->stream);
  if (ctx_->clock && stage_clock() == ctx_->clock.get()) install_stage_clock(nullptr);
  cudaFree(ctx_->workspace);
  cublasLtDestroy(ctx_->lt);
  cudaStreamDestroy(ctx_->stream);
  delete ctx_;
}

void CudaOps::set_sm_reserve(int sms) { ctx_->sm_reserve = sms < 0 ? 0 : sms; }
void CudaOps::set_exchange_alongside(bool on) { ctx_->exchange_alongside = on; }

void* CudaOps::alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    cuda::fail("alloc", "cudaMalloc of " + std::to_string(bytes >> 20) + " MiB failed (" +
                            cudaGetErrorString(err) + "); free " + std::to_string(free_b >> 20) + " of " +
                            std::to_string(total_b >> 20) + " MiB");
  }
  cuda::check(cudaMemsetAsync(p, 0, bytes, ctx_->stream), "alloc", "cudaMemset");
  sizes_[p] = bytes;
  ctx_->note_alloc(static_cast<long long>(bytes));
  return p;
}

void CudaOps::release(void* p) {
  cudaStreamSynchronize(ctx_->stream);
  auto it = sizes_.find(p);
  if (it != sizes_.end()) {
    ctx_->note_alloc(-static_cast<long long>(it->second));
    sizes_.erase(it);
  }
  cudaFree(p);
}

size_t CudaOps::peak_allocated() const { return ctx_->peak; }

void CudaOps::upload(void* dst, const void* host_src, size_t bytes) {
  // Synchronous with respect to the host buffer: callers reuse it right away.
  cuda::check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx_->stream), "upload", "memcpy");
  cuda::check(cudaStreamSynchronize(ctx_->stream), "upload", "stream sync");
}

void CudaOps::upload_async(void* dst, const void* host_src, size_t bytes) {
  const char* op = "upload_async";
  CudaContext::Staging& s = ctx_->staging[ctx_->staging_next++ % (sizeof(ctx_->staging) / sizeof(ctx_->staging[0]))];
  s.reserve(bytes, op);
  std::memcpy(s.host, host_src, bytes);
  cuda::check(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, ctx_->stream), op, "memcpy");
  cuda::check(cudaEventRecord(s.done, ctx_->stream), op, "event record");
}

size_t CudaOps::device_free_bytes() const {
  size_t free_b = 0, total_b = 0;
  cuda::check(cudaMemGetInfo(&free_b, &total_b), "device_free_bytes", "cudaMemGetInfo");
  return free_b;
}

void CudaOps::capture_begin() {
  cuda::check(cudaStreamBeginCapture(ctx_->stream, cudaStreamCaptureModeThreadLocal), "capture_begin",
              "cudaStreamBeginCapture");
}

void* CudaOps::capture_end(std::string* why) {
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(ctx_->stream, &g);
  (void)cudaGetLastError();  // an op that broke the capture left its error here
  if (e != cudaSuccess || g == nullptr) {
    if (why) *why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
    if (g) cudaGraphDestroy(g);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  if (ie != cudaSuccess) {
    (void)cudaGetLastError();
    if (why) *why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(ie);
    return nullptr;
  }
  return exec;
}

void CudaOps::graph_launch(void* graph) {
  cuda::check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), ctx_->stream), "graph_launch", "cudaGraphLaunch");
}

void CudaOps::graph_destroy(void* graph) {
  if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

void CudaOps::download(void* host_dst, const void* src, size_t bytes) {
  cuda::check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream), "download", "memcpy");
  cuda::check(cudaStreamSynchronize(ctx_->stream), "download", "stream sync");
}

void CudaOps::download_overlapped(void* host_dst, const void* src, size_t bytes,
                                  const std::function<void()>& meanwhile) {
  const char* op = "download_overlapped";
  CudaContext::Staging& s = ctx_->readback;
  s.reserve(bytes, op);  // its last copy was waited for below: no wait
  cuda::check(cudaMemcpyAsync(s.host, src, bytes, cudaMemcpyDeviceToHost, ctx_->stream), op, "memcpy");
  cuda::check(cudaEventRecord(s.done, ctx_->stream), op, "event record");
  if (meanwhile) meanwhile();
  cuda::check(cudaEventSynchronize(s.done), op, "wait for the copy");
  std::memcpy(host_dst, s.host, bytes);
}

void CudaOps::synchronize() { cuda::check(cudaStreamSynchronize(ctx_->stream), "synchronize", "stream sync"); }

std::unique_ptr<Ops> make_cuda_ops(int device) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    throw std::runtime_error("make_cuda_ops: no usable CUDA device");
  }
  return std::make_unique<CudaOps>(device);
}

}  // namespace mxt
