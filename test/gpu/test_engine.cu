// test_engine.cu: the GPU engine (cuda/engine/engine_gpu.cuh) against the CPU engine (cpu/engine_cpu.h) on
// the fixture models: log-probs and entropies of ragged packed batches in bf16 and fp8, and the
// gradients of one backward, tensor by tensor; backward adds to the gradients (micro-batches);
// --recompute layer changes no bit; --train_kv_replay's forwards and backward.
//
// The bound, justified: the CPU engine rounds where the GPU kernels round, in their order (the
// attention kernels' key tiles, running max, rescaling and BF16 probabilities, cpu/attention.h; dq,
// dk, dv stored in BF16 before RoPE's backward; the head's BF16 dlogits), so all that may remain
// between the two is FP32 rounding: the order of a tensor core's sums, the device's log. The CPU
// engine's fp32 run rounds nowhere; the distance of its bf16 (fp8) run from it is that precision's
// error. The GPU must be within a tenth of it: RMS of (GPU - CPU) at most 0.1 x the RMS of (CPU -
// CPU fp32), for log-probs and entropies and for each gradient tensor's relative Frobenius distance.
// Rounding the normalised instead of the unnormalised probabilities, or one BF16 rounding more or
// less anywhere, moves the GPU by a good fraction of the precision's own error and fails it. In
// emulation the tensor-core products are the CPU's FMA chains and exp (attention's exp2, ex2.approx's
// twin in rl/numerics/exp2.h) is the CPU's, so the two engines agree bit for bit, and that is checked too.
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/engine_cpu.h"
#include "cuda/engine/engine_gpu.cuh"
#include "rl/model/init_model.h"
#include "test/gpu/bench_model.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"
#include "test/temp_dir.h"

using namespace fp8rl;

