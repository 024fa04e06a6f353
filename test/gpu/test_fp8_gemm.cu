// test_fp8_gemm.cu: the GPU side of the FP8 recipe (fp8_gemm.cuh) against the CPU side:
//   - the device encoder (rl/numerics/fp8.h compiled for sm_90) equals CUDA's device conversion (the PTX
//     cvt.rn.satfinite instruction for satfinite) over all 2^32 inputs, both formats and modes;
//   - the quantize kernels equal the CPU quantizers (rl/numerics/fp8_block.h) bit for bit;
//   - cuBLASLt's block-scaled fprop / dgrad / wgrad equal the CPU emulation (cpu/fp8_gemm_ref.h)
//     within a stated tolerance, and a deliberately wrong scale layout FAILS that same check;
//   - the BF16 GEMM equals an FP32 CPU GEMM of the same BF16 values within tolerance.
// Tests skip, visibly, where there is no GPU (or no Hopper for the block-scaled GEMMs).
#include <cuda_fp8.h>

#include <cmath>
#include <cstring>

#include "cpu/fp8_gemm_ref.h"
#include "test/gpu/gpu_util.cuh"
#include "test/harness.h"

using namespace fp8rl;

#define REQUIRE_FP8_BLOCK_GEMM()                                              \
    do {                                                                      \
        REQUIRE_GPU();                                                        \
        std::string why_not = fp8_block_gemm_unsupported_reason(0);           \
        if (!why_not.empty()) SKIP(why_not.c_str());                          \
    } while (0)

// ---------------------------------------------------------------------------------------------
// Device encoder, all 2^32 inputs (every `stride`-th one in emulation, where the device
// conversion is cuda_fp8.h's host path and the exhaustive CPU oracle test already covers it).

__global__ void encode_sweep_kernel(int mode, uint32_t stride, unsigned long long* mismatches, unsigned int* example) {
    Fp8Format fmt = mode < 2 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    bool sat = mode % 2 == 0;
    __nv_fp8_interpretation_t cuda_fmt = mode < 2 ? __NV_E4M3 : __NV_E5M2;
    unsigned long long bad = 0;
    for (uint64_t u = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) * stride; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x * stride) {
        float x = bits_float((uint32_t)u);
        uint8_t ours = float_to_fp8(x, fmt, sat);
        uint8_t cuda = __nv_cvt_float_to_fp8(x, sat ? __NV_SATFINITE : __NV_NOSAT, cuda_fmt);
        if (ours != cuda) bad++, *example = (uint32_t)u;
    }
    if (bad) atomicAdd(mismatches, bad);
}

__global__ void decode_all_kernel(float* ours, float* cuda) {
    int code = threadIdx.x, fmt_index = blockIdx.x;
    Fp8Format fmt = fmt_index == 0 ? Fp8Format::E4M3 : Fp8Format::E5M2;
    ours[fmt_index * 256 + code] = fp8_to_float((uint8_t)code, fmt);
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, fmt_index == 0 ? __NV_E4M3 : __NV_E5M2);
    cuda[fmt_index * 256 + code] = __half2float(__half(h));
}

TEST(gpu_fp8_device_encoder_matches_cuda_all_floats) {
    REQUIRE_GPU();
    const char* names[4] = {"E4M3 satfinite", "E4M3 nosat", "E5M2 satfinite", "E5M2 nosat"};
    const uint32_t stride = emulated ? 4099 : 1;
    const int blocks = emulated ? 8 : 2048;
    DeviceBuffer<unsigned long long> mismatches(1);
    DeviceBuffer<unsigned int> example(1);
    for (int mode = 0; mode < 4; mode++) {
        CUDA_CHECK(cudaMemset(mismatches.ptr, 0, sizeof(unsigned long long)));
        LAUNCH_KERNEL(encode_sweep_kernel, blocks, 256, 0, 0, mode, stride, mismatches.ptr, example.ptr);
        unsigned long long bad = mismatches.download()[0];
        printf("    device %-15s every %u-th of the 2^32 inputs: %llu mismatches vs __nv_cvt_float_to_fp8 on the device\n",
               names[mode], stride, bad);
        CHECK_MSG(bad == 0, "%s: %llu mismatches, e.g. input bits 0x%08X", names[mode], bad, example.download()[0]);
    }
    DeviceBuffer<float> ours(512), cuda(512);
    LAUNCH_KERNEL(decode_all_kernel, 2, 256, 0, 0, ours.ptr, cuda.ptr);
    std::vector<float> o = ours.download(), c = cuda.download();
    int bad = 0;
    for (int i = 0; i < 512; i++) {
        bool same = std::isnan(c[i]) ? std::isnan(o[i]) : float_bits(o[i]) == float_bits(c[i]);
        float host = fp8_to_float((uint8_t)(i % 256), i < 256 ? Fp8Format::E4M3 : Fp8Format::E5M2);
        same = same && (std::isnan(host) ? std::isnan(o[i]) : float_bits(host) == float_bits(o[i]));
        bad += !same;
    }
    CHECK_MSG(bad == 0, "%d of 512 codes decode differently on the device", bad);
}

// The pair/quad encoders the quantize kernels write with (cuda/element.cuh: the hardware's
// cvt.rn.satfinite.e4m3x2.f32 on the device, float_to_e4m3 in emulation) against the scalar encoder
// and CUDA's single-value device conversion, byte by byte: every input u is the low value of a pair
// and of a quad whose other values are other bit patterns (a rotation, a sign flip, an odd
// multiple), so each byte position sees every input and a swapped byte order shows.
__global__ void pair_encode_sweep_kernel(uint32_t stride, unsigned long long* mismatches, unsigned int* example) {
    unsigned long long bad = 0;
    for (uint64_t u = (blockIdx.x * (uint64_t)blockDim.x + threadIdx.x) * stride; u < (1ull << 32);
         u += (uint64_t)gridDim.x * blockDim.x * stride) {
        const uint32_t b = (uint32_t)u;
        const float v[4] = {bits_float(b), bits_float(b << 13 | b >> 19), bits_float(b ^ 0x80000000u), bits_float(b * 2654435761u)};
        uint8_t want[4];
        for (int i = 0; i < 4; i++) {
            want[i] = float_to_e4m3(v[i]);
            if (want[i] != (uint8_t)__nv_cvt_float_to_fp8(v[i], __NV_SATFINITE, __NV_E4M3)) bad++;
        }
        const uint16_t pair = encode_e4m3x2(v[0], v[1]), pair_rev = encode_e4m3x2(v[1], v[0]);
        const uint32_t quad = encode_e4m3x4(v[0], v[1], v[2], v[3]), quad_rot = encode_e4m3x4(v[3], v[0], v[1], v[2]);
        bool same = pair == (uint16_t)(want[0] | want[1] << 8) && pair_rev == (uint16_t)(want[1] | want[0] << 8);
        same = same && quad == ((uint32_t)want[0] | (uint32_t)want[1] << 8 | (uint32_t)want[2] << 16 | (uint32_t)want[3] << 24);
        same = same && quad_rot == ((uint32_t)want[3] | (uint32_t)want[0] << 8 | (uint32_t)want[1] << 16 | (uint32_t)want[2] << 24);
        if (!same) bad++, *example = b;
    }
    if (bad) atomicAdd(mismatches, bad);
}

