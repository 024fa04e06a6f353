// --train_kv_replay's GPU steps (cuda/kernels/kv_replay.cuh) against the CPU engine's
// (cpu/kv_cache.h kv_fp8_replay, cpu/model.h replayed_attention): the same BF16 K and V, scales per
// KV head, values beyond 448 x scale (satfinite) and zeros, every output bit for bit; the two steps
// together equal the prefill's round trip (kv_cache.cuh's kv_round_trip_kernel); attention with the KV
// heads' scales equals attention over the scaled values where the scales are powers of two (then
// both are exact); the decode rows keep their own output.
#include <cmath>
#include <cstring>
#include <vector>

#ifdef __CUDACC__
#pragma nv_diag_suppress 177  // cpu/gemm.h: a variable only an OpenMP if() clause reads (see test_fp8_gemm.cu)
#endif
#include "cpu/attention.h"
#ifdef __CUDACC__
#pragma nv_diag_default 177
#endif
#include "cpu/kv_cache.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/kv_replay.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

int bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
    int differ = 0;
    for (size_t i = 0; i < a.size(); i++) differ += memcmp(&a[i], &b[i], 4) != 0;
    return differ;
}

}  // namespace

TEST(gpu_kv_replay_steps_match_cpu) {
    REQUIRE_GPU();
    const int T = 37, KV = 3, D = 64;
    const long width = (long)KV * D;
    const std::vector<float> k_scale = {0.004f, 0.011f, 0.0007f}, v_scale = {0.002f, 0.0013f, 0.03f};
    std::vector<float> k((size_t)T * width), v(k.size());
    for (size_t i = 0; i < k.size(); i++) {  // |x| up to ~2.5: beyond 448 x 0.004 for some, so satfinite codes occur
        k[i] = round_bf16(2.5f * std::sin(0.37f * (float)i) * (i % 7 == 0 ? 1.0f : 0.3f));
        v[i] = i % 11 == 0 ? 0.0f : round_bf16(1.7f * std::cos(0.21f * (float)i));
    }
    DeviceBuffer<__nv_bfloat16> dk(to_bf16(k)), dv(to_bf16(v)), rk(to_bf16(k)), rv(to_bf16(v));
    DeviceBuffer<float> dks(k_scale), dvs(v_scale);
    std::vector<float> ck = k, cv = v;
    kv_replay_step(dk.ptr, dv.ptr, dks.ptr, dvs.ptr, T, KV, D, KvReplayGpuStep::ToCodes, 0);
    kv_fp8_replay(ck.data(), cv.data(), T, KV, D, k_scale.data(), v_scale.data(), KvReplayStep::ToCodes, true);
    const int codes_differ = bits_differ(to_float(dk.download()), ck) + bits_differ(to_float(dv.download()), cv);
    int saturated = 0;
    for (float c : ck) saturated += std::fabs(c) == 448.0f;
    kv_replay_step(dk.ptr, dv.ptr, dks.ptr, dvs.ptr, T, KV, D, KvReplayGpuStep::ToStored, 0);
    kv_fp8_replay(ck.data(), cv.data(), T, KV, D, k_scale.data(), v_scale.data(), KvReplayStep::ToStored, true);
    const std::vector<float> gk = to_float(dk.download()), gv = to_float(dv.download());
    LAUNCH_KERNEL(kv_round_trip_kernel, 8, 256, 0, 0, rk.ptr, rv.ptr, dks.ptr, dvs.ptr, T * width, width, D);
    int changed = 0;
    for (size_t i = 0; i < k.size(); i++) changed += ck[i] != k[i];
    CHECK_MSG(codes_differ == 0, "%d of %zu E4M3 code values differ from the CPU engine's", codes_differ, 2 * k.size());
    CHECK_MSG(bits_differ(gk, ck) + bits_differ(gv, cv) == 0, "stored values differ from the CPU engine's");
    CHECK_MSG(bits_differ(gk, to_float(rk.download())) + bits_differ(gv, to_float(rv.download())) == 0,
              "codes then stored values differ from the prefill's round trip");
    CHECK(changed > (int)k.size() / 2);  // E4M3 moves most values
    CHECK(saturated > 0);
}

