// test_layers.cu: the GPU engine's layer kernels (cuda/kernels/embedding.cuh, rmsnorm.cuh, rope.cuh,
// swiglu.cuh, elementwise.cuh) against the CPU engine's functions (cpu/model_layers.h, cpu/linear.h)
// on the same inputs, FP32 and BF16 tensors, ragged shapes (widths that are not multiples of 16 or
// 128, one-token sequences, many packed sequences, more rows than one block or chunk handles):
//   - bit-exact where the kernel computes the CPU's operations in the CPU's order (spec-gpu.md §3.3):
//     embedding forward and backward, RoPE, SwiGLU, residual add, casts, bias add, and the column sums
//     of one chunk (RMSNorm's weight gradient, the bias gradient over <= 256 rows);
//   - within a bound derived in a comment where the summation order differs (RMSNorm's reductions);
//   - every backward kernel also against central finite differences of its own FP32 forward.
#include <cmath>
#include <cstring>
#include <functional>

#include "cpu/model.h"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/embedding.cuh"
#include "cuda/kernels/qkv_rope.cuh"
#include "cuda/kernels/rmsnorm.cuh"
#include "cuda/kernels/rope.cuh"
#include "cuda/kernels/swiglu.cuh"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

namespace {

using bf16_t = __nv_bfloat16;
// The default stream, typed: a literal 0 would also convert to the `bool` of the CPU functions of
// the same name (cpu/model_layers.h), an ambiguous call.
const cudaStream_t kStream = 0;
constexpr double kU = 1.0 / 16777216.0;  // 2^-24: FP32's unit roundoff
constexpr double kBf16Ulp = 1.0 / 128.0;  // 2^-7: a BF16 ulp relative to the value it rounds

template <class T>
const char* type_name() {
    return is_bf16<T> ? "bf16" : "fp32";
}

// Values uniform in [-amplitude, amplitude), rounded to BF16 when `bf16` (what a BF16 tensor holds).
std::vector<float> uniform(size_t n, uint32_t seed, float amplitude, bool bf16) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = amplitude * hash_uniform(i, seed);
    round_bf16_if(bf16, x.data(), (long)n);
    return x;
}

template <class T>
std::vector<T> to_type(const std::vector<float>& x) {
    std::vector<T> out(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = (T)x[i];  // BF16: round to nearest even
    return out;
}

template <class T>
std::vector<float> download_floats(const DeviceBuffer<T>& buffer) {
    std::vector<T> host = buffer.download();
    std::vector<float> out(host.size());
    for (size_t i = 0; i < host.size(); i++) out[i] = (float)host[i];
    return out;
}

// Elements whose bits differ (two NaNs count as equal); prints the first few.
int bit_mismatches(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    if (got.size() != want.size()) fail("%s: %zu values from the GPU, %zu from the CPU", what.c_str(), got.size(), want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size(); i++) {
        const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : float_bits(got[i]) == float_bits(want[i]);
        if (!same && bad++ < 3) fprintf(stderr, "    %s[%zu]: GPU %.9g, CPU %.9g\n", what.c_str(), i, got[i], want[i]);
    }
    printf("    %-58s %d of %zu differ from the CPU bit for bit\n", what.c_str(), bad, got.size());
    return bad;
}

// Elements with |got - want| > bound[i]; prints the worst ratio and how many are bit-exact.
int over_bound(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bound,
               const std::string& what) {
    int bad = 0, exact = 0;
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        const double err = std::fabs((double)got[i] - (double)want[i]);
        exact += float_bits(got[i]) == float_bits(want[i]);
        worst = std::fmax(worst, bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0.0));
        if (!(err <= bound[i]) && bad++ < 3)
            fprintf(stderr, "    %s[%zu]: GPU %.9g, CPU %.9g, bound %.3g\n", what.c_str(), i, got[i], want[i], bound[i]);
    }
    printf("    %-58s %zu values: max |GPU-CPU|/bound %.3f, %d bit-exact, %d over\n", what.c_str(), got.size(), worst,
           exact, bad);
    return bad;
}

// Packed sequences: positions restart at 0 in each (one-token sequences included).
std::vector<int32_t> packed_positions(const std::vector<int>& lengths) {
    std::vector<int32_t> pos;
    for (int len : lengths)
        for (int p = 0; p < len; p++) pos.push_back(p);
    return pos;
}

// Central difference of loss(value) around x0 with step h.
double central_difference(const std::function<double(float)>& loss_at, float x0, float h) {
    return (loss_at(x0 + h) - loss_at(x0 - h)) / (2.0 * (double)h);
}

// L = sum r . y in double: the scalar whose gradient with respect to y is r.
double weighted_sum(const std::vector<float>& y, const std::vector<float>& r) {
    double s = 0.0;
    for (size_t i = 0; i < y.size(); i++) s += (double)r[i] * y[i];
    return s;
}

double abs_weighted_sum(const std::vector<float>& y, const std::vector<float>& r) {
    double s = 0.0;
    for (size_t i = 0; i < y.size(); i++) s += std::fabs((double)r[i] * y[i]);
    return s;
}

