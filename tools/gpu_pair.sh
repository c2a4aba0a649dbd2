#!/bin/bash
# The Qwen2.5-Coder 1.5B + 0.5B pair on a lent GPU: the GPU rows of structured output's goals, in their order, in one
# call. Set up by ../shared/gpu/README.md (the CUDA build, the wheels) and the pair's pieces (../shared/gpu/pair.sh),
# then from the project root:
#   source $HOME/g/device-env.sh && eval "$(bash ../shared/gpu/pair.sh join)" && bash tools/gpu_pair.sh
# Outputs go to ${OUT:-gpu-out}/. Each step is cut to its time and the next runs whatever it did.
#   0. The pair where `--profile qwen2.5-coder-1.5b` finds it: linked into the models folder and verified offline
#      (`localspec pull` hashes a file put there by hand: ~3 s, no network).
#   1. bench, one sequence: the pair with its draft (auto, draft:k3) ÷ target-only, code-boilerplate's first 6
#      prompts, ${TOKENS:-96} tokens, 2 repeats (the lossless check classifies every divergence by this device's margin).
#   2. serve with the pair ÷ llama-server at its best (plain, its n-gram, -md the 0.5B), 1 and 8 clients, code items.
#   3. If time is left: constrained ÷ constrained target-only on the pair (bench --suite extract-json).
# A dry run on a CPU (small and slow, for the flow only): TOKENS=8 CLIENTS=1 STEPS=1 bash tools/gpu_pair.sh
set -u
O=${OUT:-gpu-out}
mkdir -p "$O"
B=${B:-.venv/bin}
PY=${PY:-python3}
: "${TARGET:?the pair first: eval \"\$(bash ../shared/gpu/pair.sh join)\"}" "${DRAFT:?the pair first}"
export LOCALSPEC_HISTORY=off
M=$("$PY" -c 'from localspec.paths import models_dir; print(models_dir())')
mkdir -p "$M"
for pair in "$TARGET:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" "$DRAFT:qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"; do
    [ -e "$M/${pair#*:}" ] || ln -s "$(realpath "${pair%%:*}")" "$M/${pair#*:}"
done
HF_HUB_OFFLINE=1 "$PY" -m localspec pull qwen2.5-coder-1.5b 2>&1 | tr '\r' '\n' | grep -v verifying | tee "$O/pull.txt"
head -6 localspec/bench_suites/code-boilerplate.jsonl > "$O/code6.jsonl"
P=(--profile qwen2.5-coder-1.5b)
echo "== 1. the pair with its draft, one sequence" | tee "$O/bench-pair.txt"
timeout 150 "$PY" -m localspec bench "${P[@]}" --suite "$O/code6.jsonl" --drafters none,auto,draft:k3 --repeat 2 \
    --max-tokens "${TOKENS:-96}" 2>&1 | tee -a "$O/bench-pair.txt" | tail -n 25
[ "${STEPS:-3}" -ge 2 ] || exit 0
# llama-server with every layer on the GPU, its draft's too where it has one
W=$O/llama-server-gpu
printf '#!/bin/bash\nd=(); [[ " $* " == *" --model-draft "* ]] && d=(-ngld 99)\nexec %q -ngl 99 "${d[@]}" "$@"\n' \
    "$(realpath "$B/llama-server")" > "$W" && chmod +x "$W"
echo "== 2. serve with the pair against llama-server" | tee "$O/serve-pair.txt"
timeout 240 "$PY" tools/serve_load.py "${P[@]}" --suite code-boilerplate --items --clients "${CLIENTS:-1,8}" \
    --requests 2 --max-tokens 64 --servers localspec,llama-server,llama-server-ngram,llama-server-draft \
    --llama-server "$W" 2>&1 | tee -a "$O/serve-pair.txt" | tail -n 20
[ "${STEPS:-3}" -ge 3 ] || exit 0
echo "== 3. the pair under JSON schemas" | tee "$O/bench-pair-schemas.txt"
timeout 120 "$PY" -m localspec bench "${P[@]}" --suite extract-json --drafters none,auto --repeat 1 \
    --max-tokens "${TOKENS:-64}" 2>&1 | tee -a "$O/bench-pair-schemas.txt" | tail -n 20
