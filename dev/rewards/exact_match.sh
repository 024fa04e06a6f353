#!/bin/sh
# exact_match.sh: runs exact_match.awk as a --reward_cmd worker:
#   --reward_cmd "sh dev/rewards/exact_match.sh"
# mawk (Debian's default awk) reads its input in blocks unless given -W interactive, and would wait
# for more requests before answering the first; gawk and busybox awk take a line as it comes.
# LC_ALL=C: the script counts bytes.
dir=$(dirname "$0")
export LC_ALL=C
if awk -W version 2>/dev/null | grep -q mawk; then exec awk -W interactive -f "$dir/json_lines.awk" -f "$dir/exact_match.awk"; fi
exec awk -f "$dir/json_lines.awk" -f "$dir/exact_match.awk"