// Checks the backward's gradient against central differences of L = sum r . forward(x) at `points`.
// The FP32 forward's rounding moves L by at most 4 u sum |r y| (a few roundings per output), which the
// difference divides by 2h; the truncation error h^2 |L'''| / 6 stays below 2e-4 + 1e-2 |g| for these
// O(1) inputs and h = 1e-2 (smooth functions; the linear ones have none).
int finite_difference_mismatches(const char* what, std::vector<float>& x, const std::vector<float>& grad,
                                 const std::vector<size_t>& points, const std::vector<float>& r,
                                 const std::function<std::vector<float>()>& forward) {
    const float h = 1e-2f;
    int bad = 0;
    double worst = 0.0;
    for (size_t j : points) {
        const float x0 = x[j];
        double noise = 0.0;
        auto loss_at = [&](float v) {
            x[j] = v;
            std::vector<float> y = forward();
            noise = std::fmax(noise, 4 * kU * abs_weighted_sum(y, r));
            return weighted_sum(y, r);
        };
        const double fd = central_difference(loss_at, x0, h);
        x[j] = x0;
        const double tol = noise / (2.0 * h) + 2e-4 + 1e-2 * std::fabs(grad[j]);
        const double err = std::fabs(fd - grad[j]);
        worst = std::fmax(worst, err / tol);
        if (!(err <= tol)) {
            bad++;
            fprintf(stderr, "    %s at %zu: backward %.7g, finite difference %.7g (tolerance %.3g)\n", what, j, grad[j], fd, tol);
        }
    }
    printf("    %-58s %zu points: max |backward-fd|/tolerance %.3f\n", what, points.size(), worst);
    return bad;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Embedding

namespace {

// Ids in [0, V): both ends, and a hot id taking a third of the tokens (many additions to one row).
std::vector<int32_t> test_ids(long T, int V, uint32_t seed) {
    std::vector<int32_t> ids(T);
    for (long t = 0; t < T; t++)
        ids[t] = t % 3 == 0 ? 7 % V : (int32_t)((hash_uniform(t, seed) + 1.0f) * 0.5f * V) % V;
    ids[0] = 0;
    ids[T - 1] = V - 1;
    return ids;
}

template <class Table, class Out>
int embedding_forward_case(long T, int V, int C) {
    const std::vector<float> table = uniform((size_t)V * C, 3, 1.0f, is_bf16<Table>);
    const std::vector<int32_t> ids = test_ids(T, V, 5);
    std::vector<float> want((size_t)T * C);
    embedding_forward(want.data(), table.data(), ids.data(), T, C);
    round_bf16_if(is_bf16<Out>, want.data(), (long)want.size());  // an FP32 table stored into BF16
    DeviceBuffer<Table> d_table(to_type<Table>(table));
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<Out> d_x((size_t)T * C);
    d_x.poison();
    embedding_forward(d_x.ptr, d_table.ptr, d_ids.ptr, T, V, C, kStream);
    return bit_mismatches(download_floats(d_x),
                          want, strfmt("embedding forward %s table -> %s, T=%ld V=%d C=%d", type_name<Table>(),
                                       type_name<Out>(), T, V, C));
}

template <class Grad>
int embedding_backward_case(long T, int V, int C) {
    const std::vector<float> dx = uniform((size_t)T * C, 11, 1.0f, is_bf16<Grad>);
    const std::vector<int32_t> ids = test_ids(T, V, 13);
    std::vector<float> dE = uniform((size_t)V * C, 17, 0.5f, false);  // accumulates into what is there
    DeviceBuffer<float> d_dE(dE);
    DeviceBuffer<Grad> d_dx(to_type<Grad>(dx));
    DeviceBuffer<int32_t> d_ids(ids);
    embedding_backward(dE.data(), dx.data(), ids.data(), T, C);
    embedding_backward(d_dE.ptr, d_dx.ptr, d_ids.ptr, T, V, C, kStream);
    return bit_mismatches(download_floats(d_dE), dE,
                          strfmt("embedding backward %s dx, T=%ld V=%d C=%d", type_name<Grad>(), T, V, C));
}

}  // namespace

TEST(gpu_layers_embedding_forward_matches_cpu_bit_for_bit) {
    REQUIRE_GPU();
    CHECK_EQ((embedding_forward_case<float, float>(36, 53, 75)), 0);
    CHECK_EQ((embedding_forward_case<bf16_t, bf16_t>(36, 53, 75)), 0);
    CHECK_EQ((embedding_forward_case<float, bf16_t>(36, 53, 75)), 0);
    CHECK_EQ((embedding_forward_case<bf16_t, float>(1, 53, 130)), 0);
}

// Bit-exact: the kernel adds each token's row in increasing token order, as embedding_backward does.
// T = 300 spans three rounds of 128 staged ids, C = 130 two column blocks, V = 200 four rows per range.
TEST(gpu_layers_embedding_backward_matches_cpu_bit_for_bit) {
    REQUIRE_GPU();
    CHECK_EQ(embedding_backward_case<float>(300, 200, 130), 0);
    CHECK_EQ(embedding_backward_case<bf16_t>(300, 200, 130), 0);
    CHECK_EQ(embedding_backward_case<float>(1, 53, 75), 0);
    CHECK_EQ(embedding_backward_case<bf16_t>(37, 30, 17), 0);
}

TEST(gpu_layers_embedding_backward_matches_finite_differences) {
    REQUIRE_GPU();
    const long T = 40;
    const int V = 20, C = 19;
    std::vector<float> table = uniform((size_t)V * C, 23, 1.0f, false);
    const std::vector<float> r = uniform((size_t)T * C, 29, 1.0f, false);
    const std::vector<int32_t> ids = test_ids(T, V, 31);
    DeviceBuffer<int32_t> d_ids(ids);
    DeviceBuffer<float> d_table(table.size()), d_x((size_t)T * C), d_r(r), d_dE(table.size());
    CUDA_CHECK(cudaMemset(d_dE.ptr, 0, table.size() * sizeof(float)));
    embedding_backward(d_dE.ptr, d_r.ptr, d_ids.ptr, T, V, C, kStream);
    const std::vector<float> dE = d_dE.download();
    auto forward = [&] {
        d_table.upload(table);
        embedding_forward(d_x.ptr, d_table.ptr, d_ids.ptr, T, V, C, kStream);
        return d_x.download();
    };
    const std::vector<size_t> points = {0, (size_t)7 * C + 3, (size_t)(V - 1) * C + C - 1, (size_t)12 * C + 5};
    CHECK_EQ(finite_difference_mismatches("embedding backward vs finite differences", table, dE, points, r, forward), 0);
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

namespace {

constexpr float kEps = 1e-6f;

// x [rows][n] with magnitudes that vary by row (so rstd varies), w around 1 as trained norms are.
std::vector<float> norm_input(long rows, int n, uint32_t seed, bool bf16) {
    std::vector<float> x = uniform((size_t)rows * n, seed, 1.0f, false);
    for (long r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) x[(size_t)r * n + i] *= std::ldexp(1.0f, (int)(r % 7) - 3);
    round_bf16_if(bf16, x.data(), (long)x.size());
    return x;
}

std::vector<float> norm_weight(int n, uint32_t seed, bool bf16) {
    std::vector<float> w = uniform(n, seed, 0.5f, false);
    for (float& v : w) v += 1.0f;
    round_bf16_if(bf16, w.data(), n);
    return w;
}

// Bounds (u = 2^-24). Any order of summing the n nonnegative squares is within (n - 1) u of the exact
// sum (first order), so the GPU's and the CPU's sums differ by at most 2 (n - 1) u relative; the square
// root halves that, and the division by n, the add of eps, the root and the reciprocal round at most 4
// times on each side: rstd within (n + 8) u. An FP32 y = w * (x * rstd) adds two roundings per side:
// (n + 12) u. A BF16 y rounds twice (HF): each rounding may land one BF16 ulp (<= 2^-7 of the value)
// apart when the FP32 values straddle a rounding boundary, so |dy| <= 2 * 2^-7 |y|.
template <class In, class W, class Out>
int rmsnorm_forward_case(long rows, int n) {
    const bool bf16 = is_bf16<Out>;
    const std::vector<float> x = norm_input(rows, n, 41 + n, is_bf16<In>), w = norm_weight(n, 43, is_bf16<W>);
    std::vector<float> y((size_t)rows * n), rstd(rows);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, n, kEps, bf16);
    DeviceBuffer<In> d_x(to_type<In>(x));
    DeviceBuffer<W> d_w(to_type<W>(w));
    DeviceBuffer<Out> d_y((size_t)rows * n);
    DeviceBuffer<float> d_rstd(rows);
    d_y.poison();
    d_rstd.poison();
    rmsnorm_forward(d_y.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, rows, n, kEps, kStream);
    std::vector<double> rstd_bound(rows), y_bound(y.size());
    for (long r = 0; r < rows; r++) rstd_bound[r] = (n + 8) * kU * rstd[r];
    for (size_t i = 0; i < y.size(); i++) y_bound[i] = (bf16 ? 2 * kBf16Ulp : (n + 12) * kU) * std::fabs(y[i]);
    const std::string shape = strfmt("%s x, %s w -> %s y, %ld rows of %d", type_name<In>(), type_name<W>(), type_name<Out>(), rows, n);
    return over_bound(download_floats(d_rstd), rstd, rstd_bound, "rmsnorm forward rstd, " + shape) +
           over_bound(download_floats(d_y), y, y_bound, "rmsnorm forward y, " + shape);
}

// Backward, from the CPU's rstd on both sides (so the comparison isolates the backward's own sums).
// dx: g = rstd w dy - x c with c = dot rstd^3 / n; the products match the CPU's bit for bit, the dot
// product's order differs: |d dot| <= 2 (n - 1) u sum|w dy x|, so |d g| <= |x| rstd^3 / n * that, plus
// one rounding of g and of the accumulation on each side (4 u |dx|), plus one BF16 ulp (2^-7 |dx|)
// when dx is stored as BF16. dw: bit-exact for rows <= 256 (one chunk, the CPU's order); otherwise any
// two orders of summing the rows' terms differ by at most 2 rows u sum|terms| (first order), plus the
// final add into dw (2 u |dw|).
template <class In, class W, class Dx>
int rmsnorm_backward_case(long rows, int n) {
    const std::vector<float> x = norm_input(rows, n, 51 + n, is_bf16<In>), w = norm_weight(n, 53, is_bf16<W>);
    const std::vector<float> dy = uniform((size_t)rows * n, 57, 1.0f, is_bf16<In>);
    std::vector<float> y((size_t)rows * n), rstd(rows);
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, n, kEps, is_bf16<In>);
    std::vector<float> dx = uniform((size_t)rows * n, 59, 1.0f, is_bf16<Dx>), dw = uniform(n, 61, 1.0f, false);
    DeviceBuffer<In> d_x(to_type<In>(x)), d_dy(to_type<In>(dy));
    DeviceBuffer<W> d_w(to_type<W>(w));
    DeviceBuffer<Dx> d_dx(to_type<Dx>(dx));
    DeviceBuffer<float> d_dw(dw), d_rstd(rstd);
    const long scratch_floats = rmsnorm_backward_scratch_floats(rows, n);
    DeviceBuffer<float> scratch(scratch_floats);
    rmsnorm_backward(d_dx.ptr, d_dw.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, d_rstd.ptr, rows, n, true, scratch.ptr,
                     scratch_floats, kStream);
    std::vector<double> dx_bound(dx.size()), dw_bound(n);
    for (long r = 0; r < rows; r++) {
        double abs_dot = 0.0;
        for (int i = 0; i < n; i++) abs_dot += std::fabs((double)w[i] * dy[r * n + i] * x[r * n + i]);
        const double s = rstd[r], dc = s * s * s / n * 2 * (n - 1) * kU * abs_dot;
        for (int i = 0; i < n; i++) dx_bound[r * n + i] = std::fabs(x[r * n + i]) * dc;
    }
    std::vector<double> abs_terms(n, 0.0);
    for (long r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) abs_terms[i] += std::fabs((double)dy[r * n + i] * x[r * n + i] * rstd[r]);
    const std::vector<float> dw_before = dw;
    rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, n, true);
    round_bf16_if(is_bf16<Dx>, dx.data(), (long)dx.size());
    for (size_t i = 0; i < dx.size(); i++)
        dx_bound[i] += (4 * kU + (is_bf16<Dx> ? kBf16Ulp : 0.0)) * std::fabs(dx[i]);
    const bool one_chunk = rows <= kColumnSumChunkRows;
    for (int i = 0; i < n; i++) dw_bound[i] = one_chunk ? 0.0 : 2 * rows * kU * abs_terms[i] + 2 * kU * std::fabs(dw[i]);
    const std::string shape = strfmt("%s x/dy, %s w -> %s dx, %ld rows of %d", type_name<In>(), type_name<W>(),
                                     type_name<Dx>(), rows, n);
    const std::vector<float> got_dw = d_dw.download();
    const int dw_bad = one_chunk ? bit_mismatches(got_dw, dw, "rmsnorm backward dw (one chunk), " + shape)
                                 : over_bound(got_dw, dw, dw_bound, "rmsnorm backward dw (chunks), " + shape);
    return over_bound(download_floats(d_dx), dx, dx_bound, "rmsnorm backward dx, " + shape) + dw_bad;
}

}  // namespace

