// test_kv_cache.cu: the paged KV cache of kv_cache.cuh against the CPU engine's cache and decode
// attention (cpu/kv_cache.h, cpu/attention.h's attention_forward_cached) on the same K, V and Q:
// BF16 and FP8 pages, ragged lengths (1 token, exactly a page, a page + 1, many pages), idle rows,
// GQA ratios 1 to 4, 7 and 16 (50.2 KiB of shared memory with BF16 pages: above 48 KiB), head dims
// 8, 16, 32 (the fixture models and --init tiny), 64 and 128, pages scattered over the pool (a shuffled page table),
// several chunk sizes, prompt prefixes chunked apart, cascade groups of sibling rows (bit for bit
// the per-row result, each prefix tile read once per group); FP8 append against the host encoder,
// copy_page, the amax reduction, a CUDA-graph replay and bad input.
//
// In emulation the GPU's output equals the CPU engine's (bf16 mode) bit for bit at the CPU's chunk
// size: both sum the same exact products in the same order (the tensor cores' emulated chains).
// Bounds (per element, first order). The CPU reference keeps the cache as the values the stored
// bytes decode to (FP8: the code's value, its scale applied to the products, as the GPU applies it),
// so the two differ only in summation order and in where they round:
//   vs the CPU in FP32 mode (bf16 = false: P and O in FP32): the GPU rounds O to BF16, u |O| with
//     u = 2^-8 (a bound twice BF16's unit roundoff 2^-9, for the nearest-even tie on either side),
//     plus e_s (mag + |O|) for scores summed in another order (e_s = D 2^-24 sum|q k| scale, as
//     test_attention.cu) and 1e-5 (mag + |O|) for FP32 exp, sums and the chunk merge, where
//     mag = sum_j p_j |v_j| (host, double, from the CPU's lse);
//   vs the CPU in BF16 mode (the engine's bf16/fp8 precisions): the CPU also rounds P to BF16 before
//     P V (u mag) and O (u |O|): rel = 2u + e_s + 1e-5 on (mag + |O|).
// A missed or extra key moves O by about p |v - O|, which for these peaked rows is far above u |O|.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#ifdef __CUDACC__
#pragma nv_diag_suppress 177  // cpu/gemm.h: a variable only an OpenMP if() clause reads (see test_fp8_gemm.cu)
#endif
#include "cpu/attention.h"
#include "cpu/kv_cache.h"
#include "cpu/model_layers.h"
#ifdef __CUDACC__
#pragma nv_diag_default 177
#endif
#include "kv_cache.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

struct DecodeCase {
    const char* name;
    int H, KV, D, page_tokens;
    std::vector<int> lens;        // per row; 0 = idle
    std::vector<int> split_keys;  // chunk sizes to run (0: kDecodeSplitKeys, the CPU's)
    std::vector<int> prompts;     // per row, its prompt's length (its prefix: decode_prefix_keys); empty: none
};

// Small enough for emulation (128 threads per CTA, one CTA per chunk, kv head and row).
const DecodeCase kDecodeCases[] = {
    {"D16 H4 KV2", 4, 2, 16, 16, {1, 16, 17, 0, 150, 33}, {256, 64, 0}, {1, 10, 16, 0, 100, 32}},
    {"D64 H4 KV1", 4, 1, 64, 16, {0, 64, 1, 300}, {32, 96, 0}, {0, 63, 1, 290}},
    {"D128 H2 KV2", 2, 2, 128, 16, {129, 16, 1}, {64}, {}},
    {"D8 H6 KV2, 7-token pages", 6, 2, 8, 7, {15, 7, 8, 50}, {32, 0}, {14, 3, 7, 40}},
    {"D32 H4 KV4, idle rows", 4, 4, 32, 16, {0, 40, 0}, {32}, {}},
    {"D32 H7 KV1 (a warp scores two heads)", 7, 1, 32, 16, {70, 2}, {32}, {33, 1}},
    {"D128 H32 KV1 (two query tiles in registers; 52.1 KiB of shared memory, 36.1 KiB with FP8)", 32, 1, 128, 16, {40, 1}, {32}, {}},
};

constexpr int kLayers = 2, kLayer = 1;  // the layer under test; layer 0 gets other values at the same slots

// A batch of rows with their tokens on shuffled pages of a pool with spare pages.
struct PagedBatch {
    KvCacheShape shape;
    int B = 0, max_len = 0, max_pages = 0;
    std::vector<int> lens;
    std::vector<int32_t> prefix;      // [B] each row's prompt prefix (decode_prefix_keys)
    std::vector<int32_t> page_table;  // [B][max_pages], -1 past a row's pages (reading one would fault)
    std::vector<int32_t> slots;       // [tokens] slot of each token, rows in order
    std::vector<int64_t> cpu_rows;    // [tokens] the CPU cache's row b * max_len + pos
    std::vector<float> k, v;          // [tokens][KV][D] of the layer under test
    std::vector<float> q;             // [B][H][D]
    std::vector<uint8_t> gpu_writes;  // [tokens] whether the GPU cache appends the token (a shared page once); empty: all
};

PagedBatch make_batch(const DecodeCase& c, uint32_t seed) {
    PagedBatch b;
    b.B = (int)c.lens.size();
    b.lens = c.lens;
    for (int r = 0; r < b.B; r++) b.prefix.push_back((int32_t)decode_prefix_keys(c.prompts.empty() ? 0 : c.prompts[r], c.lens[r]));
    b.max_len = *std::max_element(c.lens.begin(), c.lens.end());
    b.max_pages = (b.max_len + 20 + c.page_tokens - 1) / c.page_tokens;  // room for an upper bound max_len + 20
    int needed = 0;
    for (int len : c.lens) needed += (len + c.page_tokens - 1) / c.page_tokens;
    b.shape = {kLayers, c.KV, c.D, c.page_tokens, needed + 5};
    std::vector<int32_t> order(b.shape.pages);
    std::iota(order.begin(), order.end(), 0);
    for (int i = b.shape.pages - 1; i > 0; i--)  // Fisher-Yates with the test's hash
        std::swap(order[i], order[(int)((hash_uniform(i, seed) + 1.0f) * 0.5f * (i + 1)) % (i + 1)]);
    b.page_table.assign((size_t)b.B * b.max_pages, -1);
    int next = 0;
    for (int r = 0; r < b.B; r++)
        for (int p = 0; p * c.page_tokens < c.lens[r]; p++) b.page_table[(size_t)r * b.max_pages + p] = order[next++];
    for (int r = 0; r < b.B; r++)
        for (int pos = 0; pos < c.lens[r]; pos++) {
            b.slots.push_back(b.page_table[(size_t)r * b.max_pages + pos / c.page_tokens] * c.page_tokens +
                              pos % c.page_tokens);
            b.cpu_rows.push_back((int64_t)r * b.max_len + pos);
        }
    const size_t width = (size_t)c.KV * c.D, tokens = b.slots.size();
    // q in [-3, 3), k in [-2, 2): scores with a standard deviation of 2 (peaked rows); v in [-1, 1)
    b.k = bf16_values(tokens * width, seed + 1, 2.0f);
    b.v = bf16_values(tokens * width, seed + 2, 1.0f);
    b.q = bf16_values((size_t)b.B * c.H * c.D, seed + 3, 3.0f);
    return b;
}