namespace {

constexpr double kOracleBound = 0.1;  // GPU vs CPU, as a fraction of the CPU's distance to fp32

// Ragged sequences over the vocabulary: lengths not multiples of 16, a one-token prompt, long ones
// (the first three only under the sanitizer, where the emulation runs ~3x slower).
std::vector<Sequence> ragged_batch(int V, uint32_t seed) {
    // 141 tokens: three key tiles of the attention kernels, so the running max rescales
    const int lengths[] = {7, 33, 2, 61, 19, 141}, prompts[] = {3, 10, 1, 20, 19 - 4, 30};
    std::vector<Sequence> seqs;
    for (int s = 0; s < (harness::sanitized ? 3 : 6); s++) {
        Sequence q;
        for (int i = 0; i < lengths[s]; i++) q.ids.push_back((int32_t)((hash_uniform(s * 1000 + i, seed) + 1.0f) * 0.5f * (V - 1)));
        q.prompt_len = prompts[s];
        seqs.push_back(q);
    }
    return seqs;
}

double rms_distance(const TokenValues& a, const TokenValues& b) {
    double s = 0;
    long n = 0;
    for (size_t i = 0; i < a.size(); i++)
        for (size_t k = 0; k < a[i].size(); k++, n++) s += ((double)a[i][k] - b[i][k]) * ((double)a[i][k] - b[i][k]);
    return std::sqrt(s / std::max(n, 1L));
}

// d(loss)/d(logprob), d(loss)/d(entropy) per response position: fixed pseudo-random values.
TokenValues pseudo_gradients(const std::vector<Sequence>& seqs, uint32_t seed) {
    TokenValues d(seqs.size());
    for (size_t s = 0; s < seqs.size(); s++)
        for (int k = 0; k < seqs[s].response_len(); k++) d[s].push_back(0.1f * hash_uniform(s * 100 + k, seed));
    return d;
}

double relative_distance(const float* a, const float* b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return std::sqrt(d / std::max(r, 1e-300));
}

// precisions: those compared (bf16 does not depend on options.fp8_scaling). options.train_kv_replay:
// each engine first samples two tokens after every prompt with an FP8 KV cache, whose scales its
// replayed forwards read (the same in both engines: checked in emulation).
void compare_engines(const std::string& dir, const EngineOptions& options = {},
                     const std::vector<Precision>& precisions = {Precision::BF16, Precision::FP8}) {
    CpuEngine cpu(dir, options);
    GpuEngine gpu(dir, options);
    const std::string name = dir.substr(dir.rfind('/') + 1) +
                             (options.fp8_scaling == Fp8Scaling::Block ? "" : std::string(" ") + fp8_scaling_name(options.fp8_scaling)) +
                             (options.train_kv_replay ? " replay" : "");
    const ModelConfig& c = cpu.config();
    const std::vector<Sequence> seqs = ragged_batch((int)c.vocab_size, 7);
    if (options.train_kv_replay) {
        std::vector<GenRequest> requests;
        for (size_t s = 0; s < seqs.size(); s++)
            requests.push_back({std::vector<int32_t>(seqs[s].ids.begin(), seqs[s].ids.begin() + seqs[s].prompt_len), (uint32_t)s});
        SamplingConfig sampling;
        sampling.max_new_tokens = 2;
        cpu.generate(requests, 0, sampling, Precision::FP8, Precision::FP8, nullptr);
        gpu.generate(requests, 0, sampling, Precision::FP8, Precision::FP8, nullptr);
        std::vector<float> ck, cv, gk, gv;
        cpu.last_kv_scales(&ck, &cv);
        gpu.last_kv_scales(&gk, &gv);
        CHECK(!ck.empty() && ck.size() == gk.size());
        if (emulated) CHECK_MSG(ck == gk && cv == gv, "the engines' FP8 KV scales differ in emulation");
    }
    TokenValues ref_lp, ref_ent;
    cpu.logprobs(seqs, Precision::FP32, 0.8f, &ref_lp, &ref_ent);
    for (Precision p : precisions) {
        TokenValues c_lp, c_ent, g_lp, g_ent;
        cpu.logprobs(seqs, p, 0.8f, &c_lp, &c_ent);
        gpu.logprobs(seqs, p, 0.8f, &g_lp, &g_ent);
        const double lp_gpu = rms_distance(g_lp, c_lp), lp_ref = rms_distance(c_lp, ref_lp), lp_fp32 = rms_distance(g_lp, ref_lp);
        const double ent_gpu = rms_distance(g_ent, c_ent), ent_ref = rms_distance(c_ent, ref_ent),
                     ent_fp32 = rms_distance(g_ent, ref_ent);
        printf("    %-22s %s log-prob RMS gpu-cpu %.3g, gpu-fp32 %.3g, cpu-fp32 %.3g (ratio %.3g); entropy %.3g, %.3g, "
               "%.3g (ratio %.3g)\n",
               name.c_str(), precision_name(p), lp_gpu, lp_fp32, lp_ref, lp_gpu / lp_ref, ent_gpu,
               ent_fp32, ent_ref, ent_gpu / ent_ref);
        CHECK_MSG(lp_gpu <= kOracleBound * lp_ref, "%s %s log-probs: gpu-cpu %.3g > %g x cpu-fp32 %.3g", dir.c_str(),
                  precision_name(p), lp_gpu, kOracleBound, lp_ref);
        CHECK_MSG(ent_gpu <= kOracleBound * ent_ref, "%s %s entropies: gpu-cpu %.3g > %g x cpu-fp32 %.3g", dir.c_str(),
                  precision_name(p), ent_gpu, kOracleBound, ent_ref);
        if (emulated) CHECK_MSG(lp_gpu == 0 && ent_gpu == 0, "%s %s: log-probs or entropies differ from the CPU engine's "
                                 "in emulation (RMS %.3g, %.3g)", dir.c_str(), precision_name(p), lp_gpu, ent_gpu);
    }
    // one backward per precision, gradients tensor by tensor
    AdamWConfig adam;
    cpu.init_optimizer(adam, one_rank());
    gpu.init_optimizer(adam, one_rank());
    const TokenValues d_lp = pseudo_gradients(seqs, 21), d_ent = pseudo_gradients(seqs, 22);
    auto cpu_grads = [&](Precision p) {
        TokenValues lp, ent;
        cpu.zero_grads();
        cpu.forward_train(seqs, p, 0.8f, &lp, &ent);
        cpu.backward(d_lp, d_ent);
        return cpu.gradients();
    };
    const std::vector<float> g_ref = cpu_grads(Precision::FP32);
    const ModelWeights table = ModelWeights::load(dir, false);
    for (Precision p : precisions) {
        const std::vector<float> g_cpu = cpu_grads(p);
        TokenValues lp, ent;
        gpu.zero_grads();
        gpu.forward_train(seqs, p, 0.8f, &lp, &ent);
        gpu.backward(d_lp, d_ent);
        const std::vector<float> g_gpu = gpu.gradients();
        double worst = 0;
        std::string worst_name;
        for (const TensorInfo& t : table.tensors) {
            const double gpu_cpu = relative_distance(&g_gpu[t.offset], &g_cpu[t.offset], t.numel);
            const double cpu_ref = relative_distance(&g_cpu[t.offset], &g_ref[t.offset], t.numel);
            CHECK_MSG(gpu_cpu <= kOracleBound * cpu_ref, "%s %s gradient of %s: relative distance to the CPU %.3g > %g x "
                      "cpu-fp32 %.3g", dir.c_str(), precision_name(p), t.name.c_str(), gpu_cpu, kOracleBound, cpu_ref);
            if (emulated) CHECK_MSG(gpu_cpu == 0, "%s %s gradient of %s differs from the CPU engine's in emulation (%.3g)",
                                     dir.c_str(), precision_name(p), t.name.c_str(), gpu_cpu);
            const double ratio = gpu_cpu / (cpu_ref + 1e-30);
            if (ratio >= worst) worst = ratio, worst_name = t.name;
        }
        printf("    %-22s %s gradients: worst tensor %s at %.3g of the cpu-vs-fp32 distance\n",
               name.c_str(), precision_name(p), worst_name.c_str(), worst);
    }
}

}  // namespace

TEST(gpu_engine_matches_cpu_engine_qwen3) {
    REQUIRE_GPU();
    compare_engines("test/fixtures/models/qwen3_tiny");
}
TEST(gpu_engine_matches_cpu_engine_qwen2_biases) {
    REQUIRE_GPU();
    compare_engines("test/fixtures/models/qwen2_tiny");
}
TEST(gpu_engine_matches_cpu_engine_llama3_untied) {
    REQUIRE_GPU();
    compare_engines("test/fixtures/models/llama_tiny");
}
TEST(gpu_engine_matches_cpu_engine_gqa3_dims_not_multiples_of_128) {
    REQUIRE_GPU();
    compare_engines("test/fixtures/models/qwen3_gqa3_tiny");
}
// --fp8_scaling row and tensor: the OUTER_VEC and SCALAR GEMMs, the two-pass quantizers and the
// weights' copies, in the forward and the backward, against the CPU oracle at the same granularity.
// --train_kv_replay: the old-log-prob and training forwards' attention reads the FP8 cache (prompt
// rows as the prefill, response rows as decode: cpu/model.h's replayed_attention), per KV head scales.
TEST(gpu_engine_matches_cpu_engine_kv_replay) {
    REQUIRE_GPU();
    EngineOptions o;
    o.train_kv_replay = true;
    o.kv_scale_per_head = true;
    compare_engines("test/fixtures/models/qwen3_tiny", o, {Precision::FP8});
}

// A random one-layer Qwen3 whose every projection is a multiple of 128 on both sides (hidden 128, 2
// heads of 128 over 1 KV head, intermediate 256, vocabulary 512; no fixture is), in fp8, bit for bit
// against the CPU engine:
// - head dim 128 (Qwen3's; the fixtures' are 8 to 32): the attention forward writes the O
//   projection's FP8 operand itself (cuda/kernels/attention.cuh), in the log-prob (prefill) forward
//   and the training forward;
// - the trainer's projection GEMMs on fp8rl's own block-scaled FP8 kernel (--fp8_gemm_kernel own, the
//   default; the fixtures fall back to cuBLASLt): the batch pads to 384 tokens, so each fp8 fprop,
//   dgrad and wgrad of the log-prob pass, the training forward and the backward runs it: 4
//   projections (q|k|v, o, gate|up, down) x (2 forwards + dgrad + wgrad) = 16 launches, counted in
//   emulation.
TEST(gpu_engine_matches_cpu_engine_head_dim_128_own_fp8_gemm) {
    REQUIRE_GPU();
    const std::string dir = harness::scratch_dir() + "/engine_head_dim_128";
    write_random_model(dir, bench_model_config({"head_dim_128", 128, 256, 1, 2, 1, 128, 512}), {}, 1);
#ifdef FP8RL_EMU
    emu::start_stats();
#endif
    compare_engines(dir, {}, {Precision::FP8});
#ifdef FP8RL_EMU
    emu::stop_stats();
    const emu::RangeStats counted = emu::total_stats();
    const auto launches = counted.kernels.find("fp8_block_gemm_kernel");
    const uint64_t own = launches == counted.kernels.end() ? 0 : launches->second;
    printf("    fp8_block_gemm_kernel launches: %llu (want 16)\n", (unsigned long long)own);
    CHECK_EQ(own, (uint64_t)16);
#endif
}

TEST(gpu_engine_matches_cpu_engine_row_and_tensor_scaling) {
    REQUIRE_GPU();
    for (Fp8Scaling s : {Fp8Scaling::Row, Fp8Scaling::Tensor}) {
        EngineOptions o;
        o.fp8_scaling = s;
        compare_engines("test/fixtures/models/qwen3_tiny", o, {Precision::FP8});
    }
}

namespace {

const char* const kAccumulationModels[] = {"test/fixtures/models/qwen3_tiny", "test/fixtures/models/qwen2_tiny",
                                           "test/fixtures/models/llama_tiny"};

// One backward of seqs[b, e) after zero_grads (or, accumulate, on top of what the gradients hold).
std::vector<float> backward_of(GpuEngine& gpu, const std::vector<Sequence>& seqs, size_t b, size_t e, Precision p,
                               bool accumulate) {
    const std::vector<Sequence> part(seqs.begin() + (long)b, seqs.begin() + (long)e);
    TokenValues lp, ent;
    if (!accumulate) gpu.zero_grads();
    gpu.forward_train(part, p, 0.8f, &lp, &ent);
    gpu.backward(pseudo_gradients(part, 21), pseudo_gradients(part, 22));
    return gpu.gradients();
}

}  // namespace

// backward() adds to the gradients on every path (linear wgrad, biases, norms, head, embedding;
// tied or not): two micro-batches' backwards without zero_grads in between give the sum of their
// gradients taken apart. Per tensor the relative distance is at most 1e-5: the two differ only by
// where a float addition rounds (one addition per contribution either way); a path that overwrote
// would lose a whole micro-batch's share, a distance of order 1.
TEST(gpu_engine_backward_adds_to_the_gradients) {
    REQUIRE_GPU();
    for (const char* dir : kAccumulationModels) {
        GpuEngine gpu(dir);
        gpu.init_optimizer(AdamWConfig(), one_rank());
        const std::vector<Sequence> seqs = ragged_batch((int)gpu.config().vocab_size, 7);
        const size_t half = seqs.size() / 2;
        const ModelWeights table = ModelWeights::load(dir, false);
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            const std::vector<float> a = backward_of(gpu, seqs, 0, half, p, false);
            const std::vector<float> b = backward_of(gpu, seqs, half, seqs.size(), p, false);
            backward_of(gpu, seqs, 0, half, p, false);
            const std::vector<float> ab = backward_of(gpu, seqs, half, seqs.size(), p, true);
            std::vector<float> sum(a.size());
            for (size_t i = 0; i < a.size(); i++) sum[i] = a[i] + b[i];
            double worst = 0;
            for (const TensorInfo& t : table.tensors) {
                const double d = relative_distance(&ab[t.offset], &sum[t.offset], t.numel);
                CHECK_MSG(d <= 1e-5, "%s %s gradient of %s: accumulated vs summed apart %.3g", dir, precision_name(p),
                          t.name.c_str(), d);
                worst = std::max(worst, d);
            }
            printf("    %-22s %s: accumulated vs summed apart, worst tensor %.3g\n", dir + std::string(dir).rfind('/') + 1,
                   precision_name(p), worst);
        }
    }
}

// --recompute layer: the same log-probs, entropies and gradients as keeping every activation, bit
// for bit (the kernels are deterministic and the recomputation reads the same layer input).
TEST(gpu_engine_recompute_layer_is_bit_exact) {
    REQUIRE_GPU();
    EngineOptions recompute;
    recompute.recompute_layer = true;
    for (const char* dir : kAccumulationModels) {
        GpuEngine keep(dir), again(dir, recompute);
        keep.init_optimizer(AdamWConfig(), one_rank());
        again.init_optimizer(AdamWConfig(), one_rank());
        const std::vector<Sequence> seqs = ragged_batch((int)keep.config().vocab_size, 7);
        for (Precision p : {Precision::BF16, Precision::FP8}) {
            TokenValues lp[2], ent[2];
            GpuEngine* engines[2] = {&keep, &again};
            std::vector<float> grads[2];
            for (int e = 0; e < 2; e++) {
                engines[e]->zero_grads();
                engines[e]->forward_train(seqs, p, 0.8f, &lp[e], &ent[e]);
                engines[e]->backward(pseudo_gradients(seqs, 21), pseudo_gradients(seqs, 22));
                grads[e] = engines[e]->gradients();
            }
            auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
                return x.size() == y.size() && (x.empty() || memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
            };
            bool values_equal = true;
            for (size_t s = 0; s < seqs.size(); s++)
                values_equal = values_equal && same_bits(lp[0][s], lp[1][s]) && same_bits(ent[0][s], ent[1][s]);
            CHECK_MSG(values_equal, "%s %s: log-probs or entropies differ with --recompute layer", dir, precision_name(p));
            CHECK_MSG(same_bits(grads[0], grads[1]), "%s %s: gradients differ with --recompute layer", dir, precision_name(p));
            double norm = 0;
            for (float g : grads[0]) norm += (double)g * g;
            CHECK_MSG(norm > 0, "%s %s: zero gradients, nothing compared", dir, precision_name(p));
        }
    }
}

// The fused head's step (forward_backward_train: each token block's logits once, the loss's gradients
// asked of the caller as the block's log-probs are known) equals forward_train then backward of the
// same gradients bit for bit: log-probs, entropies, top-1 hits and every gradient. The gradients
// depend on the log-probs and entropies (as the RL loss's do), so a stale or misplaced row shows.
// One model (the head's bits are test_loss_head.cu's; this is the engine's plumbing: rows, buckets).
TEST(gpu_engine_fused_head_step_is_bit_exact) {
    REQUIRE_GPU();
    for (const char* dir : {"test/fixtures/models/qwen3_tiny"}) {
        GpuEngine gpu(dir);
        gpu.init_optimizer(AdamWConfig(), one_rank());
        const std::vector<Sequence> seqs = ragged_batch((int)gpu.config().vocab_size, 7);
        const TokenValues a = pseudo_gradients(seqs, 21), b = pseudo_gradients(seqs, 22);
        auto grad = [&](size_t s, size_t k, float lp, float ent, float* dlp, float* dent) {
            *dlp = a[s][k] * (1.0f + lp / 8), *dent = b[s][k] * ent;
        };
        for (Precision p : {Precision::FP8}) {
            TokenValues lp[2], ent[2], top1[2];
            std::vector<float> grads[2];
            gpu.zero_grads();
            gpu.forward_train(seqs, p, 0.8f, &lp[0], &ent[0]);
            gpu.last_train_top1(&top1[0]);
            TokenValues dlp(seqs.size()), dent(seqs.size());
            for (size_t s = 0; s < seqs.size(); s++) {
                dlp[s].resize(lp[0][s].size()), dent[s].resize(lp[0][s].size());
                for (size_t k = 0; k < lp[0][s].size(); k++) grad(s, k, lp[0][s][k], ent[0][s][k], &dlp[s][k], &dent[s][k]);
            }
            gpu.backward(dlp, dent);
            grads[0] = gpu.gradients();
            gpu.zero_grads();
            gpu.forward_backward_train(seqs, p, 0.8f, &lp[1], &ent[1], grad);
            gpu.last_train_top1(&top1[1]);
            grads[1] = gpu.gradients();
            auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
                return x.size() == y.size() && (x.empty() || memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
            };
            bool values_equal = true;
            for (size_t s = 0; s < seqs.size(); s++)
                values_equal = values_equal && same_bits(lp[0][s], lp[1][s]) && same_bits(ent[0][s], ent[1][s]) &&
                               same_bits(top1[0][s], top1[1][s]);
            long differing = 0;
            for (size_t i = 0; i < grads[0].size() && i < grads[1].size(); i++)
                differing += memcmp(&grads[0][i], &grads[1][i], sizeof(float)) != 0;
            double norm = 0;
            for (float g : grads[0]) norm += (double)g * g;
            printf("    %-22s %s: fused step vs forward + backward: %ld of %zu gradients differ; values %s\n",
                   dir + std::string(dir).rfind('/') + 1, precision_name(p), differing, grads[0].size(),
                   values_equal ? "equal" : "DIFFER");
            CHECK_MSG(values_equal, "%s %s: log-probs, entropies or top-1 differ in the fused step", dir, precision_name(p));
            CHECK_MSG(same_bits(grads[0], grads[1]), "%s %s: gradients differ in the fused step", dir, precision_name(p));
            CHECK_MSG(norm > 0, "%s %s: zero gradients, nothing compared", dir, precision_name(p));
        }
    }
}