// Layer norms (rows = tokens of C) and Qwen3's per-head q/k norms (rows = tokens x heads of D).
TEST(gpu_layers_rmsnorm_forward_matches_cpu_within_bound) {
    REQUIRE_GPU();
    CHECK_EQ((rmsnorm_forward_case<float, float, float>(36, 75)), 0);
    CHECK_EQ((rmsnorm_forward_case<bf16_t, bf16_t, bf16_t>(36, 75)), 0);
    CHECK_EQ((rmsnorm_forward_case<bf16_t, float, bf16_t>(3, 1000)), 0);
    CHECK_EQ((rmsnorm_forward_case<bf16_t, bf16_t, bf16_t>(36 * 9, 24)), 0);  // q norm: 36 tokens x 9 heads
    CHECK_EQ((rmsnorm_forward_case<float, float, float>(1, 1)), 0);
    // rows past the kernel's register cache (8 chunks of 256), whole 16-byte loads and not
    CHECK_EQ((rmsnorm_forward_case<bf16_t, bf16_t, bf16_t>(6, 2600)), 0);
    CHECK_EQ((rmsnorm_forward_case<bf16_t, bf16_t, bf16_t>(5, 2051)), 0);
}

TEST(gpu_layers_rmsnorm_backward_matches_cpu_within_bound) {
    REQUIRE_GPU();
    CHECK_EQ((rmsnorm_backward_case<float, float, float>(36, 75)), 0);
    CHECK_EQ((rmsnorm_backward_case<bf16_t, bf16_t, bf16_t>(36, 75)), 0);
    CHECK_EQ((rmsnorm_backward_case<bf16_t, float, float>(2, 1000)), 0);
    CHECK_EQ((rmsnorm_backward_case<bf16_t, bf16_t, bf16_t>(36 * 9, 24)), 0);  // q norm: two column-sum chunks
    CHECK_EQ((rmsnorm_backward_case<float, float, float>(300, 17)), 0);
}

TEST(gpu_layers_rmsnorm_backward_matches_finite_differences) {
    REQUIRE_GPU();
    const long rows = 5;
    const int n = 37;
    std::vector<float> x = norm_input(rows, n, 71, false), w = norm_weight(n, 73, false);
    const std::vector<float> r = uniform((size_t)rows * n, 79, 1.0f, false);
    DeviceBuffer<float> d_x(x), d_w(w), d_y((size_t)rows * n), d_rstd(rows), d_r(r), d_dx((size_t)rows * n), d_dw(n);
    const long scratch_floats = rmsnorm_backward_scratch_floats(rows, n);
    DeviceBuffer<float> scratch(scratch_floats);
    rmsnorm_forward(d_y.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, rows, n, kEps, kStream);
    CUDA_CHECK(cudaMemset(d_dw.ptr, 0, n * sizeof(float)));
    rmsnorm_backward(d_dx.ptr, d_dw.ptr, d_r.ptr, d_x.ptr, d_w.ptr, d_rstd.ptr, rows, n, false, scratch.ptr,
                     scratch_floats, kStream);
    const std::vector<float> dx = d_dx.download(), dw = d_dw.download();
    auto forward = [&] {
        d_x.upload(x);
        d_w.upload(w);
        rmsnorm_forward(d_y.ptr, d_rstd.ptr, d_x.ptr, d_w.ptr, rows, n, kEps, kStream);
        return d_y.download();
    };
    CHECK_EQ(finite_difference_mismatches("rmsnorm backward dx vs finite differences", x, dx, {0, 40, 111, 184}, r, forward), 0);
    CHECK_EQ(finite_difference_mismatches("rmsnorm backward dw vs finite differences", w, dw, {0, 17, 36}, r, forward), 0);
}

// ---------------------------------------------------------------------------------------------
// RoPE

namespace {

// Llama-3's frequencies (llama3 scaling: low frequencies divided by the factor, the middle band
// interpolated) for head_dim D, from the CPU model's own code, in a table up to max_position.
RopeTable llama3_table(int D, long max_position) {
    ModelConfig c;
    c.head_dim = D;
    c.rope.type = "llama3";
    c.rope.theta = 500000.0;
    c.rope.factor = 32.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position_embeddings = 8192;
    RopeTable table{D / 2, CpuModel::rope_inv_freq(c), {}, {}, 0};
    table.ensure(max_position);
    return table;
}

const std::vector<int> kSequenceLengths = {1, 5, 70, 1, 9, 3, 1};  // 90 packed tokens

// Forward (in place when `in_place`) and backward vs rope_forward / rope_backward, bit for bit.
template <class In, class Out>
int rope_case(bool inverse, bool bf16, int heads, int D, bool in_place) {
    const std::vector<int32_t> pos = packed_positions(kSequenceLengths);
    const long rows = (long)pos.size();
    const RopeTable table = llama3_table(D, 70);
    const DeviceRopeTable d_table(table);
    std::vector<float> x = uniform((size_t)rows * heads * D, 83 + D, 2.0f, is_bf16<In>);
    DeviceBuffer<In> d_x(to_type<In>(x));
    DeviceBuffer<Out> d_y_buffer(x.size());
    DeviceBuffer<int32_t> d_pos(pos);
    Out* d_y = in_place ? reinterpret_cast<Out*>(d_x.ptr) : d_y_buffer.ptr;
    if (inverse)
        rope_backward(d_y, d_x.ptr, d_pos.ptr, d_table.view(), rows, heads, bf16, kStream);
    else
        rope_forward(d_y, d_x.ptr, d_pos.ptr, d_table.view(), rows, heads, bf16, kStream);
    if (inverse)
        rope_backward(x.data(), pos.data(), table, rows, heads, bf16);
    else
        rope_forward(x.data(), pos.data(), table, rows, heads, bf16);
    round_bf16_if(is_bf16<Out>, x.data(), (long)x.size());  // where the CPU engine's caller rounds
    std::vector<float> got = in_place ? download_floats(d_x) : download_floats(d_y_buffer);
    return bit_mismatches(got, x, strfmt("rope %s %s -> %s%s, bf16 tables %d, %ld rows x %d heads x D=%d",
                                         inverse ? "backward" : "forward", type_name<In>(), type_name<Out>(),
                                         in_place ? " in place" : "", (int)bf16, rows, heads, D));
}

}  // namespace

