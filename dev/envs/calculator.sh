#!/bin/sh
# calculator.sh: runs calculator.awk (with dev/rewards/json_lines.awk) as an --env_cmd worker:
#   --env_cmd "sh dev/envs/calculator.sh"
# mawk reads its input in blocks unless given -W interactive (see dev/rewards/exact_match.sh).
dir=$(dirname "$0")
export LC_ALL=C
lib="$dir/../rewards/json_lines.awk"
if awk -W version 2>/dev/null | grep -q mawk; then exec awk -W interactive -f "$lib" -f "$dir/calculator.awk"; fi
exec awk -f "$lib" -f "$dir/calculator.awk"