// The GPU cache of a batch: layer 0 holds other values at the same slots, layer kLayer the batch's.
struct GpuCache {
    PagedKvCache cache;
    DeviceBuffer<int32_t> page_table, lens, prefix;
    GpuCache(const PagedBatch& b, Precision storage, const std::vector<float>& k_scale, const std::vector<float>& v_scale,
             int heads)
        : cache(b.shape, storage), page_table(b.page_table), lens(std::vector<int32_t>(b.lens.begin(), b.lens.end())),
          prefix(b.prefix) {
        cache.set_scales(k_scale, v_scale);
        cache.reserve_decode(b.B, heads, b.max_len + 20, kDecodeTile);  // room for every chunk size the tests run
        std::vector<int32_t> written;
        std::vector<float> wk, wv;  // the tokens appended: each shared page's once
        const size_t width = (size_t)b.shape.width();
        for (size_t t = 0; t < b.slots.size(); t++)
            if (b.gpu_writes.empty() || b.gpu_writes[t]) {
                written.push_back(b.slots[t]);
                wk.insert(wk.end(), b.k.begin() + t * width, b.k.begin() + (t + 1) * width);
                wv.insert(wv.end(), b.v.begin() + t * width, b.v.begin() + (t + 1) * width);
            }
        if (written.empty()) return;
        DeviceBuffer<int32_t> slots(written);
        DeviceBuffer<__nv_bfloat16> k(to_bf16(wk)), v(to_bf16(wv));
        DeviceBuffer<__nv_bfloat16> other_k(to_bf16(bf16_values(wk.size(), 77, 5.0f))),
            other_v(to_bf16(bf16_values(wv.size(), 78, 5.0f)));
        cache.append(0, other_k.ptr, other_v.ptr, slots.ptr, (long)written.size(), 0);
        cache.append(kLayer, k.ptr, v.ptr, slots.ptr, (long)written.size(), 0);
        CUDA_CHECK(cudaDeviceSynchronize());
    }
};

// split_keys 0: kDecodeSplitKeys.
std::vector<float> gpu_decode(GpuCache& g, const PagedBatch& b, int H, int max_len, int split_keys,
                              const DecodeCascade& cascade = DecodeCascade()) {
    DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), out((size_t)b.B * H * b.shape.head_dim);
    CUDA_CHECK(cudaMemset(out.ptr, 0xFF, out.count * sizeof(__nv_bfloat16)));  // NaN: an output not written fails
    g.cache.plan_decode(g.lens.ptr, g.prefix.ptr, b.B, max_len, 0, cascade, split_keys > 0 ? split_keys : kDecodeSplitKeys);
    g.cache.decode_attention(kLayer, out.ptr, q.ptr, H, g.page_table.ptr, b.max_pages, 0);
    return to_float(out.download());
}

// The CPU engine's decode attention over the active rows, in row order of the batch ([B][H][D],
// zeros for idle rows), the cache written by KvCache::store; lse [B][H] (0 for idle rows).
struct CpuDecode {
    std::vector<float> out, lse;
};

// k_scale, v_scale: layer kLayer's FP8 scale of each KV head [KV].
CpuDecode cpu_decode(const PagedBatch& b, int H, Precision storage, const std::vector<float>& k_scale,
                     const std::vector<float>& v_scale, bool bf16) {
    const int KV = b.shape.kv_heads, D = b.shape.head_dim;
    KvCache cache;
    cache.allocate(kLayers, b.B, b.max_len, KV * D, storage);
    std::vector<float> ks((size_t)kLayers * KV, 1.0f), vs((size_t)kLayers * KV, 1.0f);
    std::copy(k_scale.begin(), k_scale.end(), ks.begin() + (size_t)kLayer * KV);
    std::copy(v_scale.begin(), v_scale.end(), vs.begin() + (size_t)kLayer * KV);
    cache.set_scales(ks, vs);
    cache.store(kLayer, (long)b.cpu_rows.size(), b.cpu_rows.data(), b.k.data(), b.v.data());
    std::vector<int64_t> key_start;
    std::vector<int32_t> key_count, key_prefix;
    std::vector<int> active;
    std::vector<float> q;
    for (int r = 0; r < b.B; r++)
        if (b.lens[r] > 0) {
            active.push_back(r);
            key_start.push_back((int64_t)r * b.max_len);
            key_count.push_back(b.lens[r]);
            key_prefix.push_back(b.prefix[r]);
            q.insert(q.end(), b.q.begin() + (size_t)r * H * D, b.q.begin() + (size_t)(r + 1) * H * D);
        }
    const long T = (long)active.size(), stride = cached_attention_scratch_floats({H, KV, D}, std::max(b.max_len, 1));
    std::vector<float> out((size_t)T * H * D), lse((size_t)T * H), scratch((size_t)omp_get_max_threads() * stride);
    if (T > 0)
        attention_forward_cached(out.data(), lse.data(), q.data(), cache.keys(kLayer), cache.values(kLayer),
                                 cache.head_scales(kLayer, KV, true).data(), cache.head_scales(kLayer, KV, false).data(),
                                 key_start.data(), key_count.data(), key_prefix.data(), T, {H, KV, D}, scratch.data(),
                                 stride, bf16,
                                 CachedRows::Decode);
    CpuDecode r{std::vector<float>((size_t)b.B * H * D, 0.0f), std::vector<float>((size_t)b.B * H, 0.0f)};
    for (long t = 0; t < T; t++) {
        std::copy(out.begin() + t * H * D, out.begin() + (t + 1) * H * D, r.out.begin() + (size_t)active[t] * H * D);
        std::copy(lse.begin() + t * H, lse.begin() + (t + 1) * H, r.lse.begin() + (size_t)active[t] * H);
    }
    return r;
}

// mag = sum_j p_j |v_j| of every output, in double from the CPU cache's values and the CPU's lse.
std::vector<double> magnitudes(const PagedBatch& b, int H, Precision storage, const std::vector<float>& k_scale,
                               const std::vector<float>& v_scale, const std::vector<float>& lse) {
    const int KV = b.shape.kv_heads, D = b.shape.head_dim, group = H / KV;
    KvCache cache;  // only for stored(): the values the cache keeps
    cache.format = storage;
    std::vector<double> mag((size_t)b.B * H * D, 0.0);
    const double scale = 1.0 / std::sqrt((double)D);
    long token0 = 0;
    for (int r = 0; r < b.B; token0 += b.lens[r], r++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < b.lens[r]; j++) {
                const size_t kv = ((size_t)(token0 + j) * KV + h / group) * D;
                double s = 0;
                const float ks = k_scale[(size_t)(h / group)], vs = v_scale[(size_t)(h / group)];
                for (int d = 0; d < D; d++) s += (double)b.q[((size_t)r * H + h) * D + d] * cache.stored(b.k[kv + d], ks);
                const double p = std::exp(s * scale - lse[(size_t)r * H + h]);
                for (int d = 0; d < D; d++) mag[((size_t)r * H + h) * D + d] += p * std::fabs(cache.stored(b.v[kv + d], vs));
            }
    return mag;
}

// Counts outputs with |got - want| > rel (mag + |want|); idle rows must be exactly 0. Prints the
// worst ratio of error to bound.
int count_outside(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                  const std::vector<double>& mag, double rel) {
    int bad = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double err = std::fabs((double)got[i] - want[i]), bound = rel * (mag[i] + std::fabs(want[i]));
        if (!(err <= bound)) {  // NaN counts as outside; an idle row's bound is 0
            if (bad++ < 3) CHECK_MSG(false, "%s[%zu] = %.7g, expected %.7g (bound %.3g)", what, i, got[i], want[i], bound);
        } else if (bound > 0) {
            worst_ratio = std::max(worst_ratio, err / bound);
        }
    }
    printf("    %s: %d of %zu outside, worst error/bound %.3f\n", what, bad, want.size(), worst_ratio);
    return bad;
}

double score_error(int D) { return D * 0x1p-24 * (D * 3.0 * 2.0) / std::sqrt((double)D); }

// Per layer scales from the amax of the layer's values, as the rollout sets them.
float scale_of(const std::vector<float>& x) { return kv_scale_from_amax(max_abs(x.data(), (long)x.size())); }
// Per KV head scales of x [tokens][KV][D] (--kv_scales head), from each head's amax.
std::vector<float> head_scales_of(const std::vector<float>& x, int KV, int D) {
    std::vector<float> amax((size_t)KV);
    max_abs_per_head(amax.data(), x.data(), (long)(x.size() / ((size_t)KV * D)), KV, D);
    for (float& a : amax) a = kv_scale_from_amax(a);
    return amax;
}

// per_head: FP8 scales per layer and KV head (the GPU cache gets [layers][KV] scales, the layers'
// heads apart), else one per layer (the GPU cache gets [layers]; the CPU's repeats it per head).
void check_decode(Precision storage, bool per_head = false) {
    for (const DecodeCase& c : kDecodeCases) {
        const PagedBatch b = make_batch(c, 1000 + c.D);
        const bool fp8 = storage == Precision::FP8;
        std::vector<float> ks = per_head ? head_scales_of(b.k, c.KV, c.D) : std::vector<float>(c.KV, fp8 ? scale_of(b.k) : 1.0f);
        std::vector<float> vs = per_head ? head_scales_of(b.v, c.KV, c.D) : std::vector<float>(c.KV, fp8 ? scale_of(b.v) : 1.0f);
        std::vector<float> gpu_ks = {0.5f, ks[0]}, gpu_vs = {0.25f, vs[0]};
        if (per_head) {
            gpu_ks.assign((size_t)c.KV, 0.5f), gpu_vs.assign((size_t)c.KV, 0.25f);
            gpu_ks.insert(gpu_ks.end(), ks.begin(), ks.end()), gpu_vs.insert(gpu_vs.end(), vs.begin(), vs.end());
        }
        GpuCache g(b, storage, gpu_ks, gpu_vs, c.H);
        const CpuDecode fp32 = cpu_decode(b, c.H, storage, ks, vs, false), bf16 = cpu_decode(b, c.H, storage, ks, vs, true);
        const std::vector<double> mag = magnitudes(b, c.H, storage, ks, vs, fp32.lse);
        const double u = 0x1p-8, e = score_error(c.D) + 1e-5;
        for (int split_keys : c.split_keys)
            for (int max_len : {b.max_len, b.max_len + 20}) {  // exact and an upper bound (chunks past every length)
                printf("    %s %s, chunks of %d keys, max_len %d\n", c.name, precision_name(storage),
                       split_keys > 0 ? split_keys : kDecodeSplitKeys, max_len);
                const std::vector<float> got = gpu_decode(g, b, c.H, max_len, split_keys);
                CHECK(count_outside("O vs cpu fp32", got, fp32.out, mag, u + e) == 0);
                CHECK(count_outside("O vs cpu bf16", got, bf16.out, mag, 2 * u + e) == 0);
#ifdef FP8RL_EMU  // the CPU's chunks, the emulated tensor cores summing in the CPU engine's order: the same bits
                int differ = 0;
                for (size_t i = 0; split_keys % kDecodeSplitKeys == 0 && i < got.size(); i++)
                    if (memcmp(&got[i], &bf16.out[i], sizeof(float)) != 0 && differ++ < 3)
                        CHECK_MSG(false, "O[%zu] = %.9g, the CPU engine's %.9g", i, got[i], bf16.out[i]);
                CHECK_MSG(differ == 0, "%d outputs differ from the CPU engine's bits", differ);
#endif
            }
    }
}

}  // namespace

TEST(kv_decode_attention_bf16_matches_cpu) {
    REQUIRE_GPU();
    check_decode(Precision::BF16);
}

TEST(kv_decode_attention_fp8_matches_cpu) {
    REQUIRE_GPU();
    check_decode(Precision::FP8);
}

TEST(kv_decode_attention_fp8_scales_per_kv_head_match_cpu) {
    REQUIRE_GPU();
    check_decode(Precision::FP8, /*per_head=*/true);
}

// In an fp8 decode step decode attention also writes the O projection's FP8 1x128 operand: the
// combine kernel writes it beside the output, so its codes and scales must be the CPU's
// quantization of the output the same call wrote, and rows past B zero codes over garbage. Chunks of
// one tile: many chunks a row. Each call twice: nothing of the first may leak into the second.
TEST(kv_decode_attention_writes_the_o_projection_operand) {
    REQUIRE_GPU();
    for (const DecodeCase& c : {kDecodeCases[2], kDecodeCases[3], kDecodeCases[5]}) {
        const PagedBatch b = make_batch(c, 2000 + c.D);
        GpuCache g(b, Precision::FP8, {0.5f, scale_of(b.k)}, {0.25f, scale_of(b.v)}, c.H);
        const int cols = c.H * c.D, padded = b.B + 5;
        DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), out((size_t)b.B * cols);
        for (int call = 0; call < 2; call++) {
            DeviceBuffer<uint8_t> codes(std::vector<uint8_t>((size_t)padded * cols, 0xAB));
            DeviceBuffer<float> scales(std::vector<float>(vec128_scale_count(padded, cols), NAN));
            Fp8RowsOut operand;
            operand.codes = codes.ptr, operand.scale_inv = scales.ptr, operand.rows = padded;
            g.cache.plan_decode(g.lens.ptr, g.prefix.ptr, b.B, b.max_len, 0, DecodeCascade(), kDecodeTile);
            g.cache.decode_attention(kLayer, out.ptr, q.ptr, c.H, g.page_table.ptr, b.max_pages, 0, operand);
            std::vector<float> o = to_float(out.download());
            o.resize((size_t)padded * cols, 0.0f);
            const Fp8Tensor want = fp8_quantize_rowwise(o.data(), padded, cols, false);
            const int bad = fp8_operand_differences(codes, scales, want);
            printf("    %s, call %d: %d of %zu codes and scales differ from the CPU's quantization (%d padding rows)\n",
                   c.name, call, bad, want.data.size() + want.scale_inv.size(), padded - b.B);
            CHECK_EQ(bad, 0);
        }
    }
}

