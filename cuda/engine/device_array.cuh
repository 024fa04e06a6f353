// device_array.cuh: an owning array in device memory, the one container of the GPU engine's state.
// A failed allocation is an Error naming what was asked for and how much the device has free.
// Every array's bytes are counted in one place (device_bytes_live / device_bytes_peak), so the
// engine's high-water mark is known exactly: cudaMemGetInfo also sees the CUDA context, cuBLASLt's
// and NCCL's own memory and the allocator's rounding, and only what is held when it is called. Every
// allocation and free is counted too (device_allocations): a CUDA graph, which holds the addresses it
// was captured with, stays valid while that count has not moved.
#ifndef FP8RL_DEVICE_ARRAY_CUH
#define FP8RL_DEVICE_ARRAY_CUH
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/common.cuh"

namespace fp8rl {

// Device bytes held by all DeviceArrays of the process now, and the most held at once since the
// last reset_device_bytes_peak(). Plain counters: the engine allocates from one host thread.
struct DeviceBytes {
    size_t live = 0, peak = 0;
    uint64_t allocations = 0;  // allocations and frees so far
};
inline DeviceBytes& device_bytes() {
    static DeviceBytes bytes;
    return bytes;
}
inline size_t device_bytes_live() { return device_bytes().live; }
inline size_t device_bytes_peak() { return device_bytes().peak; }
inline void reset_device_bytes_peak() { device_bytes().peak = device_bytes().live; }
inline uint64_t device_allocations() { return device_bytes().allocations; }

template <class T>
class DeviceArray {
  public:
    DeviceArray() = default;
    DeviceArray(size_t count, const char* what) { resize(count, what); }
    ~DeviceArray() { free_memory(); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    // Contents are lost; the memory is only reallocated when it grows.
    void resize(size_t count, const char* what) {
        if (count <= capacity_) {
            count_ = count;
            return;
        }
        free_memory();
        cudaError_t e = cudaMalloc(&ptr_, count * sizeof(T));
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t free_bytes = 0, total = 0;
            cudaMemGetInfo(&free_bytes, &total);
            fail("out of GPU memory allocating %s (%.3f GB; %.3f GB of %.3f GB free): %s", what, count * sizeof(T) / 1e9,
                 free_bytes / 1e9, total / 1e9, cudaGetErrorString(e));
        }
        capacity_ = count_ = count;
        DeviceBytes& b = device_bytes();
        b.allocations++;
        b.live += count * sizeof(T);
        b.peak = std::max(b.peak, b.live);
    }
    // Frees the memory (a later resize allocates anew), for an array that shrinks for good.
    void release() { free_memory(); }
    void zero(cudaStream_t stream) {
        if (count_) CUDA_CHECK(cudaMemsetAsync(ptr_, 0, count_ * sizeof(T), stream));
    }
    void upload(const T* host, size_t count) {
        if (count > count_) fail("DeviceArray::upload: %zu elements into %zu", count, count_);
        CUDA_CHECK(cudaMemcpy(ptr_, host, count * sizeof(T), cudaMemcpyHostToDevice));
    }
    void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
    std::vector<T> download() const { return download(count_); }
    std::vector<T> download(size_t count) const {
        std::vector<T> host(count);
        if (count) CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
        return host;
    }

    T* get() const { return ptr_; }
    size_t size() const { return count_; }

  private:
    void free_memory() {
        if (ptr_) device_bytes().allocations++;
        cudaFree(ptr_);
        device_bytes().live -= capacity_ * sizeof(T);
        ptr_ = nullptr;
        capacity_ = count_ = 0;
    }

    T* ptr_ = nullptr;
    size_t count_ = 0, capacity_ = 0;
};

}  // namespace fp8rl

#endif  // FP8RL_DEVICE_ARRAY_CUH
