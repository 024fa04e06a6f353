# exact_match.awk: a --reward_cmd worker that reimplements the built-in verifier of the synthetic
# tasks (add, reverse, sort, copy; rl/tasks/tasks.h, synthetic_verdict): the response's first line,
# stripped of whitespace as Python's str.strip() does, must equal the answer; reward 1 or 0.
# A training run with it equals the run with the built-in verifier bit for bit (test/test_reward_workers.cpp).
#
#   train_rl_cpu --init tiny --task add --reward_cmd "sh dev/rewards/exact_match.sh"
#
# Its JSON helpers are in json_lines.awk (exact_match.sh loads both).
#
# One JSON request per input line, one reply per output line, flushed at once. It reads the
# request's fields in the order fp8rl writes them ("id" first; "response" and "answer" before
# "data"), which is what lets a few lines of awk stand in for a JSON parser. LC_ALL=C: bytes, not
# characters (gawk in a UTF-8 locale would count characters).

{
    if (!match($0, /^\{"id":-?[0-9]+/)) { print "not a request: " $0 > "/dev/stderr"; exit 1 }
    id = substr($0, 7, RLENGTH - 6)
    response = field($0, "response")
    answer = field($0, "answer")
    nl = index(response, "\n")
    extracted = strip(nl ? substr(response, 1, nl - 1) : response)
    hit = extracted == answer ? 1 : 0
    printf "{\"id\":%s,\"reward\":%d,\"correct\":%d,\"extracted\":%s}\n", id, hit, hit, quote(extracted)
    fflush()
}
