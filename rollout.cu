// rollout.cu: generation on the GPU engine (GpuEngine::generate), the semantics of the CPU
// generator (cpu/generate.h) on the device: stop on any eos id or after max_new_tokens, tokens
// drawn by rl/numerics/sampling.h's rule from the uniform keyed by (seed, step, sequence, position), and
// per token the log-prob under softmax(logits / T) over the full vocabulary (logprob_full, what
// the CPU engine returns).
//   prefill   a packed batch of prompts through the training forward (trunk_forward, the same layer
//             step); every layer's K (after k-norm and RoPE) and V are appended to the sequences' KV
//             pages (kv_cache.cuh) before the layer's attention, which with an FP8 cache reads them
//             as the pages hold them (as the CPU generator's prefill reads its cache); the first
//             token is sampled from each prompt's last row.
//   decode    one token per running sequence per step: embedding, per layer the shared attention
//             inputs, append, paged decode attention, the shared attention outputs and MLP; final
//             norm; logits [B][V] through the BF16 head in FP32; sampling on the device.
//   sharing   requests with the same prompt (the G samples of a group) share its cached K/V: it is
//             prefilled once while any of them runs; each holds its full pages and copies its last
//             partial page (copy on write), and the pages return to the pool with their last holder.
//   schedule  continuous batching: up to --rollout_slots sequences run together; a waiting one is
//             admitted as soon as a slot and its prompt's pages are free; a finished one frees both
//             at once. When a running sequence needs a page and none is free, the newest running
//             sequence is preempted: its pages are freed and it is generated again later from its
//             prompt. Its keys are (seed, step, sequence, position) and every row of a step is
//             computed independently of the others, so the redone completion is the same.
//   FP8 KV    scales per layer (or per layer and KV head, --kv_scales head) from a forward over the
//             prompts with the current weights (the amax of K after norm and RoPE, and of V:
//             spec-fp8.md §9.4, as the CPU engine does), the amaxes reduced over the ranks
//             (rl/numerics/kv_scales.h), set before the first append and reported in rollout_stats().
//   graphs    a decode step runs over its B sequences padded to a bucket (decode_bucket: powers of
//             two, capped at the slots), with or without graphs, so --cuda_graphs changes no bit.
//             The first step of a bucket in a rollout() call runs its launches (embedding to
//             sampling) once as a warm-up, then captures them into a graph on the engine's stream;
//             later steps of that bucket replay it. What changes per step lives in device buffers
//             uploaded before the launch: token ids, positions, cache slots, lengths, page tables,
//             sampling keys and positions, forced tokens; padding rows have token 0 at position 0,
//             cache slot -1 (nothing appended) and length 0 (attention writes zeros), and their
//             tokens are ignored. What the kernels take by value (rows, max_len, split count, seed,
//             step, temperature) and the buffers' addresses hold for one call: the graphs are
//             destroyed at its start and end, and when a prefill reallocates the FP8 GEMM scratch.
//             Prefill and each admission's first token run eagerly.
// Included at the end of cuda/engine_gpu.cuh (the GPU program is one translation unit per binary,
// so the build needs no new object); compiled alone by make cuda-check, it includes the engine.
#ifndef FP8RL_ROLLOUT_CU
#define FP8RL_ROLLOUT_CU
#include <deque>
#include <map>
#include <set>

#include "cuda/engine_gpu.cuh"
#include "cuda/sampling.cuh"
#include "kv_cache.cuh"

