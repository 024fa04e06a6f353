// model.h: the CPU reference model of the Qwen3 / Qwen2 / Llama-3 dense family (spec-model.md §2):
// pre-norm decoder, GQA with any heads:kv ratio, head_dim independent of hidden/heads, Qwen3's
// per-head q/k RMSNorm, Qwen2's q/k/v biases, llama3 RoPE scaling, rotate-half RoPE, SwiGLU, tied
// or untied head. Parameters live in the ONE master buffer of rl/model/weights.h; gradients go into any
// buffer with the same layout. Linear layers run as GEMMs over all tokens of the batch; attention
// (cpu/attention.h) as GEMMs per sequence and head, or per (token, head) over a KV cache.
//
// Use (see docs/cpu-engine.md):
//   CpuModel model(weights);                 // shapes, tensor offsets, RoPE frequencies
//   ModelParams params;  params.prepare(model, Precision::BF16);   // again after each update
//   ForwardActs acts;                        // buffers sized from the batch, reused across calls
//   model_forward(model, params, batch, temperature, acts, logprob, entropy);
//   model_backward(model, params, acts, dlogprob, dentropy, grad);  // adds into grad
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <omp.h>

#include "cpu/attention.h"
#include "cpu/kv_cache.h"
#include "cpu/linear.h"
#include "cpu/logprob_head.h"
#include "cpu/model_layers.h"
#include "rl/numerics/precision.h"
#include "rl/model/weights.h"

namespace fp8rl {

constexpr size_t kNoTensor = SIZE_MAX;

// Offsets of one layer's tensors in any buffer with the master layout (kNoTensor when absent).
struct LayerTensors {
    size_t ln1, wq, bq, wk, bk, wv, bv, q_norm, k_norm, wo, ln2, wg, wu, wd;
};

// The four projections of a layer, in the order ModelParams keeps their FP8 weights: q, k and v as
// one fused [q|k|v] weight [(H + 2 KV) D][C] (and bias), gate and up as one [gate|up] [2I][C]
// (rl/model/weights.h lays each out contiguously), o, down. Fused, a layer's input is read once
// (and quantized once) for three outputs, and the backward adds their dgrad in one GEMM.
enum Projection { kQKV, kO, kGateUp, kDown, kProjections };

struct CpuModel {
    const ModelWeights* weights;
    int V, C, I, L, H, KV, D;
    float eps;
    bool qk_norm, qkv_bias;
    size_t embed, final_norm, lm_head;  // lm_head == embed when tied
    std::vector<LayerTensors> layers;
    std::vector<float> inv_freq;  // [D/2] RoPE frequencies

    explicit CpuModel(const ModelWeights& w) : weights(&w) {
        const ModelConfig& c = w.config;
        V = (int)c.vocab_size, C = (int)c.hidden_size, I = (int)c.intermediate_size, L = (int)c.num_layers;
        H = (int)c.num_heads, KV = (int)c.num_kv_heads, D = (int)c.head_dim;
        eps = (float)c.rms_norm_eps;
        qk_norm = c.qk_norm;
        qkv_bias = c.qkv_bias;
        embed = w.offset("model.embed_tokens.weight");
        final_norm = w.offset("model.norm.weight");
        lm_head = w.offset(w.lm_head_name());
        auto opt = [&](int l, const char* s) {
            std::string n = layer_tensor_name(l, s);
            return w.has(n) ? w.offset(n) : kNoTensor;
        };
        for (int l = 0; l < L; l++)
            layers.push_back({opt(l, "input_layernorm.weight"), opt(l, "self_attn.q_proj.weight"),
                              opt(l, "self_attn.q_proj.bias"), opt(l, "self_attn.k_proj.weight"),
                              opt(l, "self_attn.k_proj.bias"), opt(l, "self_attn.v_proj.weight"),
                              opt(l, "self_attn.v_proj.bias"), opt(l, "self_attn.q_norm.weight"),
                              opt(l, "self_attn.k_norm.weight"), opt(l, "self_attn.o_proj.weight"),
                              opt(l, "post_attention_layernorm.weight"), opt(l, "mlp.gate_proj.weight"),
                              opt(l, "mlp.up_proj.weight"), opt(l, "mlp.down_proj.weight")});
        inv_freq = rope_inv_freq(c);
    }