// Seven packed sequences (one-token ones among them), 9 query heads and 1 or 3 KV heads, D = 24 and 10.
TEST(gpu_layers_rope_matches_cpu_bit_for_bit) {
    REQUIRE_GPU();
    CHECK_EQ((rope_case<float, float>(false, false, 9, 24, false)), 0);
    CHECK_EQ((rope_case<bf16_t, bf16_t>(false, true, 9, 24, true)), 0);
    CHECK_EQ((rope_case<bf16_t, bf16_t>(false, true, 1, 10, false)), 0);
    CHECK_EQ((rope_case<float, float>(true, false, 3, 24, true)), 0);
    CHECK_EQ((rope_case<float, float>(true, true, 9, 24, false)), 0);
    CHECK_EQ((rope_case<float, bf16_t>(true, true, 3, 10, false)), 0);
}

TEST(gpu_layers_rope_backward_matches_finite_differences) {
    REQUIRE_GPU();
    const std::vector<int32_t> pos = packed_positions({4, 1, 6});
    const long rows = (long)pos.size();
    const int heads = 2, D = 12;
    const RopeTable table = llama3_table(D, 6);
    const DeviceRopeTable d_table(table);
    std::vector<float> x = uniform((size_t)rows * heads * D, 89, 1.0f, false);
    const std::vector<float> r = uniform(x.size(), 97, 1.0f, false);
    DeviceBuffer<int32_t> d_pos(pos);
    DeviceBuffer<float> d_x(x.size()), d_y(x.size()), d_r(r), d_dx(x.size());
    rope_backward(d_dx.ptr, d_r.ptr, d_pos.ptr, d_table.view(), rows, heads, false, kStream);
    const std::vector<float> dx = d_dx.download();
    auto forward = [&] {
        d_x.upload(x);
        rope_forward(d_y.ptr, d_x.ptr, d_pos.ptr, d_table.view(), rows, heads, false, kStream);
        return d_y.download();
    };
    CHECK_EQ(finite_difference_mismatches("rope backward vs finite differences", x, dx, {0, 5, 6, 100, 131, 263}, r, forward), 0);
}

// ---------------------------------------------------------------------------------------------
// Producers that write the next GEMM's FP8 operand (cuda/kernels/fp8_rows.cuh)

