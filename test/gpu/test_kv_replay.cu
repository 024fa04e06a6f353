// --train_kv_replay's GPU step (cuda/kernels/kv_replay.cuh) against the CPU engine's
// (cpu/kv_cache.h kv_fp8_round_trip): the same BF16 K and V, scales per KV head, values beyond
// 448 x scale (satfinite) and zeros: every output bit for bit.
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/kv_cache.h"
#include "cuda/kernels/kv_replay.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

TEST(gpu_kv_replay_matches_cpu_round_trip) {
    REQUIRE_GPU();
    const int T = 37, KV = 3, D = 64;
    const std::vector<float> k_scale = {0.004f, 0.011f, 0.0007f}, v_scale = {0.002f, 0.0013f, 0.03f};
    std::vector<float> k((size_t)T * KV * D), v(k.size());
    for (size_t i = 0; i < k.size(); i++) {  // |x| up to ~2.5: beyond 448 x 0.004 for some, so satfinite codes occur
        k[i] = round_bf16(2.5f * std::sin(0.37f * (float)i) * (i % 7 == 0 ? 1.0f : 0.3f));
        v[i] = i % 11 == 0 ? 0.0f : round_bf16(1.7f * std::cos(0.21f * (float)i));
    }
    DeviceBuffer<__nv_bfloat16> dk(to_bf16(k)), dv(to_bf16(v));
    DeviceBuffer<float> dks(k_scale), dvs(v_scale);
    kv_replay_round_trip(dk.ptr, dv.ptr, dks.ptr, dvs.ptr, T, KV, D, 0);
    const std::vector<float> gk = to_float(dk.download()), gv = to_float(dv.download());
    std::vector<float> ck = k, cv = v;
    kv_fp8_round_trip(ck.data(), cv.data(), T, KV, D, k_scale.data(), v_scale.data(), true);
    int differ = 0, changed = 0, saturated = 0;
    for (size_t i = 0; i < k.size(); i++) {
        differ += memcmp(&gk[i], &ck[i], 4) != 0;
        differ += memcmp(&gv[i], &cv[i], 4) != 0;
        changed += ck[i] != k[i];
        saturated += std::fabs(ck[i]) >= round_bf16(448.0f * k_scale[i % (KV * D) / D]) * 0.99f;
    }
    CHECK_MSG(differ == 0, "%d of %zu replayed K/V values differ from the CPU engine's", differ, 2 * k.size());
    CHECK(changed > (int)k.size() / 2);  // E4M3 moves most values
    CHECK(saturated > 0);
}