    long num_floats() const { return (long)weights->num_floats(); }

    // Projection j of layer l (weight [N, K], bias) in a buffer with the master layout.
    LinearWeight projection(int l, Projection j, const float* base) const {
        const LayerTensors& t = layers[l];
        const int Q = H * D;
        const float* w = base + weight_offset(l, j);
        switch (j) {
            case kQKV: return {w, t.bq == kNoTensor ? nullptr : base + t.bq, qkv_dim(), C};
            case kO: return {w, nullptr, C, Q};
            case kGateUp: return {w, nullptr, 2 * I, C};
            default: return {w, nullptr, C, I};
        }
    }
    int qkv_dim() const { return (H + 2 * KV) * D; }  // the fused [q|k|v] projection's outputs

    // Every matrix the GEMMs read, by master offset: the embedding, the untied head, and each
    // layer's four projections (fused).
    struct Matrix {
        size_t offset;
        int N, K;
    };
    std::vector<Matrix> matrices() const {
        std::vector<Matrix> r = {{embed, V, C}};
        if (lm_head != embed) r.push_back({lm_head, V, C});
        for (int l = 0; l < L; l++)
            for (int j = 0; j < kProjections; j++) {
                const LinearWeight w = projection(l, (Projection)j, nullptr);
                r.push_back({weight_offset(l, (Projection)j), w.N, w.K});
            }
        return r;
    }

    // Offset of projection j's weight of layer l in the master layout.
    size_t weight_offset(int l, Projection j) const {
        const LayerTensors& t = layers[l];
        const size_t offsets[kProjections] = {t.wq, t.wo, t.wg, t.wd};
        return offsets[j];
    }

    // RoPE inverse frequencies in FP32 as HF computes them, with llama3 scaling (spec-model §2.5).
    static std::vector<float> rope_inv_freq(const ModelConfig& c) {
        const int half = (int)c.head_dim / 2;
        std::vector<float> f(half);
        for (int i = 0; i < half; i++) f[i] = 1.0f / std::pow((float)c.rope.theta, (float)(2 * i) / (float)c.head_dim);
        if (c.rope.type != "llama3") return f;
        const float factor = (float)c.rope.factor, lo = (float)c.rope.low_freq_factor, hi = (float)c.rope.high_freq_factor;
        const float old_len = (float)c.rope.original_max_position_embeddings;
        const float low_wl = old_len / lo, high_wl = old_len / hi;
        for (int i = 0; i < half; i++) {
            float wavelen = 2.0f * (float)M_PI / f[i];
            float scaled = wavelen > low_wl ? f[i] / factor : f[i];
            if (!(wavelen < high_wl) && !(wavelen > low_wl)) {
                float s = (old_len / wavelen - lo) / (hi - lo);
                scaled = (1.0f - s) * scaled / factor + s * scaled;
            }
            f[i] = scaled;
        }
        return f;
    }
};

// The parameters as one precision reads them: the master buffer itself (fp32) or a BF16-rounded
// copy (bf16, fp8), and for fp8 the quantization of every projection weight (from the FP32 master)
// at the granularity of --fp8_scaling. fp32 and bf16 also keep every matrix packed for gemm_nt_packed (cpu/gemm.h):
// the forward's X W^T reads the panels in place instead of repacking W on every call, and a decode
// step's GEMV streams them contiguously. Call prepare() again after every change of the master
// weights.
struct ModelParams {
    Precision precision = Precision::FP32;
    const float* base = nullptr;  // master layout
    std::vector<float> rounded;
    std::vector<Fp8Weight> fp8;   // [L * kProjections] (fused projections), fp8 only
    bool fp8_pow2_scales = false;  // power-of-two block scales (the option of spec-fp8.md §4.2)
    Fp8Scaling fp8_scaling = Fp8Scaling::Block;  // --fp8_scaling