// The G samples of a prompt as rollout.cu holds them: the prompt's full pages shared, each row's
// copy of its partial page (the prompt's last tokens, then its own), then its own pages. Rows
// `siblings` share a P-token prompt; the others have prompts of their own. The GPU cache writes a
// shared page once (gpu_writes), the CPU cache every row's keys.
PagedBatch make_sibling_batch(const DecodeCase& c, int siblings, int P, uint32_t seed) {
    PagedBatch b;
    b.B = (int)c.lens.size();
    b.lens = c.lens;
    b.max_len = *std::max_element(c.lens.begin(), c.lens.end());
    b.max_pages = (b.max_len + c.page_tokens - 1) / c.page_tokens;
    const int full = P / c.page_tokens;
    int needed = full;
    for (int len : c.lens) needed += (len + c.page_tokens - 1) / c.page_tokens;
    b.shape = {kLayers, c.KV, c.D, c.page_tokens, needed + 3};
    std::vector<int32_t> order(b.shape.pages);
    std::iota(order.begin(), order.end(), 0);
    for (int i = b.shape.pages - 1; i > 0; i--)
        std::swap(order[i], order[(int)((hash_uniform(i, seed) + 1.0f) * 0.5f * (i + 1)) % (i + 1)]);
    int next = 0;
    std::vector<int32_t> shared_pages;
    for (int p = 0; p < full; p++) shared_pages.push_back(order[next++]);
    b.page_table.assign((size_t)b.B * b.max_pages, -1);
    const size_t width = (size_t)c.KV * c.D;
    const std::vector<float> prompt_k = bf16_values((size_t)P * width, seed + 1, 2.0f),
                             prompt_v = bf16_values((size_t)P * width, seed + 2, 1.0f);
    for (int r = 0; r < b.B; r++) {
        const bool sibling = r < siblings;
        const int prompt = sibling ? P : c.prompts[r];
        b.prefix.push_back((int32_t)decode_prefix_keys(prompt, c.lens[r]));
        for (int p = 0; p * c.page_tokens < c.lens[r]; p++)
            b.page_table[(size_t)r * b.max_pages + p] = sibling && p < full ? shared_pages[p] : order[next++];
        const std::vector<float> own_k = bf16_values((size_t)c.lens[r] * width, seed + 10 + r, 2.0f),
                                 own_v = bf16_values((size_t)c.lens[r] * width, seed + 40 + r, 1.0f);
        for (int pos = 0; pos < c.lens[r]; pos++) {
            const bool from_prompt = sibling && pos < P;
            const float* k = from_prompt ? &prompt_k[(size_t)pos * width] : &own_k[(size_t)pos * width];
            const float* v = from_prompt ? &prompt_v[(size_t)pos * width] : &own_v[(size_t)pos * width];
            b.k.insert(b.k.end(), k, k + width);
            b.v.insert(b.v.end(), v, v + width);
            b.slots.push_back(b.page_table[(size_t)r * b.max_pages + pos / c.page_tokens] * c.page_tokens + pos % c.page_tokens);
            b.cpu_rows.push_back((int64_t)r * b.max_len + pos);
            b.gpu_writes.push_back(!(sibling && pos < full * c.page_tokens && r > 0));  // row 0 writes the shared pages
        }
    }
    b.q = bf16_values((size_t)b.B * c.H * c.D, seed + 3, 3.0f);
    return b;
}

// Cascade attention (issue 29): 11 sibling rows of a 100-token prompt (one idle: a sequence that
// finished in the window), in groups of at most cascade_rows(), beside rows of other prompts. With
// the groups the output and every chunk's LSE are the per-row launch's bit for bit, at chunks of 32
// and 256 keys, BF16 and FP8; both are within the bounds of the CPU engine's; and in emulation the
// K/V bytes read are the per-row launch's less each group's prefix read by all but one of its rows.
TEST(kv_decode_cascade_equals_per_row_bits_and_reads_the_prefix_once) {
    REQUIRE_GPU();
    const int siblings = 11, P = 100;
    const DecodeCase c{"D16 H4 KV2, 11 siblings", 4, 2, 16, 16, {101, 105, 140, 400, 0, 101, 102, 130, 101, 300, 110, 60, 7},
                       {32, 0}, {P, P, P, P, P, P, P, P, P, P, P, 40, 7}};
    const PagedBatch b = make_sibling_batch(c, siblings, P, 123);
    for (Precision storage : {Precision::BF16, Precision::FP8}) {
        const bool fp8 = storage == Precision::FP8;
        const std::vector<float> ks(c.KV, fp8 ? scale_of(b.k) : 1.0f), vs(c.KV, fp8 ? scale_of(b.v) : 1.0f);
        GpuCache g(b, storage, {0.5f, ks[0]}, {0.25f, vs[0]}, c.H);
        const int per_group = g.cache.cascade_rows();
        CHECK_EQ(per_group, kCascadeRows);  // D16, 2 heads per kv head: 8 rows fit
        std::vector<int32_t> rows, start = {0}, shared((size_t)b.B, 0);
        for (int r = 0; r < siblings; r++) {
            rows.push_back(r), shared[(size_t)r] = 1;
            if ((int)rows.size() - start.back() == per_group || r == siblings - 1) start.push_back((int)rows.size());
        }
        const int groups = (int)start.size() - 1;
        CHECK_EQ(groups, 2);
        DeviceBuffer<int32_t> rows_d(rows), start_d(start), count_d(std::vector<int32_t>{groups}), shared_d(shared);
        DecodeCascade cascade;
        cascade.rows = rows_d.ptr, cascade.start = start_d.ptr, cascade.count = count_d.ptr, cascade.shared = shared_d.ptr;
        cascade.max_groups = b.B / 2;  // as rollout.cu bounds it: CTAs past *count exit
        const CpuDecode fp32 = cpu_decode(b, c.H, storage, ks, vs, false);
        const std::vector<double> mag = magnitudes(b, c.H, storage, ks, vs, fp32.lse);
        for (int split_keys : c.split_keys) {
            const int split = split_keys > 0 ? split_keys : kDecodeSplitKeys, chunks = PagedKvCache::decode_chunks(b.max_len, split);
            auto chunk_lse = [&]() {
                std::vector<float> lse((size_t)b.B * c.H * chunks);
                CUDA_CHECK(cudaMemcpy(lse.data(), g.cache.decode_chunk_lse(), lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
                return lse;
            };
#ifdef FP8RL_EMU
            const uint64_t before = emu::async_copy_bytes();
#endif
            const std::vector<float> per_row = gpu_decode(g, b, c.H, b.max_len, split_keys);
            const std::vector<float> per_row_lse = chunk_lse();
#ifdef FP8RL_EMU
            const uint64_t middle = emu::async_copy_bytes();
#endif
            const std::vector<float> cascaded = gpu_decode(g, b, c.H, b.max_len, split_keys, cascade);
            const std::vector<float> cascaded_lse = chunk_lse();
            printf("    %s, chunks of %d keys\n", precision_name(storage), split);
            CHECK(memcmp(per_row.data(), cascaded.data(), per_row.size() * sizeof(float)) == 0);
            CHECK(memcmp(per_row_lse.data(), cascaded_lse.data(), per_row_lse.size() * sizeof(float)) == 0);
            CHECK(count_outside("cascade O vs cpu fp32", cascaded, fp32.out, mag, 0x1p-8 + score_error(c.D) + 1e-5) == 0);
#ifdef FP8RL_EMU
            const uint64_t key_bytes = 2 * (uint64_t)c.D * (fp8 ? 1 : 2) * c.KV;  // K and V of one key, every kv head
            uint64_t per_row_keys = 0, cascade_keys = 0;
            for (int r = 0; r < b.B; r++) {
                per_row_keys += (uint64_t)b.lens[r];
                cascade_keys += (uint64_t)(b.lens[r] - (shared[(size_t)r] ? b.prefix[(size_t)r] : 0));
            }
            cascade_keys += (uint64_t)groups * decode_prefix_keys(P, P + 1);  // each group's prefix, once
            printf("    K/V bytes read: per row %llu, cascade %llu (%.2fx fewer)\n", (unsigned long long)(middle - before),
                   (unsigned long long)(emu::async_copy_bytes() - middle), (double)per_row_keys / cascade_keys);
            CHECK_EQ(middle - before, per_row_keys * key_bytes);
            CHECK_EQ(emu::async_copy_bytes() - middle, cascade_keys * key_bytes);
#endif
        }
    }
}

// Batch invariance (issue 26, defect 4): a row's chunks follow its own length and prompt alone. Row 0
// (600 keys, a 450-token prompt: 2 prefix chunks and 1 of its own) decoded beside a 2,000-key row,
// alone, and with max_len 20 above every length (a longer row elsewhere in the pool): the same chunk
// LSEs and the same output bits each time.
TEST(kv_decode_chunks_do_not_depend_on_the_batch) {
    REQUIRE_GPU();
    const DecodeCase c{"D16 H4 KV2, rows past 512 keys", 4, 2, 16, 16, {600, 2000, 37, 0}, {0}, {450, 1000, 3, 0}};
    const PagedBatch b = make_batch(c, 99);
    GpuCache g(b, Precision::BF16, {1.0f, 1.0f}, {1.0f, 1.0f}, c.H);
    struct Row0 {
        std::vector<float> lse;            // its chunks' LSEs, head by head
        std::vector<__nv_bfloat16> out;  // [H][D]
    };
    auto decode_row0 = [&](int B, int max_len) {
        DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), out((size_t)B * c.H * c.D);
        g.cache.plan_decode(g.lens.ptr, g.prefix.ptr, B, max_len, 0);
        g.cache.decode_attention(kLayer, out.ptr, q.ptr, c.H, g.page_table.ptr, b.max_pages, 0);
        const int splits = PagedKvCache::decode_chunks(max_len);
        std::vector<float> lse((size_t)B * c.H * splits);
        Row0 r;
        r.out = out.download();  // synchronizes
        r.out.resize((size_t)c.H * c.D);
        CUDA_CHECK(cudaMemcpy(lse.data(), g.cache.decode_chunk_lse(), lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
        const int row0_chunks = decode_row_chunks(b.lens[0], b.prefix[0], kDecodeSplitKeys);  // written; the rest are not
        for (int h = 0; h < c.H; h++) r.lse.insert(r.lse.end(), lse.begin() + h * splits, lse.begin() + h * splits + row0_chunks);
        return r;
    };
    const Row0 batched = decode_row0(b.B, b.max_len), alone = decode_row0(1, c.lens[0]),
               padded = decode_row0(b.B, b.max_len + 20);
    CHECK_EQ(batched.lse.size(), (size_t)c.H * 3);
    for (const Row0* other : {&alone, &padded}) {
        CHECK(other->lse == batched.lse);
        CHECK(memcmp(other->out.data(), batched.out.data(), batched.out.size() * sizeof(__nv_bfloat16)) == 0);
    }
}

// The bytes the host writes for x: FP8 float_to_e4m3(x / scale) (rl/numerics/fp8.h), BF16 the value's bits.
void host_encode(uint8_t* dst, float x, float scale, Precision storage) {
    if (storage == Precision::FP8) {
        *dst = float_to_e4m3(x / scale);
    } else {
        const uint16_t bits = float_to_bf16(x);
        memcpy(dst, &bits, 2);
    }
}

std::vector<uint8_t> download_pool(const uint8_t* dev, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    CUDA_CHECK(cudaMemcpy(host.data(), dev, bytes, cudaMemcpyDeviceToHost));
    return host;
}

// The pool's bytes at every written slot of the layer are the host's encoding of the input; then
// appending rows {0, padding (-1), 2} to slots {s0, -1, s1} changes exactly slot s1's row.
// The decode kernel's E4M3 -> BF16 conversions (e4m3x2_to_bf16x2: cvt.rn.f16x2.e4m3x2, then FP16 ->
// FP32 -> BF16) on every code but NaN's, four codes a word in every byte position, as K's codes reach
// it (a word's halves) and as V's do (e4m3_column_pair's columns of a transposing ldmatrix's word):
// the value of rl/numerics/fp8.h's e4m3_to_float, exactly (E4M3 is exact in BF16), in its place.
__global__ void e4m3_to_bf16_kernel(uint32_t* out, const uint32_t* words, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int h = 0; h < 2; h++) {
        out[4 * i + h] = e4m3x2_to_bf16x2((uint16_t)(words[i] >> (16 * h)));  // codes 2 h, 2 h + 1
        out[4 * i + 2 + h] = e4m3x2_to_bf16x2(e4m3_column_pair(words[i], h));  // codes h, h + 2
    }
}

TEST(kv_decode_converts_every_e4m3_code_exactly) {
    REQUIRE_GPU();
    std::vector<uint32_t> words;
    for (uint32_t c = 0; c < 256; c++)  // code c in byte c % 4, its neighbours around it
        words.push_back(c << (8 * (c % 4)) | ((c + 1) & 0xFFu) << (8 * ((c + 1) % 4)) |
                        ((c + 2) & 0xFFu) << (8 * ((c + 2) % 4)) | ((c + 3) & 0xFFu) << (8 * ((c + 3) % 4)));
    DeviceBuffer<uint32_t> in(words), out(4 * words.size());
    LAUNCH_KERNEL(e4m3_to_bf16_kernel, 1, 256, 0, 0, out.ptr, in.ptr, (int)words.size());
    const std::vector<uint32_t> got = out.download();
    int differ = 0, checked = 0;
    for (size_t i = 0; i < words.size(); i++)
        for (int b = 0; b < 4; b++) {
            const uint8_t code = (uint8_t)(words[i] >> (8 * b));
            if ((code & 0x7F) == 0x7F) continue;  // NaN
            const uint32_t as_key = got[4 * i + b / 2] >> (16 * (b % 2)), as_value = got[4 * i + 2 + b % 2] >> (16 * (b / 2));
            for (uint32_t word : {as_key, as_value}) {
                const float value = bf16_to_float((uint16_t)word), want = e4m3_to_float(code);
                checked++;
                if (memcmp(&value, &want, sizeof value) != 0 && differ++ < 3)
                    CHECK_MSG(false, "code 0x%02x: BF16 %.9g, E4M3 %.9g", code, value, want);
            }
        }
    CHECK(checked == 2 * 4 * 254 && differ == 0);
}

// The decode kernel's runtime divisions (GQA group, page size, chunk size) are FastDivisor's
// multiply-high (rl/numerics/fast_div.h): on the device (__umulhi; in emulation the host's 64-bit
// product) its quotient and remainder equal plain division's for divisors 1..40, powers of two and
// the largest, at numerators around every multiple of the divisor up to 2^31 - 1.
__global__ void fast_div_kernel(uint32_t* q, uint32_t* r, const uint32_t* n, FastDivisor d, int count) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) q[i] = d.div(n[i]), r[i] = d.mod(n[i]);
}

