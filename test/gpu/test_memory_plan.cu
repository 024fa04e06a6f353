// test_memory_plan.cu: the memory plan (cuda/engine/memory_plan.h) against what the GPU engine allocates
// (held after its steps, and its high-water mark), its refusal and suggestions, DeviceArray's byte
// count and out-of-memory error, and the plan of Qwen3-1.7B (the README's figures).
#include <cstdio>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/engine/engine_gpu.cuh"
#include "cuda/engine/memory_plan.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

size_t free_device_bytes() {
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return free_bytes;
}

// Sequences of the given lengths over the vocabulary, half of each a prompt.
std::vector<Sequence> batch_of(const std::vector<int>& lengths, int V) {
    std::vector<Sequence> seqs;
    for (size_t s = 0; s < lengths.size(); s++) {
        Sequence q;
        for (int i = 0; i < lengths[s]; i++) q.ids.push_back((int32_t)((s * 131 + (size_t)i * 17) % (size_t)V));
        q.prompt_len = lengths[s] / 2;
        seqs.push_back(q);
    }
    return seqs;
}

}  // namespace

// The honest test of the plan, phase by phase (GpuEngine::enter_phase). The update: the device
// memory an engine holds after a forward + backward + step of a batch of T tokens (cudaMemGetInfo
// before the engine and after; in emulation cudaMalloc takes exactly the bytes asked) is at most the
// plan's update phase for T tokens, and that is at most 5% above it once the fixed 32 MiB cuBLASLt
// workspace (which would make any tiny model's ratio look perfect) is set aside: the plan bounds the
// sequence count by T and the RoPE table by T positions, the only slack. The plan also bounds the
// phase's high-water mark (DeviceArray's count, device_bytes_peak), which is at least what it holds
// at the end; that count sees every allocation of the engine: in emulation it equals cudaMemGetInfo's,
// on a GPU it is at most that. A larger first batch then a smaller one: the buffers keep their
// largest size, which is what the plan counts. The rollout: 6 completions of up to 8 new tokens after
// the batch's first prompts with a BF16 and then an FP8 KV cache (the BF16 pool, freed first, sets
// the peak); its high-water mark is at most the plan's rollout phase on this device (the pool from
// what is left: here every slot at full length) and at most 5% above it (measured: 1.014-1.021; the
// plan bounds the prefill by the decode rows, 128), and after it the update's is again. Both
// --recompute settings, tied and untied heads, biases (with one FP8 weight copy), fp8 at each
// --fp8_scaling. The second case offloads the training state (--offload_train_state 1): its rollout
// peak is the first case's (the same model and batches; recompute changes no rollout buffer) less
// the FP32 master weights, gradients and both moments, 16 bytes per parameter, counted here.
TEST(gpu_memory_plan_bounds_what_the_engine_allocates) {
    REQUIRE_GPU();
    const std::tuple<const char*, bool, Fp8Scaling, bool, bool> cases[] = {  // model, recompute, scaling, one FP8 copy, offload
        {"test/fixtures/models/qwen3_tiny", false, Fp8Scaling::Block, false, false},
        {"test/fixtures/models/qwen3_tiny", true, Fp8Scaling::Block, false, true},
        {"test/fixtures/models/qwen2_tiny", false, Fp8Scaling::Block, true, false},
        {"test/fixtures/models/llama_tiny", true, Fp8Scaling::Block, false, false},
        {"test/fixtures/models/qwen3_tiny", false, Fp8Scaling::Row, false, false},
        {"test/fixtures/models/llama_tiny", true, Fp8Scaling::Tensor, false, false}};
    // ASan: the first two (both phases, and the offload measured against the first): 140 s for all six there
    const size_t n_cases = harness::sanitized ? 2 : std::size(cases);
    size_t first_rollout_peak = 0;
    for (size_t ci = 0; ci < n_cases; ci++) {
        const auto& [dir, recompute, scaling, one_copy, offload] = cases[ci];
        EngineOptions o;
        o.recompute_layer = recompute;
        o.fp8_scaling = scaling;
        o.one_fp8_weight_copy = one_copy;
        o.offload_train_state = offload;
        const ModelConfig c = load_model_config(dir);
        const std::vector<Sequence> big = batch_of({61, 40, 33, 7, 2}, (int)c.vocab_size), small = batch_of({9, 5}, (int)c.vocab_size);
        long T = 0;
        for (const Sequence& s : big) T += (long)s.ids.size();
        constexpr int kMaxNew = 8;
        std::vector<GenRequest> requests;
        long longest_prompt = 0;
        for (int i = 0; i < 6; i++) {
            const Sequence& q = big[(size_t)i % big.size()];
            requests.push_back({std::vector<int32_t>(q.ids.begin(), q.ids.begin() + std::max(1, q.prompt_len)), (uint32_t)i});
            longest_prompt = std::max(longest_prompt, (long)requests.back().prompt.size());
        }
        const size_t before = free_device_bytes(), live_before = device_bytes_live();
        reset_device_bytes_peak();
        size_t used = 0, held = 0, update_peak = 0, rollout_peak = 0, again_peak = 0, params = 0;
        {
            GpuEngine gpu(dir, o);
            params = gpu.num_floats();
            gpu.init_optimizer(AdamWConfig(), one_rank());
            // the fused head's step (forward_backward_train) and the unfused one: their logits share an array
            auto step = [&](const std::vector<Sequence>& seqs) {
                TokenValues lp, ent;
                gpu.zero_grads();
                if (&seqs == &big) {
                    gpu.forward_backward_train(seqs, Precision::FP8, 1.0f, &lp, &ent,
                                               [](size_t, size_t, float l, float h, float* dl, float* dh) { *dl = l, *dh = h; });
                } else {
                    gpu.forward_train(seqs, Precision::FP8, 1.0f, &lp, &ent);
                    gpu.backward(lp, ent);  // any values: the buffers are what is measured
                }
                gpu.reduce_and_clip_grads(1.0);
                gpu.optimizer_step(1e-4);
                gpu.logprobs(seqs, Precision::BF16, 1.0f, &lp, nullptr);
            };
            for (const std::vector<Sequence>* seqs : {&big, &small}) step(*seqs);
            used = before - free_device_bytes();
            held = device_bytes_live() - live_before;
            update_peak = device_bytes_peak() - live_before;
            gpu.enter_phase(Engine::Phase::Rollout);
            for (Precision kv : {Precision::BF16, Precision::FP8}) {
                SamplingConfig s;
                s.max_new_tokens = kMaxNew;
                gpu.generate(requests, 0, s, Precision::FP8, kv, nullptr);
            }
            gpu.enter_phase(Engine::Phase::Update);
            step(small);
            size_t r = 0, u = 0;
            CHECK(gpu.phase_peaks(&r, &u));
            rollout_peak = r - live_before, again_peak = u - live_before;
        }
        MemoryDemand d;
        d.tokens_per_forward = T;
        d.longest_sequence = 61;
        d.rollout_requests = (int64_t)requests.size();
        d.rollout_prompts = (int64_t)requests.size();
        d.longest_prompt = longest_prompt;
        d.max_new_tokens = kMaxNew;
        d.kv_cache = Precision::BF16;  // the larger pool of the two
        const MemoryPlan plan = plan_memory(c, GpuEngine::plan_request(c, o, d), GpuEngine::plan_constants());
        const size_t ws = GemmRunner::WORKSPACE_BYTES, device = before + live_before;
        const double ratio = (double)(plan.update_peak() - ws) / (double)(used - ws);
        const size_t rollout_plan = plan.rollout_peak(device);
        printf("    %-12s recompute %-5s %-6s%s%s T %ld: update plan %zu bytes, allocated %zu (counted %zu, peak %zu, again %zu), "
               "ratio without the workspace %.4f; rollout plan %zu, peak %zu (%.4f)\n",
               dir + std::string(dir).rfind('/') + 1, recompute ? "layer" : "none", fp8_scaling_name(scaling),
               one_copy ? " one FP8 copy" : "", offload ? " offload" : "", T, plan.update_peak(), used, held, update_peak,
               again_peak, ratio, rollout_plan, rollout_peak, (double)rollout_plan / (double)rollout_peak);
        CHECK_MSG(plan.update_peak() >= used, "%s: the plan (%zu bytes) is below what the engine allocated (%zu)", dir,
                  plan.update_peak(), used);
        CHECK_MSG(ratio <= 1.05, "%s: the plan is %.3f x what the engine allocated", dir, ratio);
        CHECK_MSG(emulated ? held == used : held <= used, "%s: DeviceArray counted %zu bytes, cudaMemGetInfo %zu", dir, held,
                  used);
        CHECK_MSG(update_peak >= held && plan.update_peak() >= update_peak && plan.update_peak() >= again_peak,
                  "%s: update peaks %zu and %zu bytes, held at the end %zu, plan %zu", dir, update_peak, again_peak, held,
                  plan.update_peak());
        CHECK_MSG(rollout_plan >= rollout_peak && rollout_peak > 0 && rollout_plan <= 1.05 * rollout_peak,
                  "%s: rollout peak %zu bytes, plan %zu", dir, rollout_peak, rollout_plan);
        if (first_rollout_peak == 0) first_rollout_peak = rollout_peak;
        else if (offload)
            CHECK_MSG(rollout_peak + 16 * params == first_rollout_peak, "offloaded rollout peak %zu bytes, %zu without, %zu parameters",
                      rollout_peak, first_rollout_peak, params);
        CHECK_EQ(device_bytes_live(), live_before);  // the engine gave back all it counted
    }
}

