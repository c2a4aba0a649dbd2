#!/bin/bash
# Structured output on a lent GPU, set up by ../shared/gpu/README.md (after `source $HOME/g/device-env.sh`), from the
# project root; outputs go to ${OUT:-gpu-out}/. Each step is cut to its time and the next runs whatever it did.
#   1. tools/structured_ab.py: constrained / constrained target-only / free, one sequence, the extract-json suite
#      (3 rounds, modes interleaved): the GPU goal "constrained ÷ unconstrained tok/s ≥ 0.95x".
#   2. (BENCH=1) bench --suite extract-json: none, auto and ngram:k7 under each row's schema (its lossless check
#      classifies every divergence by this device's margin).
#   3. serve with response_format (each item's schema) at CLIENTS (8) clients, against llama-server at its best
#      (-ngl 99, sampling in its graph) given the same json_schema (SERVERS=…,llama-server-ngram: with its n-gram).
#   4. The structured-output tests on the CUDA build.
set -u
O=${OUT:-gpu-out}
mkdir -p "$O"
B=${B:-.venv/bin}
timeout 110 python3 tools/structured_ab.py --rounds ${ROUNDS:-2} --gpu-layers -1 --json "$O/structured-ab.json" 2>&1 \
    | tee "$O/structured-ab.txt"
[ "${BENCH:-0}" = 1 ] && timeout 110 python3 -m localspec bench --suite extract-json --drafters none,auto \
    --repeat 1 2>&1 | tee "$O/bench-extract-json.txt" | tail -n 40
W=$O/llama-server-ngl
printf '#!/bin/bash\nexec %q -ngl 99 "$@"\n' "$B/llama-server" > "$W" && chmod +x "$W"
timeout 140 python3 tools/serve_load.py --suite extract-json --items --schemas --clients ${CLIENTS:-8} --requests 4 \
    --max-tokens 48 --servers ${SERVERS:-localspec,llama-server} --llama-server "$W" 2>&1 \
    | tee "$O/serve-schemas.txt" | tail -n 30
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 60 python3 -m pytest -q -x tests/test_structured.py -p no:cacheprovider \
    2>&1 | tail -n 15 | tee "$O/pytest-structured.txt"