TEST(kv_fast_divisor_equals_division) {
    REQUIRE_GPU();
    std::vector<uint32_t> divisors;
    for (uint32_t d = 1; d <= 40; d++) divisors.push_back(d);
    for (uint32_t d : {64u, 256u, 4096u, 65537u, 1u << 30, 2147483647u, 1u << 31}) divisors.push_back(d);
    int wrong = 0, checked = 0;
    for (uint32_t d : divisors) {
        std::vector<uint32_t> n = {0, 1, 2, 2147483647u, 2147483646u};
        for (uint64_t m = d; m < (1ull << 31); m = m * 3 + d)  // around multiples of d, sparse at the top
            for (int64_t k = -1; k <= 1; k++) n.push_back((uint32_t)std::min<int64_t>((int64_t)m + k, 2147483647));
        const std::vector<uint32_t> top = {2147483647u / d * d, 2147483647u / d * d - 1};
        n.insert(n.end(), top.begin(), top.end());
        DeviceBuffer<uint32_t> in(n), q(n.size()), r(n.size());
        LAUNCH_KERNEL(fast_div_kernel, (unsigned)((n.size() + 127) / 128), 128, 0, 0, q.ptr, r.ptr, in.ptr,
                      FastDivisor(d), (int)n.size());
        const std::vector<uint32_t> qh = q.download(), rh = r.download();
        for (size_t i = 0; i < n.size(); i++, checked++)
            if ((qh[i] != n[i] / d || rh[i] != n[i] % d) && wrong++ < 3)
                CHECK_MSG(false, "%u / %u: %u rem %u, want %u rem %u", n[i], d, qh[i], rh[i], n[i] / d, n[i] % d);
    }
    CHECK(wrong == 0 && checked > 1000);
}

TEST(kv_append_matches_host_encoder) {
    REQUIRE_GPU();
    const DecodeCase c = {"D32 H2 KV2", 2, 2, 32, 16, {5, 16, 17}, {0}, {}};
    const PagedBatch b = make_batch(c, 7);
    for (Precision storage : {Precision::FP8, Precision::BF16}) {
        const float ks = 0.0043f, vs = 0.0021f;  // |x| / scale beyond 448 for some values: satfinite
        GpuCache g(b, storage, {1.0f, ks}, {1.0f, vs}, c.H);
        const size_t eb = PagedKvCache::element_bytes(storage), width = b.shape.width();
        const size_t pool = (size_t)kLayers * b.shape.slots() * width * eb;
        CHECK(PagedKvCache::bytes(b.shape, storage) >= 2 * pool);
        CHECK(PagedKvCache::page_bytes(b.shape, storage) * b.shape.pages == 2 * pool);
        const std::vector<uint8_t> kp = download_pool(g.cache.k_pool(), pool), vp = download_pool(g.cache.v_pool(), pool);
        int differ = 0, saturated = 0;
        for (size_t t = 0; t < b.slots.size(); t++)
            for (size_t i = 0; i < width; i++) {
                const size_t at = (((size_t)kLayer * b.shape.slots() + b.slots[t]) * width + i) * eb;
                uint8_t want_k[2], want_v[2];
                host_encode(want_k, b.k[t * width + i], ks, storage);
                host_encode(want_v, b.v[t * width + i], vs, storage);
                differ += memcmp(&kp[at], want_k, eb) != 0;
                differ += memcmp(&vp[at], want_v, eb) != 0;
                saturated += std::fabs(b.k[t * width + i] / ks) > E4M3_MAX;
            }
        CHECK_MSG(differ == 0, "%s: %d stored elements differ from the host encoder", precision_name(storage), differ);
        if (storage == Precision::FP8) CHECK_MSG(saturated > 0, "no K value reaches satfinite (the test lost its edge)");
        DeviceBuffer<int32_t> slots(std::vector<int32_t>{b.slots[0], -1, b.slots[1]});
        DeviceBuffer<__nv_bfloat16> k(to_bf16(std::vector<float>(b.k.begin(), b.k.begin() + 3 * width))),
            v(to_bf16(std::vector<float>(b.v.begin(), b.v.begin() + 3 * width)));
        g.cache.append(kLayer, k.ptr, v.ptr, slots.ptr, 3, 0);
        std::vector<uint8_t> want = kp;
        for (size_t i = 0; i < width; i++)
            host_encode(&want[(((size_t)kLayer * b.shape.slots() + b.slots[1]) * width + i) * eb], b.k[2 * width + i], ks,
                        storage);
        CHECK_MSG(download_pool(g.cache.k_pool(), pool) == want, "%s: the padded append wrote other bytes than slot %d's row",
                  precision_name(storage), b.slots[1]);
    }
}