// A plan that does not fit is refused with the numbers and the options; the --micro_batch_tokens it
// suggests is the largest that fits (the plan of one token more does not).
TEST(gpu_memory_plan_refusal_suggests_what_fits) {
    ModelConfig c;  // a 4-layer model with a 32k vocabulary
    c.arch = Arch::Qwen3, c.vocab_size = 32000, c.hidden_size = 256, c.intermediate_size = 768, c.num_layers = 4;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64, c.qk_norm = true;
    MemoryPlanRequest r;
    r.tokens = 65536;
    r.longest_sequence = 300;
    const PlanConstants k = GpuEngine::plan_constants();
    const size_t need = plan_memory(c, r, k).total();
    MemoryPlanRequest rc = r;
    rc.recompute_layer = true;
    const size_t free_bytes = plan_memory(c, rc, k).total() / 2;  // not even with recompute
    const std::string message = memory_plan_refusal(c, r, k, free_bytes, 2 * free_bytes);
    CHECK_MSG(message.find("the memory plan needs " + bytes_text(need)) != std::string::npos, "%s", message.c_str());
    CHECK_MSG(message.find(bytes_text(free_bytes) + " free of") != std::string::npos, "%s", message.c_str());
    CHECK_MSG(message.find("--recompute layer (" + bytes_text(plan_memory(c, rc, k).total()) + ")") != std::string::npos, "%s",
              message.c_str());
    CHECK_MSG(message.find("more ranks") != std::string::npos, "%s", message.c_str());
    const size_t at = message.find("--micro_batch_tokens ");
    CHECK_MSG(at != std::string::npos, "%s", message.c_str());
    if (at == std::string::npos) return;
    rc.tokens = atoll(message.c_str() + at + 21);
    CHECK(rc.tokens >= r.longest_sequence && rc.tokens < r.tokens);
    CHECK(plan_memory(c, rc, k).total() <= free_bytes);
    rc.tokens++;
    CHECK(plan_memory(c, rc, k).total() > free_bytes);
    CHECK(memory_plan_refusal(c, r, k, need, need).empty());  // exactly enough: no refusal
}

