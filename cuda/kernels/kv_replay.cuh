// kv_replay.cuh: --train_kv_replay on the GPU engine. A training or old-log-prob forward's attention
// reads one layer's K and V [T][kv_heads * D] (BF16, K after k-norm and RoPE) as the rollout read them
// from its FP8 cache, with the engine's copy of the rollout's scales (the cache itself is not kept
// through the update):
//   1. kv_replay_step(ToCodes): x -> the value of the E4M3 code of x / scale (exact in BF16);
//   2. attention_forward with the KV heads' scales (attention.cuh): the scores and outputs decode
//      computes, for the rows the rollout computed in decode steps (response positions);
//   3. kv_replay_step(ToStored): code -> code x scale in BF16, the prefill's round trip
//      (kv_cache.cuh's kv_round_trip_kernel);
//   4. attention_forward as the prefill ran it, for the rows the rollout's prefill computed;
//   5. kv_replay_keep_decode_rows: each row keeps its own.
// K and V are left as the stored values, which the backward reads: straight through, attention's dK
// and dV flow to K and V as they were. cpu/model.h's replayed_attention is the CPU engine's twin.
#ifndef FP8RL_CUDA_KV_REPLAY_CUH
#define FP8RL_CUDA_KV_REPLAY_CUH
#include <algorithm>
#include <cstdint>

#include "kv_cache.cuh"

namespace fp8rl {

enum class KvReplayGpuStep { ToCodes, ToStored };

// k, v [count / width][width] in place; k_scale, v_scale [width / head_dim].
static __global__ void kv_replay_step_kernel(__nv_bfloat16* k, __nv_bfloat16* v, const float* k_scale, const float* v_scale,
                                             long count, long width, int head_dim, bool to_codes) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < count; i += (long)gridDim.x * blockDim.x) {
        const float ks = k_scale[i % width / head_dim], vs = v_scale[i % width / head_dim];
        const float x = __bfloat162float(k[i]), y = __bfloat162float(v[i]);
        uint8_t code;
        if (to_codes) {
            kv_store(&code, x, ks);
            k[i] = __float2bfloat16(e4m3_to_float(code));
            kv_store(&code, y, vs);
            v[i] = __float2bfloat16(e4m3_to_float(code));
        } else {
            k[i] = __float2bfloat16(mul_rn(x, ks));  // kv_value's product, of the code's value
            v[i] = __float2bfloat16(mul_rn(y, vs));
        }
    }
}

// k, v [tokens][kv_heads * head_dim] BF16; k_scale, v_scale [kv_heads] on the device.
inline void kv_replay_step(__nv_bfloat16* k, __nv_bfloat16* v, const float* k_scale, const float* v_scale, long tokens,
                           int kv_heads, int head_dim, KvReplayGpuStep step, cudaStream_t stream) {
    const long width = (long)kv_heads * head_dim, count = tokens * width;
    if (count == 0) return;
    const long blocks = std::min<long>(4096, (count + 255) / 256);
    LAUNCH_KERNEL(kv_replay_step_kernel, (unsigned)blocks, 256, 0, stream, k, v, k_scale, v_scale, count, width, head_dim,
                  step == KvReplayGpuStep::ToCodes);
}

// att [rows][heads * head_dim], lse [rows][heads]: the rows with decode_row[t] != 0 take decode_att's
// and decode_lse's.
static __global__ void kv_replay_keep_decode_rows_kernel(__nv_bfloat16* att, float* lse, const __nv_bfloat16* decode_att,
                                                         const float* decode_lse, const uint8_t* decode_row, long rows,
                                                         int heads, int head_dim) {
    const long width = (long)heads * head_dim;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * width; i += (long)gridDim.x * blockDim.x) {
        const long t = i / width;
        if (!decode_row[t]) continue;
        att[i] = decode_att[i];
        if (i % width < heads) lse[t * heads + i % width] = decode_lse[t * heads + i % width];
    }
}

inline void kv_replay_keep_decode_rows(__nv_bfloat16* att, float* lse, const __nv_bfloat16* decode_att, const float* decode_lse,
                                       const uint8_t* decode_row, long rows, int heads, int head_dim, cudaStream_t stream) {
    const long count = rows * heads * head_dim;
    if (count == 0) return;
    const long blocks = std::min<long>(4096, (count + 255) / 256);
    LAUNCH_KERNEL(kv_replay_keep_decode_rows_kernel, (unsigned)blocks, 256, 0, stream, att, lse, decode_att, decode_lse,
                  decode_row, rows, heads, head_dim);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_KV_REPLAY_CUH
