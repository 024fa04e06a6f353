// generate.h: batched generation on the CPU model: one prefill over every prompt, then one decode
// step per new token over the sequences still running, with a KV cache (cpu/kv_cache.h). Each
// sequence stops on any eos id or after max_new_tokens. Tokens are drawn by the shared sampling
// rule (rl/numerics/sampling.h) from a uniform keyed by (seed, step, sequence key, position) (rl/numerics/rng.h),
// so a completion depends neither on the other sequences of the batch nor on the thread count.
//
// A multi-turn rollout (options.kept_tokens) keeps each row's cache after its completion, and
// continue_turns feeds a row's appended tokens into it and draws its next turn.
//
//   Generator gen;                               // buffers grow on first use, then are reused
//   std::vector<Completion> out = gen.generate(model, params, prompts, options);
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "cpu/model.h"
#include "rl/numerics/rng.h"
#include "rl/numerics/sampling.h"

namespace fp8rl {

struct GenerateOptions {
    SamplingParams sampling;           // temperature 0 = greedy
    int max_new_tokens = 256;
    std::vector<int64_t> eos_ids;      // stop after any of these (it is kept in the completion)
    int vocab_limit = 0;               // only ids < vocab_limit are sampled (tokenizer size); 0 = all
    uint64_t seed = 0;
    uint32_t step = 0;                 // RL step: part of every sample's random key
    std::vector<uint32_t> sequence_keys;  // per prompt; empty = the prompt's index
    Precision kv_cache = Precision::FP32;
    std::vector<float> kv_k_scale, kv_v_scale;  // per layer, required for an FP8 cache
    // Teacher forcing: prompt i's completion is (*forced)[i] (eos does not stop it), each token scored
    // as if sampled, with its sample_offset; null = sample.
    const std::vector<std::vector<int32_t>>* forced = nullptr;
    // Multi-turn: each row keeps its cache, sized for prompt + kept_tokens positions, after the
    // completion, for Generator::continue_turns; 0 = a single turn (nothing kept)
    int kept_tokens = 0;
};

// A row's next turn over its kept cache (Generator::continue_turns).
struct KeptTurn {
    size_t row;                   // its prompt's index in the generate() that kept it
    std::vector<int32_t> tokens;  // appended after its last turn (an observation's), fed with that turn's last token
    int max_new_tokens = 1;
};

struct Completion {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;       // log-prob of each token under the distribution it was drawn from
    std::vector<float> logprobs_full;  // log softmax(logits / T) of each token (T = 1 for greedy)
    std::vector<float> sample_offsets;  // teacher forcing: each token's sample_offset (rl/numerics/sampling.h)
    bool stopped_on_eos = false;
};

class Generator {
public:
    KvCache cache;

    std::vector<Completion> generate(const CpuModel& m, const ModelParams& p,
                                     const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o) {
        check(m, prompts, o);
        const long S = (long)prompts.size();
        long longest = 0, prefill = 0;
        for (const auto& pr : prompts) {
            longest = (long)pr.size() > longest ? (long)pr.size() : longest;
            prefill += (long)pr.size();
        }
        max_len_ = (int)(longest + (o.kept_tokens > 0 ? o.kept_tokens : o.max_new_tokens));
        cache.allocate(m.L, S, max_len_, m.KV * m.D, o.kv_cache);
        if (o.kv_cache == Precision::FP8) cache.set_scales(o.kv_k_scale, o.kv_v_scale);
        acts_.reserve(m, prefill > S ? prefill : S, false, false);
        rows_.reserve(prefill);

        // prefill: every prompt token, packed; sample the first new token from each prompt's last row
        rows_.clear();
        std::vector<Stream> streams;
        std::vector<long> last_row;
        for (long s = 0; s < S; s++) {
            const int32_t P = (int32_t)prompts[s].size();
            for (int32_t i = 0; i < P; i++) rows_.push_back({s, i, prompts[s][i], P});
            const int budget = o.forced ? (int)(*o.forced)[s].size() : o.max_new_tokens;
            streams.push_back({s, P, P, budget, o.sequence_keys.empty() ? (uint32_t)s : o.sequence_keys[s]});
            last_row.push_back((long)rows_.size() - 1);
        }
        acts_.cached_rows = CachedRows::Prefill;  // attention as the GPU prefill computes it, then as its decode steps
        run_rows(m, p);
        std::vector<Completion> out = decode(m, p, o, streams, last_row);
        kept_.clear();
        if (o.kept_tokens > 0) {
            options_ = o;
            options_.forced = nullptr;
            for (long s = 0; s < S; s++) kept_.push_back({streams[s].prompt_len, streams[s].start + (int32_t)out[s].tokens.size() - 1,
                                                         out[s].tokens.back(), streams[s].key, true});
        }
        return out;
    }

