// model_test_util.h: reading the HF reference fixtures of dev/make_model_fixtures.py in tests.
#pragma once
#include <string>
#include <vector>

#include "cpu/model.h"
#include "rl/io/safetensors.h"
#include "rl/model/weights.h"

namespace model_test {

constexpr size_t kGradSamples = 1024;  // dev/make_model_fixtures.py GRAD_SAMPLES

struct Fixture {
    fp8rl::SafetensorsFile file;
    explicit Fixture(const std::string& path) : file(path) {}

    bool has(const std::string& name) const { return file.find(name) != nullptr; }
    std::vector<float> get(const std::string& name) const {
        const fp8rl::TensorView* t = file.find(name);
        if (!t) fp8rl::fail("%s: fixture has no tensor %s; rerun dev/make_model_fixtures.py", file.path().c_str(), name.c_str());
        std::vector<float> v((size_t)t->numel);
        fp8rl::tensor_to_float(*t, v.data());
        return v;
    }
    std::vector<int32_t> ints(const std::string& name) const {
        std::vector<int32_t> out;
        for (float x : get(name)) out.push_back((int32_t)x);
        return out;
    }
    fp8rl::TokenBatch batch() const {
        std::vector<int32_t> ids = ints("ids"), off = ints("offsets");
        fp8rl::TokenBatch b;
        for (size_t s = 0; s + 1 < off.size(); s++) b.add(std::vector<int32_t>(ids.begin() + off[s], ids.begin() + off[s + 1]));
        return b;
    }
};

}  // namespace model_test
