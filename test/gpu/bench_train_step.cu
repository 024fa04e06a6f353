// bench_train_step.cu: one training step of the GPU engine (cuda/engine/engine_gpu.cuh through rl/driver/engine.h:
// forward_backward_train (the fused head, as the trainers run it), reduce_and_clip_grads, optimizer_step), bf16 against fp8 in the same run,
// on random models of Qwen3-0.6B and Qwen3-1.7B shape with the real vocabulary (bench_model.h):
// tokens/s and device memory three ways: the peak (the high-water mark of the engine's device bytes,
// DeviceArray's count in cuda/engine/device_array.cuh, from its construction through its steps), what
// cudaMemGetInfo says is used after the steps beyond what was before the engine (on a GPU that adds
// the allocator's rounding and cuBLASLt's and the CUDA context's own memory), and the memory plan's
// figure for this batch (cuda/engine/memory_plan.h, what train_rl checks before it allocates). The batch is
// 16 sequences of 1,024 tokens (--tiny: the tiny model, 2 of 48), random ids, pseudo-random
// d(loss)/d(logprob) and d(loss)/d(entropy); time: median of 3 steps after one. Beside each measured
// time and speedup, cuda/perf/perf_model.h's prediction for the same shapes, for the engine before issue 28
// (unfused) and after (fused); and the quantization apart from the GEMMs: each structure's standalone
// quantizer calls, each shape timed alone with CUDA events in this run, against the model.
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cuda/engine/engine_gpu.cuh"
#include "cuda/perf/perf_model.h"
#include "test/gpu/bench_model.h"
#include "test/gpu/bench_util.cuh"

using namespace fp8rl;

