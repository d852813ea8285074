#!/usr/bin/env bash
# Every section scripts/device_dist_checks.sh documents in its header has its case, and the script parses.
# (Session 31's review edit removed eleven sections, `speed` among them, and nothing noticed.)
set -uo pipefail
SCRIPT=$1
bash -n "$SCRIPT" || { echo "FAIL: $SCRIPT does not parse"; exit 1; }
documented=$(grep -oP '^#   \K[a-z0-9]+(?=  +\S)' "$SCRIPT" | sort -u)
cases=$(grep -oP '^  \K[a-z0-9]+(?=\))' "$SCRIPT" | sort -u)
n=$(wc -l <<<"$documented")
[[ $n -ge 20 ]] || { echo "FAIL: found only $n documented sections (has the header's format changed?)"; exit 1; }
missing=$(comm -23 <(echo "$documented") <(echo "$cases"))
[[ -z $missing ]] || { echo "FAIL: documented but without a case: $(echo $missing)"; exit 1; }
echo "ok: $n documented sections, each with its case"
