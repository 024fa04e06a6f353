// device_array.cuh: an owning array in device memory, the one container of the GPU engine's state.
// A failed allocation is an Error naming what was asked for and how much the device has free.
#ifndef FP8RL_DEVICE_ARRAY_CUH
#define FP8RL_DEVICE_ARRAY_CUH
#include <vector>

#include "cuda/common.cuh"

namespace fp8rl {

template <class T>
class DeviceArray {
  public:
    DeviceArray() = default;
    DeviceArray(size_t count, const char* what) { resize(count, what); }
    ~DeviceArray() { cudaFree(ptr_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    // Contents are lost; the memory is only reallocated when it grows.
    void resize(size_t count, const char* what) {
        if (count <= capacity_) {
            count_ = count;
            return;
        }
        cudaFree(ptr_);
        ptr_ = nullptr;
        capacity_ = count_ = 0;
        cudaError_t e = cudaMalloc(&ptr_, count * sizeof(T));
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t free_bytes = 0, total = 0;
            cudaMemGetInfo(&free_bytes, &total);
            fail("out of GPU memory allocating %s (%.3f GB; %.3f GB of %.3f GB free): %s", what, count * sizeof(T) / 1e9,
                 free_bytes / 1e9, total / 1e9, cudaGetErrorString(e));
        }
        capacity_ = count_ = count;
    }
    // Frees the memory (a later resize allocates anew), for an array that shrinks for good.
    void release() {
        cudaFree(ptr_);
        ptr_ = nullptr;
        capacity_ = count_ = 0;
    }
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
    T* ptr_ = nullptr;
    size_t count_ = 0, capacity_ = 0;
};

}  // namespace fp8rl

#endif  // FP8RL_DEVICE_ARRAY_CUH
