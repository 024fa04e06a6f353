// reward.h: the verifier of each task, chosen by name. Tasks: gsm8k (strict "####"),
// gsm8k_flexible (last number), math (\boxed{}, reward 1/0), dapo (Answer: line, reward +1/-1),
// countdown, and the synthetic add, reverse, sort, copy (tasks.h).
#pragma once
#include <string>

#include "rl/common.h"
#include "rl/tasks/reward_countdown.h"
#include "rl/tasks/reward_gsm8k.h"
#include "rl/tasks/reward_math.h"
#include "rl/tasks/reward_text.h"
#include "rl/tasks/tasks.h"

namespace fp8rl {

constexpr const char* reward_task_names = "gsm8k, gsm8k_flexible, math, dapo, countdown, add, reverse, sort, copy";

// Scores one response against its ground truth; an unknown task or a malformed countdown answer
// is an Error.
inline Verdict score_response(const std::string& task, const std::string& response, const std::string& answer) {
    if (task == "gsm8k" || task == "gsm8k_flexible") return gsm8k_verdict(response, answer, task == "gsm8k_flexible");
    if (task == "math") return math_verdict(response, answer);
    if (task == "dapo") return dapo_verdict(response, answer);
    if (task == "countdown") return countdown_verdict(response, answer);
    if (is_synthetic_task(task)) return synthetic_verdict(response, answer);
    fail("unknown task '%s'; known tasks: %s", task.c_str(), reward_task_names);
}

}  // namespace fp8rl
