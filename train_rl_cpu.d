train_rl_cpu: train_rl_cpu.cpp rl/args.h rl/common.h
rl/args.h:
rl/common.h:
