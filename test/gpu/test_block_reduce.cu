// test_block_reduce.cu: cuda/kernels/block_reduce.cuh's contract: every thread of the block gets the sum
// (or max) of the block's values, also when two reductions of the same type follow each other (they
// share one shared array), for block sizes of 1 to 32 warps. Values are small integers in double and
// float, so every sum is exact and the expected value is known.
#include <vector>

#include "cuda/kernels/block_reduce.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

// Thread i's value is value_of(i); out [3][blockDim.x]: sum, sum of (2 value + 1), max per thread.
__host__ __device__ double value_of(int i) { return (double)((i * 37) % 101) - 50.0; }

__global__ void reduce_twice_kernel(double* out) {
    const double v = value_of(threadIdx.x);
    const double sum = block_reduce(v, SumOp());
    const double sum2 = block_reduce(2.0 * v + 1.0, SumOp());  // reuses the array the first one read
    const float max = block_reduce((float)v, MaxOp());
    out[threadIdx.x] = sum;
    out[blockDim.x + threadIdx.x] = sum2;
    out[2 * blockDim.x + threadIdx.x] = max;
}

}  // namespace

TEST(gpu_block_reduce_gives_every_thread_the_result) {
    for (int threads : {32, 96, 256, 1024}) {
        double sum = 0, max = -1e30;
        for (int i = 0; i < threads; i++) sum += value_of(i), max = std::fmax(max, value_of(i));
        DeviceBuffer<double> out(3 * threads);
        LAUNCH_KERNEL(reduce_twice_kernel, 1, threads, 0, 0, out.ptr);
        std::vector<double> got = out.download();
        int bad = 0;
        for (int i = 0; i < threads; i++)
            bad += got[i] != sum || got[threads + i] != 2 * sum + threads || got[2 * threads + i] != max;
        printf("    %4d threads: %d threads got a wrong sum, second sum or max\n", threads, bad);
        CHECK_MSG(bad == 0, "%d threads: %d wrong", threads, bad);
    }
}
