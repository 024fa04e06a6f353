// pinned_array.cuh: an owning array in page-locked host memory (cudaMallocHost), the host side of
// asynchronous copies. A cudaMemcpyAsync from or to pageable memory is staged through a driver
// buffer and synchronizes with the host; from or to pinned memory it runs when its stream reaches
// it, so the host must not read what a copy writes, nor write what a copy reads, before an event or
// a synchronization says the copy ran (the emulation copies at that point too, so a host that
// looks early sees stale bytes there as well).
#ifndef FP8RL_PINNED_ARRAY_CUH
#define FP8RL_PINNED_ARRAY_CUH
#include <cstddef>

#include "cuda/common.cuh"

namespace fp8rl {

template <class T>
class PinnedArray {
  public:
    PinnedArray() = default;
    ~PinnedArray() { cudaFreeHost(ptr_); }  // unchecked, as every destructor here
    PinnedArray(const PinnedArray&) = delete;
    PinnedArray& operator=(const PinnedArray&) = delete;

    // Contents are lost when it grows.
    void resize(size_t count, const char* what) {
        if (count <= capacity_) return;
        CUDA_CHECK(cudaFreeHost(ptr_));
        ptr_ = nullptr;
        capacity_ = 0;
        void* p = nullptr;
        if (cudaMallocHost(&p, count * sizeof(T)) != cudaSuccess) {
            cudaGetLastError();
            fail("out of page-locked host memory allocating %s (%.3f MB)", what, count * sizeof(T) / 1e6);
        }
        ptr_ = (T*)p;
        capacity_ = count;
    }
    T* get() const { return ptr_; }
    T& operator[](size_t i) const { return ptr_[i]; }

  private:
    T* ptr_ = nullptr;
    size_t capacity_ = 0;
};

}  // namespace fp8rl

#endif  // FP8RL_PINNED_ARRAY_CUH
