// embedding.cuh: the token embedding (spec-model.md §2.2), forward and backward, as
// cpu/model_layers.h's embedding_forward / embedding_backward.
//   forward   x [T][C] = E [ids[t]]: a gather of rows of the FP32 master table or its BF16 copy,
//             stored as the activation type (BF16 on the GPU engine; FP32 into BF16 rounds once).
//   backward  dE [V][C] += dx [t] for every t with ids[t] = v, in increasing t, in FP32: the CPU's
//             order, so dE is bit-exact with embedding_backward, with no float atomics. Each block owns
//             a range of vocabulary rows and of columns (one thread per column) and scans all ids in
//             order, so one thread adds every contribution to a dE element, in token order.
// An id outside [0, V) traps rather than read or write outside the table.
#ifndef FP8RL_CUDA_EMBEDDING_CUH
#define FP8RL_CUDA_EMBEDDING_CUH
#include "cuda/element.cuh"

#include <climits>
#include <cstdint>

namespace fp8rl {

inline constexpr int kEmbeddingForwardThreads = 128;
inline constexpr int kEmbeddingBackwardThreads = 128;     // columns per block, and ids staged per round
inline constexpr int kEmbeddingBackwardVocabRanges = 64;  // blocks along the vocabulary; each scans all ids

__device__ __forceinline__ int32_t checked_id(const int32_t* ids, long t, int V) {
    const int32_t id = ids[t];
    if (id < 0 || id >= V) __trap();
    return id;
}

// One block per token.
template <class Table, class Out>
__global__ void embedding_forward_kernel(Out* x, const Table* table, const int32_t* ids, int V, int C) {
    const long t = blockIdx.x;
    const Table* row = table + (size_t)checked_id(ids, t, V) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) store_float(x + (size_t)t * C + c, as_float(row[c]));
}

// Block (range, column block): vocabulary rows [v0, v0 + rows_per_range), columns blockIdx.y * 128 + lane.
template <class Grad>
__global__ void embedding_backward_kernel(float* dE, const Grad* dx, const int32_t* ids, long T, int V, int C,
                                          int rows_per_range) {
    STATIC_SHARED(int32_t, staged_ids, [kEmbeddingBackwardThreads]);
    const int v0 = blockIdx.x * rows_per_range, v1 = min(v0 + rows_per_range, V);
    const int c = blockIdx.y * kEmbeddingBackwardThreads + threadIdx.x;
    for (long t0 = 0; t0 < T; t0 += kEmbeddingBackwardThreads) {
        if (t0 + threadIdx.x < T) staged_ids[threadIdx.x] = checked_id(ids, t0 + threadIdx.x, V);
        __syncthreads();  // every id of this round staged
        const int count = (int)min((long)kEmbeddingBackwardThreads, T - t0);
        if (c < C)
            for (int j = 0; j < count; j++) {
                const int32_t id = staged_ids[j];
                if (id >= v0 && id < v1) dE[(size_t)id * C + c] += as_float(dx[(size_t)(t0 + j) * C + c]);
            }
        __syncthreads();  // every thread done with this round's ids before the next round overwrites them
    }
}

inline void check_embedding_shape(const char* who, long T, int V, int C) {
    if (T < 0 || T > INT_MAX) fail("%s: token count T = %ld outside [0, 2^31)", who, T);
    if (V <= 0) fail("%s: vocabulary size V = %d must be positive", who, V);
    if (C <= 0) fail("%s: embedding width C = %d must be positive", who, C);
}

// x [T][C] = table [ids[t]] (table [V][C]).
template <class Table, class Out>
void embedding_forward(Out* x, const Table* table, const int32_t* ids, long T, int V, int C, cudaStream_t stream) {
    check_embedding_shape("embedding_forward", T, V, C);
    if (T == 0) return;
    LAUNCH_KERNEL((embedding_forward_kernel<Table, Out>), dim3((unsigned)T), kEmbeddingForwardThreads, 0, stream, x,
                  table, ids, V, C);
}

// dE [V][C] += dx [T][C] scattered by ids (dE accumulates: zero it for a fresh gradient).
template <class Grad>
void embedding_backward(float* dE, const Grad* dx, const int32_t* ids, long T, int V, int C, cudaStream_t stream) {
    check_embedding_shape("embedding_backward", T, V, C);
    if (T == 0) return;
    const int rows_per_range = (V + kEmbeddingBackwardVocabRanges - 1) / kEmbeddingBackwardVocabRanges;
    const dim3 grid((V + rows_per_range - 1) / rows_per_range, (C + kEmbeddingBackwardThreads - 1) / kEmbeddingBackwardThreads);
    LAUNCH_KERNEL(embedding_backward_kernel<Grad>, grid, kEmbeddingBackwardThreads, 0, stream, dE, dx, ids, T, V, C,
                  rows_per_range);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_EMBEDDING_CUH
