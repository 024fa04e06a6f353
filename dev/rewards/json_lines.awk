# json_lines.awk: what the awk workers of dev/rewards/ and dev/envs/ share: a JSON string's value
# (json_string, field), Python's str.strip() (strip) and a JSON string literal (quote). Load it
# before the worker: awk -f dev/rewards/json_lines.awk -f WORKER.awk. LC_ALL=C: bytes, not characters.

# The JSON string value that starts at s[i] (just after its opening quote), unescaped.
function json_string(s, i,    out, c, e, cp, lo) {
    out = ""
    while (i <= length(s)) {
        c = substr(s, i, 1)
        if (c == "\"") return out
        if (c != "\\") { out = out c; i++; continue }
        e = substr(s, i + 1, 1)
        if (e == "u") {
            cp = hex(substr(s, i + 2, 4)); i += 6
            if (cp >= 55296 && cp < 56320 && substr(s, i, 2) == "\\u") {  # a surrogate pair
                lo = hex(substr(s, i + 2, 4)); i += 6
                cp = 65536 + (cp - 55296) * 1024 + (lo - 56320)
            }
            out = out utf8(cp); continue
        }
        if (e == "n") out = out "\n"; else if (e == "t") out = out "\t"; else if (e == "r") out = out "\r"
        else if (e == "b") out = out "\b"; else if (e == "f") out = out "\f"; else out = out e
        i += 2
    }
    return out
}
function hex(h,    v, k) {
    v = 0
    for (k = 1; k <= 4; k++) v = v * 16 + index("0123456789abcdef", tolower(substr(h, k, 1))) - 1
    return v
}
function utf8(cp) {
    if (cp < 128) return sprintf("%c", cp)
    if (cp < 2048) return sprintf("%c%c", 192 + int(cp / 64), 128 + cp % 64)
    if (cp < 65536) return sprintf("%c%c%c", 224 + int(cp / 4096), 128 + int(cp / 64) % 64, 128 + cp % 64)
    return sprintf("%c%c%c%c", 240 + int(cp / 262144), 128 + int(cp / 4096) % 64, 128 + int(cp / 64) % 64, 128 + cp % 64)
}
# The value of "key" when it is a string; null when it is null.
function field(s, key,    at) {
    at = index(s, "\"" key "\":")
    if (at == 0) return null
    at += length(key) + 3
    if (substr(s, at, 1) != "\"") return null
    return json_string(s, at + 1)
}
# Bytes of the Python whitespace character at the start (or the end) of s, 0 if none.
function space_len(s, at_end,    n, piece) {
    for (n = 1; n <= 3; n++) {
        piece = at_end ? substr(s, length(s) - n + 1) : substr(s, 1, n)
        if (length(s) >= n && (piece in SPACE) && SPACE[piece] == n) return n
    }
    return 0
}
function strip(s,    n) {
    while ((n = space_len(s, 0)) > 0) s = substr(s, n + 1)
    while ((n = space_len(s, 1)) > 0) s = substr(s, 1, length(s) - n)
    return s
}
function quote(s,    out, k, c, o) {
    out = "\""
    for (k = 1; k <= length(s); k++) {
        c = substr(s, k, 1)
        if (c == "\"" || c == "\\") out = out "\\" c
        else if (c == "\n") out = out "\\n"
        else if (c == "\r") out = out "\\r"
        else if (c == "\t") out = out "\\t"
        else if ((o = ORD[c]) < 32) out = out sprintf("\\u%04x", o)
        else out = out c
    }
    return out "\""
}
BEGIN {
    null = ""
    for (k = 1; k < 256; k++) ORD[sprintf("%c", k)] = k
    # str.isspace(): \t\n\v\f\r, \x1c-\x1f, space, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028,
    # U+2029, U+202F, U+205F, U+3000 (as UTF-8 bytes)
    split("9 10 11 12 13 28 29 30 31 32", ascii, " ")
    for (k in ascii) SPACE[sprintf("%c", ascii[k])] = 1
    SPACE[utf8(133)] = 2; SPACE[utf8(160)] = 2
    SPACE[utf8(5760)] = 3; for (k = 8192; k <= 8202; k++) SPACE[utf8(k)] = 3
    SPACE[utf8(8232)] = 3; SPACE[utf8(8233)] = 3; SPACE[utf8(8239)] = 3; SPACE[utf8(8287)] = 3; SPACE[utf8(12288)] = 3
}