// One FP8 weight copy (EngineOptions::one_fp8_weight_copy: the transposed copy made before each
// dgrad, BF16 passes cast layer by layer from the master, a compacted BF16 copy of the rest) trains
// what the engine with both FP8 copies and the whole BF16 copy trains, bit for bit: over two
// updates the training forward's log-probs and entropies, the gradients, the master weights after
// each update, the BF16 pass (Calibrated Clipping's shadow log-probs), an fp8 generation and the
// saved checkpoint's weights. The test's engines are one rank (ZeRO's gathers: the train_rl_emu tests).
TEST(gpu_engine_one_fp8_weight_copy_trains_what_two_copies_train) {
    REQUIRE_GPU();
    EngineOptions one;
    one.one_fp8_weight_copy = true;
    auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
        return x.size() == y.size() && (x.empty() || memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    };
    auto same_values = [&](const TokenValues& x, const TokenValues& y) {
        bool same = x.size() == y.size();
        for (size_t s = 0; same && s < x.size(); s++) same = same_bits(x[s], y[s]);
        return same;
    };
    // biases and a tied head; an untied head (the compacted BF16 copy's last run); under the sanitizer the latter
    const std::vector<const char*> models = harness::sanitized ? std::vector<const char*>{"test/fixtures/models/llama_tiny"}
                                                               : std::vector<const char*>{"test/fixtures/models/qwen2_tiny",
                                                                                          "test/fixtures/models/llama_tiny"};
    for (const char* dir : models) {
        GpuEngine two_copies(dir), one_copy(dir, one);
        GpuEngine* engines[2] = {&two_copies, &one_copy};
        for (GpuEngine* e : engines) e->init_optimizer(AdamWConfig(), one_rank());
        const std::vector<Sequence> seqs = ragged_batch((int)two_copies.config().vocab_size, 7);
        for (int step = 0; step < 2; step++) {
            TokenValues lp[2], ent[2], shadow[2];
            std::vector<float> grads[2], master[2];
            for (int e = 0; e < 2; e++) {
                engines[e]->logprobs(seqs, Precision::FP32, 0.8f, &shadow[e], nullptr);  // the BF16 pass
                engines[e]->zero_grads();
                engines[e]->forward_train(seqs, Precision::FP8, 0.8f, &lp[e], &ent[e]);
                engines[e]->backward(pseudo_gradients(seqs, 21 + step), pseudo_gradients(seqs, 22 + step));
                grads[e] = engines[e]->gradients();
                engines[e]->reduce_and_clip_grads(1.0);
                engines[e]->optimizer_step(1e-2);
                master[e] = engines[e]->master_weights();
            }
            CHECK_MSG(same_values(shadow[0], shadow[1]), "%s step %d: the BF16 pass differs with one FP8 weight copy", dir, step);
            CHECK_MSG(same_values(lp[0], lp[1]) && same_values(ent[0], ent[1]),
                      "%s step %d: the fp8 training forward differs with one FP8 weight copy", dir, step);
            CHECK_MSG(same_bits(grads[0], grads[1]), "%s step %d: gradients differ with one FP8 weight copy", dir, step);
            CHECK_MSG(same_bits(master[0], master[1]), "%s step %d: weights after the update differ with one FP8 weight copy",
                      dir, step);
            double norm = 0;
            for (float g : grads[0]) norm += (double)g * g;
            CHECK_MSG(norm > 0, "%s: zero gradients, nothing compared", dir);
        }
        std::vector<GenRequest> requests;
        for (uint32_t i = 0; i < 3; i++) requests.push_back({std::vector<int32_t>(seqs[i].ids.begin(), seqs[i].ids.begin() + seqs[i].prompt_len), i});
        SamplingConfig s;
        s.max_new_tokens = 4;
        const std::vector<Generation> a = two_copies.generate(requests, 1, s, Precision::FP8, Precision::FP8, nullptr);
        const std::vector<Generation> b = one_copy.generate(requests, 1, s, Precision::FP8, Precision::FP8, nullptr);
        bool same = a.size() == b.size();
        for (size_t i = 0; same && i < a.size(); i++) same = a[i].tokens == b[i].tokens && same_bits(a[i].logprobs, b[i].logprobs);
        CHECK_MSG(same, "%s: an fp8 generation differs with one FP8 weight copy", dir);
        harness::TempDir tmp;
        two_copies.save_hf(tmp / "two"), one_copy.save_hf(tmp / "one");
        CHECK_MSG(same_bits(ModelWeights::load(tmp / "two").master, ModelWeights::load(tmp / "one").master),
                  "%s: the saved checkpoint's weights differ with one FP8 weight copy", dir);
    }
}

