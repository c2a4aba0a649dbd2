#!/usr/bin/env bash
# A new user's first `./scripts/run`, timed: a fresh clone of COMMIT (default HEAD) in a temporary folder, a fresh
# HOME (so no localspec data and no pip cache: the whole llama-cpp-python build), until the demo's first token.
#
#   bash tools/first_run.sh [COMMIT]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
commit=${1:-HEAD}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$ROOT" "$work/repo" && git -C "$work/repo" checkout -q "$commit"
mkdir "$work/home"
start=$(date +%s.%N)
cd "$work/repo"
# this machine's pip settings (index, certificates) stay; HOME and the cache are new
[ -f "$HOME/.config/pip/pip.conf" ] && export PIP_CONFIG_FILE="$HOME/.config/pip/pip.conf"
HOME="$work/home" PIP_NO_CACHE_DIR=1 XDG_CACHE_HOME="$work/home/.cache" ./scripts/run 2>"$work/stderr" | {
    head -c 1 >/dev/null
    echo "first token after $(echo "$(date +%s.%N) - $start" | bc) s ($commit: $(git -C "$work/repo" log -1 --format=%h))"
    cat >/dev/null
}
grep -E "setup: +built in|done in" "$work/stderr" || tail -n 5 "$work/stderr"