// Power-of-two scales per KV head (a wrong head's scale would differ by 2x or more): folding them into
// the scores' and the output's factors is exact, so the result equals attention over code x scale.
TEST(gpu_attention_kv_scales_equal_scaled_values) {
    REQUIRE_GPU();
    const int H = 4, KV = 2, D = 16;
    const std::vector<int64_t> offsets = {0, 5, 70, 71};
    const long T = offsets.back(), ldk = (long)KV * D;
    const std::vector<float> k_scale = {0.25f, 4.0f}, v_scale = {2.0f, 0.125f};
    std::vector<float> q((size_t)T * H * D), codes_k((size_t)T * ldk), codes_v(codes_k.size());
    for (size_t i = 0; i < q.size(); i++) q[i] = round_bf16(0.3f * std::sin(0.7f * (float)i));
    for (size_t i = 0; i < codes_k.size(); i++) {
        codes_k[i] = e4m3_to_float(float_to_e4m3(30.0f * std::cos(0.3f * (float)i)));
        codes_v[i] = e4m3_to_float(float_to_e4m3(20.0f * std::sin(0.11f * (float)i + 1.0f)));
    }
    std::vector<float> k = codes_k, v = codes_v;
    for (size_t i = 0; i < k.size(); i++) k[i] *= k_scale[i % ldk / D], v[i] *= v_scale[i % ldk / D];
    const PackedAttentionShape s{T, H, KV, D, (int)offsets.size() - 1, 65};
    std::vector<int> cu(offsets.begin(), offsets.end());
    DeviceBuffer<int> dcu(cu);
    DeviceBuffer<__nv_bfloat16> dq(to_bf16(q)), dck(to_bf16(codes_k)), dcv(to_bf16(codes_v)), dk(to_bf16(k)), dv(to_bf16(v));
    DeviceBuffer<__nv_bfloat16> out_scaled(q.size()), out_plain(q.size());
    DeviceBuffer<float> lse_scaled((size_t)T * H), lse_plain((size_t)T * H), dks(k_scale), dvs(v_scale);
    attention_forward(out_scaled.ptr, lse_scaled.ptr, dq.ptr, dck.ptr, dcv.ptr, dcu.ptr, s, 0, dks.ptr, dvs.ptr);
    attention_forward(out_plain.ptr, lse_plain.ptr, dq.ptr, dk.ptr, dv.ptr, dcu.ptr, s, 0);
    CHECK_EQ(bits_differ(to_float(out_scaled.download()), to_float(out_plain.download())), 0);
    CHECK_EQ(bits_differ(lse_scaled.download(), lse_plain.download()), 0);
    // the CPU engine's attention, the same identity
    std::vector<float> co_scaled(q.size()), co_plain(q.size()), cl_scaled((size_t)T * H), cl_plain((size_t)T * H);
    attention_forward_packed(co_scaled.data(), cl_scaled.data(), q.data(), codes_k.data(), codes_v.data(), offsets, {H, KV, D},
                             true, k_scale.data(), v_scale.data());
    attention_forward_packed(co_plain.data(), cl_plain.data(), q.data(), k.data(), v.data(), offsets, {H, KV, D}, true);
    CHECK_EQ(bits_differ(co_scaled, co_plain) + bits_differ(cl_scaled, cl_plain), 0);
}

TEST(gpu_kv_replay_keeps_the_decode_rows) {
    REQUIRE_GPU();
    const long T = 6;
    const int H = 2, D = 8;
    const std::vector<uint8_t> decode_row = {0, 0, 1, 1, 0, 1};
    std::vector<float> att((size_t)T * H * D), decode_att(att.size()), lse((size_t)T * H), decode_lse(lse.size());
    for (size_t i = 0; i < att.size(); i++) att[i] = (float)i, decode_att[i] = -(float)i - 1;
    for (size_t i = 0; i < lse.size(); i++) lse[i] = 0.5f * (float)i, decode_lse[i] = -0.5f * (float)i - 1;
    DeviceBuffer<__nv_bfloat16> datt(to_bf16(att)), ddatt(to_bf16(decode_att));
    DeviceBuffer<float> dlse(lse), ddlse(decode_lse);
    DeviceBuffer<uint8_t> drow(decode_row);
    kv_replay_keep_decode_rows(datt.ptr, dlse.ptr, ddatt.ptr, ddlse.ptr, drow.ptr, T, H, D, 0);
    const std::vector<float> got_att = to_float(datt.download()), got_lse = dlse.download();
    int wrong = 0;
    for (size_t i = 0; i < att.size(); i++) wrong += got_att[i] != (decode_row[i / (H * D)] ? decode_att[i] : att[i]);
    for (size_t i = 0; i < lse.size(); i++) wrong += got_lse[i] != (decode_row[i / H] ? decode_lse[i] : lse[i]);
    CHECK_EQ(wrong, 0);
}