namespace fp8rl {

// The sizes of what generate() allocates for `requests` requests of at most longest_prompt +
// max_new_tokens tokens, beyond the training forward's buffers (prefill runs in those): the KV page
// pool and the decode step's buffers, in elements. One function for the allocation and for the
// memory plan (rollout_device_bytes), so the two cannot drift apart.
struct RolloutSizes {
    int slots = 0;       // sequences decoded together
    long rows = 0;       // decode rows: the slots, padded to 128 for the FP8 GEMMs
    KvCacheShape shape{};
    size_t page_bytes = 0;  // K and V of one page in every layer
    size_t act = 0, act_f32 = 0, logits = 0, sample_scratch = 0, padded_head = 0, table = 0;  // elements
};

inline RolloutSizes rollout_sizes(const ModelConfig& c, const EngineOptions& o, long requests, long longest_prompt,
                                  int max_new_tokens, Precision kv_cache) {
    RolloutSizes z;
    z.slots = (int)std::min<long>(o.rollout_slots > 0 ? o.rollout_slots : requests, requests);  // 0: every request
    if (z.slots < 1 || o.kv_page_tokens < 1) fail("generate: --rollout_slots must be at least 0 and --kv_page_tokens at least 1");
    const long longest = longest_prompt + max_new_tokens;
    const int max_pages = (int)((longest + o.kv_page_tokens - 1) / o.kv_page_tokens);
    z.shape = KvCacheShape{(int)c.num_layers, (int)c.num_kv_heads, (int)c.head_dim, o.kv_page_tokens, 1};
    z.page_bytes = PagedKvCache::page_bytes(z.shape, kv_cache);
    z.shape.pages = o.kv_cache_mb > 0 ? (int)std::min(o.kv_cache_mb * 1048576.0 / z.page_bytes, 1e9) : z.slots * (max_pages + 1);
    const long C = c.hidden_size, Q = c.q_dim(), Kd = c.kv_dim(), I = c.intermediate_size, V = c.vocab_size;
    const long V8 = round_up8((int)V), N = Q + 2 * Kd;
    z.rows = (z.slots + 127) / 128 * 128;
    z.act = (size_t)(z.rows * (7 * C + N + (c.qk_norm ? Q + Kd : 0) + 2 * Q + 2 * Kd + 3 * I));
    z.act_f32 = (size_t)(z.rows * (3 + c.num_heads + c.num_kv_heads + N));
    z.logits = (size_t)(z.rows * V8);
    z.sample_scratch = (size_t)z.slots * V;
    z.padded_head = V % 8 ? (size_t)V8 * C : 0;
    z.table = (size_t)z.slots * max_pages;
    return z;
}

inline size_t rollout_device_bytes(const ModelConfig& c, const EngineOptions& o, long requests, long longest_prompt,
                                   int max_new_tokens, Precision kv_cache) {
    const RolloutSizes z = rollout_sizes(c, o, requests, longest_prompt, max_new_tokens, kv_cache);
    return PagedKvCache::bytes(z.shape, kv_cache) +
           PagedKvCache::decode_workspace_bytes(z.shape, z.slots, (int)c.num_heads) +
           (z.act + z.padded_head) * sizeof(bf16) + (z.act_f32 + z.logits + z.sample_scratch) * sizeof(float) +
           z.table * sizeof(int32_t) + (size_t)z.slots * (5 * sizeof(int32_t) + 2 * sizeof(uint32_t) + sizeof(SampledToken)) +
           // the prompts' last hidden states (at most one per request), a prefill's cache rows, the KV amax
           (size_t)requests * c.hidden_size * sizeof(bf16) + (size_t)z.slots * longest_prompt * sizeof(int32_t) +
           2 * (size_t)c.num_layers * sizeof(float);
}

// --rollout_slots 0 in an engine no memory plan resolved it for (a test, a tool): the most of
// `requests` whose rollout buffers fit in 90% of the device's free memory now (the rest for the
// allocator's rounding and the libraries). What an earlier generate() holds is not counted as free,
// so this errs toward fewer slots; training resolves 0 with its plan instead (rl/driver/memory_fit.h).
inline int GpuEngine::slots_that_fit(long requests, long longest_prompt, int max_new_tokens, Precision kv_cache) const {
    EngineOptions one = options_;
    one.rollout_slots = 1;
    if (rollout_sizes(weights_.config, one, requests, longest_prompt, max_new_tokens, kv_cache).shape.pages < 1)
        return 1;  // a --kv_cache_mb below one page: generate() says so
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    long lo = 1, hi = requests, best = 1;
    while (lo <= hi) {
        const long mid = lo + (hi - lo) / 2;
        EngineOptions o = options_;
        o.rollout_slots = (int)mid;
        if (rollout_device_bytes(weights_.config, o, requests, longest_prompt, max_new_tokens, kv_cache) <= free_bytes / 10 * 9)
            best = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    return (int)best;
}

// Teacher forcing, one thread per row of logits [rows][ld]: the given token forced[r] with its
// log-prob at temperature 1 over the first n columns, as rl/numerics/sampling.h computes logprob_full.
// scratch [rows][n].
static __global__ void forced_token_kernel(const float* logits, int ld, int n, const int32_t* forced, int rows,
                                           float* scratch, SampledToken* out) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* z = logits + (size_t)r * ld;
    double sum;
    const float s_max = exp_shifted_row(z, n, 1.0f, scratch + (size_t)r * n, &sum);
    const float lp = (float)((z[forced[r]] - s_max) - log(sum));
    out[r] = SampledToken{forced[r], lp, lp};
}

// The host-side state of one request and the device buffers of the decode step.
struct RolloutState {
    struct Request {
        const std::vector<int32_t>* prompt;
        uint32_t key;
        const std::vector<int32_t>* forced;  // teacher forcing: the completion to score; null = sample
        int prompt_id;                        // its prompt in `prompts`
        std::vector<int> pages;               // KV pages, in position order: its prompt's full pages, then its own
        Generation gen;
    };
    // A distinct prompt's K/V, prefilled once and shared by the running requests that have it: they
    // hold its full pages and each copy its last partial page (copy on write), which stays unwritten.
    struct Prompt {
        const std::vector<int32_t>* ids;
        std::vector<int> pages;
        int users = 0;  // running requests on these pages; 0: not cached
    };
    std::vector<Request> requests;
    std::vector<Prompt> prompts;
    std::unique_ptr<PagedKvCache> cache;
    std::vector<int> free_pages, page_refs;  // page_refs [pages]: holders of each page
    int page_tokens = 0, max_pages = 0, max_len = 0;
    long rows = 0;  // decode buffers' rows: the slots, padded to 128 for the FP8 GEMMs
    DeviceArray<bf16> act, head;  // decode activations; the head padded to a multiple of 8 rows
    DeviceArray<bf16> prompt_xf;  // [prompts][C] final normed hidden state of each prompt's last token
    DeviceArray<float> act_f32, logits, sample_scratch, amax;
    DeviceArray<int32_t> ids, pos, cache_rows, lens, table, forced, prefill_rows;
    DeviceArray<uint32_t> keys, sample_pos;
    DeviceArray<SampledToken> sampled;
    LayerActsGpu A{};
    bf16* xf = nullptr;  // [rows][C] the final normed hidden
    float *rstdf = nullptr, *gemm_f32 = nullptr;
    // the rows of the step being sampled: key, position of the new token, forced token or -1
    std::vector<uint32_t> step_keys, step_pos;
    std::vector<int32_t> step_forced;
    std::map<int, cudaGraphExec_t> graphs;  // decode step graphs of this rollout() call, by bucket