namespace {

// The FP8 operand a producer wrote, against the CPU's quantizer of its BF16 output (real rows, then
// zero rows up to padded): codes and scales byte for byte. Rowwise [padded][cols], or transposed
// [cols][padded] (1x128 along rows: what a wgrad reads).
int fp8_operand_mismatches(const DeviceBuffer<uint8_t>& codes, const DeviceBuffer<float>& scales,
                           const std::vector<float>& y, int rows, int padded, int cols, const std::string& what,
                           bool transposed = false) {
    std::vector<float> padded_y((size_t)padded * cols, 0.0f);
    std::copy(y.begin(), y.begin() + (size_t)rows * cols, padded_y.begin());
    const Fp8Tensor want = transposed ? fp8_quantize_rowwise_transposed(padded_y.data(), padded, cols, false)
                                      : fp8_quantize_rowwise(padded_y.data(), padded, cols, false);
    const int bad = fp8_operand_differences(codes, scales, want);
    printf("    %-58s %d of %zu codes and scales differ\n", what.c_str(), bad, want.data.size() + want.scale_inv.size());
    return bad;
}

struct Fp8OperandBuffers {
    DeviceBuffer<uint8_t> codes;
    DeviceBuffer<float> scales;
    Fp8RowsOut out;
    Fp8OperandBuffers(int padded, int cols)
        : codes(std::vector<uint8_t>((size_t)padded * cols, 0xAB)),  // garbage the producer must overwrite
          scales(std::vector<float>(vec128_scale_count(padded, cols), NAN)) {
        out.codes = codes.ptr, out.scale_inv = scales.ptr, out.rows = padded;
    }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The q/k-norm + RoPE backward (cuda/kernels/qkv_rope.cuh) against the CPU engine's steps
// (cpu/model.h's layer_backward): RoPE's backward of dq, dk rounded to BF16, the q/k norms' input
// gradient rounded to BF16, joined with dv; bit for bit, and dq, dk left holding RoPE's backward.

namespace {

// fp8: qkv_rope_backward_fp8 instead, over sequences of 100, 1 and 40 tokens (141 rows: a whole
// 128-row tile and a partial one), its FP8 operands against the CPU's quantizer of dqkv.
int qkv_rope_backward_case(int H, int KV, int D, bool qk_norm, bool fp8 = false) {
    const std::vector<int32_t> pos = packed_positions(fp8 ? std::vector<int>{100, 1, 40} : std::vector<int>{3, 1, 9});
    const long T = (long)pos.size(), Q = (long)H * D, K = (long)KV * D;
    const RopeTable table = llama3_table(D, fp8 ? 100 : 9);
    std::vector<float> dq = uniform((size_t)(T * Q), 131 + D, 1.0f, true), dk = uniform((size_t)(T * K), 137, 1.0f, true);
    const std::vector<float> dv = uniform((size_t)(T * K), 139, 1.0f, true);
    const std::vector<float> qp = norm_input(T * H, D, 149, true), kp = norm_input(T * KV, D, 151, true);
    const std::vector<float> q_norm = norm_weight(D, 157, true), k_norm = norm_weight(D, 163, true);
    std::vector<float> scratch((size_t)(T * Q)), rstd_q((size_t)(T * H)), rstd_k((size_t)(T * KV));
    rmsnorm_forward(scratch.data(), rstd_q.data(), qp.data(), q_norm.data(), T * H, D, kEps, true);
    rmsnorm_forward(scratch.data(), rstd_k.data(), kp.data(), k_norm.data(), T * KV, D, kEps, true);
    DeviceBuffer<bf16_t> d_dq(to_type<bf16_t>(dq)), d_dk(to_type<bf16_t>(dk)), d_dv(to_type<bf16_t>(dv));
    DeviceBuffer<bf16_t> d_qp(to_type<bf16_t>(qp)), d_kp(to_type<bf16_t>(kp));
    DeviceBuffer<bf16_t> d_q_norm(to_type<bf16_t>(q_norm)), d_k_norm(to_type<bf16_t>(k_norm));
    DeviceBuffer<float> d_rstd_q(rstd_q), d_rstd_k(rstd_k);
    DeviceBuffer<bf16_t> d_dqkv((size_t)(T * (Q + 2 * K)));
    DeviceBuffer<int32_t> d_pos(pos);
    const DeviceRopeTable d_table(table);
    d_dqkv.poison();
    const QkvShape shape{H, KV, D, kEps, nullptr, qk_norm ? d_q_norm.ptr : nullptr, qk_norm ? d_k_norm.ptr : nullptr};
    const QkvGrad grad{d_dq.ptr, d_dk.ptr, d_dv.ptr, d_qp.ptr, d_kp.ptr, d_rstd_q.ptr, d_rstd_k.ptr};
    const int N = (int)(Q + 2 * K), Tp = (int)(T + 127) / 128 * 128;
    Fp8OperandBuffers rows_q(Tp, N), cols_q(N, Tp);
    if (fp8)
        qkv_rope_backward_fp8(grad, T, Tp, d_pos.ptr, d_table.view(), shape, false, rows_q.codes.ptr, rows_q.scales.ptr,
                              cols_q.codes.ptr, cols_q.scales.ptr, kStream);
    else
        qkv_rope_backward(d_dqkv.ptr, grad, T, d_pos.ptr, d_table.view(), shape, kStream);
    rope_backward(dq.data(), pos.data(), table, T, H, true);
    rope_backward(dk.data(), pos.data(), table, T, KV, true);
    round_bf16_if(true, dq.data(), T * Q);
    round_bf16_if(true, dk.data(), T * K);
    std::vector<float> dqp = dq, dkp = dk, dw((size_t)D);
    if (qk_norm) {
        rmsnorm_backward(dqp.data(), dw.data(), dq.data(), qp.data(), q_norm.data(), rstd_q.data(), T * H, D, false);
        rmsnorm_backward(dkp.data(), dw.data(), dk.data(), kp.data(), k_norm.data(), rstd_k.data(), T * KV, D, false);
        round_bf16_if(true, dqp.data(), T * Q);
        round_bf16_if(true, dkp.data(), T * K);
    }
    std::vector<float> dqkv((size_t)(T * (Q + 2 * K)));
    join_qkv(dqkv.data(), dqp.data(), dkp.data(), dv.data(), T, (int)Q, (int)K);
    const std::string name = strfmt("qkv_rope backward%s, %d + 2 x %d heads of D=%d, q/k norm %d", fp8 ? " -> FP8" : "",
                                    H, KV, D, (int)qk_norm);
    int bad = fp8 ? fp8_operand_mismatches(rows_q.codes, rows_q.scales, dqkv, (int)T, Tp, N, name + ": dqkv's FP8 operand") +
                        fp8_operand_mismatches(cols_q.codes, cols_q.scales, dqkv, (int)T, Tp, N, name + ": transposed", true)
                  : bit_mismatches(download_floats(d_dqkv), dqkv, name + ": dqkv");
    if (qk_norm)  // the norms' output gradients, for their weight gradients
        bad += bit_mismatches(download_floats(d_dq), dq, name + ": dq") + bit_mismatches(download_floats(d_dk), dk, name + ": dk");
    return bad;
}

}  // namespace

// Half the head dim a multiple of 8 (16-byte table loads) and not (D = 10, 24: the per-value path);
// D past one warp's 256 values (two chunks); 9 query heads over one block's 8 warps.
TEST(gpu_layers_qkv_rope_backward_matches_cpu_bit_for_bit) {
    REQUIRE_GPU();
    CHECK_EQ(qkv_rope_backward_case(9, 3, 16, true), 0);
    CHECK_EQ(qkv_rope_backward_case(4, 2, 10, true), 0);
    CHECK_EQ(qkv_rope_backward_case(3, 1, 24, false), 0);
    CHECK_EQ(qkv_rope_backward_case(2, 1, 272, true), 0);
    CHECK_EQ(qkv_rope_backward_case(2, 2, 300, true), 0);
}

// In fp8 (issue 59) straight into dqkv's FP8 operands, rowwise and transposed, no BF16 dqkv: heads of
// 16 (8 a tile; 240 columns, a partial column tile) and of 128 (one a tile), with and without the norm.
TEST(gpu_layers_qkv_rope_backward_fp8_matches_cpu_bit_for_bit) {
    REQUIRE_GPU();
    CHECK_EQ(qkv_rope_backward_case(9, 3, 16, true, true), 0);
    CHECK_EQ(qkv_rope_backward_case(1, 1, 128, true, true), 0);
    CHECK_EQ(qkv_rope_backward_case(2, 1, 32, false, true), 0);
    QkvShape bad{4, 2, 24, kEps, nullptr, nullptr, nullptr};
    const DeviceRopeTable table(llama3_table(24, 4));
    CHECK_THROWS(qkv_rope_backward_fp8({}, 4, 128, nullptr, table.view(), bad, false, nullptr, nullptr, nullptr, nullptr, kStream),
                 "D divides 128");
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

namespace {

// Gate values over SiLU's range, with fast_exp's cut-offs (-g < -87 gives exp 0, -g > 88 gives inf)
// and zeros; n = 1037 is no multiple of the CPU's 8-lane vectors, so both its paths are compared.
std::vector<float> gate_values(size_t n, bool bf16) {
    std::vector<float> g = uniform(n, 101, 12.0f, false);
    const float special[] = {0.0f, -0.0f, 87.5f, -87.5f, 88.5f, -88.5f, 100.0f, -100.0f, 1e-30f, -3.0e-39f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) g[i * 97 % n] = special[i];
    round_bf16_if(bf16, g.data(), (long)n);
    return g;
}

// Rows of the fused [gate|up] output gu [T][2I]: g = gu[t][0, I), u = gu[t][I, 2I).
std::vector<float> fused_gate_up(const std::vector<float>& g, const std::vector<float>& u, long T, int I) {
    std::vector<float> gu((size_t)T * 2 * I);
    for (long t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            gu[(size_t)t * 2 * I + i] = g[(size_t)t * I + i];
            gu[(size_t)t * 2 * I + I + i] = u[(size_t)t * I + i];
        }
    return gu;
}

template <class In, class Out>
int swiglu_case(long T, int I) {
    const long n = T * I;
    const std::vector<float> gu = fused_gate_up(gate_values(n, is_bf16<In>), uniform(n, 103, 2.0f, is_bf16<In>), T, I);
    const std::vector<float> da = uniform(n, 107, 1.0f, is_bf16<In>);
    DeviceBuffer<In> d_gu(to_type<In>(gu)), d_da(to_type<In>(da));
    DeviceBuffer<Out> d_a(n), d_dgu(2 * n);
    swiglu_forward(d_a.ptr, d_gu.ptr, T, I, kStream);
    swiglu_backward(d_dgu.ptr, d_da.ptr, d_gu.ptr, T, I, kStream);
    std::vector<float> a(n), dgu(2 * n);
    swiglu_forward(a.data(), gu.data(), T, I, is_bf16<Out>);
    swiglu_backward(dgu.data(), da.data(), gu.data(), T, I);
    round_bf16_if(is_bf16<Out>, dgu.data(), 2 * n);
    const std::string shape = strfmt("%s -> %s, %ld x %d", type_name<In>(), type_name<Out>(), T, I);
    return bit_mismatches(download_floats(d_a), a, "swiglu forward " + shape) +
           bit_mismatches(download_floats(d_dgu), dgu, "swiglu backward " + shape);
}

}  // namespace

TEST(gpu_layers_swiglu_matches_cpu_bit_for_bit) {
    REQUIRE_GPU();
    CHECK_EQ((swiglu_case<float, float>(3, 1037)), 0);
    CHECK_EQ((swiglu_case<bf16_t, bf16_t>(3, 1037)), 0);
    CHECK_EQ((swiglu_case<bf16_t, bf16_t>(2, 256)), 0);
    CHECK_EQ((swiglu_case<bf16_t, float>(1, 13)), 0);
}

TEST(gpu_layers_swiglu_backward_matches_finite_differences) {
    REQUIRE_GPU();
    const long T = 2;
    const int I = 25;
    std::vector<float> gu = fused_gate_up(uniform(T * I, 109, 4.0f, false), uniform(T * I, 113, 2.0f, false), T, I);
    const std::vector<float> r = uniform(T * I, 127, 1.0f, false);
    DeviceBuffer<float> d_gu(gu), d_r(r), d_a(T * I), d_dgu(2 * T * I);
    swiglu_backward(d_dgu.ptr, d_r.ptr, d_gu.ptr, T, I, kStream);
    const std::vector<float> dgu = d_dgu.download();
    auto forward = [&] {
        d_gu.upload(gu);
        swiglu_forward(d_a.ptr, d_gu.ptr, T, I, kStream);
        return d_a.download();
    };
    // g of rows 0 and 1, then u of both rows
    CHECK_EQ(finite_difference_mismatches("swiglu backward vs finite differences", gu, dgu, {0, 9, 23, 50, 74, 26, 40, 99}, r,
                                          forward), 0);
}

// ---------------------------------------------------------------------------------------------
// Producers that write the next GEMM's FP8 operand (cuda/kernels/fp8_rows.cuh): helpers above


// The residual add + RMSNorm, SwiGLU and the attention output's pass write the FP8 1x128 operand of
// what they produce as the CPU quantizes it, the padding rows as zeros (in the BF16 outputs too):
// widths with an odd number of groups (the half-warp pairs) and a partial last group. In a training
// forward the norms and SwiGLU also write the transposed operand (1x128 along tokens: 130 rows, a
// whole tile and a partial one) as the CPU quantizes the transpose.
TEST(gpu_layers_producers_write_fp8_operands_bit_for_bit) {
    REQUIRE_GPU();
    const int T = 130, Tp = 256, C = 384, I = 400;
    const float eps = 1e-6f;
    // residual add + RMSNorm
    const std::vector<float> x = uniform((size_t)Tp * C, 131, 3.0f, true), branch = uniform((size_t)Tp * C, 137, 1.0f, true);
    const std::vector<float> w = uniform(C, 139, 1.5f, true);
    std::vector<float> sum((size_t)T * C), y((size_t)T * C), rstd(T);
    residual_add(sum.data(), x.data(), branch.data(), (long)T * C, true);
    rmsnorm_forward(y.data(), rstd.data(), sum.data(), w.data(), T, C, eps, true);
    DeviceBuffer<bf16_t> d_x(to_type<bf16_t>(x)), d_branch(to_type<bf16_t>(branch)), d_w(to_type<bf16_t>(w));
    DeviceBuffer<bf16_t> d_sum((size_t)Tp * C), d_y(std::vector<bf16_t>((size_t)Tp * C, (bf16_t)7.0f));
    DeviceBuffer<float> d_rstd(T);
    Fp8OperandBuffers norm_q(Tp, C);
    residual_rmsnorm_forward(d_y.ptr, d_rstd.ptr, d_sum.ptr, d_x.ptr, d_branch.ptr, d_w.ptr, T, C, eps, kStream, norm_q.out, Tp);
    std::vector<float> want_y((size_t)Tp * C, 0.0f);
    std::copy(y.begin(), y.end(), want_y.begin());
    std::vector<float> got_sum = download_floats(d_sum);
    got_sum.resize(sum.size());
    CHECK_EQ(bit_mismatches(got_sum, sum, "residual add into the norm"), 0);
    CHECK_EQ(bit_mismatches(download_floats(d_y), want_y, "norm output, padding rows zero"), 0);
    CHECK_EQ(bit_mismatches(d_rstd.download(), rstd, "norm rstd"), 0);
    CHECK_EQ(fp8_operand_mismatches(norm_q.codes, norm_q.scales, y, T, Tp, C, "norm's FP8 operand"), 0);
    // a training forward's norms: the statistics pass, then tiles writing y's rowwise operand and its
    // transpose (the wgrad's), no BF16 y; with the residual add, and without (x = the sum above)
    for (bool add : {true, false}) {
        Fp8OperandBuffers y_q(Tp, C), y_t(C, Tp);
        DeviceBuffer<bf16_t> d_sum_t((size_t)Tp * C);
        DeviceBuffer<float> d_rstd_t(T);
        const Fp8Transposed target{y_t.codes.ptr, y_t.scales.ptr};
        if (add)
            residual_rmsnorm_forward((bf16_t*)nullptr, d_rstd_t.ptr, d_sum_t.ptr, d_x.ptr, d_branch.ptr, d_w.ptr, T, C, eps,
                                     kStream, y_q.out, Tp, target);
        else
            rmsnorm_forward((bf16_t*)nullptr, d_rstd_t.ptr, (const bf16_t*)d_sum.ptr, d_w.ptr, T, C, eps, kStream, y_q.out, Tp,
                            target);
        const std::string what = add ? "training add + norm's" : "training norm's";
        if (add) {
            std::vector<float> got = download_floats(d_sum_t);
            got.resize(sum.size());
            CHECK_EQ(bit_mismatches(got, sum, what + " residual add"), 0);
        }
        CHECK_EQ(bit_mismatches(d_rstd_t.download(), rstd, what + " rstd"), 0);
        CHECK_EQ(fp8_operand_mismatches(y_q.codes, y_q.scales, y, T, Tp, C, what + " FP8 operand"), 0);
        CHECK_EQ(fp8_operand_mismatches(y_t.codes, y_t.scales, y, T, Tp, C, what + " transposed FP8 operand", true), 0);
    }
    CHECK_THROWS(rmsnorm_forward(d_y.ptr, d_rstd.ptr, (const bf16_t*)d_sum.ptr, d_w.ptr, T, C, eps, kStream, norm_q.out, Tp,
                                 Fp8Transposed{norm_q.codes.ptr, norm_q.scales.ptr}),
                 "without a BF16 y");
    // SwiGLU
    std::vector<float> gu = fused_gate_up(gate_values((size_t)Tp * I, true), uniform((size_t)Tp * I, 149, 2.0f, true), Tp, I);
    std::vector<float> a((size_t)T * I);
    swiglu_forward(a.data(), gu.data(), T, I, true);
    DeviceBuffer<bf16_t> d_gu(to_type<bf16_t>(gu)), d_a(std::vector<bf16_t>((size_t)Tp * I, (bf16_t)7.0f));
    Fp8OperandBuffers swiglu_q(Tp, I);
    swiglu_forward(d_a.ptr, d_gu.ptr, T, I, kStream, swiglu_q.out, Tp);
    std::vector<float> want_a((size_t)Tp * I, 0.0f);
    std::copy(a.begin(), a.end(), want_a.begin());
    CHECK_EQ(bit_mismatches(download_floats(d_a), want_a, "SwiGLU output, padding rows zero"), 0);
    CHECK_EQ(fp8_operand_mismatches(swiglu_q.codes, swiglu_q.scales, a, T, Tp, I, "SwiGLU's FP8 operand"), 0);
    Fp8OperandBuffers fp8_only(Tp, I);  // without the BF16 output (forward-only fp8)
    swiglu_forward((bf16_t*)nullptr, d_gu.ptr, T, I, kStream, fp8_only.out, Tp);
    CHECK_EQ(fp8_operand_mismatches(fp8_only.codes, fp8_only.scales, a, T, Tp, I, "SwiGLU's FP8 operand alone"), 0);
    // the SwiGLU backward's d[gate|up] straight into its FP8 operands, rowwise and transposed
    const std::vector<float> da = uniform((size_t)Tp * I, 151, 1.0f, true);
    std::vector<float> dgu((size_t)Tp * 2 * I, 0.0f);
    swiglu_backward(dgu.data(), da.data(), gu.data(), T, I);
    round_bf16_if(true, dgu.data(), (long)dgu.size());
    DeviceBuffer<bf16_t> d_da(to_type<bf16_t>(da));
    Fp8OperandBuffers dgu_q(Tp, 2 * I), dgu_t(2 * I, Tp);
    swiglu_backward_fp8(d_da.ptr, d_gu.ptr, T, Tp, I, false, dgu_q.codes.ptr, dgu_q.scales.ptr, dgu_t.codes.ptr,
                        dgu_t.scales.ptr, kStream);
    CHECK_EQ(fp8_operand_mismatches(dgu_q.codes, dgu_q.scales, dgu, Tp, Tp, 2 * I, "SwiGLU backward's FP8 operand"), 0);
    CHECK_EQ(fp8_operand_mismatches(dgu_t.codes, dgu_t.scales, dgu, Tp, Tp, 2 * I, "SwiGLU backward's transposed FP8 operand", true), 0);
    // a training forward's SwiGLU: a's rowwise operand and its transpose (the down wgrad's), no BF16 a
    Fp8OperandBuffers a_q(Tp, I), a_t(I, Tp);
    swiglu_forward_fp8(d_gu.ptr, T, Tp, I, a_q.out, Fp8Transposed{a_t.codes.ptr, a_t.scales.ptr}, kStream);
    CHECK_EQ(fp8_operand_mismatches(a_q.codes, a_q.scales, a, T, Tp, I, "training SwiGLU's FP8 operand"), 0);
    CHECK_EQ(fp8_operand_mismatches(a_t.codes, a_t.scales, a, T, Tp, I, "training SwiGLU's transposed FP8 operand", true), 0);
    // one pass over a BF16 tensor (the attention output), its padding rows not read
    Fp8OperandBuffers rows_q(Tp, C);
    quantize_rows_gpu(d_x.ptr, T, C, rows_q.out, kStream);
    CHECK_EQ(fp8_operand_mismatches(rows_q.codes, rows_q.scales, x, T, Tp, C, "quantize_rows_gpu"), 0);
    // what they refuse
    CHECK_THROWS(quantize_rows_gpu(d_x.ptr, T, 100, rows_q.out, kStream), "multiple of 16 columns");
    CHECK_THROWS(swiglu_forward(d_a.ptr, d_gu.ptr, T, I, kStream, swiglu_q.out, 384), "an FP8 operand of 256 rows for 384");
    CHECK_THROWS(swiglu_forward_fp8(d_gu.ptr, T, Tp, I, a_q.out, Fp8Transposed{}, kStream), "needs both FP8 targets");
}

// The decode step's norm (issue 47: a warp per row, several rows a block) as the CPU engine computes
// it, on a row longer than the kernel's register cache (2,320 values: 10 chunks of 256, the last
// partial), with the residual add and the FP8 operand, the padding rows zero; and every row count
// around a block's 4 rows.
TEST(gpu_layers_decode_norm_rows_match_cpu_bit_for_bit) {
    REQUIRE_GPU();
    const int C = 2320;
    const float eps = 1e-6f;
    for (int T : {1, 5, 9}) {
        const int Tp = T + 3;
        const std::vector<float> x = uniform((size_t)Tp * C, 171 + T, 3.0f, true), branch = uniform((size_t)Tp * C, 173, 1.0f, true);
        const std::vector<float> w = uniform(C, 179, 1.5f, true);
        std::vector<float> sum((size_t)T * C), y((size_t)T * C), rstd(T);
        residual_add(sum.data(), x.data(), branch.data(), (long)T * C, true);
        rmsnorm_forward(y.data(), rstd.data(), sum.data(), w.data(), T, C, eps, true);
        DeviceBuffer<bf16_t> d_x(to_type<bf16_t>(x)), d_branch(to_type<bf16_t>(branch)), d_w(to_type<bf16_t>(w));
        DeviceBuffer<bf16_t> d_sum((size_t)Tp * C), d_y(std::vector<bf16_t>((size_t)Tp * C, (bf16_t)7.0f));
        DeviceBuffer<float> d_rstd(T);
        Fp8OperandBuffers q(Tp, C);
        residual_rmsnorm_forward(d_y.ptr, d_rstd.ptr, d_sum.ptr, d_x.ptr, d_branch.ptr, d_w.ptr, T, C, eps, kStream, q.out, Tp);
        std::vector<float> want_y((size_t)Tp * C, 0.0f);
        std::copy(y.begin(), y.end(), want_y.begin());
        std::vector<float> got_sum = download_floats(d_sum);
        got_sum.resize(sum.size());
        CHECK_EQ(bit_mismatches(got_sum, sum, strfmt("decode norm's residual add, %d rows", T)), 0);
        CHECK_EQ(bit_mismatches(download_floats(d_y), want_y, strfmt("decode norm's output, %d rows + 3 padding", T)), 0);
        CHECK_EQ(bit_mismatches(d_rstd.download(), rstd, strfmt("decode norm's rstd, %d rows", T)), 0);
        CHECK_EQ(fp8_operand_mismatches(q.codes, q.scales, y, T, Tp, C, strfmt("decode norm's FP8 operand, %d rows", T)), 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Residual add, casts, bias

TEST(gpu_layers_residual_add_and_casts_match_cpu_bit_for_bit) {
    REQUIRE_GPU();
    const long n = 1000 + 37;
    const std::vector<float> a = uniform(n, 131, 3.0f, true), b = uniform(n, 137, 3.0f, true);
    DeviceBuffer<bf16_t> d_a(to_type<bf16_t>(a)), d_b(to_type<bf16_t>(b)), d_y(n);
    residual_add(d_y.ptr, d_a.ptr, d_b.ptr, n, kStream);
    residual_add(d_a.ptr, d_a.ptr, d_b.ptr, n, kStream);  // in place, as the engine updates the stream
    std::vector<float> y(n);
    residual_add(y.data(), a.data(), b.data(), n, true);
    CHECK_EQ(bit_mismatches(download_floats(d_y), y, "residual add bf16 + bf16 -> bf16"), 0);
    CHECK_EQ(bit_mismatches(download_floats(d_a), y, "residual add bf16, in place"), 0);
    const std::vector<float> a32 = uniform(n, 139, 3.0f, false);
    DeviceBuffer<float> d_a32(a32), d_y32(n);
    residual_add(d_y32.ptr, d_a32.ptr, d_a32.ptr, n, kStream);
    residual_add(y.data(), a32.data(), a32.data(), n, false);
    CHECK_EQ(bit_mismatches(d_y32.download(), y, "residual add fp32"), 0);

    // FP32 -> BF16 with ties (to even), the largest finite values, infinities, subnormals, NaN.
    std::vector<float> x = uniform(n, 149, 100.0f, false);
    const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x7F7FFFFFu, 0x7F7F7FFFu, 0x7F800000u,
                                0xFF800000u, 0x00000001u, 0x00008000u, 0x80018000u, 0x7FC00000u, 0x00000000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[i * 31] = bits_float(special[i]);
    DeviceBuffer<float> d_x(x), d_back(n);
    DeviceBuffer<bf16_t> d_x16(n);
    cast(d_x16.ptr, d_x.ptr, n, kStream);
    cast(d_back.ptr, d_x16.ptr, n, kStream);
    std::vector<float> rounded = x;
    round_bf16_if(true, rounded.data(), n);
    CHECK_EQ(bit_mismatches(download_floats(d_x16), rounded, "cast fp32 -> bf16"), 0);
    CHECK_EQ(bit_mismatches(d_back.download(), rounded, "cast bf16 -> fp32"), 0);
}

namespace {

// The CPU's bias add is inside linear_forward: an identity weight makes its GEMM return x exactly
// (every product is x * 1 or x * 0, every sum adds zeros), so y = x + b, rounded in bf16 precision.
std::vector<float> cpu_bias_add(const std::vector<float>& x, const std::vector<float>& bias, long T, int N, bool bf16) {
    std::vector<float> identity((size_t)N * N, 0.0f), y((size_t)T * N);
    for (int i = 0; i < N; i++) identity[(size_t)i * N + i] = 1.0f;
    linear_forward(y.data(), x.data(), T, LinearWeight{identity.data(), bias.data(), N, N}, bf16 ? Precision::BF16 : Precision::FP32);
    return y;
}

template <class Bias, class Out>
int bias_add_case(long T, int N) {
    const std::vector<float> x = uniform((size_t)T * N, 151, 4.0f, false);  // the GEMM's FP32 output
    const std::vector<float> bias = uniform(N, 157, 1.0f, is_bf16<Bias>);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<Bias> d_bias(to_type<Bias>(bias));
    DeviceBuffer<Out> d_y(x.size());
    bias_add(d_y.ptr, d_x.ptr, d_bias.ptr, T, N, kStream);
    return bit_mismatches(download_floats(d_y), cpu_bias_add(x, bias, T, N, is_bf16<Out>),
                          strfmt("bias add fp32 x + %s b -> %s, T=%ld N=%d", type_name<Bias>(), type_name<Out>(), T, N));
}

// The bias gradient vs linear_backward's column sums; bit-exact for T <= 256 (one chunk), else two
// orders of summing T values, within 2 T u sum|dy| (first order) plus the add into db (2 u |db|).
template <class Grad>
int bias_backward_case(long T, int N) {
    const std::vector<float> dy = uniform((size_t)T * N, 163, 1.0f, is_bf16<Grad>), x((size_t)T * N, 0.0f);
    std::vector<float> db = uniform(N, 167, 1.0f, false), w((size_t)N * N, 0.0f), dx((size_t)T * N), dW((size_t)N * N, 0.0f);
    DeviceBuffer<Grad> d_dy(to_type<Grad>(dy));
    DeviceBuffer<float> d_db(db);
    const long scratch_floats = bias_backward_scratch_floats(T, N);
    DeviceBuffer<float> scratch(scratch_floats);
    bias_backward(d_db.ptr, d_dy.ptr, T, N, scratch.ptr, scratch_floats, kStream);
    linear_backward(dx.data(), false, dW.data(), db.data(), dy.data(), x.data(), T, LinearWeight{w.data(), nullptr, N, N},
                    Precision::FP32);
    const std::string what = strfmt("bias backward %s dy, T=%ld N=%d", type_name<Grad>(), T, N);
    if (T <= kColumnSumChunkRows) return bit_mismatches(d_db.download(), db, what + " (one chunk)");
    std::vector<double> bound(N, 0.0);
    for (int n = 0; n < N; n++) {
        for (long t = 0; t < T; t++) bound[n] += 2 * T * kU * std::fabs(dy[t * N + n]);
        bound[n] += 2 * kU * std::fabs(db[n]);
    }
    return over_bound(d_db.download(), db, bound, what + " (chunks)");
}

}  // namespace

TEST(gpu_layers_bias_add_and_gradient_match_cpu) {
    REQUIRE_GPU();
    CHECK_EQ((bias_add_case<float, float>(36, 75)), 0);
    CHECK_EQ((bias_add_case<bf16_t, bf16_t>(36, 75)), 0);
    CHECK_EQ((bias_add_case<float, bf16_t>(1, 130)), 0);
    CHECK_EQ(bias_backward_case<float>(36, 75), 0);
    CHECK_EQ(bias_backward_case<bf16_t>(1, 130), 0);
    CHECK_EQ(bias_backward_case<float>(600, 19), 0);
    CHECK_EQ(bias_backward_case<bf16_t>(300, 24), 0);
}

TEST(gpu_layers_bias_backward_matches_finite_differences) {
    REQUIRE_GPU();
    const long T = 7;
    const int N = 11;
    const std::vector<float> x = uniform((size_t)T * N, 173, 1.0f, false), r = uniform((size_t)T * N, 179, 1.0f, false);
    std::vector<float> bias = uniform(N, 181, 1.0f, false);
    DeviceBuffer<float> d_x(x), d_bias(N), d_y(x.size()), d_r(r), d_db(N);
    const long scratch_floats = bias_backward_scratch_floats(T, N);
    DeviceBuffer<float> scratch(scratch_floats);
    CUDA_CHECK(cudaMemset(d_db.ptr, 0, N * sizeof(float)));
    bias_backward(d_db.ptr, d_r.ptr, T, N, scratch.ptr, scratch_floats, kStream);
    const std::vector<float> db = d_db.download();
    auto forward = [&] {
        d_bias.upload(bias);
        bias_add(d_y.ptr, d_x.ptr, d_bias.ptr, T, N, kStream);
        return d_y.download();
    };
    CHECK_EQ(finite_difference_mismatches("bias backward vs finite differences", bias, db, {0, 5, 10}, r, forward), 0);
}

// Shapes a launcher refuses, named in the error.
TEST(gpu_layers_launchers_name_a_wrong_shape) {
    REQUIRE_GPU();
    DeviceBuffer<float> buffer(64);
    DeviceBuffer<int32_t> ids(4);
    CHECK_THROWS(embedding_forward(buffer.ptr, buffer.ptr, ids.ptr, 4, 0, 8, kStream), "embedding_forward: vocabulary size V = 0");
    CHECK_THROWS(embedding_backward(buffer.ptr, buffer.ptr, ids.ptr, 4, 8, -1, kStream), "embedding_backward: embedding width C = -1");
    CHECK_THROWS(rmsnorm_forward(buffer.ptr, buffer.ptr, buffer.ptr, buffer.ptr, 2, 0, kEps, kStream), "rmsnorm_forward: row length n = 0");
    CHECK_THROWS(rmsnorm_forward(buffer.ptr, buffer.ptr, buffer.ptr, buffer.ptr, 2, 8, 0.0f, kStream), "eps = 0 must be positive");
    CHECK_THROWS(rmsnorm_backward(buffer.ptr, buffer.ptr, buffer.ptr, buffer.ptr, buffer.ptr, buffer.ptr, 300, 8, false,
                                  buffer.ptr, 8, kStream),
                 "scratch of 8 floats, the column sum of 300 x 8 needs 16");
    CHECK_THROWS(rope_forward(buffer.ptr, buffer.ptr, ids.ptr, RopeTableView{buffer.ptr, buffer.ptr, 0, 4}, 4, 2, false, kStream),
                 "rope_forward: rows = 4, heads = 2, half the head dim = 0");
    CHECK_THROWS(swiglu_forward(buffer.ptr, buffer.ptr, -1, 4, kStream), "swiglu_forward: -1 rows");
    CHECK_THROWS(bias_add(buffer.ptr, buffer.ptr, buffer.ptr, 3, 0, kStream), "bias_add: 3 rows of 0 features");
    CHECK_THROWS(bias_backward(buffer.ptr, buffer.ptr, 3, 8, buffer.ptr, 0, kStream), "bias_backward: scratch of 0 floats");
}

// An id past the vocabulary and a position past the RoPE table trap instead of reading (or, for the
// embedding's backward, writing) outside the tables. Emulation only: a trap on a device leaves its
// context unusable for the tests that follow, and only the emulation names the faulting kernel.
#ifdef FP8RL_EMU
namespace {

// Runs `launch`, which must trap in `kernel` (reported at the launch or the synchronization); then
// resets the device (a trap leaves it faulted).
int trap_mismatches(const char* kernel, const std::function<void()>& launch) {
    bool threw = false;
    try {
        launch();
        CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const Error&) {
        threw = true;
    }
    const std::string fault = emu::last_fault();
    const bool named = fault.find(std::string("kernel ") + kernel) != std::string::npos &&
                       fault.find("__trap() called") != std::string::npos;
    printf("    %-58s %s\n", kernel, fault.c_str());
    CUDA_CHECK(cudaDeviceReset());
    return !(threw && named);
}

}  // namespace

TEST(gpu_layers_out_of_range_ids_and_positions_trap) {
    const int V = 10, C = 8;
    const RopeTable table = llama3_table(C, 4);
    DeviceBuffer<float> d_table((size_t)V * C), d_x(3 * C);
    DeviceBuffer<int32_t> d_bad_ids(std::vector<int32_t>{1, V, 2}), d_bad_pos(std::vector<int32_t>{0, 1, 4});
    CHECK_EQ(trap_mismatches("(embedding_forward_kernel<Table, Out>)",
                             [&] { embedding_forward(d_x.ptr, d_table.ptr, d_bad_ids.ptr, 3, V, C, kStream); }),
             0);
    CHECK_EQ(trap_mismatches("embedding_backward_kernel<Grad>",
                             [&] { embedding_backward(d_table.ptr, d_x.ptr, d_bad_ids.ptr, 3, V, C, kStream); }),
             0);
    const DeviceRopeTable d_rope(table);
    CHECK_EQ(trap_mismatches("(rope_rotate_kernel<In, Out>)",
                             [&] { rope_forward(d_x.ptr, d_x.ptr, d_bad_pos.ptr, d_rope.view(), 3, 1, false, kStream); }),
             0);
}
#else
TEST(gpu_layers_out_of_range_ids_and_positions_trap) {
    SKIP("emulation only: a trap on a real device poisons the context for the tests that follow");
}
#endif