    void prepare(const CpuModel& m, Precision p) {
        precision = p;
        const std::vector<float>& master = m.weights->master;
        fp8.clear();
        if (p == Precision::FP8)
            for (int l = 0; l < m.L; l++)
                for (int j = 0; j < kProjections; j++) {
                    const LinearWeight w = m.projection(l, (Projection)j, master.data());
                    fp8.push_back(fp8_quantize_weight(w.w, w.N, w.K, fp8_pow2_scales, fp8_scaling));
                }
        if (p == Precision::FP32) {
            rounded.clear();
            base = master.data();
        } else {
            rounded.resize(master.size());
            const long n = (long)master.size();
#pragma omp parallel for schedule(static)
            for (long i = 0; i < n; i++) rounded[i] = round_bf16(master[i]);
            base = rounded.data();
        }
        pack_matrices(m);
    }
    const float* at(size_t offset) const { return offset == kNoTensor ? nullptr : base + offset; }
    // The packed copy of the 2-D tensor at master offset `offset` (nullptr for fp8).
    const float* packed_at(size_t offset) const {
        auto it = packed_offset_.find(offset);
        return it == packed_offset_.end() ? nullptr : gemm_detail::align64(packed_.data()) + it->second;
    }

    // Projection j of layer l as this precision's GEMMs read it.
    LinearWeight linear(const CpuModel& m, int l, Projection j) const {
        LinearWeight w = m.projection(l, j, base);
        if (precision == Precision::FP8) w.fp8 = &fp8[(size_t)l * kProjections + j];
        w.packed = packed_at(m.weight_offset(l, j));
        return w;
    }

private:
    std::vector<float> packed_;                 // every 2-D tensor packed, one after another (fp32, bf16)
    std::map<size_t, size_t> packed_offset_;    // master offset -> offset in packed_ (64-byte aligned)

    void pack_matrices(const CpuModel& m) {
        packed_offset_.clear();
        if (precision == Precision::FP8) {
            packed_.clear();
            return;
        }
        size_t used = 0;
        const std::vector<CpuModel::Matrix> matrices = m.matrices();
        for (const CpuModel::Matrix& t : matrices) {
            packed_offset_[t.offset] = used;
            used += (size_t)(packed_weight_floats(t.N, t.K) + 15) / 16 * 16;
        }
        packed_.resize(used + 16);
        float* const dst = gemm_detail::align64(packed_.data());
        for (const CpuModel::Matrix& t : matrices) pack_weight(base + t.offset, t.N, t.K, dst + packed_offset_.at(t.offset));
    }
};

// A batch of variable-length sequences, packed: sequence s is ids[offsets[s] .. offsets[s+1]).
// Every sequence sees positions 0 .. len-1.
struct TokenBatch {
    std::vector<int32_t> ids;      // [T]
    std::vector<int64_t> offsets;  // [B + 1], offsets[0] = 0, offsets[B] = T

    long num_tokens() const { return (long)ids.size(); }
    int num_sequences() const { return (int)offsets.size() - 1; }
    void add(const std::vector<int32_t>& seq) {
        if (offsets.empty()) offsets.push_back(0);
        ids.insert(ids.end(), seq.begin(), seq.end());
        offsets.push_back((int64_t)ids.size());
    }
};

// Activations of one layer (pointers into ForwardActs' storage).
struct LayerActs {
    float *x, *xn1, *rstd1, *qkv, *qp, *kp, *rstd_q, *rstd_k, *q, *k, *v, *att, *lse, *h1, *xn2, *rstd2, *gu, *a;
};

// Gradients of activations, used by the backward pass (one set, reused layer by layer).
struct BackwardActs {
    float *dh, *dxn, *dq, *dk, *dv, *dqp, *dkp, *dqkv, *datt, *delta, *dgu, *da, *dlogprob_row, *dentropy_row;
};

// Buffers of a forward (and backward) pass, sized from the batch shape; they grow when needed and
// are reused, so steady-state calls allocate nothing. keep_all_layers: training keeps every
// layer's activations for the backward pass; generation keeps one layer's at a time.
struct ForwardActs {
    long T = 0;
    bool keep_all_layers = true;
    float temperature = 1.0f;
    // per token
    std::vector<int32_t> ids, pos, target, key_count;
    std::vector<int64_t> key_start, cache_row;
    std::vector<int32_t> key_prefix;   // decode rows over a cache: keys of their prompt (decode_prefix_keys); empty: none
    std::vector<int64_t> seq_offsets;  // [B + 1] packed batch: sequence s is rows seq_offsets[s] .. seq_offsets[s+1]
    std::vector<LayerActs> layers;
    std::vector<float> k_amax, v_amax;  // [L][KV] max |K| (after k-norm and RoPE) and max |V| per KV head, last pass
    // --train_kv_replay: [L][KV] FP8 KV scales that K and V go through in attention (replayed_attention);
    // empty: none. replay_decode_row [T]: 1 where the rollout computed the row in a decode step (a
    // response position), 0 in its prefill. Set by the engine before each forward.
    std::vector<float> replay_k_scale, replay_v_scale;
    std::vector<uint8_t> replay_decode_row;
    std::vector<float> replay_att, replay_lse;  // replayed_attention's decode-style output [T][H][D] and lse [T][H]
    float *hf = nullptr, *xf = nullptr, *rstdf = nullptr;               // final hidden [T, C], normed, rstd
    float *head_logprob = nullptr, *head_entropy = nullptr, *head_lse = nullptr, *head_mu = nullptr;  // [T]
    float* head_top1 = nullptr;  // [T] 1 where the target is the most likely token (head_forward's top1)
    BackwardActs grad{};
    RopeTable rope;
    HeadScratch head;
    std::vector<float> attn_scratch;
    long attn_scratch_stride = 0;
    CachedRows cached_rows = CachedRows::Prefill;  // with a KV cache: a prefill's rows or a decode step's