// out: encode_e4m3x2 of each pair of x [n], then encode_e4m3x4 of each quad.
__global__ void pair_encode_values_kernel(const float* x, int n, uint32_t* out) {
    for (int i = 0; i + 1 < n; i += 2) out[i / 2] = encode_e4m3x2(x[i], x[i + 1]);
    for (int i = 0; i + 3 < n; i += 4) out[n / 2 + i / 4] = encode_e4m3x4(x[i], x[i + 1], x[i + 2], x[i + 3]);
}

TEST(gpu_fp8_pair_encoder_matches_scalar_all_floats) {
    REQUIRE_GPU();
    const uint32_t stride = emulated ? 4099 : 1;
    DeviceBuffer<unsigned long long> mismatches(1);
    DeviceBuffer<unsigned int> example(1);
    CUDA_CHECK(cudaMemset(mismatches.ptr, 0, sizeof(unsigned long long)));
    LAUNCH_KERNEL(pair_encode_sweep_kernel, emulated ? 8 : 2048, 256, 0, 0, stride, mismatches.ptr, example.ptr);
    unsigned long long bad = mismatches.download()[0];
    printf("    encode_e4m3x2 / encode_e4m3x4, every %u-th of the 2^32 inputs in each byte: %llu mismatches vs "
           "float_to_e4m3 and __nv_cvt_float_to_fp8\n",
           stride, bad);
    CHECK_MSG(bad == 0, "%llu mismatches, e.g. input bits 0x%08X", bad, example.download()[0]);
    // the values the satfinite rule is about, on the device: +-Inf and overflow saturate to +-448,
    // NaN of either sign is 0x7F, underflow keeps its sign
    const std::vector<float> special = {NAN, -NAN, INFINITY, -INFINITY, 464.0f, -465.0f, -1e-9f, 0.3f};
    const uint8_t want[] = {0x7F, 0x7F, 0x7E, 0xFE, 0x7E, 0xFE, 0x80, 0x2A};
    DeviceBuffer<float> in(special);
    DeviceBuffer<uint32_t> out(special.size() / 2 + special.size() / 4);
    LAUNCH_KERNEL(pair_encode_values_kernel, 1, 1, 0, 0, in.ptr, (int)special.size(), out.ptr);
    std::vector<uint32_t> got = out.download();
    for (size_t i = 0; i < special.size(); i += 2)
        CHECK_MSG(got[i / 2] == (uint32_t)(want[i] | want[i + 1] << 8), "encode_e4m3x2(%g, %g) = 0x%04X", special[i],
                  special[i + 1], got[i / 2]);
    for (size_t i = 0; i < special.size(); i += 4) {
        uint32_t w = want[i] | want[i + 1] << 8 | want[i + 2] << 16 | (uint32_t)want[i + 3] << 24;
        CHECK_MSG(got[special.size() / 2 + i / 4] == w, "encode_e4m3x4 of values %zu..%zu = 0x%08X, want 0x%08X", i, i + 3,
                  got[special.size() / 2 + i / 4], w);
    }
}

// ---------------------------------------------------------------------------------------------
// Quantize kernels vs the CPU quantizers.

