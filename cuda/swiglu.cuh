// swiglu.cuh: the SwiGLU activation (spec-model.md §2.6), forward and backward, as
// cpu/model_layers.h's swiglu_forward / swiglu_backward, bit for bit: the same operations in the
// same order, exp from rl/numerics/fast_exp.h (the function the CPU calls), products unfused (mul_rn) and the
// 1 + exp(-g) addition unfused (__fadd_rn: nvcc may fuse fast_exp's final product y * 2^n into it,
// which differs when that product is subnormal).
//   a = silu(g) * u, silu(z) = z / (1 + exp(-z));
//   sig = sigmoid(g): dg = da * u * sig * (1 + g * (1 - sig)), du = da * g * sig.
// A BF16 output rounds once, where the CPU rounds (its bf16 flag; round_bf16_if after the backward).
#ifndef FP8RL_CUDA_SWIGLU_CUH
#define FP8RL_CUDA_SWIGLU_CUH
#include "cuda/element.cuh"
#include "rl/numerics/fast_exp.h"
#include "rl/numerics/hostdevice.h"

namespace fp8rl {

inline constexpr int kSwigluThreads = 256;

// a, g, u [n] (the [T][I] activations, flat).
template <class In, class Out>
__global__ void swiglu_forward_kernel(Out* a, const In* g, const In* u, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float gi = as_float(g[i]);
        store_float(a + i, gi / __fadd_rn(1.0f, fast_exp(-gi)) * as_float(u[i]));
    }
}

template <class In, class Out>
__global__ void swiglu_backward_kernel(Out* dg, Out* du, const In* da, const In* g, const In* u, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        const float gi = as_float(g[i]), dai = as_float(da[i]);
        const float sig = 1.0f / __fadd_rn(1.0f, fast_exp(-gi));
        store_float(dg + i, dai * as_float(u[i]) * sig * (1.0f + mul_rn(gi, 1.0f - sig)));
        store_float(du + i, dai * gi * sig);
    }
}

template <class In, class Out>
void swiglu_forward(Out* a, const In* g, const In* u, long n, cudaStream_t stream) {
    if (n < 0) fail("swiglu_forward: element count %ld is negative", n);
    if (n == 0) return;
    LAUNCH_KERNEL((swiglu_forward_kernel<In, Out>), elementwise_blocks(n, kSwigluThreads), kSwigluThreads, 0, stream, a,
                  g, u, n);
}

template <class In, class Out>
void swiglu_backward(Out* dg, Out* du, const In* da, const In* g, const In* u, long n, cudaStream_t stream) {
    if (n < 0) fail("swiglu_backward: element count %ld is negative", n);
    if (n == 0) return;
    LAUNCH_KERNEL((swiglu_backward_kernel<In, Out>), elementwise_blocks(n, kSwigluThreads), kSwigluThreads, 0, stream,
                  dg, du, da, g, u, n);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_SWIGLU_CUH
