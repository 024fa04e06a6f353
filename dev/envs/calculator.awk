# calculator.awk: the example --env_cmd environment (docs/rewards-and-tasks.md). The model may ask
# for a sum or product and get its value back as a tool observation, then answer:
#   - its turn (stripped) equals the row's "answer": done, reward 1;
#   - its turn is an expression of non-negative integers with + - * (no spaces; * before + and -):
#     not done, the observation is the expression's value (role "tool");
#   - anything else: done, reward 0.
# Past --max_turns the trajectory ends without a reward here, and the verifier of --task scores the
# whole conversation. It reads the request's fields in the order fp8rl writes them: "id" first, the
# last assistant message is the last {"role":"assistant","content":...} of "messages", then "answer".
#
#   train_rl_cpu --init tiny --task add --env_cmd "sh dev/envs/calculator.sh" --max_turns 3 --max_total_tokens 12

# The value of a product of integers ("3*4*2").
function product(t,    f, n, k, v) {
    n = split(t, f, "*")
    v = 1
    for (k = 1; k <= n; k++) v *= f[k] + 0
    return v
}
{
    if (!match($0, /^\{"id":-?[0-9]+/)) { print "not a request: " $0 > "/dev/stderr"; exit 1 }
    id = substr($0, 7, RLENGTH - 6)
    rest = $0; at = 0
    key = "{\"role\":\"assistant\",\"content\":\""
    while ((k = index(rest, key)) > 0) { at += k; rest = substr(rest, k + 1) }  # the last assistant turn
    turn = at ? strip(json_string($0, at + length(key))) : ""
    answer = field($0, "answer")
    if (turn == answer) { printf "{\"id\":%s,\"observation\":null,\"done\":true,\"reward\":1}\n", id; fflush(); next }
    if (turn !~ /^[0-9]+([-+*][0-9]+)+$/) { printf "{\"id\":%s,\"observation\":null,\"done\":true,\"reward\":0}\n", id; fflush(); next }
    # a sum of signed products, left to right
    value = 0; sign = 1; term = ""
    for (k = 1; k <= length(turn) + 1; k++) {
        c = substr(turn, k, 1)
        if (c == "+" || c == "-" || c == "") { value += sign * product(term); sign = c == "-" ? -1 : 1; term = "" }
        else term = term c
    }
    printf "{\"id\":%s,\"observation\":\"%d\",\"role\":\"tool\",\"done\":false}\n", id, value
    fflush()
}
