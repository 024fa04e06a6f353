// rope.cuh: rotary position embedding, rotate-half form (spec-model.md §2.5), forward and backward,
// as cpu/model_layers.h's rope_forward / rope_backward: the pair (x_i, x_{i+D/2}) of every head is
// rotated by the angle pos * inv_freq[i] of its token's position (positions restart at 0 in every
// packed sequence: the caller passes them per token); the backward applies the transposed rotation.
// The cos/sin table is the CPU's RopeTable (llama3 frequency scaling included there) uploaded as is,
// not recomputed: the device's double cos/sin are not guaranteed correctly rounded (CUDA documents up
// to 2 ulp), so only the uploaded FP32 values make the rotation bit-exact with the CPU. With BF16
// activations (`bf16`) cos/sin are rounded to BF16 as HF casts them; a BF16 output rounds once.
#ifndef FP8RL_CUDA_ROPE_CUH
#define FP8RL_CUDA_ROPE_CUH
#include "cpu/model_layers.h"
#include "cuda/engine/device_array.cuh"
#include "cuda/element.cuh"
#include "rl/numerics/bf16.h"
#include "rl/numerics/hostdevice.h"

#include <climits>
#include <cstdint>

namespace fp8rl {

inline constexpr int kRopeThreads = 256;

// What the kernels read: cos, sin [positions][half] in device memory.
struct RopeTableView {
    const float* cos;
    const float* sin;
    int half;
    long positions;
};

// The CPU's RopeTable in device memory (owns it).
struct DeviceRopeTable {
    DeviceArray<float> cos, sin;
    int half = 0;
    long positions = 0;

    explicit DeviceRopeTable(const RopeTable& table) : half(table.half), positions(table.positions) {
        const size_t count = (size_t)positions * half;
        if (half <= 0 || positions <= 0 || table.cos.size() != count || table.sin.size() != count)
            fail("DeviceRopeTable: the RopeTable has half = %d, %ld positions, %zu cos and %zu sin values", half, positions,
                 table.cos.size(), table.sin.size());
        cos.resize(count, "RoPE cos table");
        sin.resize(count, "RoPE sin table");
        cos.upload(table.cos);
        sin.upload(table.sin);
    }
    RopeTableView view() const { return {cos.get(), sin.get(), half, positions}; }
};

// One thread per (row, head, pair i). x, y [rows][heads][2 * half] (y may be x); pos [rows].
template <class In, class Out>
__global__ void rope_rotate_kernel(Out* y, const In* x, const int32_t* pos, RopeTableView table, long rows, int heads,
                                   bool bf16, bool inverse) {
    const long index = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (index >= rows * heads * table.half) return;
    const int i = (int)(index % table.half);
    const long row_head = index / table.half, r = row_head / heads;
    const int32_t p = pos[r];
    if (p < 0 || p >= table.positions) __trap();  // past the uploaded table
    float c = table.cos[(size_t)p * table.half + i], s = table.sin[(size_t)p * table.half + i];
    if (bf16) c = round_bf16(c), s = round_bf16(s);
    if (inverse) s = -s;
    const size_t first = (size_t)row_head * 2 * table.half + i, second = first + table.half;
    const float a = as_float(x[first]), b = as_float(x[second]);
    store_float(y + first, mul_rn(a, c) - mul_rn(b, s));
    store_float(y + second, mul_rn(b, c) + mul_rn(a, s));
}

template <class In, class Out>
void rope_rotate(const char* who, Out* y, const In* x, const int32_t* pos, const RopeTableView& table, long rows,
                 int heads, bool bf16, bool inverse, cudaStream_t stream) {
    if (rows < 0 || heads <= 0 || table.half <= 0)
        fail("%s: rows = %ld, heads = %d, half the head dim = %d (all must be positive)", who, rows, heads, table.half);
    const long threads = rows * heads * table.half;
    if (threads / kRopeThreads >= INT_MAX) fail("%s: %ld rows x %d heads is too many for one launch", who, rows, heads);
    if (rows == 0) return;
    LAUNCH_KERNEL((rope_rotate_kernel<In, Out>), dim3((unsigned)((threads + kRopeThreads - 1) / kRopeThreads)),
                  kRopeThreads, 0, stream, y, x, pos, table, rows, heads, bf16, inverse);
}

// y = RoPE(x), x [rows][heads][D] with D = 2 * table.half; bf16: the model's activations are BF16.
template <class In, class Out>
void rope_forward(Out* y, const In* x, const int32_t* pos, const RopeTableView& table, long rows, int heads, bool bf16,
                  cudaStream_t stream) {
    rope_rotate("rope_forward", y, x, pos, table, rows, heads, bf16, false, stream);
}

// dx = the transposed rotation of dy (a BF16 dx rounds once, as the CPU engine's caller does).
template <class In, class Out>
void rope_backward(Out* dx, const In* dy, const int32_t* pos, const RopeTableView& table, long rows, int heads,
                   bool bf16, cudaStream_t stream) {
    rope_rotate("rope_backward", dx, dy, pos, table, rows, heads, bf16, true, stream);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_ROPE_CUH