    // A multi-turn rollout's next turn over the caches a generate() with kept_tokens kept: row
    // turns[i].row's last drawn token and then turns[i].tokens are fed into its cache as decode rows
    // (one batched forward, each row attending to the keys before it, as a decode step would have
    // computed them: so a trajectory's tokens are computed as teacher forcing through the decode path
    // computes them), and then at most turns[i].max_new_tokens are drawn with generate()'s options.
    // A row not in turns is done and keeps nothing; fed_tokens() counts the rows fed.
    std::vector<Completion> continue_turns(const CpuModel& m, const ModelParams& p, const std::vector<KeptTurn>& turns) {
        std::vector<Kept> next;
        std::vector<Stream> streams;
        std::vector<long> last_row;
        rows_.clear();
        for (size_t i = 0; i < turns.size(); i++) {
            const KeptTurn& t = turns[i];
            if (t.row >= kept_.size() || !kept_[t.row].live || t.max_new_tokens < 1)
                fail("generate: a next turn of row %zu (of %zu kept) with %d new tokens (need a kept row and at least 1)", t.row,
                     kept_.size(), t.max_new_tokens);
            const Kept& k = kept_[t.row];
            const int32_t end = k.length + 1 + (int32_t)t.tokens.size();
            if (end + t.max_new_tokens > max_len_)
                fail("generate: row %zu's next turn reaches %d positions, past the %d its kept cache holds", t.row,
                     end + t.max_new_tokens, max_len_);
            for (int32_t pos = k.length; pos < end; pos++) {
                const int32_t id = pos == k.length ? k.last : t.tokens[(size_t)(pos - k.length - 1)];
                if (id < 0 || id >= m.V) fail("generate: token id %d outside the vocabulary [0, %d)", id, m.V);
                rows_.push_back({(long)t.row, pos, id, k.prompt_len});
            }
            streams.push_back({(long)t.row, k.prompt_len, end, t.max_new_tokens, k.key});
            last_row.push_back((long)rows_.size() - 1);
        }
        fed_tokens_ = (int64_t)rows_.size();
        std::vector<Completion> out;
        if (!turns.empty()) {
            acts_.reserve(m, (long)rows_.size(), false, false);
            acts_.cached_rows = CachedRows::Decode;
            run_rows(m, p);
            out = decode(m, p, options_, streams, last_row);
        }
        std::vector<Kept> kept(kept_.size(), Kept{});
        for (size_t i = 0; i < turns.size(); i++)
            kept[turns[i].row] = {streams[i].prompt_len, streams[i].start + (int32_t)out[i].tokens.size() - 1, out[i].tokens.back(),
                                  streams[i].key, true};
        kept_.swap(kept);
        return out;
    }

    void end_turns() { kept_.clear(); }

