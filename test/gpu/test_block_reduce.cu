// test_block_reduce.cu: cuda/kernels/block_reduce.cuh's contract: every thread of the block gets the sum
// (or max) of the block's values, also when two reductions of the same type follow each other (they
// share one shared array), for block sizes of 1 to 32 warps. Values are small integers in double and
// float, so every sum is exact and the expected value is known. warp_reduce_spread's: each lane gets
// warp_reduce's bits of its value.
#include <cstring>
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

// out [32]: lane L's warp_reduce_spread result of N values, then [32] warp_reduce's of value L / (32 / N);
// the values inexact in double (sums that round, so that a changed order shows).
template <int N>
__global__ void reduce_spread_kernel(double* out) {
    double values[N], each[N];
    for (int k = 0; k < N; k++) values[k] = each[k] = 1.0 / (3 + threadIdx.x + 7 * k) * (1 + (threadIdx.x * k) % 5 * 1e5);
    out[threadIdx.x] = warp_reduce_spread(values, SumOp());
    double want = 0.0;
    for (int k = 0; k < N; k++) {
        const double sum = warp_reduce(each[k], SumOp());
        if (k == (int)threadIdx.x / (32 / N)) want = sum;
    }
    out[32 + threadIdx.x] = want;
}

template <int N>
int spread_mismatches() {
    DeviceBuffer<double> out(64);
    LAUNCH_KERNEL(reduce_spread_kernel<N>, 1, 32, 0, 0, out.ptr);
    const std::vector<double> got = out.download();
    int bad = 0;
    for (int lane = 0; lane < 32; lane++) bad += memcmp(&got[lane], &got[32 + lane], sizeof(double)) != 0;
    printf("    %2d values: %d lanes differ from warp_reduce's bits\n", N, bad);
    return bad;
}

}  // namespace

TEST(gpu_warp_reduce_spread_gives_warp_reduce_bits) {
    CHECK(spread_mismatches<1>() == 0);
    CHECK(spread_mismatches<2>() == 0);
    CHECK(spread_mismatches<8>() == 0);
    CHECK(spread_mismatches<32>() == 0);
}

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