// An allocation that fails during a run is one Error naming the buffer and the device's memory
// (the binaries print it as one line and exit 1), and leaves the array empty.
TEST(gpu_device_array_out_of_memory_is_one_clear_error) {
    REQUIRE_GPU();
    DeviceArray<float> a;
    CHECK_THROWS(a.resize((size_t)1 << 40, "a test buffer"), "out of GPU memory allocating a test buffer (4398.047 GB;");
    CHECK_EQ(a.size(), (size_t)0);
    CHECK(cudaGetLastError() == cudaSuccess);  // not sticky: the run can report and end cleanly
}

// DeviceArray's byte count is exact: arrays of known sizes allocated, grown, shrunk, released,
// destroyed, and one allocation that fails move the live bytes and the high-water mark by the bytes
// asked for (the sizes below, counted by hand), and a reset brings the mark down to the live bytes.
TEST(gpu_memory_device_array_counts_live_and_peak_bytes) {
    REQUIRE_GPU();
    const size_t base = device_bytes_live();
    reset_device_bytes_peak();
    CHECK_EQ(device_bytes_peak(), base);
    {
        DeviceArray<float> a(1000, "a");  // 4,000 bytes
        DeviceArray<double> b(300, "b");  // 2,400
        CHECK_EQ(device_bytes_live(), base + 6400);
        a.resize(500, "a");  // shrinking keeps the memory
        CHECK_EQ(device_bytes_live(), base + 6400);
        a.resize(2000, "a");  // growing frees the 4,000 first, then takes 8,000
        CHECK_EQ(device_bytes_live(), base + 10400);
        CHECK_EQ(device_bytes_peak(), base + 10400);
        b.release();
        CHECK_EQ(device_bytes_live(), base + 8000);
        CHECK_EQ(device_bytes_peak(), base + 10400);
        reset_device_bytes_peak();
        CHECK_EQ(device_bytes_peak(), base + 8000);
        DeviceArray<uint16_t> c(50, "c");  // 100
        CHECK_EQ(device_bytes_peak(), base + 8100);
        CHECK_THROWS(a.resize((size_t)1 << 40, "a test buffer"), "out of GPU memory");  // frees a's 8,000, takes nothing
        CHECK(cudaGetLastError() == cudaSuccess);
        CHECK_EQ(device_bytes_live(), base + 100);
        b.resize(10, "b");  // 80: below the mark
        CHECK_EQ(device_bytes_live(), base + 180);
        CHECK_EQ(device_bytes_peak(), base + 8100);
    }
    CHECK_EQ(device_bytes_live(), base);
    CHECK_EQ(device_bytes_peak(), base + 8100);
}