// round_trip: with FP8 storage, K and V become the values cpu/kv_cache.h's stored() keeps for them
// (the CPU engine's prefill reads those), rounded to BF16, including satfinite ones, with scales per
// layer and per KV head; with BF16 storage they stay as they are, bit for bit.
TEST(kv_round_trip_matches_cpu_stored_values) {
    REQUIRE_GPU();
    const DecodeCase c = {"D32 H2 KV2", 2, 2, 32, 16, {5, 16, 17}, {0}, {}};
    const PagedBatch b = make_batch(c, 9);
    const float ks = 0.0043f, vs = 0.0021f;  // |x| / scale beyond 448 for some values: satfinite
    KvCache cpu;
    cpu.format = Precision::FP8;
    const size_t n = b.slots.size(), width = b.shape.width();
    for (int per_head = 0; per_head < 3; per_head++) {  // 2: BF16 storage
        const Precision storage = per_head < 2 ? Precision::FP8 : Precision::BF16;
        // layer kLayer's scale per KV head: head 1's three times head 0's with per-head scales
        const std::vector<float> k_heads = {ks, per_head == 1 ? 3 * ks : ks}, v_heads = {vs, per_head == 1 ? 3 * vs : vs};
        GpuCache g(b, storage, per_head == 1 ? std::vector<float>{1.0f, 1.0f, k_heads[0], k_heads[1]} : std::vector<float>{1.0f, ks},
                   per_head == 1 ? std::vector<float>{1.0f, 1.0f, v_heads[0], v_heads[1]} : std::vector<float>{1.0f, vs}, c.H);
        const std::vector<__nv_bfloat16> k_in = to_bf16(std::vector<float>(b.k.begin(), b.k.begin() + n * width)),
                                         v_in = to_bf16(std::vector<float>(b.v.begin(), b.v.begin() + n * width));
        DeviceBuffer<__nv_bfloat16> k(k_in), v(v_in);
        g.cache.round_trip(kLayer, k.ptr, v.ptr, (long)n, 0);
        const std::vector<float> k_out = to_float(k.download()), v_out = to_float(v.download());
        const std::vector<float> k_ref = to_float(k_in), v_ref = to_float(v_in);
        int differ = 0;
        for (size_t i = 0; i < n * width; i++) {
            const size_t head = i % width / (size_t)c.D;
            const float want_k = storage == Precision::FP8 ? round_bf16(cpu.stored(k_ref[i], k_heads[head])) : k_ref[i];
            const float want_v = storage == Precision::FP8 ? round_bf16(cpu.stored(v_ref[i], v_heads[head])) : v_ref[i];
            differ += memcmp(&k_out[i], &want_k, 4) != 0;
            differ += memcmp(&v_out[i], &want_v, 4) != 0;
        }
        CHECK_MSG(differ == 0, "%s%s: %d values differ from the CPU cache's stored values", precision_name(storage),
                  per_head == 1 ? " (scales per KV head)" : "", differ);
    }
}

// copy_page: the copy's bytes equal the source page's in every layer, K and V, and a row reading the
// copy attends exactly as the row reading the original.
TEST(kv_copy_page_copies_every_layer) {
    REQUIRE_GPU();
    const DecodeCase c = {"D16 H2 KV1", 2, 1, 16, 16, {20}, {0}, {}};
    PagedBatch b = make_batch(c, 21);
    const float ks = scale_of(b.k), vs = scale_of(b.v);
    GpuCache g(b, Precision::FP8, {ks, ks}, {vs, vs}, c.H);
    const int src = b.page_table[1];  // the partial second page
    int dst = 0;                      // a spare page
    while (dst == b.page_table[0] || dst == src) dst++;
    g.cache.copy_page(src, dst, 0);
    const size_t pool = (size_t)kLayers * b.shape.slots() * b.shape.width(), page = (size_t)b.shape.page_tokens * b.shape.width();
    for (const uint8_t* dev : {g.cache.k_pool(), g.cache.v_pool()}) {
        const std::vector<uint8_t> bytes = download_pool(dev, pool);
        for (int l = 0; l < kLayers; l++) {
            const uint8_t* layer = bytes.data() + (size_t)l * b.shape.slots() * b.shape.width();
            CHECK_MSG(memcmp(layer + (size_t)dst * page, layer + (size_t)src * page, page) == 0,
                      "layer %d: page %d differs from page %d after the copy", l, dst, src);
        }
    }
    const std::vector<float> before = gpu_decode(g, b, c.H, b.max_len, 0);
    b.page_table[1] = dst;
    g.page_table.upload(b.page_table);
    const std::vector<float> after = gpu_decode(g, b, c.H, b.max_len, 0);
    CHECK(before == after);
    const std::vector<float> k_heads((size_t)c.KV, ks), v_heads((size_t)c.KV, vs);
    const CpuDecode want = cpu_decode(b, c.H, Precision::FP8, k_heads, v_heads, false);
    const std::vector<double> mag = magnitudes(b, c.H, Precision::FP8, k_heads, v_heads, want.lse);
    CHECK(count_outside("O over the copied page vs cpu fp32", after, want.out, mag, 0x1p-8 + score_error(c.D) + 1e-5) == 0);
}

// max |x| of n BF16 values, bit for bit the CPU engine's max_abs (cpu/model_layers.h), with the
// largest magnitude negative, at the end of the array, with NaN skipped, and with +-inf; and per KV
// head of x [rows][heads][head_dim], bit for bit its max_abs_per_head (--kv_scales head).
TEST(kv_amax_matches_cpu_max_abs) {
    REQUIRE_GPU();
    for (long n : {1L, 1000L, 300001L}) {
        std::vector<float> x = bf16_values((size_t)n, (uint32_t)n, 3.0f);
        x[n - 1] = -7.5f;
        for (int special = 0; special < 3; special++) {
            if (special == 1 && n > 1) x[n / 2] = NAN;
            if (special == 2) x[0] = -INFINITY;
            DeviceBuffer<__nv_bfloat16> dx(to_bf16(x));
            DeviceBuffer<float> amax(1);
            kv_amax_gpu(amax.ptr, dx.ptr, 1, 1, (int)n, 0);
            const float got = amax.download()[0], want = max_abs(x.data(), n);
            CHECK_MSG(float_bits(got) == float_bits(want), "n = %ld, case %d: amax %g, max_abs %g", n, special, got, want);
        }
    }
    const long rows = 777;
    const int heads = 3, head_dim = 40;
    std::vector<float> x = bf16_values((size_t)rows * heads * head_dim, 5, 2.0f), want((size_t)heads);
    x[(size_t)(500 * heads + 1) * head_dim + 7] = -9.0f;  // head 1's largest, negative, mid-array
    x[(size_t)(rows * heads - 1) * head_dim] = 8.0f;      // head 2's largest, in the last row
    max_abs_per_head(want.data(), x.data(), rows, heads, head_dim);
    DeviceBuffer<__nv_bfloat16> dx(to_bf16(x));
    DeviceBuffer<float> amax((size_t)heads);
    kv_amax_gpu(amax.ptr, dx.ptr, rows, heads, head_dim, 0);
    const std::vector<float> got = amax.download();
    for (int h = 0; h < heads; h++)
        CHECK_MSG(float_bits(got[(size_t)h]) == float_bits(want[(size_t)h]), "head %d: amax %g, max_abs_per_head %g", h,
                  got[(size_t)h], want[(size_t)h]);
    CHECK(want[1] == 9.0f && want[2] == 8.0f);
    DeviceBuffer<float> none(1);
    kv_amax_gpu(none.ptr, nullptr, 0, 1, 1, 0);
    CHECK(none.download()[0] == 0.0f);
}