    int64_t fed_tokens() const { return fed_tokens_; }

private:
    struct Row {
        long slot;
        int32_t pos, id, prompt;  // prompt: its prompt's length
    };
    // A completion being drawn: its cache slot, its prompt's length, the position of its first token,
    // the most tokens it draws, its sampling key.
    struct Stream {
        long slot;
        int32_t prompt_len, start;
        int budget;
        uint32_t key;
    };
    // A row's kept cache between turns: positions [0, length) written, `last` (at `length`) drawn but not fed.
    struct Kept {
        int32_t prompt_len = 0, length = 0, last = 0;
        uint32_t key = 0;
        bool live = false;  // its trajectory goes on
    };
    std::vector<Row> rows_;
    ForwardActs acts_;
    std::vector<float> x_, logits_, scratch_;
    int max_len_ = 0;          // positions per cache slot
    std::vector<Kept> kept_;   // per row of the last generate() with kept_tokens, while its trajectory goes on
    GenerateOptions options_;  // that generate()'s
    int64_t fed_tokens_ = 0;

    // Samples each stream's first token from rows_'s row last_row[i] (the forward just run), then one
    // decode step per token over the streams still drawing.
    std::vector<Completion> decode(const CpuModel& m, const ModelParams& p, const GenerateOptions& o,
                                   const std::vector<Stream>& streams, std::vector<long> last_row) {
        const long S = (long)streams.size();
        std::vector<Completion> out(S);
        for (long s = 0; s < S; s++) {  // no allocation per token from here on
            out[s].tokens.reserve(streams[s].budget);
            out[s].logprobs.reserve(streams[s].budget);
            out[s].logprobs_full.reserve(streams[s].budget);
        }
        acts_.cached_rows = CachedRows::Decode;
        std::vector<long> active, next;
        next.reserve(S);
        for (long s = 0; s < S; s++) active.push_back(s);
        while (!active.empty()) {
            sample_rows(m, p, o, streams, active, last_row, out);
            // keep the sequences that go on, and feed each its new token at the next position
            next.clear();
            rows_.clear();
            for (long s : active) {
                const Completion& c = out[s];
                if (c.stopped_on_eos || c.tokens.size() >= (size_t)streams[s].budget) continue;
                next.push_back(s);
                rows_.push_back({streams[s].slot, (int32_t)(streams[s].start + c.tokens.size() - 1), c.tokens.back(),
                                 streams[s].prompt_len});
            }
            active.swap(next);
            if (active.empty()) break;
            run_rows(m, p);
            last_row.resize(active.size());
            for (size_t i = 0; i < active.size(); i++) last_row[i] = (long)i;
        }
        return out;
    }

    static void check(const CpuModel& m, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& o) {
        if (prompts.empty()) fail("generate: no prompts");
        if (!o.sequence_keys.empty() && o.sequence_keys.size() != prompts.size())
            fail("generate: %zu sequence keys for %zu prompts", o.sequence_keys.size(), prompts.size());
        if (o.max_new_tokens < 1) fail("generate: max_new_tokens must be at least 1");
        if (o.vocab_limit < 0 || o.vocab_limit > m.V) fail("generate: vocab_limit %d outside [0, %d]", o.vocab_limit, m.V);
        if (o.forced) {
            if (o.forced->size() != prompts.size())
                fail("generate: %zu forced completions for %zu prompts", o.forced->size(), prompts.size());
            for (const auto& f : *o.forced) {
                if (f.empty() || (int)f.size() > o.max_new_tokens)
                    fail("generate: a forced completion of %zu tokens (need 1 to max_new_tokens = %d)", f.size(),
                         o.max_new_tokens);
                for (int32_t id : f)
                    if (id < 0 || id >= m.V) fail("generate: forced token id %d outside the vocabulary [0, %d)", id, m.V);
            }
        }
        for (size_t s = 0; s < prompts.size(); s++) {
            if (prompts[s].empty()) fail("generate: prompt %zu is empty", s);
            for (int32_t id : prompts[s])
                if (id < 0 || id >= m.V) fail("generate: prompt %zu has token id %d outside the vocabulary [0, %d)", s, id, m.V);
        }
    }

