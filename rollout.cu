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
//   windows   the decode loop runs without the host (cuda/rollout/decode_slots.cuh): the running sequences'
//             state lives in device slots, a step's first kernel turns them into its inputs and its
//             last appends each drawn token to its slot's window buffer, advancing the slot and
//             stopping it on eos or at its limit (a padding row from then on). The host looks once
//             per window of up to kDecodeWindow (16) steps: one copy of the tokens and slots back
//             into pinned memory and the one wait (collect_window), then one copy of the next
//             window's slots and page tables in (start_window): the host synchronizes once per 16
//             steps and copies to the device at most once per step.
//   schedule  continuous batching at the windows' edges: up to --rollout_slots sequences run
//             together; a waiting one is admitted as soon as a slot and its prompt's pages are free
//             (its first token is drawn on the device in the window); a finished one frees both. A
//             window takes the pages its steps will cross into beforehand, as many steps as the
//             free pages give every running sequence. Within a window, slots are refilled on the
//             device: waiting requests whose prompt is cached (a running sibling holds it) stand by,
//             their pages for the window taken and their first token drawn at its start, and a row
//             whose sequence stops (eos or its limit) takes the next of them in the following step
//             (decode_slots.cuh's refill); one no row took waits again, keeping that token. With
//             requests waiting and none able to stand by, the window ends when the first running
//             one reaches its limit, so its slot is refilled then. When not one step fits,
//             the newest running sequence is preempted: it frees its pages and waits, keeping its
//             tokens; admitted again it gets its prompt's K/V as before and those of its kept tokens
//             from decode launches over one row per token (replay_kept_tokens), which compute what
//             the steps that fed them computed. Its keys are (seed, step, sequence, position) and
//             every row of a step is computed independently of the others (GEMM algorithms pinned
//             per weight, decode attention cut by the row's own length), so a completion has the
//             same bits whatever it is batched with, waits for or is preempted by.
//   turns     a multi-turn rollout (start_turns, next_turns): a request that finishes its turn keeps
//             its pages (held); its next turn appends its observation and waits again, and its
//             admission feeds the last turn's last token and the observation's tokens into its
//             pages from where they end (replay_kept_tokens from q.fed), then decodes on. A request
//             whose trajectory ended gives its pages back; under page pressure held pages give way
//             (release_one_held) before a running request is preempted, and a released request
//             gets its K/V back as a preempted one does, with the same bits.
//   FP8 KV    scales per layer (or per layer and KV head, --kv_scales head) from a forward over the
//             prompts with the current weights (the amax of K after norm and RoPE, and of V:
//             spec-fp8.md §9.4, as the CPU engine does), the amaxes reduced over the ranks
//             (rl/numerics/kv_scales.h), set before the first append and reported in rollout_stats().
//   graphs    a decode step runs over its B sequences padded to a bucket (decode_bucket: powers of
//             two, capped at the slots), the same for a whole window, with or without graphs, so
//             --cuda_graphs changes no bit. The first step of a bucket runs its launches (slots to
//             rows, embedding to sampling, commit) once as a warm-up, then captures them into a
//             graph on the engine's stream; later steps replay it, in this rollout() call and the
//             next ones: what changes per step lives in device buffers (the slots, the page tables,
//             the RL step), and the graphs are dropped when what the kernels take by value changes
//             (slots, max_len, precision, sampling parameters, teacher forcing) or when any device
//             buffer was allocated or freed since their capture (device_allocations), since a
//             graph holds the addresses it was captured with. Prefill, admissions' first tokens and
//             replays run eagerly.
// Included at the end of cuda/engine/engine_gpu.cuh (the GPU program is one translation unit per binary,
// so the build needs no new object); compiled alone by make cuda-check, it includes the engine.
#ifndef FP8RL_ROLLOUT_CU
#define FP8RL_ROLLOUT_CU
#include <deque>
#include <map>
#include <set>

#include "cuda/rollout/decode_slots.cuh"
#include "cuda/engine/engine_gpu.cuh"
#include "cuda/engine/pinned_array.cuh"
#include "cuda/rollout/sampling.cuh"
#include "kv_cache.cuh"

namespace fp8rl {

// Decode steps per window: the host looks at the device once per window (collect_window), so its
// synchronizations are 1/16 of the steps. A finished sequence's row is refilled on the device from
// the window's standby requests; without one it waits at most this many steps for the host (at
// ~1,000-token completions under 1% of the row's steps).
constexpr int kDecodeWindow = 16;

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
    size_t control = 0;  // bytes of the decode control block (cuda/rollout/decode_slots.cuh), and as much pinned host memory
};

// The pages a generation needs at least: its longest request's (the last token of a completion is
// never fed: a sequence holds prompt + max_new_tokens - 1 positions), plus its prompt's unwritten
// partial page.
inline int kv_pages_needed(long longest_prompt, int max_new_tokens, int page_tokens) {
    return (int)((longest_prompt + max_new_tokens - 1 + page_tokens - 1) / page_tokens) + 1;
}

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
    z.table = (size_t)z.rows * max_pages;  // the kept tokens' replay runs up to `rows` rows
    z.control = DecodeControlLayout(z.slots, kDecodeWindow, max_pages).bytes;
    return z;
}

// The rollout phase's device memory for the plan (cuda/engine/memory_plan.h): the decode buffers, the
// KV page pool asked for (every slot at full length, or --kv_cache_mb) and the least a generation
// runs in (the longest request's pages: rollout() refuses less), and the size of a page.
struct RolloutMemory {
    size_t buffers = 0, pool = 0, pool_min = 0, page = 0;
};

inline RolloutMemory rollout_memory(const ModelConfig& c, const EngineOptions& o, long requests, long longest_prompt,
                                    int max_new_tokens, Precision kv_cache) {
    const RolloutSizes z = rollout_sizes(c, o, requests, longest_prompt, max_new_tokens, kv_cache);
    RolloutMemory m;
    m.page = z.page_bytes;
    m.pool = PagedKvCache::bytes(z.shape, kv_cache);
    m.pool_min = kv_pages_needed(longest_prompt, max_new_tokens, z.shape.page_tokens) * z.page_bytes;
    m.buffers =
        PagedKvCache::decode_workspace_bytes(z.shape, (int)z.rows, (int)c.num_heads, (int)(longest_prompt + max_new_tokens)) +
        (z.act + z.padded_head) * sizeof(bf16) + (z.act_f32 + z.logits + z.sample_scratch) * sizeof(float) +
        // the control block (slots and page tables), the kept tokens' page table, the step's row inputs
        z.control + z.table * sizeof(int32_t) + (size_t)z.rows * 5 * sizeof(int32_t) +
        (size_t)z.slots * (sizeof(int32_t) + 3 * sizeof(uint32_t) + sizeof(SampledToken)) +
        // the prompts' last hidden states (at most one per request), a prefill's cache rows, the KV amax, the eos ids
        (size_t)requests * c.hidden_size * sizeof(bf16) + (size_t)z.slots * longest_prompt * sizeof(int32_t) +
        2 * (size_t)c.num_layers * sizeof(float) + c.eos_token_ids.size() * sizeof(int32_t);
    return m;
}

