// gpu_probe.cu: part 0 of dev/gpu_check.sh, seconds on a GPU machine: is the device there and usable
// (a context, a trivial kernel run and its result read back), is it Hopper (compute capability 9.x,
// what the kernels are built for), and is cuBLASLt new enough for block-scaled FP8 (12.9: VEC128 and
// BLK128x128 scales)? Prints one line: the facts, or what is missing; exits 1 when anything is.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>

__global__ void add_one(int* x) { x[threadIdx.x] += 1; }

int main() {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("no usable GPU: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "the driver lists no CUDA device");
        return 1;
    }
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, 0);
    int* x = nullptr;
    int host[32] = {};
    if (e == cudaSuccess) e = cudaMalloc(&x, sizeof host);
    if (e == cudaSuccess) e = cudaMemset(x, 0, sizeof host);
    if (e == cudaSuccess) {
        add_one<<<1, 32>>>(x);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(host, x, sizeof host, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        printf("no usable GPU: a trivial kernel failed: %s\n", cudaGetErrorString(e));
        return 1;
    }
    int sum = 0;
    for (int v : host) sum += v;
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const size_t lt = cublasLtGetVersion();
    printf("%s, compute capability %d.%d, %d SMs, %.0f of %.0f GiB free; kernel %s; cuBLASLt %zu", prop.name, prop.major,
           prop.minor, prop.multiProcessorCount, free_bytes / 1073741824.0, total_bytes / 1073741824.0,
           sum == 32 ? "ran" : "WRONG RESULT", lt);
    if (sum != 32) return printf(": the trivial kernel computed %d, not 32\n", sum), 1;
    if (prop.major != 9) return printf(": the kernels are built for sm_90 (Hopper) only\n"), 1;
    if (lt < 120900) return printf(": block-scaled FP8 needs cuBLASLt 12.9 or later\n"), 1;
    printf("\n");
    return 0;
}
