// kv_replay.cuh: --train_kv_replay on the GPU engine. Before a training or old-log-prob forward's
// attention, one layer's K and V [T][kv_heads * D] (BF16, K after k-norm and RoPE) are replaced in
// place by what the rollout's FP8 cache stored for them and decode read back: E4M3 codes of x / scale
// times scale, rounded to BF16. That is the prefill's round trip (kv_cache.cuh's kv_round_trip_kernel,
// the cache's one rule for what decode reads), run here with the engine's copy of the rollout's
// scales, since the cache itself is not kept through the update. The backward is straight through:
// attention's dK and dV flow to the K and V as they were. cpu/kv_cache.h's kv_fp8_round_trip is the
// CPU engine's twin.
#ifndef FP8RL_CUDA_KV_REPLAY_CUH
#define FP8RL_CUDA_KV_REPLAY_CUH
#include <algorithm>

#include "kv_cache.cuh"

namespace fp8rl {

// k, v [tokens][kv_heads * head_dim] BF16; k_scale, v_scale [kv_heads] on the device.
inline void kv_replay_round_trip(__nv_bfloat16* k, __nv_bfloat16* v, const float* k_scale, const float* v_scale, long tokens,
                                 int kv_heads, int head_dim, cudaStream_t stream) {
    const long width = (long)kv_heads * head_dim, count = tokens * width;
    if (count == 0) return;
    const long blocks = std::min<long>(4096, (count + 255) / 256);
    LAUNCH_KERNEL(kv_round_trip_kernel, (unsigned)blocks, 256, 0, stream, k, v, k_scale, v_scale, count, width, head_dim);
}

}  // namespace fp8rl

#endif  // FP8RL_CUDA_KV_REPLAY_CUH