inline size_t rollout_device_bytes(const ModelConfig& c, const EngineOptions& o, long requests, long longest_prompt,
                                   int max_new_tokens, Precision kv_cache) {
    const RolloutMemory m = rollout_memory(c, o, requests, longest_prompt, max_new_tokens, kv_cache);
    return m.buffers + m.pool;
}

// The plan's rollout phase (GpuEngine::plan_request): the decode buffers and the pool as rollout()
// sizes them, and its largest forward: the prefill of the distinct prompts admitted at once, the KV
// calibration's over all of them, the decode rows, or the RoPE table of the longest sequence.
inline void GpuEngine::fill_rollout_request(const ModelConfig& c, const EngineOptions& o, const MemoryDemand& d,
                                            MemoryPlanRequest& r) {
    const RolloutMemory m = rollout_memory(c, o, (long)d.rollout_requests, (long)d.longest_prompt, d.max_new_tokens, d.kv_cache);
    r.rollout_bytes = m.buffers, r.kv_pool_bytes = m.pool, r.kv_pool_min_bytes = m.pool_min, r.kv_page_bytes = m.page;
    const RolloutSizes z = rollout_sizes(c, o, (long)d.rollout_requests, (long)d.longest_prompt, d.max_new_tokens, d.kv_cache);
    // an FP8 cache's calibration runs every distinct prompt at once; a prefill, those admitted together (at most the slots)
    const int64_t prompts = std::max<int64_t>(d.kv_cache == Precision::FP8 ? d.rollout_prompts : std::min<int64_t>(d.rollout_prompts, z.slots), 1);
    r.rollout_tokens = std::max({prompts * d.longest_prompt, (int64_t)z.rows, d.longest_prompt + d.max_new_tokens});
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

// Teacher forcing, one block per row of logits [rows][ld]: the given token forced[r] with its log-prob
// at temperature 1 / inv_t over the first n columns, as rl/numerics/sampling.h computes logprob_full
// (exp_shifted_row: the row's max of z * inv_t, then sampling.h's chunked row_sum, which
// block_row_sum adds in the host's order, so the bits are the host's). scratch [rows][n].
static __global__ void __launch_bounds__(kSampleThreads)
    forced_token_kernel(const float* logits, int ld, int n, float inv_t, const int32_t* forced, float* scratch, SampledToken* out) {
    const long r = blockIdx.x;
    const float* z = logits + r * ld;
    float s_max = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s_max = fmaxf(s_max, mul_rn(z[i], inv_t));
    s_max = block_reduce(s_max, [](float a, float b) { return fmaxf(a, b); });
    STATIC_SHARED(double, chunk_sums, [kSampleMaxChunks]);
    const double sum = block_row_sum(n, ExpTerm{z, inv_t, s_max, scratch + r * n}, chunk_sums);
    if (threadIdx.x == 0) {
        const float lp = (float)((mul_rn(z[forced[r]], inv_t) - s_max) - log(sum));
        out[r] = SampledToken{forced[r], lp, lp};
    }
}

// One request's host-side state.
struct RolloutRequest {
    const std::vector<int32_t>* prompt;
    uint32_t key;
    const std::vector<int32_t>* forced;  // teacher forcing: the completion to score; null = sample
    int prompt_id;                        // its prompt in `prompts`
    int forced_offset;                    // its completion in the forced pool (teacher forcing)
    std::vector<int> pages;               // KV pages, in position order: its prompt's full pages, then its own
    Generation gen;                       // kept when it is preempted; a multi-turn row's: every turn's and observation's tokens
    int limit = 0;                        // it draws until gen holds this many tokens (sampled)
    // Multi-turn (GpuEngine::next_turns): `held`, it keeps its pages between turns (a finished turn, or
    // waiting for its next one), the K/V of its positions [0, fed) in them; turn_start: this turn's first token in gen.
    bool held = false, ended = false;  // ended: its trajectory is over (a next_turns did not list it)
    long fed = 0;
    size_t turn_start = 0;
};

// The host-side state of the requests and the device buffers of the decode loop.
struct RolloutState {
    using Request = RolloutRequest;
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
    DeviceArray<int32_t> ids, pos, cache_rows, lens, prefix, forced, prefill_rows, replay_table, forced_pool, eos;
    DeviceArray<uint32_t> keys, sample_pos, steps;
    DeviceArray<SampledToken> sampled;
    DeviceArray<uint8_t> control;  // cuda/rollout/decode_slots.cuh's control block, and its pinned mirror
    PinnedArray<uint8_t> mirror;
    DecodeControlLayout layout;
    LayerActsGpu A{};
    bf16* xf = nullptr;  // [rows][C] the final normed hidden
    float *rstdf = nullptr, *gemm_f32 = nullptr;
    // Decode step graphs by bucket and decode_len, kept across rollout() calls while what their
    // launches take by value (graph_key) holds and no device buffer was allocated or freed since
    // their capture.
    std::map<std::pair<int, int>, cudaGraphExec_t> graphs;
    std::vector<uint64_t> graph_key;
    uint64_t graph_allocations = 0;

    void drop_graphs() {
        for (const auto& g : graphs) CUDA_CHECK(cudaGraphExecDestroy(g.second));
        graphs.clear();
    }
    DecodeRows rows_out() {
        return {ids.get(), pos.get(), cache_rows.get(), lens.get(), prefix.get(), forced.get(), keys.get(), sample_pos.get(), steps.get()};
    }
    template <class T>
    T* in_control(size_t offset) { return (T*)(control.get() + offset); }
    template <class T>
    T* in_mirror(size_t offset) { return (T*)(mirror.get() + offset); }

    // Scheduling, on the host, at the windows' edges: slot i of the next window runs running[i].
    struct Admission {
        int request;
        bool fresh;       // it draws its first token at admission (else it kept tokens through a preemption)
        bool new_prompt;  // its prompt is prefilled for it
        int copy_from, copy_to;  // its copy of the prompt's last partial page (-1: none)
    };
    std::deque<int> waiting;
    std::vector<int> running;          // in admission order: the newest last
    std::vector<Admission> admitted;   // this window's admissions: the last of `running`
    std::vector<Admission> standby;    // this window's standby requests: slot S + j is standby[j]'s
    int64_t finished = 0;
    bool keep = false;  // a multi-turn rollout: a request that finishes its turn keeps its pages (held)

    int limit(const Request& q) const { return q.forced ? (int)q.forced->size() : q.limit; }
    // A held request's turn is over (it waits for next_turns), or it waits for its next turn's draws.
    bool turn_done(const Request& q) const { return q.gen.finished || (int)q.gen.tokens.size() >= limit(q); }
    // The keys of the longest row at the window's first step, of the running and the standby
    // requests (a refill takes a standby one): each row has at most this many plus the steps since.
    long longest_at_steps() const {
        long longest = 0;
        for (int i : running) longest = std::max(longest, (long)requests[(size_t)i].prompt->size() + tokens_at_steps(requests[(size_t)i]));
        for (const Admission& a : standby)
            longest = std::max(longest, (long)requests[(size_t)a.request].prompt->size() + tokens_at_steps(requests[(size_t)a.request]));
        return longest;
    }
    // The max_len a decode step's attention plans for, rows of at most `longest` keys: rounded up to
    // whole chunks, so the steps of a chunk count share one graph, and at most max_len. Its grid
    // follows the rows' lengths, not the configured maximum.
    int decode_len(long longest) const {
        return (int)std::min<long>(max_len, (longest + kDecodeSplitKeys - 1) / kDecodeSplitKeys * kDecodeSplitKeys);
    }
    // the request's tokens when the window's decode steps begin (a fresh admission draws its first before them)
    static int tokens_at_steps(const Request& q) { return std::max<int>(1, (int)q.gen.tokens.size()); }

    void release(Request& q) {
        for (int p : q.pages) drop_page(p);
        q.pages.clear();
        q.held = false, q.fed = 0;
        Prompt& pr = prompts[(size_t)q.prompt_id];
        if (--pr.users > 0) return;
        for (int p : pr.pages) drop_page(p);
        pr.pages.clear();
    }

    // The pages that taking waiting request q in needs: its prompt's (unless it is cached), its copy of
    // the prompt's last partial page, and the pages of the tokens it kept through a preemption, all
    // but the last (which the next step feeds).
    int pages_to_hold(const Request& q) const {
        const long P = (long)q.prompt->size(), kept = (long)q.gen.tokens.size();
        if (q.held) return std::max(0, pages_for(P + kept - 1) - (int)q.pages.size());  // its next turn's new positions
        return (prompts[(size_t)q.prompt_id].users ? 0 : pages_for(P)) + pages_for(P + std::max<long>(kept - 1, 0)) -
               (int)(P / page_tokens);
    }
    // Takes those pages for request i (pages_to_hold of them must be free).
    Admission hold(int i) {
        Request& q = requests[(size_t)i];
        Prompt& pr = prompts[(size_t)q.prompt_id];
        const long P = (long)q.prompt->size(), full = P / page_tokens, kept = (long)q.gen.tokens.size();
        if (q.held) {  // a next turn: its pages and K/V are there, up to q.fed
            while ((int)q.pages.size() < pages_for(P + kept - 1)) q.pages.push_back(take_page());
            q.held = false;
            return Admission{i, false, false, -1, -1};
        }
        const int own = pages_for(P + std::max<long>(kept - 1, 0)) - (int)full;
        Admission a{i, kept == 0, pr.users == 0, -1, -1};
        if (pr.users++ == 0)
            for (int k = 0; k < pages_for(P); k++) pr.pages.push_back(take_page());
        for (long k = 0; k < full; k++) q.pages.push_back(pr.pages[(size_t)k]), page_refs[(size_t)pr.pages[(size_t)k]]++;
        for (int k = 0; k < own; k++) q.pages.push_back(take_page());
        if (P % page_tokens) a.copy_from = pr.pages[(size_t)full], a.copy_to = q.pages[(size_t)full];
        return a;
    }

    // Admits waiting requests while a slot and their pages are free.
    void admit(int slots) {
        admitted.clear();
        while (!waiting.empty() && (int)running.size() < slots) {
            if (pages_to_hold(requests[(size_t)waiting.front()]) > (int)free_pages.size()) {
                if (running.empty() && release_one_held(waiting.front())) continue;
                break;
            }
            admitted.push_back(hold(waiting.front()));
            running.push_back(waiting.front());
            waiting.pop_front();
        }
    }

    // A waiting request that a row can take on the device when its sequence stops (decode_slots.cuh's
    // refill): its prompt is cached and it kept at most its first token, so nothing but that token
    // (drawn at the window's start) needs computing first.
    bool can_stand_by(const Request& q) const {
        return prompts[(size_t)q.prompt_id].users > 0 && q.gen.tokens.size() <= 1 && !q.held;
    }

    // Under page pressure the pages a multi-turn rollout keeps give way before a running request is
    // preempted: a held request's (one whose turn is over first, then the last waiting), except
    // request `except`'s. Released, it gets its K/V back as a preempted one does. False: none held.
    bool release_one_held(int except) {
        int pick = -1;
        for (int i = (int)requests.size() - 1; i >= 0 && pick < 0; i--)
            if (i != except && requests[(size_t)i].held && turn_done(requests[(size_t)i])) pick = i;
        for (auto it = waiting.rbegin(); it != waiting.rend() && pick < 0; ++it)
            if (*it != except && requests[(size_t)*it].held) pick = *it;
        if (pick < 0) return false;
        release(requests[(size_t)pick]);
        return true;
    }

    // After plan_window: up to `slots` waiting requests that can stand by, in waiting order, while the
    // free pages give each what it holds and the pages of `steps` decode steps. They leave `waiting`
    // for `standby`; collect_window returns those no row took. The window's steps: `steps`, but no
    // more than a running or standby request may take (a step after every row stopped is wasted).
    int choose_standby(int slots, int steps) {
        standby.clear();
        for (auto it = waiting.begin(); it != waiting.end() && (int)standby.size() < slots;) {
            Request& q = requests[(size_t)*it];
            if (!can_stand_by(q)) {
                ++it;
                continue;
            }
            // its copy of the partial page, or the pages of the window's steps beyond its prompt's full ones
            const int need = std::max(pages_to_hold(q), pages_after(q, steps) - (int)(q.prompt->size() / page_tokens));
            if (need > (int)free_pages.size()) break;
            standby.push_back(hold(*it));
            while ((int)q.pages.size() < pages_after(q, steps)) q.pages.push_back(take_page());
            it = waiting.erase(it);
        }
        int longest = 0;
        for (int i : running) longest = std::max(longest, steps_left(i));
        for (const Admission& a : standby) longest = std::max(longest, steps_left(a.request));
        return std::min(steps, longest);
    }

    // The pages request q holds after `steps` decode steps: one more for each step that feeds a position on a new page.
    int pages_after(const Request& q, int steps) const {
        const int t = tokens_at_steps(q), fed = std::min(steps, limit(q) - t);
        return std::max((int)q.pages.size(), pages_for((long)q.prompt->size() + t - 1 + fed));
    }
    long pages_needed(int steps) const {
        long need = 0;
        for (int i : running) need += pages_after(requests[(size_t)i], steps) - (long)requests[(size_t)i].pages.size();
        return need;
    }

    // The decode steps of the next window, at most `window` and no more than a running request still
    // takes: as many as the free pages give every running request. When not one step fits, the newest running request is preempted: it gives its
    // pages back and waits again, keeping its tokens (one admitted for this window is taken back).
    // With requests waiting, none of which can stand by, the window ends when the first running
    // request reaches its limit, so its slot is refilled then; one that can stand by is taken on the
    // device instead.
    int plan_window(int window, int64_t* preemptions) {
        for (;;) {
            int longest = 0, shortest = window;  // of the steps the running requests may still take
            for (int i : running) longest = std::max(longest, steps_left(i)), shortest = std::min(shortest, steps_left(i));
            bool refills = false;  // and those that may stand by
            for (int i : waiting)
                if (can_stand_by(requests[(size_t)i])) refills = true, longest = std::max(longest, steps_left(i));
            const int cap = std::min({window, longest, waiting.empty() || refills ? window : shortest});
            if (cap <= 0) return 0;
            for (int steps = cap; steps > 0; steps--) {
                if (pages_needed(steps) > (long)free_pages.size()) continue;
                for (int i : running) {
                    Request& q = requests[(size_t)i];
                    while ((int)q.pages.size() < pages_after(q, steps)) q.pages.push_back(take_page());
                }
                return steps;
            }
            if (release_one_held(-1)) continue;
            const int newest = running.back();
            release(requests[(size_t)newest]);
            if (!admitted.empty() && admitted.back().request == newest) admitted.pop_back();
            waiting.push_front(newest);
            running.pop_back();
            (*preemptions)++;
        }
    }

    int steps_left(int i) const { return limit(requests[(size_t)i]) - tokens_at_steps(requests[(size_t)i]); }
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

// Entering the update: the KV pool, the decode buffers and the graphs captured on them (the next
// rollout captures them again).
inline void GpuEngine::release_rollout() {
    if (!rollout_) return;
    rollout_->drop_graphs();
    rollout_.reset();
}

// --kv_cache_mb 0: the KV pages the device leaves for this generation beside what else the rollout
// allocates (its decode buffers, the prefill forward of its distinct prompts, one activation set, and
// the GEMM scratch), less kPoolHeadroomBytes: free memory now, and the pool this engine holds (which
// rollout() frees first). Buffers it already holds are counted again, so this errs toward fewer pages.
inline int GpuEngine::pages_left(const std::vector<GenRequest>& requests, long longest_prompt, int max_new_tokens,
                                 Precision kv_cache, const RolloutSizes& z) const {
    std::set<std::vector<int32_t>> distinct;
    long prompt_tokens = 0;
    for (const GenRequest& r : requests)
        if (distinct.insert(r.prompt).second) prompt_tokens += (long)r.prompt.size();
    const long forward = std::max({prompt_tokens, z.rows, longest_prompt + max_new_tokens});
    EngineOptions o = options_;
    o.rollout_slots = z.slots;
    const ModelConfig& c = weights_.config;
    const size_t other = rollout_memory(c, o, (long)requests.size(), longest_prompt, max_new_tokens, kv_cache).buffers +
                         memory_plan_detail::forward_bytes(c, forward, true) + GemmRunner::WORKSPACE_BYTES +
                         memory_plan_detail::linear_scratch_bytes(c, forward, options_.fp8_scaling) + kPoolHeadroomBytes;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (rollout_ && rollout_->cache) free_bytes += PagedKvCache::bytes(rollout_->cache->shape(), rollout_->cache->storage());
    return free_bytes > other ? (int)std::min<size_t>((free_bytes - other) / z.page_bytes, (size_t)1e9) : 0;
}

// The rows a decode step of B sequences runs over: B padded up to a power of two, capped at the
// slots. Each bucket costs one warm-up and one capture while its graph is kept (graph_key), at most
// log2(slots) + 2 of them, and at most doubles the rows; extra rows cost little in decode, which reads every
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

inline TokenValues GpuEngine::decode_logprobs(const std::vector<Sequence>& seqs, const SamplingConfig& s, const RolloutNumerics& n) {
    TokenValues out;
    if (seqs.empty()) return out;
    std::vector<GenRequest> requests;
    std::vector<std::vector<int32_t>> responses;
    SamplingConfig forced = s;
    forced.max_new_tokens = teacher_forcing_split(seqs, &requests, &responses);
    const RolloutStats kept = rollout_stats_;  // the last generate()'s: its KV scales are what --train_kv_replay reads
    for (Generation& g : rollout(requests, &responses, 0, forced, n.weights, n.kv_cache, nullptr, &n)) out.push_back(std::move(g.logprobs));
    rollout_stats_ = kept;
    return out;
}

inline std::vector<Generation> GpuEngine::rollout(const std::vector<GenRequest>& requests,
                                                  const std::vector<std::vector<int32_t>>* forced, uint32_t step,
                                                  const SamplingConfig& s, Precision weights, Precision kv_cache,
                                                  Progress* progress, const RolloutNumerics* at, int kept_tokens) {
    const CpuModel& m = model_;
    if (weights == Precision::FP32) fail("the GPU engine generates in bf16 or fp8 (--rollout_precision; --precision with --prompts), not fp32");
    if (kv_cache == Precision::FP32) fail("the GPU engine's KV cache is bf16 or fp8 (--kv_cache), not fp32");
    if (options_.one_fp8_weight_copy && weights != Precision::FP8)
        fail("internal: an engine with one FP8 weight copy generates in fp8, not %s", precision_name(weights));
    need_fp8_weights(weights);
    if (requests.empty()) fail("generate: no prompts");
    if (s.max_new_tokens < 1) fail("generate: max_new_tokens must be at least 1");
    // the new tokens a request's pages and positions are sized for: a multi-turn trajectory's, or this call's
    const int horizon = kept_tokens > 0 ? kept_tokens : s.max_new_tokens;
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
        if (positions > 0 && (long)p.size() + horizon > positions)
            fail("generate: prompt %zu (%zu tokens) + --max_new_tokens %d exceeds the model's %ld positions "
                 "(max_position_embeddings); lower --max_new_tokens", i, p.size(), horizon, positions);
        longest = std::max(longest, (long)p.size());
    }
    if (!rollout_) rollout_.reset(new RolloutState());
    RolloutState& R = *rollout_;
    rollout_stats_ = RolloutStats();

    // the page pool (what the device leaves, up to every slot at its longest; or the pages --kv_cache_mb
    // holds) and the decode buffers, for --rollout_slots or, at 0 (unresolved by a memory plan), the most
    // requests free memory holds
    EngineOptions o = options_;
    if (o.rollout_slots == 0) o.rollout_slots = slots_that_fit((long)requests.size(), longest, horizon, kv_cache);
    RolloutSizes z = rollout_sizes(weights_.config, o, (long)requests.size(), longest, horizon, kv_cache);
    const int slots = z.slots;
    R.page_tokens = z.shape.page_tokens;
    R.max_len = (int)(longest + horizon);
    R.max_pages = R.pages_for(R.max_len);
    if (o.kv_cache_mb <= 0) z.shape.pages = std::min(z.shape.pages, pages_left(requests, longest, horizon, kv_cache, z));
    const KvCacheShape shape = z.shape;
    const int needed = kv_pages_needed(longest, horizon, R.page_tokens);
    if (shape.pages < needed && o.kv_cache_mb > 0)
        fail("generate: --kv_cache_mb %g holds %d KV pages of %d tokens (%zu bytes each), but the longest request "
             "(%ld prompt + %d new tokens) needs %d; raise --kv_cache_mb or lower --max_new_tokens",
             options_.kv_cache_mb, shape.pages, R.page_tokens, z.page_bytes, longest, horizon, needed);
    if (shape.pages < needed)
        fail("generate: the device leaves room for %d KV pages of %d tokens (%zu bytes each) beside the rollout's other "
             "buffers, but the longest request (%ld prompt + %d new tokens) needs %d; lower --max_new_tokens or "
             "--rollout_slots, or free the device (--offload_train_state 1)",
             std::max(shape.pages, 0), R.page_tokens, z.page_bytes, longest, horizon, needed);
    const KvCacheShape& had = R.cache ? R.cache->shape() : shape;
    if (!R.cache || R.cache->storage() != kv_cache || had.pages != shape.pages || had.page_tokens != shape.page_tokens) {
        R.cache.reset();  // free the old pool before the new one is allocated
        R.cache.reset(new PagedKvCache(shape, kv_cache));
    }
    if (kv_cache == Precision::FP8 && at) {
        if (at->k_scale.empty() || at->v_scale.empty()) fail("decode_logprobs: an FP8 KV cache without its scales");
        R.cache->set_scales(at->k_scale, at->v_scale);
        rollout_stats_.k_scale = at->k_scale, rollout_stats_.v_scale = at->v_scale;
    } else if (kv_cache == Precision::FP8) {
        calibrate_kv_scales(requests, weights);
    }
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
    // a step's rows: a decode step's at most `slots`, a replay of kept tokens' up to `rows`
    for (DeviceArray<int32_t>* a : {&R.ids, &R.pos, &R.cache_rows, &R.lens, &R.prefix}) a->resize((size_t)rows, "decode step rows");
    R.forced.resize((size_t)slots, "forced tokens");
    for (DeviceArray<uint32_t>* a : {&R.keys, &R.sample_pos, &R.steps}) a->resize((size_t)slots, "sampling keys");
    R.cache->reserve_decode((int)rows, m.H, R.max_len);
    R.layout = DecodeControlLayout(slots, kDecodeWindow, R.max_pages);
    R.control.resize(R.layout.bytes, "decode control block");
    R.mirror.resize(R.layout.bytes, "decode control block (host mirror)");
    R.replay_table.resize(z.table, "page table of kept tokens");
    const std::vector<int64_t>& eos = config().eos_token_ids;
    R.eos.resize(eos.size(), "eos ids");
    if (!eos.empty()) R.eos.upload(std::vector<int32_t>(eos.begin(), eos.end()));
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
    std::vector<int32_t> pool;  // teacher forcing: the completions, back to back
    for (size_t i = 0; i < requests.size(); i++) {
        const int id = prompt_ids.emplace(requests[i].prompt, (int)prompt_ids.size()).first->second;
        R.requests[i] = {&requests[i].prompt, requests[i].sequence, forced ? &(*forced)[i] : nullptr, id, -1, {}, {}, s.max_new_tokens};
        if (forced) R.requests[i].forced_offset = (int)pool.size(), pool.insert(pool.end(), (*forced)[i].begin(), (*forced)[i].end());
    }
    R.forced_pool.resize(pool.size(), "teacher-forced completions");
    if (!pool.empty()) R.forced_pool.upload(pool);
    R.prompts.assign(prompt_ids.size(), RolloutState::Prompt{});
    for (const RolloutState::Request& q : R.requests) R.prompts[(size_t)q.prompt_id].ids = q.prompt;
    R.prompt_xf.resize(prompt_ids.size() * (size_t)C, "prompts' last hidden states");

    // what the decode launches take by value: the graphs of an earlier call replay while it holds
    const SamplingParams sp{s.temperature, s.top_k, s.top_p};
    const std::vector<uint64_t> key = {(uint64_t)slots, (uint64_t)R.max_len, (uint64_t)weights, (uint64_t)(forced != nullptr),
                                       float_bits(sp.temperature), (uint64_t)sp.top_k, float_bits(sp.top_p),
                                       (uint64_t)s.vocab_limit, s.seed};
    if (key != R.graph_key) R.drop_graphs(), R.graph_key = key;

    R.keep = kept_tokens > 0;
    R.waiting.clear(), R.running.clear();
    for (size_t i = 0; i < requests.size(); i++) R.waiting.push_back((int)i);
    run_windows(step, weights, s, progress);
    std::vector<Generation> out;
    for (RolloutState::Request& q : R.requests) out.push_back(R.keep ? q.gen : std::move(q.gen));
    return out;
}

// The decode loop until every request in R.waiting has finished (its turn): admissions, windows of
// decode steps, collections.
inline void GpuEngine::run_windows(uint32_t step, Precision weights, const SamplingConfig& s, Progress* progress) {
    RolloutState& R = *rollout_;
    const int slots = (int)R.sampled.size();
    const int64_t count = (int64_t)R.waiting.size();
    R.finished = 0;
    while (R.finished < count) {
        R.admit(slots);
        int steps = R.plan_window(kDecodeWindow, &rollout_stats_.preemptions);
        if (R.running.empty()) fail("generate: no request fits the KV page pool (internal: the pool was checked above)");
        steps = R.choose_standby(slots, steps);
        start_window(step, weights, s);
        const int bucket = decode_bucket((int)R.running.size(), slots);
        rollout_stats_.max_running = std::max(rollout_stats_.max_running, (int)R.running.size());
        const long longest = R.longest_at_steps();
        for (int k = 0; k < steps; k++) decode_step(bucket, R.decode_len(longest + k), weights, s);
        collect_window(progress);
        rollout_stats_.windows++;
    }
}

inline std::vector<Generation> GpuEngine::start_turns(const std::vector<GenRequest>& requests, int max_total_tokens, uint32_t step,
                                                      const SamplingConfig& s, Precision weights, Precision kv_cache,
                                                      Progress* progress) {
    PROFILE_RANGE("rollout");
    if (max_total_tokens < s.max_new_tokens)
        fail("start_turns: a trajectory of %d tokens cannot hold a first turn of %d", max_total_tokens, s.max_new_tokens);
    turn_requests_ = requests;  // the rows' prompts, which the kept state points into
    turn_step_ = step, turn_sampling_ = s, turn_weights_ = weights;
    return rollout(turn_requests_, nullptr, step, s, weights, kv_cache, progress, nullptr, max_total_tokens);
}

// Each listed row takes its appended tokens (placeholders in its log-probs: the driver keeps its
// own) and its budget, and waits with the pages it holds; the rows not listed give theirs back. Its
// admission feeds its last turn's last token and the appended ones (replay_kept_tokens, from q.fed),
// and its first decode step feeds the last and draws.
inline std::vector<Generation> GpuEngine::next_turns(const std::vector<TurnRequest>& turns) {
    PROFILE_RANGE("rollout");
    if (!rollout_ || !rollout_->keep) fail("next_turns: no multi-turn rollout in progress (start_turns)");
    RolloutState& R = *rollout_;
    std::vector<char> listed(R.requests.size(), 0);
    for (const TurnRequest& t : turns) {
        if (t.row >= R.requests.size() || listed[t.row] || t.max_new_tokens < 1)
            fail("next_turns: row %zu (of %zu, listed once) with %d new tokens (need at least 1)", t.row, R.requests.size(),
                 t.max_new_tokens);
        listed[t.row] = 1;
        const RolloutState::Request& q = R.requests[t.row];
        if (q.ended) fail("next_turns: row %zu has ended (a turn before this one did not list it)", t.row);
        const long end = (long)q.prompt->size() + (long)q.gen.tokens.size() + (long)t.tokens.size() + t.max_new_tokens;
        if (end > R.max_len)
            fail("next_turns: row %zu's next turn reaches %ld positions, past the %d its trajectory was given", t.row, end,
                 R.max_len);
        for (int32_t id : t.tokens)
            if (id < 0 || id >= model_.V) fail("next_turns: token id %d outside the vocabulary [0, %d)", id, model_.V);
    }
    for (size_t i = 0; i < R.requests.size(); i++) {
        if (listed[i]) continue;
        if (R.requests[i].held) R.release(R.requests[i]);
        R.requests[i].ended = true;
    }
    rollout_stats_.turn_fed_tokens = (int64_t)turns.size();  // each row's last token, fed by its first decode step
    R.waiting.clear(), R.running.clear();
    for (const TurnRequest& t : turns) {
        RolloutState::Request& q = R.requests[t.row];
        q.gen.tokens.insert(q.gen.tokens.end(), t.tokens.begin(), t.tokens.end());
        q.gen.logprobs.insert(q.gen.logprobs.end(), t.tokens.size(), NAN);
        q.gen.logprobs_sampled.insert(q.gen.logprobs_sampled.end(), t.tokens.size(), NAN);
        q.gen.finished = false;
        q.turn_start = q.gen.tokens.size();
        q.limit = (int)q.turn_start + t.max_new_tokens;
        R.waiting.push_back((int)t.row);
    }
    run_windows(turn_step_, turn_weights_, turn_sampling_, nullptr);
    std::vector<Generation> out;
    for (const TurnRequest& t : turns) {
        const RolloutState::Request& q = R.requests[t.row];
        Generation g;
        g.tokens.assign(q.gen.tokens.begin() + (long)q.turn_start, q.gen.tokens.end());
        g.logprobs.assign(q.gen.logprobs.begin() + (long)q.turn_start, q.gen.logprobs.end());
        g.logprobs_sampled.assign(q.gen.logprobs_sampled.begin() + (long)q.turn_start, q.gen.logprobs_sampled.end());
        g.finished = q.gen.finished;
        out.push_back(std::move(g));
    }
    return out;
}

inline void GpuEngine::end_turns() {
    if (!rollout_ || !rollout_->keep) return;
    RolloutState& R = *rollout_;
    for (RolloutState::Request& q : R.requests)
        if (q.held) R.release(q);
    R.keep = false;
    R.requests.clear();
}

// The start of a window, all issued without waiting: the slots and page tables of the running and
// the standby requests in one copy, then the admissions' and standbys' work: their prompts
// prefilled, their partial pages copied, the kept tokens of preempted ones fed again
// (replay_kept_tokens), and the fresh ones' first tokens drawn from their prompts' last rows into
// their window buffers.
inline void GpuEngine::start_window(uint32_t step, Precision weights, const SamplingConfig& s) {
    RolloutState& R = *rollout_;
    const DecodeControlLayout& L = R.layout;
    const int C = model_.C, rows = L.rows;
    DecodeSlot* slot = R.in_mirror<DecodeSlot>(L.slots);
    int32_t* table = R.in_mirror<int32_t>(L.table);
    int32_t *row_slot = R.in_mirror<int32_t>(L.row_slot), *draw_slot = R.in_mirror<int32_t>(L.draw_slot);
    auto set_slot = [&](int i, const RolloutState::Request& q) {
        const int P = (int)q.prompt->size(), g = (int)q.gen.tokens.size();
        slot[i] = DecodeSlot{g ? q.gen.tokens.back() : q.prompt->back(), P + g - 1, g, R.limit(q) - g, q.key,
                             q.forced ? q.forced_offset : -1, 0, i < rows ? i : -1};
        std::copy(q.pages.begin(), q.pages.end(), table + i * (size_t)L.max_pages);
    };
    for (int i = 0; i < L.slot_count; i++) slot[i] = DecodeSlot{0, 0, 0, 0, 0u, -1, 0, -1};  // idle: a padding row
    for (size_t i = 0; i < R.running.size(); i++) set_slot((int)i, R.requests[(size_t)R.running[i]]);
    for (size_t j = 0; j < R.standby.size(); j++) set_slot(rows + (int)j, R.requests[(size_t)R.standby[j].request]);
    for (int r = 0; r < rows; r++) row_slot[r] = r;
    write_cascade_groups();
    // the fresh admissions' and standbys' slots, whose first tokens are drawn now
    std::vector<const RolloutState::Admission*> fresh;
    const int first = (int)(R.running.size() - R.admitted.size());  // the admissions' first slot
    for (size_t a = 0; a < R.admitted.size(); a++)
        if (R.admitted[a].fresh) draw_slot[fresh.size()] = first + (int)a, fresh.push_back(&R.admitted[a]);
    for (size_t j = 0; j < R.standby.size(); j++)
        if (R.standby[j].fresh) draw_slot[fresh.size()] = rows + (int)j, fresh.push_back(&R.standby[j]);
    *R.in_mirror<DecodeRun>(L.run) = DecodeRun{step, (int32_t)R.standby.size(), rows, 0};
    CUDA_CHECK(cudaMemcpyAsync(R.control.get() + L.slots, R.mirror.get() + L.slots, L.upload_bytes(), cudaMemcpyHostToDevice,
                               stream_));

    std::vector<int> new_prompts;
    for (const RolloutState::Admission& a : R.admitted)
        if (a.new_prompt) new_prompts.push_back(R.requests[(size_t)a.request].prompt_id);
    if (!new_prompts.empty()) prefill(new_prompts, weights);
    for (const std::vector<RolloutState::Admission>* list : {&R.admitted, &R.standby})
        for (const RolloutState::Admission& a : *list)
            if (a.copy_from >= 0) R.cache->copy_page(a.copy_from, a.copy_to, stream_);
    for (const RolloutState::Admission& a : R.admitted)
        if (!a.fresh) replay_kept_tokens(R.requests[(size_t)a.request], weights);
    // the first tokens, up to `slots` rows at a time (the sampling buffers' rows): row r samples
    // from its request's prompt's last row, for slot draw_slot[r]
    const int slots = (int)R.sampled.size();
    DecodeSlot* slots_dev = R.in_control<DecodeSlot>(L.slots);
    for (int begin = 0; begin < (int)fresh.size(); begin += slots) {
        const int n = std::min(slots, (int)fresh.size() - begin);
        for (int r = 0; r < n; r++)
            CUDA_CHECK(cudaMemcpyAsync(R.xf + (size_t)r * C,
                                       R.prompt_xf.get() + (size_t)R.requests[(size_t)fresh[(size_t)(begin + r)]->request].prompt_id * C,
                                       C * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
        const int32_t* rows_dev = R.in_control<int32_t>(L.draw_slot) + begin;
        decode_rows_gpu(R.rows_out(), slots_dev, rows_dev, n, R.in_control<DecodeRun>(L.run), R.in_control<int32_t>(L.table),
                        L.max_pages, R.page_tokens, R.forced_pool.get(), stream_);
        sample_rows(n, s);
        decode_commit_gpu(slots_dev, rows_dev, n, R.sampled.get(), R.in_control<SampledToken>(L.out), L.out_per_slot,
                          R.eos.get(), (int)R.eos.size(), stream_);
    }
}

// The window's cascade groups (kv_cache.cuh's DecodeCascade) into the control block's mirror: the
// running slots of each prompt with a prefix (decode_prefix_keys), up to cascade_rows() at a time, so
// decode attention reads the prompt's pages once per group. A group needs two rows; a slot that
// finishes within the window drops out of its group on the device (an idle row).
inline void GpuEngine::write_cascade_groups() {
    RolloutState& R = *rollout_;
    const DecodeControlLayout& L = R.layout;
    const int slots = (int)R.sampled.size(), per_group = R.cache->cascade_rows();
    int32_t *rows = R.in_mirror<int32_t>(L.cascade_rows), *start = R.in_mirror<int32_t>(L.cascade_start),
            *shared = R.in_mirror<int32_t>(L.cascade_shared);
    std::fill(shared, shared + slots, 0);
    std::map<int, std::vector<int>> by_prompt;  // prompt id -> its running slots
    for (size_t i = 0; i < R.running.size(); i++) {
        const RolloutState::Request& q = R.requests[(size_t)R.running[i]];
        const long P = (long)q.prompt->size();
        if (per_group > 1 && decode_prefix_keys(P, P + 1) > 0) by_prompt[q.prompt_id].push_back((int)i);
    }
    int groups = 0, at = 0;
    start[0] = 0;
    for (const auto& prompt : by_prompt)
        for (size_t b = 0; b + 1 < prompt.second.size(); b += (size_t)per_group) {
            for (size_t k = b; k < std::min(prompt.second.size(), b + (size_t)per_group); k++)
                rows[at++] = prompt.second[k], shared[prompt.second[k]] = 1;
            start[++groups] = at;
        }
    *R.in_mirror<int32_t>(L.cascade_count) = groups;
    rollout_stats_.cascade_rows += at;
}

// A preempted request's K/V back in its pages: its prompt's come from the prompt's prefill (as they
// first did), and those of the tokens it kept, all but the last, from decode launches over one row
// per token (sampling nothing), each row what the decode step that fed the token computed: the
// same GEMM rows, and decode attention over the row's own length, which the row before it in the
// same layer has already appended. So the completion goes on with the bits it would have had.
inline void GpuEngine::replay_kept_tokens(const RolloutState::Request& q, Precision weights) {
    RolloutState& R = *rollout_;
    // a multi-turn row's next turn starts past its kept positions (q.fed), feeding its last turn's
    // last token and its observation's the same way
    const long P = (long)q.prompt->size(), n = (long)q.gen.tokens.size() - 1, chunk = R.rows;
    for (long begin = std::max(0L, q.fed - P); begin < n; begin += chunk) {
        const int rows = (int)std::min(chunk, n - begin);
        std::vector<int32_t> ids((size_t)rows), pos((size_t)rows), cache_rows((size_t)rows), lens((size_t)rows),
            prefix((size_t)rows);
        std::vector<int32_t> table((size_t)rows * R.max_pages, 0);
        for (int r = 0; r < rows; r++) {
            const long position = P + begin + r;
            ids[(size_t)r] = q.gen.tokens[(size_t)(begin + r)];
            pos[(size_t)r] = (int32_t)position;
            cache_rows[(size_t)r] = R.cache_row(q, position);
            lens[(size_t)r] = (int32_t)position + 1;
            prefix[(size_t)r] = (int32_t)decode_prefix_keys(P, position + 1);
            std::copy(q.pages.begin(), q.pages.end(), table.begin() + (size_t)r * R.max_pages);
        }
        R.ids.upload(ids), R.pos.upload(pos), R.cache_rows.upload(cache_rows), R.lens.upload(lens), R.prefix.upload(prefix);
        R.replay_table.upload(table);
        decode_launches(rows, (int)(P + begin + rows), weights, R.replay_table.get(), nullptr);
        (q.fed > 0 ? rollout_stats_.turn_fed_tokens : rollout_stats_.replayed_tokens) += rows;
    }
}

// The end of a window: its drawn tokens and the slots back in one copy, the one wait for the device;
// each running and standby request takes its tokens; the finished ones give their pages back, the
// standby ones a row took run on, the others wait again (keeping the first token they drew).
inline void GpuEngine::collect_window(Progress* progress) {
    RolloutState& R = *rollout_;
    const DecodeControlLayout& L = R.layout;
    CUDA_CHECK(cudaMemcpyAsync(R.mirror.get(), R.control.get(), L.download_bytes(), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    const DecodeSlot* slot = R.in_mirror<DecodeSlot>(L.slots);
    const SampledToken* drawn = R.in_mirror<SampledToken>(L.out);
    // request i of slot k takes its tokens; true when it is finished
    auto take_tokens = [&](int i, int k) {
        RolloutState::Request& q = R.requests[(size_t)i];
        for (int t = 0; t < slot[k].drawn; t++) {
            const SampledToken& d = drawn[(size_t)k * L.out_per_slot + t];
            q.gen.tokens.push_back(d.token);
            q.gen.logprobs.push_back(d.logprob_full);
            q.gen.logprobs_sampled.push_back(d.logprob);
            for (int64_t e : config().eos_token_ids) q.gen.finished |= !q.forced && d.token == e;
        }
        const bool done = q.forced ? q.gen.tokens.size() == q.forced->size() : R.turn_done(q);
        if (done != (slot[k].remaining == 0))
            fail("generate: request %d holds %zu tokens but its slot may draw %d more (internal)", i, q.gen.tokens.size(),
                 slot[k].remaining);
        if (done && R.keep) {  // its pages wait for its next turn (next_turns), holding every position but the last drawn
            q.held = true;
            q.fed = (long)q.prompt->size() + (long)q.gen.tokens.size() - 1;
        } else if (done) {
            R.release(q);
        }
        R.finished += done;
        return done;
    };
    std::vector<int> going;
    for (size_t k = 0; k < R.running.size(); k++)
        if (!take_tokens(R.running[k], (int)k)) going.push_back(R.running[k]);
    std::vector<int> back;  // the standby requests no row took, in waiting order
    for (size_t j = 0; j < R.standby.size(); j++) {
        const int i = R.standby[j].request, k = L.rows + (int)j;
        const bool taken = slot[k].row >= 0;
        rollout_stats_.refills += taken;
        if (take_tokens(i, k)) continue;
        if (taken) {
            going.push_back(i);
        } else {
            R.release(R.requests[(size_t)i]);
            back.push_back(i);
        }
    }
    R.waiting.insert(R.waiting.begin(), back.begin(), back.end());
    R.standby.clear();
    R.running = going;
    if (progress) progress->update(R.finished);
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
    trunk_forward(prompts, weights, false, Fp8GemmKernel::Cublaslt, [&](int l) {
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
    trunk_forward(prompts, weights, false, Fp8GemmKernel::Cublaslt, [&](int l) {
        R.cache->append(l, layers_[l].k, layers_[l].v, R.prefill_rows.get(), T_, stream_);
        R.cache->round_trip(l, layers_[l].k, layers_[l].v, T_, stream_);
    });
    for (size_t s = 0; s < prompt_ids.size(); s++)
        CUDA_CHECK(cudaMemcpyAsync(R.prompt_xf.get() + (size_t)prompt_ids[s] * m.C, xf_ + (batch_.offsets[s + 1] - 1) * m.C,
                                   m.C * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
    rollout_stats_.prefills++;
    rollout_stats_.prefill_tokens += T_;
}

// One decode step over `rows` rows (the bucket of the running slots) of at most max_len keys
// (decode_len): the launches, or the replay of the graph of the bucket and max_len, captured at its
// first step. Every input is on the device (the slots), so steps follow each other without the host.
inline void GpuEngine::decode_step(int rows, int max_len, Precision weights, const SamplingConfig& s) {
    PROFILE_RANGE("decode_step");
    RolloutState& R = *rollout_;
    rollout_stats_.decode_steps++;
    const int32_t* table = R.in_control<int32_t>(R.layout.table);
    if (!options_.cuda_graphs) return decode_launches(rows, max_len, weights, table, &s);
    if (device_allocations() != R.graph_allocations) R.drop_graphs();  // they may hold freed addresses
    const auto graph = R.graphs.find({rows, max_len});
    if (graph != R.graphs.end()) {
        CUDA_CHECK(cudaGraphLaunch(graph->second, stream_));
        rollout_stats_.graph_launches++;
        return;
    }
    // the warm-up computes this step; whatever the launches set up lazily (GEMM plans, kernel
    // attributes) is done by then, so the capture records kernels and device copies only
    decode_launches(rows, max_len, weights, table, &s);
    cudaGraph_t captured = nullptr;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    decode_launches(rows, max_len, weights, table, &s);
    CUDA_CHECK(cudaStreamEndCapture(stream_, &captured));
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, captured, 0));
    CUDA_CHECK(cudaGraphDestroy(captured));
    R.graphs[{rows, max_len}] = exec;
    R.graph_allocations = device_allocations();
    rollout_stats_.graphs_captured++;
}

// The launches of a decode step over `rows` rows of at most max_len keys: embedding, the step's
// decode-attention plan, per layer the shared attention inputs (appending K and V), paged decode
// attention over `table` [rows][max_pages], the shared attention outputs and MLP. Sampling (s not null): first the rows' inputs from the slots (decode_rows_gpu),
// last the final norm, the tokens (sample_rows), each slot's advance (decode_commit_gpu) and the
// standby slots taken by the rows whose slots stopped (decode_refill_gpu); without
// it (replay_kept_tokens) the rows' inputs are uploaded and only the cache is written.
inline void GpuEngine::decode_launches(int rows, int max_len, Precision weights, const int32_t* table,
                                       const SamplingConfig* s) {
    RolloutState& R = *rollout_;
    const CpuModel& m = model_;
    const DecodeControlLayout& L = R.layout;
    DecodeSlot* slots = R.in_control<DecodeSlot>(L.slots);
    int32_t* row_slot = R.in_control<int32_t>(L.row_slot);
    if (s)
        decode_rows_gpu(R.rows_out(), slots, row_slot, rows, R.in_control<DecodeRun>(L.run), table, L.max_pages, R.page_tokens,
                        R.forced_pool.get(), stream_);
    const StepRows r{rows, weights == Precision::FP8 ? (rows + 127) / 128 * 128 : rows, R.pos.get(), R.gemm_f32, weights,
                     false, options_.fp8_scaling};
    LayerActsGpu& A = R.A;
    DecodeCascade cascade;  // a decode step's sibling groups (write_cascade_groups); a replay has none
    if (s && R.cache->cascade_rows() > 1) {
        cascade.rows = R.in_control<int32_t>(L.cascade_rows), cascade.start = R.in_control<int32_t>(L.cascade_start);
        cascade.count = R.in_control<int32_t>(L.cascade_count), cascade.shared = R.in_control<int32_t>(L.cascade_shared);
        cascade.max_groups = rows / 2;
    }
    embedding_forward(A.x, wb(m.embed), R.ids.get(), rows, m.V, m.C, stream_);
    R.cache->plan_decode(R.lens.get(), R.prefix.get(), rows, max_len, stream_, cascade);  // the rows' lengths: every layer's
    for (int l = 0; l < m.L; l++) {
        // the residual: the last layer's h1 + mlp; K and V appended to the cache by the q/k-norm + RoPE kernel
        attention_inputs(A, l > 0 ? &A : nullptr, l, r, R.cache->append_target(l, R.cache_rows.get()));
        // attention writes the O projection's FP8 operand itself (fp8_operand: none in bf16 or tensor scaling)
        const Fp8RowsOut att_operand = fp8_operand(r, m.H * m.D);
        R.cache->decode_attention(l, A.att, A.q, m.H, table, R.max_pages, stream_, att_operand);
        attention_outputs(A, l, r, false, (bool)att_operand);
    }
    if (!s) return;
    residual_rmsnorm_forward(R.xf, R.rstdf, A.x, A.h1, A.mlp, wb(m.final_norm), rows, m.C, m.eps, stream_);
    sample_rows(rows, *s);
    decode_commit_gpu(slots, row_slot, rows, R.sampled.get(), R.in_control<SampledToken>(L.out), L.out_per_slot, R.eos.get(),
                      (int)R.eos.size(), stream_);
    decode_refill_gpu(slots, row_slot, rows, R.in_control<DecodeRun>(L.run), R.in_control<int32_t>(L.table), L.max_pages,
                      R.in_control<int32_t>(L.cascade_shared), L.rows, stream_);
}

// Logits of R.xf's first `rows` rows through the BF16 head (FP32 accumulation, as loss.cuh's
// head and the CPU generator compute them), then one token per row (cuda/rollout/sampling.cuh) with the
// rows' keys, positions and RL steps (decode_rows_gpu wrote them), or the forced token when
// teacher forcing.
inline void GpuEngine::sample_rows(int rows, const SamplingConfig& s) {
    PROFILE_RANGE("sampling");
    RolloutState& R = *rollout_;
    const CpuModel& m = model_;
    const int V8 = round_up8(m.V), n = s.vocab_limit > 0 ? s.vocab_limit : m.V;
    const bf16* W = m.V % 8 ? R.head.get() : wb(m.lm_head);
    gemm_.bf16("rollout logits", V8, rows, m.C, W, R.xf, R.logits.get(), GemmOut::F32, stream_);
    if (R.requests.front().forced) {
        const float inv_t = s.temperature > 0.0f ? 1.0f / s.temperature : 1.0f;  // greedy's logprob_full: at T = 1
        LAUNCH_KERNEL(forced_token_kernel, (unsigned)rows, kSampleThreads, 0, stream_, (const float*)R.logits.get(), V8, n,
                      inv_t, (const int32_t*)R.forced.get(), R.sample_scratch.get(), R.sampled.get());
        return;
    }
    sample_tokens_gpu(R.sampled.get(), nullptr, R.logits.get(), rows, V8, n, {s.temperature, s.top_k, s.top_p}, s.seed,
                      R.steps.get(), R.keys.get(), R.sample_pos.get(), R.sample_scratch.get(), stream_);
}

}  // namespace fp8rl

#endif  // FP8RL_ROLLOUT_CU