// Test data with what real tensors have and what breaks layouts: magnitudes that vary by row and
// by 128-column block (so every scale differs), an all-zero group, a NaN, an Inf, FP32-subnormal
// values, values rounded to BF16. x [rows][cols].
static std::vector<float> varied_data(int rows, int cols, uint32_t seed) {
    std::vector<float> x((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float row_mag = std::ldexp(1.0f, (int)(8 * hash_uniform(r, seed + 1)));
            float block_mag = std::ldexp(1.0f, (int)(4 * hash_uniform(c / 128 + 7 * (r / 128), seed + 2)));
            x[(size_t)r * cols + c] = round_bf16(row_mag * block_mag * hash_uniform((size_t)r * cols + c, seed));
        }
    if (rows > 3 && cols > 130) {
        for (int c = 0; c < 128; c++) x[(size_t)1 * cols + c] = 0.0f;
        x[(size_t)2 * cols + 5] = NAN;
        x[(size_t)3 * cols + 129] = -INFINITY;
        for (int c = 128; c < cols && c < 256; c++) x[c] = round_bf16(1e-39f * hash_uniform(c, seed));
    }
    return x;
}

template <class A, class B>
static int count_bit_differences(const std::vector<A>& device, const std::vector<B>& host, const char* what) {
    if (device.size() != host.size()) {
        fprintf(stderr, "    %s: %zu elements on the device, %zu on the host\n", what, device.size(), host.size());
        return -1;
    }
    int bad = 0;
    for (size_t i = 0; i < device.size(); i++)
        if (memcmp(&device[i], &host[i], sizeof(A)) != 0 && bad++ < 3)
            fprintf(stderr, "    %s[%zu]: device %g, host %g\n", what, i, (double)device[i], (double)host[i]);
    return bad;
}

TEST(gpu_fp8_quantize_kernels_match_host_bit_for_bit) {
    REQUIRE_GPU();
    const int shapes[][2] = {{300, 520}, {256, 384}, {64, 128}};
    for (auto shape : shapes)
        for (bool pow2 : {false, true}) {
            int rows = shape[0], cols = shape[1];
            std::vector<float> x = varied_data(rows, cols, 11 + rows);
            DeviceBuffer<__nv_bfloat16> x_bf16(to_bf16(x));
            DeviceBuffer<float> x_f32(x);
            DeviceBuffer<uint8_t> codes((size_t)rows * cols), codes_t((size_t)rows * cols);
            DeviceBuffer<float> s(vec128_scale_count(rows, cols)), s_t(vec128_scale_count(cols, rows));
            for (auto* b : {&codes, &codes_t}) b->poison();
            for (auto* b : {&s, &s_t}) b->poison();
            fp8_quantize_rowwise_gpu(x_bf16.ptr, rows, cols, pow2, codes.ptr, s.ptr, codes_t.ptr, s_t.ptr, 0);
            Fp8Tensor host = fp8_quantize_rowwise(x.data(), rows, cols, pow2);
            Fp8Tensor host_t = fp8_quantize_rowwise_transposed(x.data(), rows, cols, pow2);
            std::string tag = strfmt("[%d][%d] pow2=%d", rows, cols, (int)pow2);
            CHECK_MSG(count_bit_differences(codes.download(), host.data, "rowwise codes") == 0, "rowwise codes %s", tag.c_str());
            CHECK_MSG(count_bit_differences(s.download(), host.scale_inv, "rowwise scales") == 0, "rowwise scales %s", tag.c_str());
            CHECK_MSG(count_bit_differences(codes_t.download(), host_t.data, "transposed codes") == 0,
                      "transposed (along rows) codes %s", tag.c_str());
            CHECK_MSG(count_bit_differences(s_t.download(), host_t.scale_inv, "transposed scales") == 0,
                      "transposed (along rows) scales %s", tag.c_str());

            DeviceBuffer<float> b(blk128_scale_count(rows, cols)), b_t(blk128_scale_count(cols, rows));
            codes.poison(), codes_t.poison(), b.poison(), b_t.poison();
            fp8_quantize_blockwise_gpu(x_f32.ptr, rows, cols, pow2, codes.ptr, b.ptr, codes_t.ptr, b_t.ptr, 0);
            Fp8Tensor hw = fp8_quantize_blockwise(x.data(), rows, cols, pow2), hwt = fp8_transpose(hw);
            CHECK_MSG(count_bit_differences(codes.download(), hw.data, "blockwise codes") == 0, "blockwise codes %s", tag.c_str());
            CHECK_MSG(count_bit_differences(b.download(), hw.scale_inv, "blockwise scales") == 0, "blockwise scales %s", tag.c_str());
            CHECK_MSG(count_bit_differences(codes_t.download(), hwt.data, "blockwise^T codes") == 0,
                      "blockwise transposed codes %s", tag.c_str());
            CHECK_MSG(count_bit_differences(b_t.download(), hwt.scale_inv, "blockwise^T scales") == 0,
                      "blockwise transposed scales %s", tag.c_str());
        }
}

// The dgrad copy one FP8 weight copy makes before each dgrad (fp8_transpose_block_copy_gpu) is the
// transposed copy the blockwise quantizer writes beside the codes, byte for byte and scale for scale
// (padding entries included), and the CPU's fp8_transpose: shapes with partial tiles both ways.
TEST(gpu_fp8_transposed_block_copy_equals_the_quantizers) {
    REQUIRE_GPU();
    const int shapes[][2] = {{304, 520}, {256, 384}, {48, 272}};
    for (auto shape : shapes)
        for (bool pow2 : {false, true}) {
            const int rows = shape[0], cols = shape[1];
            const std::vector<float> x = varied_data(rows, cols, 5 + cols);
            DeviceBuffer<float> x_f32(x);
            DeviceBuffer<uint8_t> codes((size_t)rows * cols), codes_t((size_t)rows * cols), made_t((size_t)rows * cols);
            DeviceBuffer<float> b(blk128_scale_count(rows, cols)), b_t(blk128_scale_count(cols, rows)),
                made_b_t(blk128_scale_count(cols, rows));
            for (auto* d : {&codes, &codes_t, &made_t}) d->poison();
            for (auto* d : {&b, &b_t, &made_b_t}) d->poison();
            fp8_quantize_blockwise_gpu(x_f32.ptr, rows, cols, pow2, codes.ptr, b.ptr, codes_t.ptr, b_t.ptr, 0);
            fp8_transpose_block_copy_gpu(codes.ptr, b.ptr, rows, cols, made_t.ptr, made_b_t.ptr, 0);
            const Fp8Tensor host_t = fp8_transpose(fp8_quantize_blockwise(x.data(), rows, cols, pow2));
            const std::string tag = strfmt("[%d][%d] pow2=%d", rows, cols, (int)pow2);
            CHECK_MSG(count_bit_differences(made_t.download(), codes_t.download(), "made^T codes") == 0,
                      "transposed codes %s differ from the quantizer's", tag.c_str());
            CHECK_MSG(count_bit_differences(made_b_t.download(), b_t.download(), "made^T scales") == 0,
                      "transposed scales %s differ from the quantizer's", tag.c_str());
            CHECK_MSG(count_bit_differences(made_t.download(), host_t.data, "host^T codes") == 0,
                      "transposed codes %s differ from fp8_transpose", tag.c_str());
            CHECK_MSG(count_bit_differences(made_b_t.download(), host_t.scale_inv, "host^T scales") == 0,
                      "transposed scales %s differ from fp8_transpose", tag.c_str());
        }
    CHECK_THROWS(fp8_transpose_block_copy_gpu(nullptr, nullptr, 30, 64, nullptr, nullptr, 0), "multiples of 4");
}

// The elements [offset, offset + n) of a device buffer.
template <class T>
static std::vector<T> download_range(const DeviceBuffer<T>& d, size_t offset, size_t n) {
    std::vector<T> all = d.download();
    return std::vector<T>(all.begin() + (long)offset, all.begin() + (long)(offset + n));
}

template <class T>
static bool all_poisoned(const DeviceBuffer<T>& d) {
    std::vector<T> all = d.download();
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(all.data());
    for (size_t i = 0; i < all.size() * sizeof(T); i++)
        if (bytes[i] != 0xA5) return false;
    return true;
}

// One call of the rowwise quantizer on x (In = float or BF16) placed `offset` elements into its
// buffer, with codes and codes_t `offset` bytes into theirs; outputs: 0 both, 1 transposed only
// (codes null), 2 rowwise only (codes_t null). Each given output must equal the CPU quantizer's
// bytes, each output not given must stay untouched.
template <class In>
static void check_rowwise_call(const std::vector<float>& x, int rows, int cols, bool pow2, int offset, int outputs) {
    const size_t n = (size_t)rows * cols;
    std::vector<In> host_in(n + 16);
    for (size_t i = 0; i < n; i++) {
        if constexpr (std::is_same<In, float>::value) host_in[offset + i] = x[i];
        else host_in[offset + i] = __float2bfloat16(x[i]);
    }
    DeviceBuffer<In> xd(host_in);
    DeviceBuffer<uint8_t> codes(n + 16), codes_t(n + 16);
    DeviceBuffer<float> s(vec128_scale_count(rows, cols)), s_t(vec128_scale_count(cols, rows));
    codes.poison(), codes_t.poison(), s.poison(), s_t.poison();
    const bool rowwise = outputs != 1, transposed = outputs != 2;
    fp8_quantize_rowwise_gpu(xd.ptr + offset, rows, cols, pow2, rowwise ? codes.ptr + offset : nullptr, rowwise ? s.ptr : nullptr,
                             transposed ? codes_t.ptr + offset : nullptr, transposed ? s_t.ptr : nullptr, 0);
    const std::string tag = strfmt("[%d][%d] %s pow2=%d offset=%d outputs=%s", rows, cols,
                                   std::is_same<In, float>::value ? "FP32" : "BF16", (int)pow2, offset,
                                   outputs == 0 ? "both" : outputs == 1 ? "transposed only" : "rowwise only");
    if (rowwise) {
        Fp8Tensor host = fp8_quantize_rowwise(x.data(), rows, cols, pow2);
        CHECK_MSG(count_bit_differences(download_range(codes, offset, n), host.data, "rowwise codes") == 0, "rowwise codes %s",
                  tag.c_str());
        CHECK_MSG(count_bit_differences(s.download(), host.scale_inv, "rowwise scales") == 0, "rowwise scales %s", tag.c_str());
        std::vector<uint8_t> all = codes.download();
        bool around = true;  // the bytes before and after the tensor's codes
        for (size_t i = 0; i < all.size(); i++) around = around && (i >= (size_t)offset && i < offset + n ? true : all[i] == 0xA5);
        CHECK_MSG(around, "rowwise codes %s: a byte outside the tensor was written", tag.c_str());
    } else {
        CHECK_MSG(all_poisoned(codes) && all_poisoned(s), "%s: the rowwise outputs were written", tag.c_str());
    }
    if (transposed) {
        Fp8Tensor host_t = fp8_quantize_rowwise_transposed(x.data(), rows, cols, pow2);
        CHECK_MSG(count_bit_differences(download_range(codes_t, offset, n), host_t.data, "transposed codes") == 0,
                  "transposed codes %s", tag.c_str());
        CHECK_MSG(count_bit_differences(s_t.download(), host_t.scale_inv, "transposed scales") == 0, "transposed scales %s",
                  tag.c_str());
    } else {
        CHECK_MSG(all_poisoned(codes_t) && all_poisoned(s_t), "%s: the transposed outputs were written", tag.c_str());
    }
}

template <class In>
static void check_blockwise_call(const std::vector<float>& x, int rows, int cols, bool pow2, int offset) {
    const size_t n = (size_t)rows * cols;
    std::vector<float> host_in(n + 16, 0.0f);
    std::copy(x.begin(), x.end(), host_in.begin() + offset);
    DeviceBuffer<In> xd(n + 16);
    if constexpr (std::is_same<In, float>::value) xd.upload(host_in);
    else xd.upload(to_bf16(host_in));
    DeviceBuffer<uint8_t> codes(n + 16), codes_t(n + 16);
    DeviceBuffer<float> b(blk128_scale_count(rows, cols)), b_t(blk128_scale_count(cols, rows));
    codes.poison(), codes_t.poison(), b.poison(), b_t.poison();
    fp8_quantize_blockwise_gpu(xd.ptr + offset, rows, cols, pow2, codes.ptr + offset, b.ptr, codes_t.ptr + offset, b_t.ptr, 0);
    Fp8Tensor hw = fp8_quantize_blockwise(x.data(), rows, cols, pow2), hwt = fp8_transpose(hw);
    const std::string tag = strfmt("[%d][%d] %s pow2=%d offset=%d", rows, cols, std::is_same<In, float>::value ? "FP32" : "BF16",
                                   (int)pow2, offset);
    CHECK_MSG(count_bit_differences(download_range(codes, offset, n), hw.data, "blockwise codes") == 0, "blockwise codes %s", tag.c_str());
    CHECK_MSG(count_bit_differences(b.download(), hw.scale_inv, "blockwise scales") == 0, "blockwise scales %s", tag.c_str());
    CHECK_MSG(count_bit_differences(download_range(codes_t, offset, n), hwt.data, "blockwise^T codes") == 0,
              "blockwise transposed codes %s", tag.c_str());
    CHECK_MSG(count_bit_differences(b_t.download(), hwt.scale_inv, "blockwise^T scales") == 0, "blockwise transposed scales %s",
              tag.c_str());
}

// Shapes that are not multiples of 128, or of the 16-byte load (7, 131: narrow loads at each row's
// end and rows that start off a 16-byte boundary; odd row counts: byte stores of the transposed
// codes), tensors whose buffers start one element (x) and one byte (codes) off the allocation's
// 256-byte boundary (every load and store narrow), both input types, and each output set of the
// rowwise quantizer (transposed only: codes == nullptr, the wgrad's x^T alone).
TEST(gpu_fp8_quantize_kernels_odd_shapes_offsets_and_single_outputs) {
    REQUIRE_GPU();
    const int shapes[][2] = {{129, 131}, {37, 250}, {200, 7}, {1, 1}, {256, 136}, {132, 264}};
    int calls = 0;
    for (auto shape : shapes) {
        const int rows = shape[0], cols = shape[1];
        std::vector<float> x = varied_data(rows, cols, 5 + rows + cols);
        for (int offset : {0, 1})
            for (int outputs : {0, 1, 2}) {
                const bool pow2 = (outputs + offset) % 2 == 1;
                check_rowwise_call<__nv_bfloat16>(x, rows, cols, pow2, offset, outputs);
                check_rowwise_call<float>(x, rows, cols, !pow2, offset, outputs);
                calls += 2;
            }
        for (int offset : {0, 1}) {
            check_blockwise_call<__nv_bfloat16>(x, rows, cols, offset == 1, offset);
            check_blockwise_call<float>(x, rows, cols, offset == 0, offset);
            calls += 2;
        }
    }
    printf("    %d quantizer calls over %zu shapes, offsets 0 and 1, every output set: bit-identical to the CPU quantizers\n",
           calls, sizeof shapes / sizeof shapes[0]);
    // a call without any output is an error, as is a codes buffer without its scales
    DeviceBuffer<float> x(16);
    DeviceBuffer<uint8_t> c(16);
    CHECK_THROWS(fp8_quantize_rowwise_gpu(x.ptr, 4, 4, false, (uint8_t*)nullptr, nullptr, (uint8_t*)nullptr, nullptr, 0),
                 "neither the rowwise nor the transposed output");
    CHECK_THROWS(fp8_quantize_rowwise_gpu(x.ptr, 4, 4, false, c.ptr, nullptr, (uint8_t*)nullptr, nullptr, 0),
                 "given together or not at all");
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt GEMMs vs the CPU emulation.

static Fp8GemmOperand absolute(Fp8GemmOperand op) {
    for (float& v : op.values) v = std::fabs(v);
    for (float& s : op.scale_inv) s = std::fabs(s);
    return op;
}

// Compares a GPU result [rows][cols] with the CPU emulation. Tolerance per element:
//   |gpu - cpu| <= 2^-9 * sum_k |a_k b_k| sA sB  +  (BF16 output ? 2^-8 |cpu| : 0)
// Why: the emulation's FP32 sums are within ~1e-7 of exact (test_fp8_block.cpp); Hopper's FP8
// tensor cores keep about 13 fraction bits per accumulation step (spec-fp8.md §8) over the 4 k=32
// steps of a 128-block before the FP32 promotion, i.e. about 4 * 2^-13 = 2^-11 of sum |a b|;
// 2^-9 leaves a factor 4. A BF16 output adds one rounding (2^-9 relative; 2^-8 leaves a factor 2).
// A wrong scale layout multiplies whole blocks by wrong factors (row and block magnitudes in this
// data span 2^-7 .. 2^7 and 2^-3 .. 2^3).
// Returns the number of elements outside the tolerance; prints the error figures.
static long count_outside_tolerance(const std::vector<float>& gpu, const std::vector<float>& cpu,
                                    const std::vector<float>& abs_dot, bool bf16_out, const std::string& what) {
    long bad = 0;
    double err2 = 0, ref2 = 0, worst = 0;
    for (size_t i = 0; i < gpu.size(); i++) {
        double diff = std::fabs((double)gpu[i] - cpu[i]);
        double tol = std::ldexp((double)abs_dot[i], -9) + (bf16_out ? std::ldexp(std::fabs((double)cpu[i]), -8) : 0.0);
        if (!(diff <= tol)) bad++;
        worst = std::fmax(worst, diff / (tol > 0 ? tol : 1e-30));
        err2 += diff * diff, ref2 += (double)cpu[i] * cpu[i];
    }
    printf("    %-52s rel. Frobenius error %.3g, worst |err|/tol %.3g, %ld of %zu outside\n", what.c_str(),
           std::sqrt(err2 / ref2), worst, bad, gpu.size());
    return bad;
}

// --fp8_scaling row and tensor: the two-pass quantizer (amax, then the cast) of activations (BF16) and
// of weights (the FP32 master's copies for fprop and dgrad) equals the CPU quantizers bit for bit.
TEST(gpu_fp8_row_and_tensor_quantizers_match_host_bit_for_bit) {
    REQUIRE_GPU();
    const int shapes[][2] = {{300, 520}, {256, 384}, {64, 128}};
    for (Fp8Scaling scaling : {Fp8Scaling::Row, Fp8Scaling::Tensor})
        for (auto shape : shapes)
            for (bool pow2 : {false, true}) {
                const int rows = shape[0], cols = shape[1];
                const Fp8Layout layout = fp8_rows_layout(scaling);
                std::vector<float> x = varied_data(rows, cols, 31 + rows);
                DeviceBuffer<__nv_bfloat16> x_bf16(to_bf16(x));
                DeviceBuffer<float> x_f32(x);
                DeviceBuffer<uint8_t> codes((size_t)rows * cols), codes_t((size_t)rows * cols);
                DeviceBuffer<float> s(fp8_scale_count(layout, rows, cols)), s_t(fp8_scale_count(layout, cols, rows));
                DeviceBuffer<uint32_t> amax(fp8_amax_words(scaling, rows, cols));
                const std::string tag = strfmt("%s [%d][%d] pow2=%d", fp8_scaling_name(scaling), rows, cols, (int)pow2);
                auto check = [&](const Fp8Tensor& host, const Fp8Tensor& host_t, const char* what) {
                    CHECK_MSG(count_bit_differences(codes.download(), host.data, "codes") == 0, "%s codes %s", what, tag.c_str());
                    CHECK_MSG(count_bit_differences(s.download(), host.scale_inv, "scales") == 0, "%s scales %s", what, tag.c_str());
                    CHECK_MSG(count_bit_differences(codes_t.download(), host_t.data, "transposed codes") == 0,
                              "%s transposed codes %s", what, tag.c_str());
                    CHECK_MSG(count_bit_differences(s_t.download(), host_t.scale_inv, "transposed scales") == 0,
                              "%s transposed scales %s", what, tag.c_str());
                };
                for (auto* b : {&codes, &codes_t}) b->poison();
                for (auto* b : {&s, &s_t}) b->poison();
                amax.poison();  // the launcher clears what it reads
                fp8_quantize_rowwise_gpu(x_bf16.ptr, rows, cols, pow2, codes.ptr, s.ptr, codes_t.ptr, s_t.ptr, 0, scaling,
                                         amax.ptr);
                std::vector<float> xr(x.size());  // the BF16 values the device read
                for (size_t i = 0; i < x.size(); i++) xr[i] = round_bf16(x[i]);
                check(fp8_quantize_rowwise(xr.data(), rows, cols, pow2, scaling),
                      fp8_quantize_rowwise_transposed(xr.data(), rows, cols, pow2, scaling), "activation");

                for (auto* b : {&codes, &codes_t}) b->poison();
                for (auto* b : {&s, &s_t}) b->poison();
                const Fp8WeightCopy copy{codes.ptr, s.ptr, codes_t.ptr, s_t.ptr, pow2, scaling};
                fp8_requantize_weight_gpu(x_f32.ptr, rows, cols, copy, amax.ptr, 0);
                const Fp8Weight host = fp8_quantize_weight(x.data(), rows, cols, pow2, scaling);
                check(host.w, host.wt, "weight");
            }
}

static std::vector<float> download_output(const DeviceBuffer<char>& d, size_t count, GemmOut out) {
    std::vector<char> raw = d.download();
    std::vector<float> y(count);
    for (size_t i = 0; i < count; i++) {
        if (out == GemmOut::F32)
            memcpy(&y[i], raw.data() + 4 * i, 4);
        else {
            uint16_t h;
            memcpy(&h, raw.data() + 2 * i, 2);
            y[i] = bf16_to_float(h);
        }
    }
    return y;
}

namespace {
// One linear layer's FP8 operands at a granularity, quantized on the host (identical to the device
// kernels, as the previous tests check) and uploaded in cuBLASLt's layouts.
struct LinearOperands {
    int T, K, N;
    Fp8Tensor x, dy, xt, dyt;
    Fp8Tensor w, wt;
    LinearOperands(int T_, int K_, int N_, Fp8Scaling scaling = Fp8Scaling::Block) : T(T_), K(K_), N(N_) {
        std::vector<float> xf = varied_data(T, K, 21), wf = varied_data(N, K, 22), dyf = varied_data(T, N, 23);
        for (auto* v : {&xf, &wf, &dyf})  // no NaN/Inf here: the GEMM comparison needs finite values
            for (float& e : *v)
                if (!std::isfinite(e)) e = 1.0f;
        x = fp8_quantize_rowwise(xf.data(), T, K, false, scaling);
        dy = fp8_quantize_rowwise(dyf.data(), T, N, false, scaling);
        xt = fp8_quantize_rowwise_transposed(xf.data(), T, K, false, scaling);
        dyt = fp8_quantize_rowwise_transposed(dyf.data(), T, N, false, scaling);
        const Fp8Weight q = fp8_quantize_weight(wf.data(), N, K, false, scaling);
        w = q.w, wt = q.wt;
    }
};

struct GemmCase {
    const char* name;
    int m, n, k;
    const std::vector<uint8_t>*a, *b;
    const std::vector<float>*sa, *sb;
    Fp8ScaleMode ma, mb;
    Fp8GemmOperand cpu_a, cpu_b;  // emulation: out [n][m] = cpu_b . cpu_a^T
};

// Runs one block-scaled GEMM on the GPU (scales given explicitly, so a test can pass a wrong
// layout) and counts the elements outside the tolerance against the CPU emulation.
long run_and_compare(GemmRunner& runner, const GemmCase& g, const std::vector<float>& sa, const std::vector<float>& sb,
                     GemmOut out, const std::string& label) {
    DeviceBuffer<uint8_t> a(*g.a), b(*g.b);
    DeviceBuffer<float> da(sa), db(sb);
    size_t count = (size_t)g.m * g.n;
    DeviceBuffer<char> d(count * 4);
    d.poison();
    runner.fp8(g.name, g.m, g.n, g.k, a.ptr, da.ptr, g.ma, b.ptr, db.ptr, g.mb, d.ptr, out, 0);
    std::vector<float> gpu = download_output(d, count, out);
    std::vector<float> cpu(count), abs_dot(count);
    fp8_gemm_nt_ref(g.cpu_b, g.cpu_a, cpu.data(), false);
    fp8_gemm_nt_ref(absolute(g.cpu_b), absolute(g.cpu_a), abs_dot.data(), false);
    return count_outside_tolerance(gpu, cpu, abs_dot, out == GemmOut::BF16, label);
}
}  // namespace

// The GEMM shapes: K of 5 blocks (the BLK grid row padded to 8); smaller T and N under the
// sanitizer, where the emulated GEMMs run ~10x slower.
constexpr int kGemmT = harness::sanitized ? 128 : 384, kGemmK = 640, kGemmN = harness::sanitized ? 384 : 896;

// Each granularity's three GEMMs in its cuBLASLt scale modes (block: BLK128x128 / VEC128, row:
// OUTER_VEC, tensor: SCALAR) against the CPU oracle (cpu/fp8_gemm_ref.h).
TEST(gpu_fp8_gemms_match_cpu_emulation_at_each_granularity) {
    REQUIRE_FP8_BLOCK_GEMM();
    const int T = kGemmT, K = kGemmK, N = kGemmN;
    GemmRunner runner;
    for (Fp8Scaling scaling : {Fp8Scaling::Block, Fp8Scaling::Row, Fp8Scaling::Tensor}) {
        LinearOperands op(T, K, N, scaling);
        const Fp8ScaleMode wm = weight_scale_mode(scaling), rm = rows_scale_mode(scaling);
        GemmCase cases[] = {
            {"fprop", N, T, K, &op.w.data, &op.x.data, &op.w.scale_inv, &op.x.scale_inv, wm, rm, fp8_gemm_operand(op.w),
             fp8_gemm_operand(op.x)},
            {"dgrad", K, T, N, &op.wt.data, &op.dy.data, &op.wt.scale_inv, &op.dy.scale_inv, wm, rm, fp8_gemm_operand(op.wt),
             fp8_gemm_operand(op.dy)},
            {"wgrad", K, N, T, &op.xt.data, &op.dyt.data, &op.xt.scale_inv, &op.dyt.scale_inv, rm, rm,
             fp8_gemm_operand(op.xt), fp8_gemm_operand(op.dyt)},
        };
        for (const GemmCase& g : cases)
            for (GemmOut out : {GemmOut::BF16, GemmOut::F32}) {
                std::string label = strfmt("%s %s m=%d n=%d k=%d %s out", fp8_scaling_name(scaling), g.name, g.m, g.n, g.k,
                                           out == GemmOut::BF16 ? "BF16" : "FP32");
                long bad = run_and_compare(runner, g, *g.sa, *g.sb, out, label);
                CHECK_MSG(bad == 0, "%s: %ld elements outside tolerance", label.c_str(), bad);
            }
    }
}

// The same check must FAIL when the scales are laid out the way one might naively write them.
TEST(gpu_fp8_wrong_scale_layout_fails_the_check) {
    REQUIRE_FP8_BLOCK_GEMM();
    const int T = kGemmT, K = kGemmK, N = kGemmN;
    LinearOperands op(T, K, N);
    GemmRunner runner;
    GemmCase fprop = {"fprop", N, T, K, &op.w.data, &op.x.data, &op.w.scale_inv, &op.x.scale_inv,
                      Fp8ScaleMode::BLK128x128, Fp8ScaleMode::VEC128, fp8_gemm_operand(op.w), fp8_gemm_operand(op.x)};
    int L = fp8_num_blocks(K), NB = fp8_num_blocks(N);
    // (1) X's 1x128 scales row-major [T][L] (token-major) instead of VEC128's [L][T]
    std::vector<float> x_row_major((size_t)T * L);
    for (int t = 0; t < T; t++)
        for (int kb = 0; kb < L; kb++) x_row_major[(size_t)t * L + kb] = op.x.scale_inv_at(t, kb);
    long bad1 = run_and_compare(runner, fprop, op.w.scale_inv, x_row_major, GemmOut::F32, "fprop, X scales [T][L] (wrong)");
    CHECK_MSG(bad1 > 0, "a [T][L] X scale layout passed the check: the check cannot see layout errors");
    // (2) W's 128x128 grid without padding each row to a multiple of 4 (stride L instead of 8)
    std::vector<float> w_unpadded(blk128_scale_count(N, K), 0.0f);
    for (int nb = 0; nb < NB; nb++)
        for (int kb = 0; kb < L; kb++) w_unpadded[(size_t)nb * L + kb] = op.w.scale_inv[blk128_scale_index(nb, kb, K)];
    long bad2 = run_and_compare(runner, fprop, w_unpadded, op.x.scale_inv, GemmOut::F32, "fprop, W grid unpadded (wrong)");
    CHECK_MSG(bad2 > 0, "an unpadded W scale grid passed the check: the check cannot see layout errors");
}

// fp8rl's own block-scaled kernel (cuda/kernels/fp8_block_gemm.cuh, --fp8_gemm_kernel own) on a linear
// layer's three GEMMs (fprop and dgrad: A BLK128x128; wgrad: both VEC128), BF16 and FP32 D, and FP32
// D accumulated onto a prefilled one, against cuBLASLt's path (the same runner, Fp8GemmKernel::Cublaslt)
// and the CPU oracle (cpu/fp8_gemm_ref.h). In emulation bit for bit: each output's 128-wide blocks
// sum from 0 in k order and join part with one FMA in all three. On a GPU the tensor
// cores sum in their own order: the tolerance of count_outside_tolerance. T = 256, K = 640, N = 256:
// 2 and 5 tiles a side, k of 2 and 5 blocks (fewer than the ring copies ahead, and more); one tile
// with k of 13 blocks, A BLK128x128 (fprop) and VEC128 (wgrad): the 6-stage ring wraps twice, every
// stage issued, copied into and promoted from after a wrap.
// In emulation the own path must launch fp8_block_gemm_kernel (no cuBLASLt call), and a shape it does
// not fit (k = 64) must fall back to cuBLASLt.
TEST(gpu_fp8_own_block_gemm_matches_cublaslt_and_cpu) {
    REQUIRE_FP8_BLOCK_GEMM();
    const int T = harness::sanitized ? 128 : 256, K = 640, N = 256;
    const int long_k = 13 * FP8_BLOCK;
    LinearOperands op(T, K, N), long_fprop(128, long_k, 128), long_wgrad(long_k, 128, 128);
    GemmRunner runner;
    const Fp8ScaleMode blk = Fp8ScaleMode::BLK128x128, vec = Fp8ScaleMode::VEC128;
    const GemmCase cases[] = {
        {"fprop", N, T, K, &op.w.data, &op.x.data, &op.w.scale_inv, &op.x.scale_inv, blk, vec, fp8_gemm_operand(op.w),
         fp8_gemm_operand(op.x)},
        {"dgrad", K, T, N, &op.wt.data, &op.dy.data, &op.wt.scale_inv, &op.dy.scale_inv, blk, vec, fp8_gemm_operand(op.wt),
         fp8_gemm_operand(op.dy)},
        {"wgrad", K, N, T, &op.xt.data, &op.dyt.data, &op.xt.scale_inv, &op.dyt.scale_inv, vec, vec, fp8_gemm_operand(op.xt),
         fp8_gemm_operand(op.dyt)},
        {"fprop", 128, 128, long_k, &long_fprop.w.data, &long_fprop.x.data, &long_fprop.w.scale_inv,
         &long_fprop.x.scale_inv, blk, vec, fp8_gemm_operand(long_fprop.w), fp8_gemm_operand(long_fprop.x)},
        {"wgrad", 128, 128, long_k, &long_wgrad.xt.data, &long_wgrad.dyt.data, &long_wgrad.xt.scale_inv,
         &long_wgrad.dyt.scale_inv, vec, vec, fp8_gemm_operand(long_wgrad.xt), fp8_gemm_operand(long_wgrad.dyt)},
    };
    auto bits_differing = [](const std::vector<char>& x, const std::vector<char>& y, size_t bytes) {
        long n = 0;
        for (size_t i = 0; i < bytes; i++) n += x[i] != y[i];
        return n;
    };
    for (const GemmCase& g : cases) {
        DeviceBuffer<uint8_t> a(*g.a), b(*g.b);
        DeviceBuffer<float> sa(*g.sa), sb(*g.sb);
        const size_t count = (size_t)g.m * g.n;
        std::vector<float> prior(count);  // what an accumulating GEMM adds onto
        for (size_t i = 0; i < count; i++) prior[i] = hash_uniform((uint32_t)i, 91) * 64.0f;
        std::vector<float> cpu(count), cpu_acc(prior), abs_dot(count);
        fp8_gemm_nt_ref(g.cpu_b, g.cpu_a, cpu.data(), false);
        fp8_gemm_nt_ref(g.cpu_b, g.cpu_a, cpu_acc.data(), true);
        fp8_gemm_nt_ref(absolute(g.cpu_b), absolute(g.cpu_a), abs_dot.data(), false);
        for (int variant = 0; variant < 3; variant++) {  // BF16 D, FP32 D, FP32 D accumulated
            const GemmOut out = variant == 0 ? GemmOut::BF16 : GemmOut::F32;
            const bool accumulate = variant == 2;
            const size_t bytes = count * (out == GemmOut::F32 ? 4 : 2);
            DeviceBuffer<char> own(count * 4), lt(count * 4);
            for (DeviceBuffer<char>* d : {&own, &lt}) {
                if (accumulate) CUDA_CHECK(cudaMemcpy(d->ptr, prior.data(), bytes, cudaMemcpyHostToDevice));
                else d->poison();
            }
#ifdef FP8RL_EMU
            emu::start_stats();
#endif
            runner.fp8(g.name, g.m, g.n, g.k, a.ptr, sa.ptr, g.ma, b.ptr, sb.ptr, g.mb, own.ptr, out, 0, accumulate,
                       Fp8GemmKernel::Own);
#ifdef FP8RL_EMU
            emu::stop_stats();
            const emu::RangeStats counted = emu::total_stats();
            const auto launches = counted.kernels.find("fp8_block_gemm_kernel");
            CHECK_MSG(counted.gemm_calls == 0 && launches != counted.kernels.end() && launches->second == 1,
                      "%s: the own kernel's path made %llu cuBLASLt calls and %llu fp8_block_gemm_kernel launches", g.name,
                      (unsigned long long)counted.gemm_calls,
                      (unsigned long long)(launches == counted.kernels.end() ? 0 : launches->second));
#endif
            runner.fp8(g.name, g.m, g.n, g.k, a.ptr, sa.ptr, g.ma, b.ptr, sb.ptr, g.mb, lt.ptr, out, 0, accumulate,
                       Fp8GemmKernel::Cublaslt);
            const std::string label = strfmt("own %s m=%d n=%d k=%d %s%s", g.name, g.m, g.n, g.k,
                                             out == GemmOut::BF16 ? "BF16" : "FP32", accumulate ? " accumulated" : "");
            const std::vector<float> own_values = download_output(own, count, out);
            const std::vector<float>& want = accumulate ? cpu_acc : cpu;  // the prior adds no product error
            const long bad = count_outside_tolerance(own_values, want, abs_dot, out == GemmOut::BF16, label);
            CHECK_MSG(bad == 0, "%s: %ld elements outside tolerance", label.c_str(), bad);
            if (emulated) {
                const long vs_lt = bits_differing(own.download(), lt.download(), bytes);
                long vs_cpu = 0;
                for (size_t i = 0; i < count; i++) {
                    const float c = out == GemmOut::BF16 ? round_bf16(want[i]) : want[i];
                    vs_cpu += memcmp(&own_values[i], &c, sizeof(float)) != 0;
                }
                printf("    %-52s bytes differing from cuBLASLt's path %ld, values from the CPU oracle %ld\n", label.c_str(),
                       vs_lt, vs_cpu);
                CHECK_MSG(vs_lt == 0 && vs_cpu == 0, "%s: not bit for bit in emulation", label.c_str());
            }
        }
    }
#ifdef FP8RL_EMU
    // k = 64: not whole 128-blocks of k, so cuBLASLt runs it
    DeviceBuffer<uint8_t> a(128 * 64), b(128 * 64);
    DeviceBuffer<float> s(1024);
    DeviceBuffer<char> d(128 * 128 * 4);
    CUDA_CHECK(cudaMemset(a.ptr, 0x38, 128 * 64)), CUDA_CHECK(cudaMemset(b.ptr, 0x38, 128 * 64));
    CUDA_CHECK(cudaMemset(s.ptr, 0, 1024 * sizeof(float)));
    emu::start_stats();
    runner.fp8("narrow", 128, 128, 64, a.ptr, s.ptr, Fp8ScaleMode::VEC128, b.ptr, s.ptr, Fp8ScaleMode::VEC128, d.ptr,
               GemmOut::F32, 0, false, Fp8GemmKernel::Own);
    emu::stop_stats();
    CHECK_EQ(emu::total_stats().gemm_calls, (uint64_t)1);
#endif
}

TEST(gpu_fp8_gemm_rejects_bad_shapes) {
    REQUIRE_FP8_BLOCK_GEMM();
    GemmRunner runner;
    DeviceBuffer<uint8_t> a(64 * 130), b(64 * 130);
    DeviceBuffer<float> s(1024);
    DeviceBuffer<char> d(64 * 64 * 4);
    CHECK_THROWS(runner.fp8("fprop", 64, 63, 128, a.ptr, s.ptr, Fp8ScaleMode::BLK128x128, b.ptr, s.ptr,
                            Fp8ScaleMode::VEC128, d.ptr, GemmOut::BF16, 0),
                 "FP8 GEMM fprop (m=64 n=63 k=128");
    CHECK_THROWS(runner.fp8("wgrad", 64, 64, 120, a.ptr, s.ptr, Fp8ScaleMode::VEC128, b.ptr, s.ptr,
                            Fp8ScaleMode::VEC128, d.ptr, GemmOut::BF16, 0),
                 "k a multiple of 16");
    CHECK_THROWS(runner.fp8("x", 64, 64, 128, a.ptr, s.ptr, Fp8ScaleMode::BLK128x128, b.ptr, s.ptr,
                            Fp8ScaleMode::BLK128x128, d.ptr, GemmOut::BF16, 0),
                 "no BLK128x128 x BLK128x128");
}

// The CPU product of the BF16 test's operands in layout `ops` (a and b as stored, see GemmOps):
// D [n][m] = B [n][k] . A [m][k]^T (TN), B [n][k] . A [k][m] (NN), B [k][n]^T . A [k][m] (NT).
static std::vector<float> cpu_product(GemmOps ops, int m, int n, int k, const std::vector<float>& a,
                                      const std::vector<float>& b) {
    std::vector<float> d((size_t)m * n);
    if (ops == GemmOps::TN) gemm_nt(n, m, k, b.data(), k, a.data(), k, d.data(), m, false);
    if (ops == GemmOps::NN) gemm_nn(n, m, k, b.data(), k, a.data(), m, d.data(), m, false);
    if (ops == GemmOps::NT) gemm_tn(n, m, k, b.data(), n, a.data(), m, d.data(), m, false);
    return d;
}

TEST(gpu_bf16_gemm_matches_cpu) {
    REQUIRE_GPU();
    const int M = harness::sanitized ? 128 : 256, N = harness::sanitized ? 128 : 384, K = 640;
    const char* names[] = {"TN", "NN", "NT"};
    GemmRunner runner;
    for (GemmOps ops : {GemmOps::TN, GemmOps::NN, GemmOps::NT}) {
        // a holds m x k values and b n x k values in every layout; only how they are read differs
        std::vector<float> a = varied_data(ops == GemmOps::TN ? M : K, ops == GemmOps::TN ? K : M, 31);
        std::vector<float> b = varied_data(ops == GemmOps::NT ? K : N, ops == GemmOps::NT ? N : K, 32);
        for (auto* v : {&a, &b})
            for (float& e : *v)
                if (!std::isfinite(e)) e = 1.0f;
        DeviceBuffer<__nv_bfloat16> da(to_bf16(a)), db(to_bf16(b));
        std::vector<float> aa(a.size()), ab(b.size());
        for (size_t i = 0; i < a.size(); i++) aa[i] = std::fabs(a[i]);
        for (size_t i = 0; i < b.size(); i++) ab[i] = std::fabs(b[i]);
        std::vector<float> cpu = cpu_product(ops, M, N, K, a, b), abs_dot = cpu_product(ops, M, N, K, aa, ab);
        for (GemmOut out : {GemmOut::BF16, GemmOut::F32}) {
            DeviceBuffer<char> d((size_t)M * N * 4);
            d.poison();
            runner.bf16("bf16 test", M, N, K, da.ptr, db.ptr, d.ptr, out, 0, ops);
            std::vector<float> gpu = download_output(d, (size_t)M * N, out);
            // BF16 products are exact in FP32 and the tensor cores accumulate BF16 in FP32: the 2^-9
            // sum|ab| term of the FP8 tolerance is generous here too.
            long bad = count_outside_tolerance(gpu, cpu, abs_dot, out == GemmOut::BF16,
                                               strfmt("bf16 %s m=%d n=%d k=%d %s out", names[(int)ops], M, N, K,
                                                      out == GemmOut::BF16 ? "BF16" : "FP32"));
            CHECK_EQ(bad, 0L);
        }
        // accumulate: D = 0.5 + product, on an FP32 D that starts at 0.5
        DeviceBuffer<float> d(std::vector<float>((size_t)M * N, 0.5f));
        runner.bf16("bf16 accumulate", M, N, K, da.ptr, db.ptr, d.ptr, GemmOut::F32, 0, ops, true);
        std::vector<float> gpu = d.download(), want(cpu);
        for (float& w : want) w += 0.5f;
        for (float& t : abs_dot) t += 0.5f;
        CHECK_EQ(count_outside_tolerance(gpu, want, abs_dot, false, strfmt("bf16 %s accumulate into FP32", names[(int)ops])), 0L);
    }
    DeviceBuffer<__nv_bfloat16> x(64 * 64);
    DeviceBuffer<char> d(64 * 64 * 4);
    CHECK_THROWS(runner.bf16("nt", 64, 60, 64, x.ptr, x.ptr, d.ptr, GemmOut::F32, 0, GemmOps::NT), "m, k and n must be multiples of 8");
    CHECK_THROWS(runner.bf16("acc", 64, 64, 64, x.ptr, x.ptr, d.ptr, GemmOut::BF16, 0, GemmOps::TN, true), "needs an FP32 output");
}