    void drop_graphs() {
        for (const auto& g : graphs) CUDA_CHECK(cudaGraphExecDestroy(g.second));
        graphs.clear();
    }

    int pages_for(long tokens) const { return (int)((tokens + page_tokens - 1) / page_tokens); }
    int take_page() {
        const int p = free_pages.back();
        free_pages.pop_back();
        page_refs[(size_t)p] = 1;
        return p;
    }
    void drop_page(int p) {
        if (--page_refs[(size_t)p] == 0) free_pages.push_back(p);
    }
    int32_t cache_row(const Request& q, long position) const {
        return (int32_t)((long)q.pages[position / page_tokens] * page_tokens + position % page_tokens);
    }
};

// Unchecked, as every destructor here: a CUDA error thrown from one would end the program, and
// during unwinding would hide the error being reported.
inline GpuEngine::~GpuEngine() {
    if (rollout_)
        for (const auto& g : rollout_->graphs) cudaGraphExecDestroy(g.second);
    cudaStreamDestroy(stream_);
}

// The rows a decode step of B sequences runs over: B padded up to a power of two, capped at the
// slots. Each bucket costs one warm-up and one capture per rollout() call, at most log2(slots) + 2
// of them, and at most doubles the rows; extra rows cost little in decode, which reads every
// weight once whatever the rows (and the FP8 GEMMs pad to 128 rows anyway), and an idle row's
// attention reads no key.
inline int decode_bucket(int B, int slots) {
    int b = 1;
    while (b < B) b *= 2;
    return std::min(b, slots);
}

inline std::vector<Generation> GpuEngine::generate(const std::vector<GenRequest>& requests, uint32_t step,
                                                   const SamplingConfig& s, Precision weights, Precision kv_cache,
                                                   Progress* progress) {
    PROFILE_RANGE("rollout");
    return rollout(requests, nullptr, step, s, weights, kv_cache, progress);
}

inline std::vector<Generation> GpuEngine::teacher_forced(const std::vector<GenRequest>& requests,
                                                         const std::vector<std::vector<int32_t>>& tokens,
                                                         Precision weights, Precision kv_cache) {
    if (tokens.size() != requests.size()) fail("teacher_forced: %zu completions for %zu requests", tokens.size(), requests.size());
    SamplingConfig s;
    s.max_new_tokens = 1;
    for (const auto& t : tokens) {
        if (t.empty()) fail("teacher_forced: an empty completion");
        for (int32_t id : t)
            if (id < 0 || id >= model_.V) fail("teacher_forced: token id %d outside the vocabulary [0, %d)", id, model_.V);
        s.max_new_tokens = std::max(s.max_new_tokens, (int)t.size());
    }
    return rollout(requests, &tokens, 0, s, weights, kv_cache, nullptr);
}

inline std::vector<Generation> GpuEngine::rollout(const std::vector<GenRequest>& requests,
                                                  const std::vector<std::vector<int32_t>>* forced, uint32_t step,
                                                  const SamplingConfig& s, Precision weights, Precision kv_cache,
                                                  Progress* progress) {
    const CpuModel& m = model_;
    if (weights == Precision::FP32) fail("the GPU engine generates in bf16 or fp8 (--rollout_precision; --precision with --prompts), not fp32");
    if (kv_cache == Precision::FP32) fail("the GPU engine's KV cache is bf16 or fp8 (--kv_cache), not fp32");
    if (requests.empty()) fail("generate: no prompts");
    if (s.max_new_tokens < 1) fail("generate: max_new_tokens must be at least 1");
    if (s.vocab_limit < 0 || s.vocab_limit > m.V) fail("generate: vocab_limit %d outside [0, %d]", s.vocab_limit, m.V);
    const long positions = (long)config().max_position_embeddings;
    long longest = 0;
    for (size_t i = 0; i < requests.size(); i++) {
        const std::vector<int32_t>& p = requests[i].prompt;
        if (p.empty()) fail("generate: prompt %zu is empty", i);
        for (int32_t id : p)
            if (id < 0 || id >= m.V) fail("generate: prompt %zu has token id %d outside the vocabulary [0, %d)", i, id, m.V);
        if (positions > 0 && (long)p.size() > positions)
            fail("generate: prompt %zu has %zu tokens, more than the model's %ld positions (max_position_embeddings); "
                 "shorten the prompt", i, p.size(), positions);
        if (positions > 0 && (long)p.size() + s.max_new_tokens > positions)
            fail("generate: prompt %zu (%zu tokens) + --max_new_tokens %d exceeds the model's %ld positions "
                 "(max_position_embeddings); lower --max_new_tokens", i, p.size(), s.max_new_tokens, positions);
        longest = std::max(longest, (long)p.size());
    }
    if (!rollout_) rollout_.reset(new RolloutState());
    RolloutState& R = *rollout_;
    R.drop_graphs();  // a call that failed may have left some
    rollout_stats_ = RolloutStats();

    // the page pool (every slot at its longest, or the pages --kv_cache_mb holds) and the decode buffers,
    // for --rollout_slots or, at 0 (unresolved by a memory plan), the most requests free memory holds
    EngineOptions o = options_;
    if (o.rollout_slots == 0) o.rollout_slots = slots_that_fit((long)requests.size(), longest, s.max_new_tokens, kv_cache);
    const RolloutSizes z = rollout_sizes(weights_.config, o, (long)requests.size(), longest, s.max_new_tokens, kv_cache);
    const int slots = z.slots;
    R.page_tokens = z.shape.page_tokens;
    R.max_len = (int)(longest + s.max_new_tokens);
    R.max_pages = R.pages_for(R.max_len);
    const KvCacheShape shape = z.shape;
    // the last token of a completion is never fed: a sequence holds prompt + max_new_tokens - 1
    // positions, plus its prompt's unwritten partial page
    const int needed = R.pages_for(longest + s.max_new_tokens - 1) + 1;
    if (shape.pages < needed)
        fail("generate: --kv_cache_mb %g holds %d KV pages of %d tokens (%zu bytes each), but the longest request "
             "(%ld prompt + %d new tokens) needs %d; raise --kv_cache_mb or lower --max_new_tokens",
             options_.kv_cache_mb, shape.pages, R.page_tokens, z.page_bytes, longest, s.max_new_tokens, needed);
    const KvCacheShape& had = R.cache ? R.cache->shape() : shape;
    if (!R.cache || R.cache->storage() != kv_cache || had.pages != shape.pages || had.page_tokens != shape.page_tokens) {
        R.cache.reset();  // free the old pool before the new one is allocated
        R.cache.reset(new PagedKvCache(shape, kv_cache));
    }
    if (kv_cache == Precision::FP8) calibrate_kv_scales(requests, weights);
    R.free_pages.clear();
    for (int p = shape.pages - 1; p >= 0; p--) R.free_pages.push_back(p);
    R.page_refs.assign((size_t)shape.pages, 0);

    // decode buffers for `slots` rows
    const long C = m.C, Q = (long)m.H * m.D, Kd = (long)m.KV * m.D, I = m.I, N = m.qkv_dim();
    R.rows = z.rows;
    const long rows = R.rows;
    // not zeroed: a step writes every row of what it reads (padding slots run token 0 at position 0,
    // the FP8 operands' padding rows are written as zeros by their producers)
    R.act.resize(z.act, "decode activations");
    R.act_f32.resize(z.act_f32, "decode FP32 activations");
    R.logits.resize(z.logits, "decode logits");
    R.sample_scratch.resize(z.sample_scratch, "sampling scratch");
    R.sampled.resize((size_t)slots, "sampled tokens");
    bf16* b = R.act.get();
    float* f = R.act_f32.get();
    auto take_b = [&](long n) { bf16* r = b; b += n; return r; };
    auto take_f = [&](long n) { float* r = f; f += n; return r; };
    LayerActsGpu& A = R.A;
    A.x = take_b(rows * C), A.xn1 = take_b(rows * C), A.qkv = take_b(rows * N);
    A.qp = m.qk_norm ? take_b(rows * Q) : nullptr, A.kp = m.qk_norm ? take_b(rows * Kd) : nullptr;
    A.q = take_b(rows * Q), A.k = take_b(rows * Kd), A.v = take_b(rows * Kd), A.att = take_b(rows * Q);
    A.o = take_b(rows * C), A.h1 = take_b(rows * C), A.xn2 = take_b(rows * C), A.gu = take_b(rows * 2 * I);
    A.a = take_b(rows * I), A.mlp = take_b(rows * C);
    R.xf = take_b(rows * C);
    A.rstd1 = take_f(rows), A.rstd2 = take_f(rows), R.rstdf = take_f(rows);
    A.rstd_q = take_f(rows * m.H), A.rstd_k = take_f(rows * m.KV), R.gemm_f32 = take_f(rows * N);
    for (DeviceArray<int32_t>* a : {&R.ids, &R.pos, &R.cache_rows, &R.lens, &R.forced}) a->resize((size_t)slots, "decode step rows");
    R.keys.resize((size_t)slots, "sampling keys"), R.sample_pos.resize((size_t)slots, "sampling positions");
    R.cache->reserve_decode(slots, m.H);
    R.table.resize(z.table, "decode page table");
    if (m.V % 8) {  // the logits GEMM needs a multiple of 8 rows: the head with zero rows appended
        R.head.resize(z.padded_head, "padded head weights");
        R.head.zero(stream_);
        CUDA_CHECK(cudaMemcpyAsync(R.head.get(), wb(m.lm_head), (size_t)m.V * C * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                   stream_));
    }
    ensure_rope(R.max_len);
    ensure_scratch(rows);

    R.requests.assign(requests.size(), RolloutState::Request{});
    std::map<std::vector<int32_t>, int> prompt_ids;
    for (size_t i = 0; i < requests.size(); i++) {
        const int id = prompt_ids.emplace(requests[i].prompt, (int)prompt_ids.size()).first->second;
        R.requests[i] = {&requests[i].prompt, requests[i].sequence, forced ? &(*forced)[i] : nullptr, id, {}, {}};
    }
    R.prompts.assign(prompt_ids.size(), RolloutState::Prompt{});
    for (const RolloutState::Request& q : R.requests) R.prompts[(size_t)q.prompt_id].ids = q.prompt;
    R.prompt_xf.resize(prompt_ids.size() * (size_t)C, "prompts' last hidden states");
    auto done_with = [&](const RolloutState::Request& q) {
        return q.forced ? q.gen.tokens.size() == q.forced->size()
                        : q.gen.finished || (int)q.gen.tokens.size() >= s.max_new_tokens;
    };
    auto release = [&](RolloutState::Request& q) {
        for (int p : q.pages) R.drop_page(p);
        q.pages.clear();
        RolloutState::Prompt& pr = R.prompts[(size_t)q.prompt_id];
        if (--pr.users > 0) return;
        for (int p : pr.pages) R.drop_page(p);
        pr.pages.clear();
    };
    // appends each row's token; returns the rows' sequences that go on
    int64_t finished = 0;
    auto record = [&](const std::vector<int>& seqs) {
        const std::vector<SampledToken> tok = R.sampled.download(seqs.size());
        std::vector<int> going;
        for (size_t r = 0; r < seqs.size(); r++) {
            RolloutState::Request& q = R.requests[(size_t)seqs[r]];
            q.gen.tokens.push_back(tok[r].token);
            q.gen.logprobs.push_back(tok[r].logprob_full);
            q.gen.logprobs_sampled.push_back(tok[r].logprob);
            for (int64_t e : config().eos_token_ids) q.gen.finished |= !q.forced && tok[r].token == e;
            if (done_with(q)) {
                release(q);
                finished++;
            } else {
                going.push_back(seqs[r]);
            }
        }
        if (progress) progress->update(finished);
        return going;
    };
    // the sampling inputs of `rows` rows: the sequences', then padding rows (key 0, position 0,
    // token 0 forced: a valid id)
    auto set_step_rows = [&](const std::vector<int>& seqs, int rows) {
        R.step_keys.assign((size_t)rows, 0), R.step_pos.assign((size_t)rows, 0), R.step_forced.assign((size_t)rows, 0);
        for (size_t r = 0; r < seqs.size(); r++) {
            const RolloutState::Request& q = R.requests[(size_t)seqs[r]];
            const size_t k = q.gen.tokens.size();
            R.step_keys[r] = q.key;
            R.step_pos[r] = (uint32_t)(q.prompt->size() + k);
            R.step_forced[r] = q.forced ? (*q.forced)[k] : -1;
        }
        R.keys.upload(R.step_keys), R.sample_pos.upload(R.step_pos), R.forced.upload(R.step_forced);
    };

    std::deque<int> waiting;
    for (size_t i = 0; i < requests.size(); i++) waiting.push_back((int)i);
    std::vector<int> running;  // in admission order: the newest last
    while (finished < (int64_t)requests.size()) {
        // admit waiting sequences while a slot and the pages are free: their prompt's (unless it is
        // cached) and their copy of its last partial page
        std::vector<int> admit, new_prompts;
        std::vector<std::pair<int, int>> copies;  // (prompt page, the request's copy)
        while (!waiting.empty() && (int)(running.size() + admit.size()) < slots) {
            RolloutState::Request& q = R.requests[(size_t)waiting.front()];
            RolloutState::Prompt& pr = R.prompts[(size_t)q.prompt_id];
            const long P = (long)q.prompt->size(), full = P / R.page_tokens;
            const int need = (pr.users ? 0 : R.pages_for(P)) + (P % R.page_tokens ? 1 : 0);
            if (need > (int)R.free_pages.size()) break;
            if (pr.users++ == 0) {
                for (int k = 0; k < R.pages_for(P); k++) pr.pages.push_back(R.take_page());
                new_prompts.push_back(q.prompt_id);
            }
            for (long k = 0; k < full; k++) q.pages.push_back(pr.pages[(size_t)k]), R.page_refs[(size_t)pr.pages[(size_t)k]]++;
            if (P % R.page_tokens) {
                q.pages.push_back(R.take_page());
                copies.push_back({pr.pages[(size_t)full], q.pages.back()});
            }
            admit.push_back(waiting.front());
            waiting.pop_front();
        }
        if (!admit.empty()) {
            if (!new_prompts.empty()) prefill(new_prompts, weights);
            for (const auto& c : copies) R.cache->copy_page(c.first, c.second, stream_);
            for (size_t r = 0; r < admit.size(); r++)  // each samples its first token from its prompt's last row
                CUDA_CHECK(cudaMemcpyAsync(R.xf + r * C, R.prompt_xf.get() + (size_t)R.requests[(size_t)admit[r]].prompt_id * C,
                                           C * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
            set_step_rows(admit, (int)admit.size());
            sample_rows((int)admit.size(), s, step);
            for (int i : record(admit)) running.push_back(i);
        }
        // each running sequence feeds its last token; one crossing into a new page takes one, and
        // when none is free the newest running sequence gives its pages back and waits again
        for (size_t k = 0; k < running.size();) {
            RolloutState::Request& q = R.requests[(size_t)running[k]];
            const long position = (long)(q.prompt->size() + q.gen.tokens.size() - 1);
            if (position / R.page_tokens < (long)q.pages.size()) {
                k++;
            } else if (!R.free_pages.empty()) {
                q.pages.push_back(R.take_page());
                k++;
            } else {
                RolloutState::Request& newest = R.requests[(size_t)running.back()];
                release(newest);
                newest.gen = Generation();
                waiting.push_front(running.back());
                running.pop_back();
                rollout_stats_.preemptions++;
            }
        }
        if (running.empty()) continue;
        const int rows = decode_bucket((int)running.size(), slots);
        set_step_rows(running, rows);
        decode_step(running, rows, weights, s, step);
        running = record(running);
    }
    R.drop_graphs();
    std::vector<Generation> out;
    for (RolloutState::Request& q : R.requests) out.push_back(std::move(q.gen));
    return out;
}

inline void GpuEngine::calibrate_kv_scales(const std::vector<GenRequest>& requests, Precision weights) {
    RolloutState& R = *rollout_;
    // each distinct prompt once: duplicates change no amax, nor do the other rows of the batch (rows
    // are computed independently), so the max over the ranks is the amax over all their prompts
    std::vector<Sequence> prompts;
    std::set<std::vector<int32_t>> seen;
    for (const GenRequest& r : requests)
        if (seen.insert(r.prompt).second) prompts.push_back({r.prompt, (int32_t)r.prompt.size()});
    const CpuModel& m = model_;
    const size_t per_tensor = (size_t)m.L * m.KV;
    R.amax.resize(2 * per_tensor, "KV amax");  // [K, V][L][KV]
    trunk_forward(prompts, weights, false, [&](int l) {
        kv_amax_gpu(R.amax.get() + (size_t)l * m.KV, layers_[l].k, T_, m.KV, m.D, stream_);
        kv_amax_gpu(R.amax.get() + per_tensor + (size_t)l * m.KV, layers_[l].v, T_, m.KV, m.D, stream_);
    });
    const std::vector<float> amax = R.amax.download();
    // one scale per layer (the max over its KV heads) or, with --kv_scales head, per layer and KV head,
    // from the amaxes of every rank's prompts
    std::vector<float> k, v;
    kv_scales_from_amax(amax.data(), amax.data() + per_tensor, m.L, m.KV, options_.kv_scale_per_head, options_.kv_amax_reduce,
                        k, v);
    R.cache->set_scales(k, v);
    if (R.cache->k_scales() != k || R.cache->v_scales() != v) fail("generate: the KV cache did not take its FP8 scales");
    rollout_stats_.k_scale = k, rollout_stats_.v_scale = v;
}

// Prefill of distinct prompts into their pages (R.prompts[id].pages); each prompt's last row is
// kept in R.prompt_xf, where its requests sample their first token from.
inline void GpuEngine::prefill(const std::vector<int>& prompt_ids, Precision weights) {
    PROFILE_RANGE("forward");
    RolloutState& R = *rollout_;
    const CpuModel& m = model_;
    std::vector<Sequence> prompts;
    std::vector<int32_t> rows;
    for (int id : prompt_ids) {
        const std::vector<int32_t>* p = R.prompts[(size_t)id].ids;
        prompts.push_back({*p, (int32_t)p->size()});
        const std::vector<int>& pages = R.prompts[(size_t)id].pages;
        for (long t = 0; t < (long)p->size(); t++)
            rows.push_back((int32_t)((long)pages[(size_t)(t / R.page_tokens)] * R.page_tokens + t % R.page_tokens));
    }
    R.prefill_rows.resize(rows.size(), "prefill cache rows");
    R.prefill_rows.upload(rows);
    const long scratch_rows = scratch_max_tokens_;
    trunk_forward(prompts, weights, false, [&](int l) {
        R.cache->append(l, layers_[l].k, layers_[l].v, R.prefill_rows.get(), T_, stream_);
        R.cache->round_trip(l, layers_[l].k, layers_[l].v, T_, stream_);
    });
    if (scratch_max_tokens_ != scratch_rows) R.drop_graphs();  // they quantize into the FP8 scratch this forward reallocated
    for (size_t s = 0; s < prompt_ids.size(); s++)
        CUDA_CHECK(cudaMemcpyAsync(R.prompt_xf.get() + (size_t)prompt_ids[s] * m.C, xf_ + (batch_.offsets[s + 1] - 1) * m.C,
                                   m.C * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
    rollout_stats_.prefills++;
    rollout_stats_.prefill_tokens += T_;
}

// One decode step of the running sequences `seqs` over `rows` rows (their bucket; the sampling
// inputs already uploaded): the rows' inputs uploaded, then the step's launches, or the replay of
// the bucket's graph, captured at its first step.
inline void GpuEngine::decode_step(const std::vector<int>& seqs, int rows, Precision weights, const SamplingConfig& s,
                                   uint32_t step) {
    PROFILE_RANGE("decode_step");
    RolloutState& R = *rollout_;
    const int B = (int)seqs.size();
    // padding rows: token 0 at position 0, no cache slot, length 0
    std::vector<int32_t> ids((size_t)rows, 0), pos((size_t)rows, 0), cache_rows((size_t)rows, -1), lens((size_t)rows, 0);
    std::vector<int32_t> table((size_t)rows * R.max_pages, 0);
    for (int r = 0; r < B; r++) {
        const RolloutState::Request& q = R.requests[(size_t)seqs[r]];
        const long position = (long)(q.prompt->size() + q.gen.tokens.size() - 1);
        ids[(size_t)r] = q.gen.tokens.back();
        pos[(size_t)r] = (int32_t)position;
        cache_rows[(size_t)r] = R.cache_row(q, position);
        lens[(size_t)r] = (int32_t)position + 1;
        std::copy(q.pages.begin(), q.pages.end(), table.begin() + (size_t)r * R.max_pages);
    }
    R.ids.upload(ids), R.pos.upload(pos), R.cache_rows.upload(cache_rows), R.lens.upload(lens), R.table.upload(table);
    rollout_stats_.decode_steps++;
    rollout_stats_.max_running = std::max(rollout_stats_.max_running, B);
    if (!options_.cuda_graphs) return decode_launches(rows, weights, s, step);
    const auto graph = R.graphs.find(rows);
    if (graph != R.graphs.end()) {
        CUDA_CHECK(cudaGraphLaunch(graph->second, stream_));
        rollout_stats_.graph_launches++;
        return;
    }
    // the warm-up computes this step; whatever the launches set up lazily (GEMM plans, kernel
    // attributes) is done by then, so the capture records kernels and device copies only
    decode_launches(rows, weights, s, step);
    cudaGraph_t captured = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    decode_launches(rows, weights, s, step);
    CUDA_CHECK(cudaStreamEndCapture(stream_, &captured));
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, captured, 0));
    CUDA_CHECK(cudaGraphDestroy(captured));
    R.graphs[rows] = exec;
    rollout_stats_.graphs_captured++;
}

// The launches of a decode step over `rows` rows, every input on the device: embedding, per layer
// the shared attention inputs (appending K and V), paged decode attention, the shared attention outputs and
// MLP; final norm; then the tokens (sample_rows).
inline void GpuEngine::decode_launches(int rows, Precision weights, const SamplingConfig& s, uint32_t step) {
    RolloutState& R = *rollout_;
    const CpuModel& m = model_;
    const StepRows r{rows, weights == Precision::FP8 ? (rows + 127) / 128 * 128 : rows, R.pos.get(), R.gemm_f32, weights,
                     false, options_.fp8_scaling};
    LayerActsGpu& A = R.A;
    embedding_forward(A.x, wb(m.embed), R.ids.get(), rows, m.V, m.C, stream_);
    for (int l = 0; l < m.L; l++) {
        // the residual: the last layer's h1 + mlp; K and V appended to the cache by the q/k-norm + RoPE kernel
        attention_inputs(A, l > 0 ? &A : nullptr, l, r, R.cache->append_target(l, R.cache_rows.get()));
        R.cache->decode_attention(l, A.att, A.q, m.H, R.table.get(), R.max_pages, R.lens.get(), rows, R.max_len, stream_);
        attention_outputs(A, l, r, false);
    }
    residual_rmsnorm_forward(R.xf, R.rstdf, A.x, A.h1, A.mlp, wb(m.final_norm), rows, m.C, m.eps, stream_);
    sample_rows(rows, s, step);
}

// Logits of R.xf's first `rows` rows through the BF16 head (FP32 accumulation, as loss.cuh's
// head and the CPU generator compute them), then one token per row (cuda/sampling.cuh), or the
// forced token when teacher forcing.
inline void GpuEngine::sample_rows(int rows, const SamplingConfig& s, uint32_t step) {
    PROFILE_RANGE("sampling");
    RolloutState& R = *rollout_;
    const CpuModel& m = model_;
    const int V8 = round_up8(m.V), n = s.vocab_limit > 0 ? s.vocab_limit : m.V;
    const bf16* W = m.V % 8 ? R.head.get() : wb(m.lm_head);
    gemm_.bf16("rollout logits", V8, rows, m.C, W, R.xf, R.logits.get(), GemmOut::F32, stream_);
    if (R.requests.front().forced) {
        LAUNCH_KERNEL(forced_token_kernel, (rows + 63) / 64, 64, 0, stream_, (const float*)R.logits.get(), V8, n,
                      (const int32_t*)R.forced.get(), rows, R.sample_scratch.get(), R.sampled.get());
        return;
    }
    sample_tokens_gpu(R.sampled.get(), nullptr, R.logits.get(), rows, V8, n, {s.temperature, s.top_k, s.top_p}, s.seed,
                      step, R.keys.get(), R.sample_pos.get(), R.sample_scratch.get(), stream_);
}

}  // namespace fp8rl

#endif  // FP8RL_ROLLOUT_CU