namespace {

struct Batch {
    std::vector<Sequence> seqs;
    TokenValues d_logprob, d_entropy;
    long tokens = 0;
};

Batch random_batch(int num_seqs, int length, long vocab) {
    Batch b;
    for (int s = 0; s < num_seqs; s++) {
        Sequence q;
        for (int i = 0; i < length; i++) q.ids.push_back((int32_t)((hash_uniform(s * 100003 + i, 5) + 1.0f) * 0.5f * (vocab - 1)));
        q.prompt_len = length / 8;
        b.d_logprob.emplace_back(), b.d_entropy.emplace_back();
        for (int k = 0; k < q.response_len(); k++) {
            b.d_logprob.back().push_back(1e-4f * hash_uniform(s * 100003 + k, 6));
            b.d_entropy.back().push_back(1e-5f * hash_uniform(s * 100003 + k, 7));
        }
        b.tokens += length;
        b.seqs.push_back(q);
    }
    return b;
}

struct StepResult {
    double ms;
    size_t peak, used;  // the engine's device high-water mark; cudaMemGetInfo's used bytes after the steps, less before
};

StepResult bench_step(const std::string& dir, Precision p, const Batch& batch, const Dist& dist) {
    const size_t used_before = cuda_mem_used(), live_before = device_bytes_live();
    reset_device_bytes_peak();
    GpuEngine engine(dir);
    engine.init_optimizer(AdamWConfig(), dist);
    const auto step = [&] {
        TokenValues lp, ent;
        engine.zero_grads();
        engine.forward_backward_train(batch.seqs, p, 1.0f, &lp, &ent, [&](size_t s, size_t k, float, float, float* dlp, float* dent) {
            *dlp = batch.d_logprob[s][k], *dent = batch.d_entropy[s][k];
        });
        engine.reduce_and_clip_grads(1.0);
        engine.optimizer_step(1e-6);
    };
    const double ms = median_ms(step, 3, 1, 1);
    CUDA_CHECK(cudaDeviceSynchronize());
    return {ms, device_bytes_peak() - live_before, cuda_mem_used() - used_before};
}

// The memory plan's bytes for training on this batch (no generation, no reference policy).
size_t planned_bytes(const std::string& dir, const Batch& batch, int length) {
    const ModelConfig c = load_model_config(dir);
    MemoryDemand d;
    d.tokens_per_forward = batch.tokens;
    d.longest_sequence = length;
    return plan_memory(c, GpuEngine::plan_request(c, EngineOptions(), d), GpuEngine::plan_constants()).total();
}

// The step as cuda/perf/perf_model.h sees it: this batch, the engine's head tile.
StepShape step_shape(const std::string& dir, int num_seqs, int length) {
    StepShape s;
    s.model = load_model_config(dir);
    s.tokens = (int64_t)num_seqs * length, s.seq_len = length;
    s.head_vocab_chunk = HEAD_VOCAB_CHUNK, s.head_token_block = HEAD_TOKEN_BLOCK;
    return s;
}

// Milliseconds one step spends in the model's standalone quantizer calls `ks` (the tile quantizer,
// fp8_gemm.cuh), each shape timed alone: {all, the weights' re-quantization}.
std::pair<double, double> measured_quantize_ms(const std::vector<KernelCost>& ks) {
    double all = 0, weights = 0;
    for (const KernelCost& k : ks) {
        if (k.cls != KernelClass::Quantize) continue;
        const int rows = (int)k.rows, cols = (int)k.cols;
        const size_t n = (size_t)rows * cols;
        DeviceBuffer<uint8_t> codes(n), codes_t(n);
        DeviceBuffer<float> scales(std::max(vec128_scale_count(rows, cols), blk128_scale_count(rows, cols))),
            scales_t(std::max(vec128_scale_count(cols, rows), blk128_scale_count(cols, rows)));
        double ms;
        if (k.weight) {
            DeviceBuffer<float> w(n);
            fill_uniform(w.ptr, n, 8, 0.05f);
            ms = median_ms([&] { fp8_quantize_blockwise_gpu(w.ptr, rows, cols, false, codes.ptr, scales.ptr, codes_t.ptr, scales_t.ptr, 0); });
            weights += ms * k.calls;
        } else {  // the engine's call for these outputs: one pass (rowwise), or the tile quantizer
            DeviceBuffer<__nv_bfloat16> x(n);
            fill_uniform(x.ptr, n, 9, 2.0f);
            Fp8RowsOut out;
            out.codes = codes.ptr, out.scale_inv = scales.ptr, out.rows = rows;
            const bool row = k.outputs & 1, col = k.outputs & 2;
            ms = median_ms([&] {
                if (!col) return quantize_rows_gpu(x.ptr, rows, cols, out, 0);
                fp8_quantize_rowwise_gpu(x.ptr, rows, cols, false, row ? codes.ptr : nullptr, row ? scales.ptr : nullptr,
                                         codes_t.ptr, scales_t.ptr, 0);
            });
        }
        all += ms * k.calls;
    }
    return {all, weights};
}

// The backward glue (issue 59) of one layer at the model's shapes for T tokens, each kernel timed alone
// (median, CUDA events): milliseconds and the bytes each tensor must move once (BF16 unless said) per
// millisecond, against the hardware's effective bandwidth. Table rows.
std::vector<std::string> backward_glue_rows(const BenchModel& m, long T, const PerfHardware& hw) {
    const long C = m.hidden, I = m.intermediate, Q = (long)m.heads * m.head_dim, K = (long)m.kv_heads * m.head_dim;
    using bf16 = __nv_bfloat16;
    const long most = std::max({T * 2 * I, T * C, T * Q});
    DeviceBuffer<bf16> a(most), b(most), c(most), w(std::max(C, (long)m.head_dim));
    DeviceBuffer<bf16> x(T * Q), y(T * K), dqkv(T * (Q + 2 * K));  // x, y: the normed q and k inputs
    for (DeviceBuffer<bf16>* d : {&a, &b, &c, &w, &x, &y}) fill_uniform(d->ptr, d->count, 11, 1.0f);
    DeviceBuffer<float> rstd(T * m.heads), dw(std::max(C, (long)m.head_dim));
    fill_uniform(rstd.ptr, rstd.count, 12, 1.0f);
    const long scratch_floats = std::max(rmsnorm_backward_scratch_floats(T, (int)C),
                                         rmsnorm_backward_scratch_floats(T * m.heads, m.head_dim));
    DeviceBuffer<float> scratch(scratch_floats);
    ModelConfig config;
    config.head_dim = m.head_dim;
    RopeTable host_table{m.head_dim / 2, CpuModel::rope_inv_freq(config), {}, {}, 0};
    host_table.ensure(T);
    const DeviceRopeTable table(host_table);
    std::vector<int32_t> positions((size_t)T);
    for (long t = 0; t < T; t++) positions[(size_t)t] = (int32_t)t;
    DeviceBuffer<int32_t> pos(positions);
    const QkvShape shape{m.heads, m.kv_heads, m.head_dim, 1e-6f, nullptr, w.ptr, w.ptr};
    const QkvGrad grad{a.ptr, b.ptr, c.ptr, x.ptr, y.ptr, rstd.ptr, rstd.ptr};
    struct Kernel {
        const char* name;
        double bytes;
        const char* sass;  // its streaming kernel in cuda/perf/sass_counts.h (a prefix), for the prediction
        int launches;
        std::function<void()> run;
    };
    const std::vector<Kernel> kernels = {
        {"rmsnorm_backward dx (accumulate) + dw, T x C", 2.0 * T * C * 4, "rmsnorm_backward_dx_kernel<", 3,
         [&] { rmsnorm_backward(a.ptr, dw.ptr, b.ptr, c.ptr, w.ptr, rstd.ptr, T, (int)C, true, scratch.ptr, scratch_floats, 0); }},
        {"swiglu_backward (bf16), T x I", 2.0 * T * I * 5, "swiglu_backward_kernel<", 1,
         [&] { swiglu_backward(a.ptr, b.ptr, c.ptr, T, (int)I, 0); }},
        {"qkv_rope_backward (q/k norm), T x (H + 2 KV) D", 2.0 * T * ((Q + K) * 4 + K * 2), "qkv_rope_backward_kernel", 1,
         [&] { qkv_rope_backward(dqkv.ptr, grad, T, pos.ptr, table.view(), shape, 0); }},
        {"q norm weight gradient (column sums), T H x D", 2.0 * T * Q * 2, "column_sum_partials_kernel<RmsnormWeightGradTerm", 2,
         [&] { rmsnorm_weight_grad(dw.ptr, a.ptr, b.ptr, rstd.ptr, T * m.heads, m.head_dim, scratch.ptr, scratch_floats, 0); }},
    };
    std::vector<std::string> rows;
    for (const Kernel& k : kernels) {
        const double ms = median_ms(k.run);
        // the model's price: its bytes at the bandwidth, or what its streaming loop's loads in flight allow
        const SassKernel* priced = find_sass_kernel(k.sass);
        const double cap = priced ? std::min(streaming_bandwidth(bench_gpu(), *priced), hw.bandwidth()) : hw.bandwidth();
        record_calibration("bench_train_step", strfmt("%s %s, T = %ld", m.name, k.name, T), ms * 1e-3,
                           k.bytes / cap + k.launches * hw.launch_s, cap < hw.bandwidth() ? "latency" : "hbm");
        rows.push_back(strfmt("| %s | %ld | %s | %.3f | %.0f | %.0f%% |", m.name, T, k.name, ms, k.bytes / (ms * 1e-3) / 1e9,
                              100.0 * k.bytes / (ms * 1e-3) / hw.bandwidth()));
    }
    return rows;
}

// The LM head (loss.cuh) of one micro-batch of T tokens: fused (forward_backward, the training step's,
// in blocks of HEAD_FUSED_TOKEN_BLOCK tokens, the host asked for each block's gradients after a
// stream synchronization as the engine does), and forward and backward timed apart in the tiles of
// the passes without a gradient (HEAD_TOKEN_BLOCK tokens) and in the L2-resident ones (1,024 tokens,
// 8 MiB of logits); median, CUDA events, beside cuda/perf/perf_model.h's price of the head's kernels
// at each. Table rows.
std::vector<std::string> head_rows(const BenchModel& m, const StepShape& shape, const PerfHardware& hw) {
    const long T = shape.tokens, C = m.hidden, V = m.vocab;
    DeviceBuffer<__nv_bfloat16> x((size_t)T * C), W((size_t)V * C);
    fill_uniform(x.ptr, x.count, 21, 1.0f);
    fill_uniform(W.ptr, W.count, 22, 0.05f);
    std::vector<int32_t> targets((size_t)T);
    for (long t = 0; t < T; t++) targets[(size_t)t] = (int32_t)((t * 7919) % V);
    DeviceBuffer<int32_t> target(targets);
    DeviceBuffer<float> logprob(T), entropy(T), lse(T), mu(T), da(T), db(T), dx((size_t)T * C), dW((size_t)V * C);
    fill_uniform(da.ptr, da.count, 23, 1.0f);
    fill_uniform(db.ptr, db.count, 24, 0.5f);
    GemmRunner gemm;
    const HeadGpuShape hs{(int)V, (int)C, 1.0f};
    std::vector<std::string> rows;
    {
        LogprobHeadGpu head(gemm);
        const double ms = median_ms([&] {
            head.forward_backward(logprob.ptr, entropy.ptr, lse.ptr, mu.ptr, da.ptr, db.ptr, dx.ptr, dW.ptr, x.ptr, W.ptr,
                                  target.ptr, (int)T, hs, [](int, int) { CUDA_CHECK(cudaStreamSynchronize(0)); }, 0);
        });
        double predicted = 0;
        for (const KernelCost& k : step_kernels(hw, shape, Precision::BF16, StepStructure::Fused))
            if (k.cls == KernelClass::HeadGemm || k.cls == KernelClass::HeadSoftmax) predicted += k.seconds(hw);
        // the block's logits, whose first halves then hold its dlogits
        const long tb8 = round_up8((int)std::min<long>(T, HEAD_FUSED_TOKEN_BLOCK)), tail = V % HEAD_VOCAB_CHUNK;
        const double workspace = (double)tb8 * (V - tail + round_up8((int)tail)) * 4;
        record_calibration("bench_train_step", strfmt("%s LM head fused, T = %ld, blocks of %d tokens", m.name, T,
                                                      HEAD_FUSED_TOKEN_BLOCK), ms * 1e-3, predicted, "tensor");
        rows.push_back(strfmt("| %s | %ld | %d (fused) | %.1f | forward + backward | %.3f | %.3f |", m.name, T,
                              HEAD_FUSED_TOKEN_BLOCK, workspace / 1048576.0, ms, predicted * 1e3));
    }
    for (int block : {HEAD_TOKEN_BLOCK, 1024}) {
        LogprobHeadGpu head(gemm, HEAD_VOCAB_CHUNK, block);
        const double fwd_ms = median_ms([&] {
            head.forward(logprob.ptr, entropy.ptr, lse.ptr, mu.ptr, x.ptr, W.ptr, target.ptr, (int)T, hs, 0);
        });
        const double bwd_ms = median_ms([&] {
            head.backward(dx.ptr, dW.ptr, da.ptr, db.ptr, lse.ptr, mu.ptr, x.ptr, W.ptr, target.ptr, (int)T, hs, 0);
        });
        StepShape tiles = shape;
        tiles.head_token_block = block, tiles.fused_head = false;
        double predicted[2] = {0, 0};  // forward, backward
        for (const KernelCost& k : step_kernels(hw, tiles, Precision::BF16, StepStructure::Fused))
            if (k.cls == KernelClass::HeadGemm || k.cls == KernelClass::HeadSoftmax)
                predicted[k.phase == StepPhase::Backward] += k.seconds(hw);
        const double workspace = (double)round_up8((int)std::min<long>(T, block)) * HEAD_VOCAB_CHUNK * 4;  // dlogits over the logits
        for (int backward = 0; backward < 2; backward++) {
            const double ms = backward ? bwd_ms : fwd_ms;
            record_calibration("bench_train_step", strfmt("%s LM head %s, T = %ld, tiles of %d tokens", m.name,
                                                          backward ? "backward" : "forward", T, block),
                               ms * 1e-3, predicted[backward], "tensor");
            rows.push_back(strfmt("| %s | %ld | %d | %.1f | %s | %.3f | %.3f |", m.name, T, block, workspace / 1048576.0,
                                  backward ? "backward" : "forward", ms, predicted[backward] * 1e3));
        }
    }
    return rows;
}

}  // namespace