// --save_format fp8 from the GPU engine: the export holds the device's FP8 weight copy, which after an
// update is the CPU quantizer's copy of the updated master, bit for bit; a fresh engine's export is
// the CPU engine's file byte for byte (v_proj of qwen3_tiny starts at row 192: quantized alone on both).
TEST(gpu_engine_fp8_export_is_its_fp8_copy) {
    REQUIRE_GPU();
    const std::string dir = harness::model_fixtures + "qwen3_tiny";
    harness::TempDir tmp;
    GpuEngine gpu(dir);
    CpuEngine cpu(dir);
    TrainerState gs, cs;
    gpu.save_state(gs), cpu.save_state(cs);
    std::filesystem::create_directories(tmp / "gpu"), std::filesystem::create_directories(tmp / "cpu");
    CHECK_EQ(gpu.save_hf_fp8(tmp / "gpu", gs.master), cpu.save_hf_fp8(tmp / "cpu", cs.master));
    CHECK_MSG(read_file(tmp / "gpu/model.safetensors") == read_file(tmp / "cpu/model.safetensors"),
              "the GPU engine's FP8 export differs from the CPU engine's");
    gpu.init_optimizer(AdamWConfig(), one_rank());
    const std::vector<Sequence> seqs = ragged_batch((int)gpu.config().vocab_size, 3);
    TokenValues lp, ent;
    gpu.zero_grads();
    gpu.forward_train(seqs, Precision::FP8, 1.0f, &lp, &ent);
    gpu.backward(pseudo_gradients(seqs, 5), pseudo_gradients(seqs, 6));
    gpu.reduce_and_clip_grads(1.0);
    gpu.optimizer_step(1e-2);
    const std::vector<float> master = gpu.master_weights();
    const std::vector<Fp8Tensor> copies = gpu.fp8_weight_copies();
    const ModelWeights table = ModelWeights::load(dir, false);
    const CpuModel model(table);
    size_t compared = 0, differ = 0;
    for (int l = 0; l < cpu.config().num_layers; l++)
        for (int j = 0; j < kProjections; j++) {
            const Fp8Tensor& g = copies[(size_t)l * kProjections + j];
            const LinearWeight w = model.projection(l, (Projection)j, master.data());
            const Fp8Tensor want = fp8_quantize_blockwise(w.w, w.N, w.K, false);
            differ += g.data != want.data || g.scale_inv != want.scale_inv;
            compared++;
        }
    CHECK_MSG(differ == 0 && compared > 0, "%zu of %zu FP8 copies after an update differ from the quantized master", differ, compared);
}