// Qwen3-1.7B (hidden 2048, 28 layers, FFN 6144, 16 q / 8 kv heads, head_dim 128, vocabulary 151936,
// tied): its parameter count from the architecture, counted here independently (the model card's
// 1.7B, 1.4B of them outside the embedding), and the plan at 16k tokens per micro-batch with and
// without --recompute layer, the figures the README states.
TEST(gpu_memory_plan_of_qwen3_1p7b) {
    ModelConfig c;
    c.arch = Arch::Qwen3, c.vocab_size = 151936, c.hidden_size = 2048, c.intermediate_size = 6144, c.num_layers = 28;
    c.num_heads = 16, c.num_kv_heads = 8, c.head_dim = 128, c.qk_norm = true, c.tie_word_embeddings = true;
    const size_t C = 2048, Q = 16 * 128, Kd = 8 * 128, I = 6144, V = 151936;
    const size_t layer = Q * C + 2 * Kd * C + C * Q + 3 * C * I + 2 * C + 2 * 128;
    const size_t params = V * C + 28 * layer + C;
    CHECK_EQ(params, (size_t)1720574976);
    CHECK(28 * layer > 1.35e9 && 28 * layer < 1.45e9);
    MemoryPlanRequest r;
    r.tokens = 16384;
    const MemoryPlan keep = plan_memory(c, r, GpuEngine::plan_constants());
    r.recompute_layer = true;
    const MemoryPlan again = plan_memory(c, r, GpuEngine::plan_constants());
    CHECK_EQ(keep.params, params);
    CHECK_EQ(keep.master, 4 * params);
    CHECK_EQ(keep.adam_m + keep.adam_v, 8 * params);
    CHECK_EQ(keep.bf16_copy, 2 * params);
    CHECK(again.activations < keep.activations);
    CHECK_EQ(keep.total() - keep.activations, again.total() - again.activations);
    // generation: 64 slots of a 256-token prompt + 1,024 new tokens; a BF16 KV cache holds K and V of
    // 28 layers x 8 heads x 128 dims per token (112 KiB, spec-gpu.md §5's 144 KiB for 36 layers), and
    // the pool asked for holds each slot at its longest plus a page
    EngineOptions o;
    o.rollout_slots = 64;
    MemoryDemand d;
    d.tokens_per_forward = 16384, d.longest_sequence = 1280, d.rollout_requests = 64, d.rollout_prompts = 8;
    d.longest_prompt = 256, d.max_new_tokens = 1024, d.kv_cache = Precision::BF16;
    const MemoryPlan rollout = plan_memory(c, GpuEngine::plan_request(c, o, d), GpuEngine::plan_constants());
    const double kv_per_token = 2.0 * 28 * 8 * 128 * 2, kv = 64 * 1280 * kv_per_token;
    CHECK_EQ(kv_per_token, 112.0 * 1024);
    CHECK_MSG(rollout.kv_pool >= kv && rollout.kv_pool <= 1.05 * kv, "KV pool %zu bytes, the slots at full length %.0f",
              rollout.kv_pool, kv);
    printf("%s%s%s", memory_plan_text(keep, kH200Bytes).c_str(), memory_plan_text(again, kH200Bytes).c_str(),
           memory_plan_text(rollout, kH200Bytes).c_str());
}

