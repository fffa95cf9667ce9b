// serve-sim on CUDA: device memory, pinned staging for the per-step inputs, and one CUDA graph per
// path holding a whole step (every layer's writers, builders and decode), captured at the batch
// size and replayed while the lengths change; CUDA events bracket each replay alone.
#include <cuda_runtime.h>

#include <cstring>

#include "device_mirror.h"
#include "runner.h"
#include "serve_sim.h"

namespace sparsemla::tools {

namespace {

class CudaStepProgram : public StepProgram {
 public:
  CudaStepProgram(cudaGraphExec_t exec, cudaStream_t s) : exec_(exec), s_(s) {}
  ~CudaStepProgram() override { cudaGraphExecDestroy(exec_); }
  double run() override {
    cuda_check(cudaEventRecord(ev_.start, s_), "record");
    cuda_check(cudaGraphLaunch(exec_, s_), "graph launch");
    cuda_check(cudaEventRecord(ev_.stop, s_), "record");
    return ev_.seconds();
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t s_;
  CudaEvents ev_;
};

class CudaSimBackend : public SimBackend {
 public:
  CudaSimBackend() {
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    cuda_check(cudaGetDeviceProperties(&prop_, device), "cudaGetDeviceProperties");
  }
  ~CudaSimBackend() override {
    cudaStreamSynchronize(stream_.s);
    for (void* p : pinned_) cudaFreeHost(p);
  }
  bool gpu() const override { return true; }
  std::string describe() const override {
    return std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) +
           std::to_string(prop_.minor) + ", " + std::to_string(prop_.multiProcessorCount) +
           " SMs, " + std::to_string(prop_.totalGlobalMem >> 30) + " GiB)";
  }
  double default_memory_budget() const override {
    size_t free_bytes = 0, total = 0;
    cuda_check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    return 0.85 * static_cast<double>(free_bytes);
  }
  void* alloc(size_t bytes) override {
    uint8_t* p = arena_.alloc<uint8_t>(bytes);
    cuda_check(cudaMemsetAsync(p, 0, std::max<size_t>(bytes, 1), stream_.s), "cudaMemsetAsync");
    return p;
  }
  void* alloc_staging(size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "cudaMallocHost");
    pinned_.push_back(p);
    std::memset(p, 0, bytes);
    return p;
  }
  void upload(void* dst, const void* src, size_t bytes) override {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_.s), "upload");
    cuda_check(cudaStreamSynchronize(stream_.s), "upload");
  }
  void upload_async(void* dst, const void* staging, size_t bytes) override {
    cuda_check(cudaMemcpyAsync(dst, staging, bytes, cudaMemcpyHostToDevice, stream_.s),
               "upload_async");
  }
  void download(void* dst, const void* src, size_t bytes) override {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_.s), "download");
    cuda_check(cudaStreamSynchronize(stream_.s), "download");
  }
  void* stream() override { return stream_.s; }
  std::unique_ptr<StepProgram> record(std::function<void()> enqueue) override {
    enqueue();  // warm-up outside the capture (module loading, first-launch costs)
    cuda_check(cudaStreamSynchronize(stream_.s), "warm-up step");
    cudaGraphExec_t exec = capture_graph(stream_.s, enqueue);
    return std::make_unique<CudaStepProgram>(exec, stream_.s);
  }

 private:
  cudaDeviceProp prop_{};
  DeviceArena arena_;  // freed after the stream is idle (destructor above)
  CudaStream stream_;
  std::vector<void*> pinned_;
};

}  // namespace

std::unique_ptr<SimBackend> make_cuda_sim_backend() {
  if (!cuda_device_available())
    throw_arg_error("serve-sim", "--paths", "cpu (no CUDA device is usable here)", "a CUDA path");
  return std::make_unique<CudaSimBackend>();
}

}  // namespace sparsemla::tools