// A decode step captured in a CUDA graph, replayed after new lengths, queries and scales are
// uploaded to the same device buffers, gives what an eager call gives on the new inputs.
TEST(kv_decode_attention_replays_in_a_graph) {
    REQUIRE_GPU();
    const DecodeCase c = {"D16 H4 KV2", 4, 2, 16, 16, {3, 40, 17}, {32}, {3, 33, 10}};
    PagedBatch b = make_batch(c, 5);
    const int max_len = 48;  // the bucket's bound
    GpuCache g(b, Precision::FP8, {1.0f, scale_of(b.k)}, {1.0f, scale_of(b.v)}, c.H);
    DeviceBuffer<__nv_bfloat16> q(to_bf16(b.q)), out((size_t)b.B * c.H * c.D);
    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    g.cache.plan_decode(g.lens.ptr, g.prefix.ptr, b.B, max_len, stream, DecodeCascade(), kDecodeTile);
    g.cache.decode_attention(kLayer, out.ptr, q.ptr, c.H, g.page_table.ptr, b.max_pages, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    b.lens = {1, 0, 17};  // a shorter row, an idle one, one unchanged
    b.q = bf16_values(b.q.size(), 99, 3.0f);
    g.lens.upload(std::vector<int32_t>(b.lens.begin(), b.lens.end()));
    q.upload(to_bf16(b.q));
    g.cache.set_scales({1.0f, 2 * scale_of(b.k)}, {1.0f, scale_of(b.v)});  // read at replay, not at capture
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> replayed = to_float(out.download());
    const std::vector<float> eager = gpu_decode(g, b, c.H, max_len, kDecodeTile);
    CHECK(replayed == eager);
    CHECK(replayed[(size_t)1 * c.H * c.D] == 0.0f);
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    CUDA_CHECK(cudaStreamDestroy(stream));
}

// A length above max_len (a caller's bug) reads no key past max_len: not the -1 entries of the page
// table after the row's pages (ASan would see the read), and the result is attention over max_len keys.
TEST(kv_decode_attention_reads_no_key_past_max_len) {
    REQUIRE_GPU();
    const DecodeCase c = {"D16 H2 KV1", 2, 1, 16, 16, {17}, {32}, {}};
    const PagedBatch b = make_batch(c, 31);
    GpuCache g(b, Precision::BF16, {1.0f, 1.0f}, {1.0f, 1.0f}, c.H);
    g.lens.upload(std::vector<int32_t>{40});
    const std::vector<float> got = gpu_decode(g, b, c.H, 17, 0);
    const std::vector<float> ones((size_t)c.KV, 1.0f);
    const CpuDecode want = cpu_decode(b, c.H, Precision::BF16, ones, ones, false);
    const std::vector<double> mag = magnitudes(b, c.H, Precision::BF16, ones, ones, want.lse);
    CHECK(count_outside("O over max_len keys vs cpu fp32", got, want.out, mag, 0x1p-8 + score_error(c.D) + 1e-5) == 0);
}

// Bad shapes and calls fail with one line naming what is wrong.
TEST(kv_cache_rejects_bad_input) {
    REQUIRE_GPU();
    const KvCacheShape shape = {2, 2, 16, kKvPageTokens, 4};
    CHECK_THROWS((PagedKvCache(shape, Precision::FP32)), "storage fp32 is not supported");
    CHECK_THROWS((PagedKvCache({2, 2, 24, 16, 4}, Precision::BF16)), "head dim D = 24 is not supported");
    CHECK_THROWS((PagedKvCache({2, 2, 16, 16, 0}, Precision::BF16)), "pages = 0: each must be >= 1");
    PagedKvCache cache(shape, Precision::FP8);
    CHECK_THROWS((cache.set_scales({1.0f}, {1.0f})), "1 K and 1 V scales for 2 layers of 2 KV heads");
    CHECK_THROWS((cache.set_scales({1.0f, 0.0f}, {1.0f, 1.0f})), "layer 1, KV head 0 has K scale 0");
    CHECK_THROWS((cache.set_scales({1.0f, 1.0f, 1.0f}, {1.0f, 1.0f, 1.0f})), "3 K and 3 V scales");
    CHECK_THROWS((cache.set_scales({1.0f, 1.0f, 1.0f, 1.0f}, {1.0f, 1.0f, 0.0f, 1.0f})), "layer 1, KV head 0 has K scale 1, V scale 0");
    CHECK_THROWS((cache.append(2, nullptr, nullptr, nullptr, 1, 0)), "append: layer 2 outside [0, 2)");
    CHECK_THROWS((cache.copy_page(0, 4, 0)), "pages 0 -> 4 outside the pool [0, 4)");
    DeviceBuffer<int32_t> lens(std::vector<int32_t>{1, 1, 1});
    CHECK_THROWS((cache.decode_attention(0, nullptr, nullptr, 4, nullptr, 1, 0)), "no plan: call plan_decode");
    CHECK_THROWS((cache.plan_decode(lens.ptr, nullptr, 1, 16, 0)), "call reserve_decode");
    cache.reserve_decode(2, 4, 16);
    cache.plan_decode(lens.ptr, nullptr, 1, 16, 0);
    CHECK_THROWS((cache.decode_attention(0, nullptr, nullptr, 3, nullptr, 1, 0)),
                 "heads = 3 must be a positive multiple of kv_heads = 2");
    CHECK_THROWS((cache.decode_attention(0, nullptr, nullptr, 8, nullptr, 1, 0)), "1 rows x 8 heads x");
    cache.plan_decode(lens.ptr, nullptr, 1, 17, 0);
    CHECK_THROWS((cache.decode_attention(0, nullptr, nullptr, 4, nullptr, 1, 0)), "max_len <= max_pages * page_tokens");
    PagedKvCache wide({1, 1, 128, 16, 1}, Precision::BF16);
    CHECK_THROWS((wide.reserve_decode(1, 400, 16)), "400 query heads per kv head need 25 query tiles");
    CHECK_THROWS((cache.reserve_decode(1, 4, 16, 48)), "split_keys = 48 must be a positive multiple of 32");
    CHECK_THROWS((cache.plan_decode(lens.ptr, nullptr, 3, 16, 0)), "3 rows (0 cascade groups) x 2 chunks exceed the decode work lists");
    CHECK_THROWS((cache.plan_decode(lens.ptr, nullptr, 2, 64, 0, DecodeCascade(), 32)),
                 "2 rows (0 cascade groups) x 3 chunks exceed the decode work lists");
    DecodeCascade half;  // rows without the rest
    half.rows = reinterpret_cast<const int32_t*>(16);
    CHECK_THROWS((cache.plan_decode(lens.ptr, nullptr, 1, 16, 0, half)), "a cascade needs rows, start, count and shared");
}
