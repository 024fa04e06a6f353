train_rl_cpu: train_rl_cpu.cpp rl/args.h rl/common.h rl/score.h rl/json.h \
 rl/reward.h rl/reward_countdown.h rl/reward_text.h rl/reward_digits.h \
 rl/reward_gsm8k.h rl/reward_math.h rl/tasks.h
rl/args.h:
rl/common.h:
rl/score.h:
rl/json.h:
rl/reward.h:
rl/reward_countdown.h:
rl/reward_text.h:
rl/reward_digits.h:
rl/reward_gsm8k.h:
rl/reward_math.h:
rl/tasks.h:
