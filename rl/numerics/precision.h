// precision.h: the arithmetic a CPU-engine call emulates (DESIGN.md §3), chosen per call.
//   fp32: plain FP32 everywhere (the high-precision reference).
//   bf16: weights read by GEMMs and activations between kernels rounded to BF16, FP32 math inside.
//   fp8:  as bf16, and the linear layers' GEMMs run through the emulated blockwise FP8 GEMM.
// The same three names choose the KV cache's storage.
#pragma once
#include <string>

#include "rl/common.h"

namespace fp8rl {

enum class Precision { FP32, BF16, FP8 };

inline const char* precision_name(Precision p) { return p == Precision::FP32 ? "fp32" : p == Precision::BF16 ? "bf16" : "fp8"; }

// `what` names the flag or field in the error.
inline Precision parse_precision(const std::string& s, const char* what) {
    if (s == "fp32") return Precision::FP32;
    if (s == "bf16") return Precision::BF16;
    if (s == "fp8") return Precision::FP8;
    fail("%s %s: must be one of fp32, bf16, fp8", what, s.c_str());
}

// True when this precision stores activations (and non-FP8 GEMM weights) in BF16.
inline bool stores_bf16(Precision p) { return p != Precision::FP32; }

}  // namespace fp8rl
