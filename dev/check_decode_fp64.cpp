// check_decode_fp64.cpp: how far the CPU engine's decode attention (cpu/attention.h's
// attention_forward_cached, CachedRows::Decode, bf16 = true: the GPU decode kernel's rounding points)
// is from FP64 arithmetic over the same stored K and V, for BF16 and FP8 caches (scales per layer),
// several head dims and GQA groups, rows of 1 to 700 keys. Prints per cache format the mean and the
// largest |O - O64| / (mag + |O64|) (mag = sum_j p_j |v_j|, FP64) and the mean |lse - lse64|.
// Built against the tree it sits in, or with -DFP8RL_DECODE_BEFORE_I47 against the headers of the
// commit before issue 47 moved the decode rounding points (attention_forward_cached without scales,
// the cache keeping scaled values): dev/check_decode_fp64.sh runs both.
#include <cmath>
#include <cstdio>
#include <vector>

#include "cpu/attention.h"
#include "cpu/kv_cache.h"
#include "cpu/model_layers.h"

using namespace fp8rl;

namespace {
uint32_t hash(uint32_t x) {
    x ^= x >> 16, x *= 0x7feb352dU, x ^= x >> 15, x *= 0x846ca68bU, x ^= x >> 16;
    return x;
}
float uniform(uint32_t i, uint32_t seed) { return (float)(hash(i * 2654435761U ^ hash(seed)) >> 8) / 8388608.0f - 1.0f; }
}  // namespace

int main() {
    for (Precision format : {Precision::BF16, Precision::FP8}) {
        double err_sum = 0, err_max = 0, lse_sum = 0;
        long outputs = 0, rows = 0;
        struct Shape { int H, KV, D; };
        for (Shape sh : {Shape{4, 2, 64}, Shape{16, 8, 128}, Shape{8, 1, 32}, Shape{6, 2, 16}})
            for (int len : {1, 17, 64, 255, 256, 300, 700}) {
                const int H = sh.H, KV = sh.KV, D = sh.D, width = KV * D, group = H / KV;
                const uint32_t seed = (uint32_t)(H * 1000 + D * 10 + len);
                std::vector<float> k((size_t)len * width), v(k.size()), q((size_t)H * D);
                // BF16 values; keys with a few large channels (peaked and flat rows both)
                for (size_t i = 0; i < k.size(); i++) {
                    k[i] = round_bf16(uniform((uint32_t)i, seed) * (i % D < 4 ? 8.0f : 2.0f));
                    v[i] = round_bf16(uniform((uint32_t)i, seed + 1));
                }
                for (size_t i = 0; i < q.size(); i++) q[i] = round_bf16(uniform((uint32_t)i, seed + 2) * 3.0f);
                KvCache cache;
                cache.allocate(1, 1, len, width, format);
                const float ks = kv_scale_from_amax(max_abs(k.data(), (long)k.size())),
                            vs = kv_scale_from_amax(max_abs(v.data(), (long)v.size()));
                if (format == Precision::FP8) cache.set_scales({ks}, {vs});
                std::vector<int64_t> rows_at(len);
                for (int t = 0; t < len; t++) rows_at[t] = t;
                cache.store(0, len, rows_at.data(), k.data(), v.data());
                const int64_t start = 0;
                const int32_t count = len, prefix = 0;
                const long stride = cached_attention_scratch_floats({H, KV, D}, len);
                std::vector<float> out((size_t)H * D), lse(H), scratch((size_t)omp_get_max_threads() * stride);
#ifdef FP8RL_DECODE_BEFORE_I47
                attention_forward_cached(out.data(), lse.data(), q.data(), cache.keys(0), cache.values(0), &start, &count,
                                         &prefix, 1, {H, KV, D}, scratch.data(), stride, true, CachedRows::Decode);
#else
                const std::vector<float> kh = cache.head_scales(0, KV, true), vh = cache.head_scales(0, KV, false);
                attention_forward_cached(out.data(), lse.data(), q.data(), cache.keys(0), cache.values(0), kh.data(),
                                         vh.data(), &start, &count, &prefix, 1, {H, KV, D}, scratch.data(), stride, true,
                                         CachedRows::Decode);
#endif
                for (int h = 0; h < H; h++) {  // FP64 over the values the stored bytes stand for
                    const int kvh = h / group;
                    std::vector<double> s(len);
                    double m = -INFINITY;
                    for (int j = 0; j < len; j++) {
                        double dot = 0;
                        for (int d = 0; d < D; d++)
                            dot += (double)q[h * D + d] * cache.stored(k[(size_t)j * width + kvh * D + d], ks);
                        s[j] = dot / std::sqrt((double)D);
                        m = std::max(m, s[j]);
                    }
                    double sum = 0;
                    for (int j = 0; j < len; j++) sum += std::exp(s[j] - m);
                    lse_sum += std::fabs(lse[h] - (m + std::log(sum))), rows++;
                    for (int d = 0; d < D; d++) {
                        double o = 0, mag = 0;
                        for (int j = 0; j < len; j++) {
                            const double p = std::exp(s[j] - m) / sum, x = cache.stored(v[(size_t)j * width + kvh * D + d], vs);
                            o += p * x, mag += p * std::fabs(x);
                        }
                        const double err = std::fabs(out[h * D + d] - o) / (mag + std::fabs(o));
                        err_sum += err, err_max = std::max(err_max, err), outputs++;
                    }
                }
            }
        printf("%s cache: |O - O64| / (mag + |O64|) mean %.4e, max %.4e over %ld outputs; |lse - lse64| mean %.4e\n",
               precision_name(format), err_sum / outputs, err_max, outputs, lse_sum / rows);
    }
    return 0;
}