    // Forward of rows_ through the model, writing their K/V into the cache and attending to it.
    void run_rows(const CpuModel& m, const ModelParams& p) {
        const long max_len = max_len_;
        const long T = (long)rows_.size();
        ForwardActs& a = acts_;
        a.T = T;
        a.ids.resize(T), a.pos.resize(T), a.key_count.resize(T), a.key_start.resize(T), a.cache_row.resize(T);
        a.key_prefix.resize(T);
        for (long t = 0; t < T; t++) {
            const Row& r = rows_[t];
            a.ids[t] = r.id;
            a.pos[t] = r.pos;
            a.key_start[t] = r.slot * max_len;
            a.key_count[t] = r.pos + 1;
            a.key_prefix[t] = (int32_t)decode_prefix_keys(r.prompt, r.pos + 1);  // decode rows' chunks (prefill ignores it)
            a.cache_row[t] = r.slot * max_len + r.pos;
        }
        forward_trunk(m, p, a, &cache);
    }

    // log softmax(z / T)[token] over all n ids (T = 1 for greedy), as a draw's logprob_full.
    static float forced_logprob(const float* z, int n, float temperature, int token, float* scratch) {
        const float inv_t = temperature > 0.0f ? 1.0f / temperature : 1.0f;
        double z_all;
        const float s_max = exp_shifted_row(z, n, inv_t, scratch, &z_all);
        return (float)((mul_rn(z[token], inv_t) - s_max) - std::log(z_all));
    }

    // Samples the next token of each active sequence from its row's final hidden state (or, teacher
    // forcing, scores the given one).
    void sample_rows(const CpuModel& m, const ModelParams& p, const GenerateOptions& o, const std::vector<Stream>& streams,
                     const std::vector<long>& active, const std::vector<long>& row, std::vector<Completion>& out) {
        const long n = (long)active.size();
        const int limit = o.vocab_limit > 0 ? o.vocab_limit : m.V;
        const long block = kHeadBufferFloats / m.V > 0 ? kHeadBufferFloats / m.V : 1;
        x_.resize((size_t)n * m.C);
        for (long i = 0; i < n; i++)
            for (int c = 0; c < m.C; c++) x_[i * m.C + c] = acts_.xf[row[i] * m.C + c];
        logits_.resize((size_t)block * m.V);
        scratch_.resize((size_t)omp_get_max_threads() * m.V);
        for (long i0 = 0; i0 < n; i0 += block) {
            const long nb = n - i0 < block ? n - i0 : block;
            head_logits_chunk(logits_.data(), x_.data() + i0 * m.C, nb, p.at(m.lm_head), 0, m.V,
                              {m.V, m.C, 1.0f, p.packed_at(m.lm_head)});
#pragma omp parallel for schedule(dynamic, 1)
            for (long i = i0; i < i0 + nb; i++) {
                const long s = active[i];
                Completion& c = out[s];
                const uint32_t position = (uint32_t)(streams[s].start + c.tokens.size());
                const float u = rng_uniform(o.seed, o.step, streams[s].key, position);
                const float* z = logits_.data() + (i - i0) * m.V;
                float* row_scratch = scratch_.data() + (long)omp_get_thread_num() * m.V;
                if (o.forced) {
                    const int32_t token = (*o.forced)[s][c.tokens.size()];
                    c.sample_offsets.push_back(sample_offset(z, limit, o.sampling, u, token, row_scratch));
                    c.tokens.push_back(token);
                    c.logprobs_full.push_back(forced_logprob(z, limit, o.sampling.temperature, token, row_scratch));
                    c.logprobs.push_back(c.logprobs_full.back());
                    continue;
                }
                SampledToken tok = sample_token(z, limit, o.sampling, u, row_scratch);
                c.tokens.push_back(tok.token);
                c.logprobs.push_back(tok.logprob);
                c.logprobs_full.push_back(tok.logprob_full);
                for (int64_t e : o.eos_ids) c.stopped_on_eos |= tok.token == e;
            }
        }
    }
};

}  // namespace fp8rl