// A bf16 run's engine (EngineOptions::fp8_weights false, which the driver sets when no pass runs in
// fp8) holds no FP8 weight copies: it allocates the plan's FP8 copy bytes less than the same engine
// with them (and the plan's FP8 line is 0), trains and evaluates in bf16 bit for bit as that engine
// does, and refuses an fp8 pass in one line.
TEST(gpu_bf16_engine_holds_no_fp8_weights) {
    const char* dir = "test/fixtures/models/qwen3_tiny";
    const ModelConfig c = load_model_config(dir);
    const std::vector<Sequence> seqs = batch_of({9, 5}, (int)c.vocab_size);
    size_t held[2] = {0, 0}, planned[2] = {0, 0};
    TokenValues after[2];
    for (int fp8 = 0; fp8 < 2; fp8++) {
        EngineOptions o;
        o.fp8_weights = fp8 == 1;
        MemoryDemand d;
        d.tokens_per_forward = 14;
        d.longest_sequence = 9;
        planned[fp8] = plan_memory(c, GpuEngine::plan_request(c, o, d), GpuEngine::plan_constants()).fp8_copies;
        const size_t live_before = device_bytes_live();
        GpuEngine gpu(dir, o);
        held[fp8] = device_bytes_live() - live_before;
        gpu.init_optimizer(AdamWConfig(), one_rank());
        TokenValues lp, ent;
        gpu.zero_grads();
        gpu.forward_train(seqs, Precision::BF16, 1.0f, &lp, &ent);
        gpu.backward(lp, ent);
        gpu.reduce_and_clip_grads(1.0);
        gpu.optimizer_step(1e-3);
        gpu.logprobs(seqs, Precision::BF16, 1.0f, &after[fp8], nullptr);
        if (fp8) continue;
        std::string refusal;
        try {
            gpu.logprobs(seqs, Precision::FP8, 1.0f, &lp, nullptr);
        } catch (const Error& e) {
            refusal = e.what();
        }
        CHECK_MSG(refusal.find("without FP8 weights") != std::string::npos, "an fp8 pass: \"%s\"", refusal.c_str());
    }
    printf("    qwen3_tiny: the engine holds %zu bytes with FP8 weights, %zu without; the plan's FP8 copies %zu and %zu bytes\n",
           held[1], held[0], planned[1], planned[0]);
    CHECK_EQ(planned[0], (size_t)0);
    CHECK_MSG(held[1] - held[0] >= planned[1] && held[1] - held[0] <= planned[1] + 4096,
              "the FP8 weights take %zu bytes, the plan counts %zu", held[1] - held[0], planned[1]);
    CHECK(after[0] == after[1]);
}