int main(int argc, char** argv) {
    const bool tiny = bench_tiny(argc, argv, "bench_train_step");
    std::string why_not = bench_unavailable_reason();
    if (!why_not.empty()) {
        printf("bench_train_step: SKIPPED: %s\n", why_not.c_str());
        return 0;
    }
    print_bench_header("bench_train_step", tiny);
    printf("step = forward + backward + gradient norm and clip + AdamW (+ FP8 re-quantization); tokens/s = batch "
           "tokens / median step time; peak = the engine's device high-water mark from its construction through its "
           "steps (DeviceArray's count); used = cudaMemGetInfo's used bytes after the steps less before the engine (on a "
           "GPU: plus allocator rounding, cuBLASLt's and the context's memory); plan = cuda/engine/memory_plan.h's figure for "
           "this batch; speedup = bf16 time / fp8 time; predicted: cuda/perf/perf_model.h's step on this GPU (sass_hardware: attention from its SASS) for the engine "
           "before issue 28 (unfused) and after it (fused)\n\n");
    printf("| model | parameters | batch | precision | step ms | predicted ms unfused / fused | tokens/s | peak GiB | used GiB "
           "| plan GiB | speedup | predicted unfused / fused |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const PerfHardware& hw = bench_hardware();
    std::vector<std::string> quant_rows, glue_rows, head_table;  // the quantization, backward glue and head tables, after the steps
    std::vector<BenchModel> models = {kQwen3_0_6B, kQwen3_1_7B};
    int num_seqs = 16, length = 1024;
    if (tiny) models = {kTinyBenchModel}, num_seqs = 2, length = 48;
    Dist dist;
    int failures = 0;
    std::string key;  // the last model's fp8 figures, for the closing line (dev/gpu_check.sh's summary)
    for (const BenchModel& m : models) {
        try {
            const std::string dir = bench_model_dir(m);
            const Batch batch = random_batch(num_seqs, length, m.vocab);
            const size_t params = ModelWeights::load(dir, false).num_floats(), plan = planned_bytes(dir, batch, length);
            const StepShape shape = step_shape(dir, num_seqs, length);
            double bf16_ms = 0;
            for (Precision p : {Precision::BF16, Precision::FP8}) {
                const StepResult r = bench_step(dir, p, batch, dist);
                if (p == Precision::BF16) bf16_ms = r.ms;
                const double GiB = 1073741824.0;
                const auto predicted_ms = [&](StepStructure st) { return step_seconds(hw, shape, p, st) * 1e3; };
                const std::string speedups =
                    p == Precision::BF16 ? "1.00 | 1.00"
                                         : strfmt("%.2f | %.2f / %.2f", bf16_ms / r.ms, step_speedup(hw, shape, StepStructure::Unfused),
                                                  step_speedup(hw, shape, StepStructure::Fused));
                printf("| %s | %.3gM | %d x %d | %s | %.1f | %.1f / %.1f | %.0f | %.3f | %.3f | %.3f | %s |\n", m.name, params / 1e6,
                       num_seqs, length, precision_name(p), r.ms, predicted_ms(StepStructure::Unfused),
                       predicted_ms(StepStructure::Fused), batch.tokens / (r.ms * 1e-3), r.peak / GiB, r.used / GiB, plan / GiB,
                       speedups.c_str());
                fflush(stdout);
                KernelTally tally;  // the fused step's prediction and the bound that holds the most of it
                for (const KernelCost& k : step_kernels(hw, shape, p, StepStructure::Fused)) tally.add("", k, hw);
                std::map<std::string, double> bounds;
                for (const PricedKernel& k : tally.kernels())
                    for (const auto& b : k.bound_seconds) bounds[b.first] += b.second;
                const auto most = std::max_element(bounds.begin(), bounds.end(), [](auto& a, auto& b) { return a.second < b.second; });
                record_calibration("bench_train_step", strfmt("%s step %d x %d %s (fused)", m.name, num_seqs, length, precision_name(p)),
                                   r.ms * 1e-3, predicted_ms(StepStructure::Fused) * 1e-3, most->first, p == Precision::FP8);
                if (p == Precision::FP8)
                    key = strfmt("; %s fp8: %.2fx bf16 (predicted %.2f unfused, %.2f fused), peak %.2f GiB (plan %.2f)", m.name,
                                 bf16_ms / r.ms, step_speedup(hw, shape, StepStructure::Unfused),
                                 step_speedup(hw, shape, StepStructure::Fused), r.peak / GiB, plan / GiB);
            }
            const std::vector<KernelCost> unfused = step_kernels(hw, shape, Precision::FP8, StepStructure::Unfused);
            const std::vector<KernelCost> fused = step_kernels(hw, shape, Precision::FP8, StepStructure::Fused);
            double calls = 0, weight_s = 0;
            for (const KernelCost& k : unfused)
                if (k.cls == KernelClass::Quantize) calls += k.calls, weight_s += k.weight ? k.seconds(hw) : 0;
            const auto [measured, measured_weights] = measured_quantize_ms(unfused);
            double fused_calls = 0;
            for (const KernelCost& k : fused) fused_calls += k.cls == KernelClass::Quantize ? k.calls : 0;
            const double fused_measured = measured_quantize_ms(fused).first;
            for (const std::string& row : backward_glue_rows(m, batch.tokens, hw)) glue_rows.push_back(row);
            for (const std::string& row : head_rows(m, shape, hw)) head_table.push_back(row);
            quant_rows.push_back(strfmt("| %s | %.0f | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.1f |", m.name, calls,
                                        measured, class_seconds(unfused, hw, KernelClass::Quantize) * 1e3, measured_weights,
                                        weight_s * 1e3, fused_calls, fused_measured,
                                        class_seconds(fused, hw, KernelClass::Quantize) * 1e3,
                                        class_seconds(fused, hw, KernelClass::LayerGemm) * 1e3));
        } catch (const Error& e) {
            printf("| %s | ERROR: %s |\n", m.name, e.what());
            failures++;
            cudaGetLastError();  // clear a sticky launch error so the next model can run
        }
    }
    printf("\nquantization apart from the GEMMs, fp8: each standalone quantizer call of a step, its shape timed alone in "
           "this run with today's kernels (median, CUDA events) x its calls per step; unfused = the calls the engine made "
           "before issue 28 (predicted at the old tile quantizer's 7 ps per element), fused = the calls it makes now "
           "(predicted at bandwidth); the fp8 projection GEMMs' predicted time for scale\n\n");
    printf("| model | unfused calls | measured ms | predicted ms | weights measured ms | predicted | fused calls | measured "
           "ms | predicted ms | projection GEMMs predicted ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::string& row : quant_rows) printf("%s\n", row.c_str());
    printf("\nbackward glue of one layer, each kernel alone at the batch's tokens (median, CUDA events): bytes = each "
           "tensor read or written once (BF16; dx read and written; the FP32 statistics and weights left out); GB/s = "
           "those bytes / the time; %% = of the effective bandwidth the perf model assumes (%.2f TB/s)\n\n",
           hw.bandwidth() / 1e12);
    printf("| model | tokens | kernel | ms | GB/s | of bandwidth |\n|---|---|---|---|---|---|\n");
    for (const std::string& row : glue_rows) printf("%s\n", row.c_str());
    printf("\nLM head (loss.cuh) of the batch (median, CUDA events): fused (forward_backward, the training step's, "
           "logits once), and forward and backward each timed alone in the tiles of the passes without a gradient and "
           "in 1,024-token ones (the logits workspace, the dlogits written over it: MiB); predicted = the perf model's head kernels "
           "(cuda/perf/perf_model.h, fused_head() or head()) at those blocks\n\n");
    printf("| model | tokens | tile tokens | workspace MiB | pass | ms | predicted ms |\n|---|---|---|---|---|---|---|\n");
    for (const std::string& row : head_table) printf("%s\n", row.c_str());
    printf("\nbench_train_step: %d model(s) failed%s\n", failures, key.c_str());
    return failures ? 1 : 0;
}