    // Lays out storage for T tokens (and the backward buffers when `backward`); grows it if needed.
    void reserve(const CpuModel& m, long tokens, bool keep_all, bool backward) {
        T = tokens;
        keep_all_layers = keep_all;
        k_amax.assign((size_t)m.L * m.KV, 0.0f);
        v_amax.assign((size_t)m.L * m.KV, 0.0f);
        size_t n = layout(m, backward, nullptr);
        if (storage_.size() < n) storage_.resize(n);
        layout(m, backward, storage_.data());
    }

    // The residual stream entering layer l (l == L: leaving the last layer).
    float* resid(const CpuModel& m, int l) { return keep_all_layers ? (l < m.L ? layers[l].x : hf) : layers[0].x; }
    LayerActs& layer(int l) { return layers[keep_all_layers ? l : 0]; }

    // Per-thread scratch of attention over a KV cache: `floats` (cached_attention_scratch_floats).
    void reserve_attention(long floats) {
        attn_scratch_stride = floats;
        size_t n = (size_t)omp_get_max_threads() * floats;
        if (attn_scratch.size() < n) attn_scratch.resize(n);
    }

private:
    std::vector<float> storage_;

    // Carves the buffers out of base (nullptr: only counts); returns the floats needed.
    size_t layout(const CpuModel& m, bool backward, float* base) {
        const long C = m.C, Q = (long)m.H * m.D, K = (long)m.KV * m.D, I = m.I;
        size_t used = 0;
        auto take = [&](long n) {
            float* r = base ? base + used : nullptr;
            used += (size_t)n;
            return r;
        };
        layers.resize(keep_all_layers ? m.L : 1);
        const long N = m.qkv_dim();
        for (LayerActs& a : layers) {
            a.x = take(T * C), a.xn1 = take(T * C), a.rstd1 = take(T), a.qkv = take(T * N);
            a.qp = m.qk_norm ? take(T * Q) : nullptr, a.kp = m.qk_norm ? take(T * K) : nullptr;
            a.rstd_q = m.qk_norm ? take(T * m.H) : nullptr, a.rstd_k = m.qk_norm ? take(T * m.KV) : nullptr;
            a.q = take(T * Q), a.k = take(T * K), a.v = take(T * K), a.att = take(T * Q), a.lse = take(T * m.H);
            a.h1 = take(T * C), a.xn2 = take(T * C), a.rstd2 = take(T);
            a.gu = take(T * 2 * I), a.a = take(T * I);
        }
        hf = keep_all_layers ? take(T * C) : layers[0].x;
        xf = take(T * C), rstdf = take(T);
        head_logprob = take(T), head_entropy = take(T), head_lse = take(T), head_mu = take(T), head_top1 = take(T);
        grad = BackwardActs{};
        if (backward) {
            BackwardActs& g = grad;
            g.dh = take(T * C), g.dxn = take(T * C), g.dq = take(T * Q), g.dk = take(T * K), g.dv = take(T * K);
            g.dqp = take(T * Q), g.dkp = take(T * K), g.dqkv = take(T * N), g.datt = take(T * Q), g.delta = take(T * m.H);
            g.dgu = take(T * 2 * I), g.da = take(T * I);
            g.dlogprob_row = take(T), g.dentropy_row = take(T);
        }
        return used;
    }
};

// Checks a batch against the model: at least one sequence, none empty, every id in the vocabulary.
inline void validate_batch(const CpuModel& m, const TokenBatch& b) {
    if (b.offsets.size() < 2 || b.offsets[0] != 0 || b.offsets.back() != b.num_tokens())
        fail("batch: offsets must start at 0 and end at the token count");
    for (int s = 0; s < b.num_sequences(); s++)
        if (b.offsets[s + 1] <= b.offsets[s]) fail("batch: sequence %d is empty", s);
    for (long t = 0; t < b.num_tokens(); t++)
        if (b.ids[t] < 0 || b.ids[t] >= m.V)
            fail("batch: token id %d at position %ld is outside the vocabulary [0, %d)", b.ids[t], t, m.V);
}

// Per-token structure of a packed batch: positions, causal key ranges, next-token targets.
inline void set_batch_rows(ForwardActs& acts, const TokenBatch& b) {
    const long T = b.num_tokens();
    acts.ids = b.ids;
    acts.pos.resize(T), acts.target.resize(T), acts.key_count.resize(T);
    acts.key_start.resize(T);
    acts.seq_offsets = b.offsets;
    for (int s = 0; s < b.num_sequences(); s++)
        for (long t = b.offsets[s]; t < b.offsets[s + 1]; t++) {
            acts.pos[t] = (int32_t)(t - b.offsets[s]);
            acts.key_start[t] = b.offsets[s];
            acts.key_count[t] = acts.pos[t] + 1;
            acts.target[t] = t + 1 < b.offsets[s + 1] ? b.ids[t + 1] : -1;
        }
}

// --train_kv_replay: one layer's attention as the rollout computed it from its FP8 cache. A row its
// prefill computed (a prompt position) reads the stored values in BF16 with the training kernel, as
// the prefill did; a row its decode steps computed (a response position: replay_decode_row) reads the
// E4M3 codes with the KV head's K scale on the scores and V scale on the output, where decode applies
// them (cpu/attention.h). Both are computed for every row; each row keeps its own. K and V are left
// as the stored values, which the backward reads (straight through to K and V as they were; a decode
// row's probabilities are recomputed from them, a rounding of BF16 away from those its forward used).
inline void replayed_attention(const CpuModel& m, ForwardActs& acts, LayerActs& A, int l, bool bf16) {
    const long T = acts.T, Q = (long)m.H * m.D;
    const float *ks = &acts.replay_k_scale[(size_t)l * m.KV], *vs = &acts.replay_v_scale[(size_t)l * m.KV];
    acts.replay_att.resize((size_t)(T * Q));
    acts.replay_lse.resize((size_t)(T * m.H));
    kv_fp8_replay(A.k, A.v, T, m.KV, m.D, ks, vs, KvReplayStep::ToCodes, bf16);
    attention_forward_packed(acts.replay_att.data(), acts.replay_lse.data(), A.q, A.k, A.v, acts.seq_offsets,
                             {m.H, m.KV, m.D}, bf16, ks, vs);
    kv_fp8_replay(A.k, A.v, T, m.KV, m.D, ks, vs, KvReplayStep::ToStored, bf16);
    attention_forward_packed(A.att, A.lse, A.q, A.k, A.v, acts.seq_offsets, {m.H, m.KV, m.D}, bf16);
    for (long t = 0; t < T; t++)
        if (acts.replay_decode_row[(size_t)t]) {
            std::copy_n(acts.replay_att.data() + t * Q, Q, A.att + t * Q);
            std::copy_n(acts.replay_lse.data() + t * m.H, m.H, A.lse + t * m.H);
        }
}

// One decoder layer, forward. With a cache, K and V are written at acts.cache_row and attention
// reads the cache (keys of row t: acts.key_start[t] .. + key_count[t] in cache rows).
inline void layer_forward(const CpuModel& m, const ModelParams& p, ForwardActs& acts, int l, KvCache* cache) {
    const LayerTensors& w = m.layers[l];
    LayerActs& A = acts.layer(l);
    const long T = acts.T;
    const bool bf16 = stores_bf16(p.precision);
    float* x = acts.resid(m, l);
    rmsnorm_forward(A.xn1, A.rstd1, x, p.at(w.ln1), T, m.C, m.eps, bf16);
    linear_forward(A.qkv, A.xn1, T, p.linear(m, l, kQKV), p.precision);
    split_qkv(m.qk_norm ? A.qp : A.q, m.qk_norm ? A.kp : A.k, A.v, A.qkv, T, m.H * m.D, m.KV * m.D);
    if (m.qk_norm) {
        rmsnorm_forward(A.q, A.rstd_q, A.qp, p.at(w.q_norm), T * m.H, m.D, m.eps, bf16);
        rmsnorm_forward(A.k, A.rstd_k, A.kp, p.at(w.k_norm), T * m.KV, m.D, m.eps, bf16);
    }
    rope_forward(A.q, acts.pos.data(), acts.rope, T, m.H, bf16);
    rope_forward(A.k, acts.pos.data(), acts.rope, T, m.KV, bf16);
    max_abs_per_head(&acts.k_amax[(size_t)l * m.KV], A.k, T, m.KV, m.D);
    max_abs_per_head(&acts.v_amax[(size_t)l * m.KV], A.v, T, m.KV, m.D);
    if (cache) {
        cache->store(l, T, acts.cache_row.data(), A.k, A.v);
        const std::vector<float> k_scale = cache->head_scales(l, m.KV, true), v_scale = cache->head_scales(l, m.KV, false);
        attention_forward_cached(A.att, A.lse, A.q, cache->keys(l), cache->values(l), k_scale.data(), v_scale.data(),
                                 acts.key_start.data(),
                                 acts.key_count.data(), acts.key_prefix.empty() ? nullptr : acts.key_prefix.data(), T,
                                 {m.H, m.KV, m.D}, acts.attn_scratch.data(),
                                 acts.attn_scratch_stride, bf16, acts.cached_rows);
    } else {
        if (!acts.replay_k_scale.empty()) replayed_attention(m, acts, A, l, bf16);  // after the amaxes: the next rollout's
        else attention_forward_packed(A.att, A.lse, A.q, A.k, A.v, acts.seq_offsets, {m.H, m.KV, m.D}, bf16);  // see K, V as they are
    }
    linear_forward(A.h1, A.att, T, p.linear(m, l, kO), p.precision);
    residual_add(A.h1, x, A.h1, T * m.C, bf16);
    rmsnorm_forward(A.xn2, A.rstd2, A.h1, p.at(w.ln2), T, m.C, m.eps, bf16);
    linear_forward(A.gu, A.xn2, T, p.linear(m, l, kGateUp), p.precision);
    swiglu_forward(A.a, A.gu, T, m.I, bf16);
    float* out = acts.resid(m, l + 1);
    linear_forward(out, A.a, T, p.linear(m, l, kDown), p.precision);
    residual_add(out, A.h1, out, T * m.C, bf16);
}

// FP8 KV-cache scales [L] (per layer) or [L][KV] (per_head) from the K/V amax of the last forward
// pass (spec-fp8.md §9.4: the trainer runs the updated weights forward and hands these to the next
// rollout), reduced over the ranks by `reduce` (rl/numerics/kv_scales.h) when given.
inline void kv_scales_from_forward(const ForwardActs& acts, int kv_heads, bool per_head, std::vector<float>& k_scale,
                                   std::vector<float>& v_scale, const KvAmaxReduce& reduce = {}) {
    kv_scales_from_amax(acts.k_amax.data(), acts.v_amax.data(), (int)(acts.k_amax.size() / kv_heads), kv_heads, per_head,
                        reduce, k_scale, v_scale);
}

// Embedding, every layer and the final norm over the rows set up in acts (ids, pos, key ranges).
// Leaves the normed final hidden states in acts.xf [T, C].
inline void forward_trunk(const CpuModel& m, const ModelParams& p, ForwardActs& acts, KvCache* cache) {
    long max_pos = 0, max_keys = 1;
    for (long t = 0; t < acts.T; t++) {
        max_pos = acts.pos[t] + 1 > max_pos ? acts.pos[t] + 1 : max_pos;
        max_keys = acts.key_count[t] > max_keys ? acts.key_count[t] : max_keys;
    }
    if (acts.rope.inv_freq != m.inv_freq) acts.rope = RopeTable{m.D / 2, m.inv_freq, {}, {}, 0};
    acts.rope.ensure(max_pos);
    if (cache) acts.reserve_attention(cached_attention_scratch_floats({m.H, m.KV, m.D}, max_keys));
    embedding_forward(acts.resid(m, 0), p.at(m.embed), acts.ids.data(), acts.T, m.C);
    for (int l = 0; l < m.L; l++) layer_forward(m, p, acts, l, cache);
    rmsnorm_forward(acts.xf, acts.rstdf, acts.resid(m, m.L), p.at(m.final_norm), acts.T, m.C, m.eps,
                    stores_bf16(p.precision));
}

// Forward over a packed batch: logprob[t] = log p(ids[t] | ids before t in its sequence) and
// entropy[t] = entropy of that next-token distribution, both under softmax(logits / temperature);
// 0 at the first token of each sequence. logprob, entropy: [T]. Keeps what backward needs in acts.
inline void model_forward(const CpuModel& m, const ModelParams& p, const TokenBatch& batch, float temperature,
                          ForwardActs& acts, float* logprob, float* entropy, bool for_backward = true) {
    validate_batch(m, batch);
    if (!(temperature > 0.0f)) fail("model_forward: temperature must be > 0 (got %g)", temperature);
    acts.reserve(m, batch.num_tokens(), for_backward, for_backward);
    acts.temperature = temperature;
    set_batch_rows(acts, batch);
    forward_trunk(m, p, acts, nullptr);
    head_forward(acts.head_logprob, acts.head_entropy, acts.head_lse, acts.head_mu, acts.xf, p.at(m.lm_head),
                 acts.target.data(), acts.T, {m.V, m.C, temperature, p.packed_at(m.lm_head)}, acts.head, for_backward,
                 acts.head_top1);
    for (long t = 0; t < acts.T; t++) {
        bool first = acts.pos[t] == 0;
        logprob[t] = first ? 0.0f : acts.head_logprob[t - 1];
        entropy[t] = first ? 0.0f : acts.head_entropy[t - 1];
    }
}

// One decoder layer, backward. On entry g.dh holds dL/d(residual leaving the layer); on exit,
// dL/d(residual entering it). Parameter gradients are added into grad.
inline void layer_backward(const CpuModel& m, const ModelParams& p, ForwardActs& acts, int l, float* grad) {
    const LayerTensors& w = m.layers[l];
    LayerActs& A = acts.layer(l);
    BackwardActs& g = acts.grad;
    const long T = acts.T;
    const bool bf16 = stores_bf16(p.precision);
    const Precision pr = p.precision;
    const int Q = m.H * m.D, K = m.KV * m.D;
    auto gr = [&](size_t off) { return off == kNoTensor ? nullptr : grad + off; };
    // MLP
    linear_backward(g.da, false, gr(w.wd), nullptr, g.dh, A.a, T, p.linear(m, l, kDown), pr);
    round_bf16_if(bf16, g.da, T * m.I);
    swiglu_backward(g.dgu, g.da, A.gu, T, m.I);
    round_bf16_if(bf16, g.dgu, T * 2 * m.I);
    linear_backward(g.dxn, false, gr(w.wg), nullptr, g.dgu, A.xn2, T, p.linear(m, l, kGateUp), pr);
    round_bf16_if(bf16, g.dxn, T * m.C);
    rmsnorm_backward(g.dh, gr(w.ln2), g.dxn, A.h1, p.at(w.ln2), A.rstd2, T, m.C, true);
    round_bf16_if(bf16, g.dh, T * m.C);
    // attention
    linear_backward(g.datt, false, gr(w.wo), nullptr, g.dh, A.att, T, p.linear(m, l, kO), pr);
    round_bf16_if(bf16, g.datt, T * Q);
    attention_backward_packed(g.dq, g.dk, g.dv, g.delta, g.datt, A.att, A.lse, A.q, A.k, A.v, acts.seq_offsets, T,
                              {m.H, m.KV, m.D}, bf16);
    round_bf16_if(bf16, g.dq, T * Q);  // attention's outputs are BF16 tensors, RoPE's backward reads them
    round_bf16_if(bf16, g.dk, T * K);
    round_bf16_if(bf16, g.dv, T * K);
    rope_backward(g.dq, acts.pos.data(), acts.rope, T, m.H, bf16);
    rope_backward(g.dk, acts.pos.data(), acts.rope, T, m.KV, bf16);
    round_bf16_if(bf16, g.dq, T * Q);
    round_bf16_if(bf16, g.dk, T * K);
    float *dq = g.dq, *dk = g.dk;
    if (m.qk_norm) {
        rmsnorm_backward(g.dqp, gr(w.q_norm), g.dq, A.qp, p.at(w.q_norm), A.rstd_q, T * m.H, m.D, false);
        rmsnorm_backward(g.dkp, gr(w.k_norm), g.dk, A.kp, p.at(w.k_norm), A.rstd_k, T * m.KV, m.D, false);
        round_bf16_if(bf16, g.dqp, T * Q);
        round_bf16_if(bf16, g.dkp, T * K);
        dq = g.dqp, dk = g.dkp;
    }
    join_qkv(g.dqkv, dq, dk, g.dv, T, Q, K);
    linear_backward(g.dxn, false, gr(w.wq), gr(w.bq), g.dqkv, A.xn1, T, p.linear(m, l, kQKV), pr);
    round_bf16_if(bf16, g.dxn, T * m.C);
    rmsnorm_backward(g.dh, gr(w.ln1), g.dxn, acts.resid(m, l), p.at(w.ln1), A.rstd1, T, m.C, true);
    round_bf16_if(bf16, g.dh, T * m.C);
}

// Backward of the last model_forward (same params, same acts): dlogprob, dentropy [T] are
// dL/dlogprob[t] and dL/dentropy[t] in model_forward's alignment (entries at sequence starts are
// ignored). Adds dL/dparameter into grad (master layout, num_floats()).
inline void model_backward(const CpuModel& m, const ModelParams& p, ForwardActs& acts, const float* dlogprob,
                           const float* dentropy, float* grad) {
    if (!acts.keep_all_layers) fail("model_backward: the forward pass was run without keeping activations");
    const long T = acts.T;
    BackwardActs& g = acts.grad;
    for (long r = 0; r < T; r++) {  // head row r predicts token r + 1
        bool scored = acts.target[r] >= 0;
        g.dlogprob_row[r] = scored ? dlogprob[r + 1] : 0.0f;
        g.dentropy_row[r] = scored ? dentropy[r + 1] : 0.0f;
    }
    const bool bf16 = stores_bf16(p.precision);
    std::fill(g.dxn, g.dxn + T * m.C, 0.0f);
    head_backward(g.dxn, grad + m.lm_head, g.dlogprob_row, g.dentropy_row, acts.head_lse, acts.head_mu, acts.xf,
                  p.at(m.lm_head), acts.target.data(), T,
                  {m.V, m.C, acts.temperature, p.packed_at(m.lm_head), stores_bf16(p.precision)}, acts.head);
    round_bf16_if(bf16, g.dxn, T * m.C);
    rmsnorm_backward(g.dh, grad + m.final_norm, g.dxn, acts.hf, p.at(m.final_norm), acts.rstdf, T, m.C, false);
    round_bf16_if(bf16, g.dh, T * m.C);
    for (int l = m.L - 1; l >= 0; l--) layer_backward(m, p, acts, l, grad);
    embedding_backward(grad + m.embed, g.dh, acts.ids.data(), T, m.C);
}

}  // namespace fp8rl
