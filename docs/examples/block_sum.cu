// block_sum.cu: a CUDA program of one's own on fp8rl's emulation (docs/gpu-emulation.md): the sum
// of 0 .. n-1, a shared-memory tree reduction per block of 256 threads. One source, two builds:
//   GPU:        nvcc -std=c++17 -arch=sm_90 -I. docs/examples/block_sum.cu -o block_sum
//   emulation:  make emu-lib, then g++ -std=c++17 -DFP8RL_EMU -I. -isystem $CUDA_HOME/include
//               -x c++ docs/examples/block_sum.cu -x none build/libcudaemu.a -fopenmp -lpthread -o block_sum
#include <cstdio>
#include <vector>

#include "cuda/common.cuh"

constexpr int kThreads = 256;

// sums[b] = the sum of in[i] over block b's kThreads indices i < n.
__global__ void __launch_bounds__(kThreads) block_sum_kernel(const int* in, int n, long long* sums) {
    STATIC_SHARED(long long, partial, [kThreads]);
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    partial[t] = i < n ? in[i] : 0;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) sums[blockIdx.x] = partial[0];
}

int main() {
    try {
        const int n = 1 << 16, blocks = (n + kThreads - 1) / kThreads;
        std::vector<int> in(n);
        for (int i = 0; i < n; i++) in[i] = i;
        int* d_in = nullptr;
        long long* d_sums = nullptr;
        CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(int)));
        CUDA_CHECK(cudaMalloc(&d_sums, blocks * sizeof(long long)));
        CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
        LAUNCH_KERNEL(block_sum_kernel, blocks, kThreads, 0, 0, d_in, n, d_sums);
        std::vector<long long> sums(blocks);
        CUDA_CHECK(cudaMemcpy(sums.data(), d_sums, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(d_in));
        CUDA_CHECK(cudaFree(d_sums));
        long long total = 0;
        for (long long s : sums) total += s;
        const long long want = (long long)n * (n - 1) / 2;
        printf("block_sum: %lld from %d blocks of %d threads (want %lld)\n", total, blocks, kThreads, want);
        return total == want ? 0 : 1;
    } catch (const fp8rl::Error& e) {
        fprintf(stderr, "block_sum: %s\n", e.what());
        return 1;
    }
}
