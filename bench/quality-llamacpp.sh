#!/usr/bin/env bash
# Perplexity side by side with llama.cpp's `llama-perplexity` (issue 26): is our `fast` numerics
# mode no further from `exact` than llama.cpp itself is, on the same model and text? Not part of
# CI: the first run builds llama.cpp (~10 minutes on 2 cores).
#
#   bench/quality-llamacpp.sh                 # the default model (SmolLM2 Q4_1)
#   bench/quality-llamacpp.sh gemma3-270m     # a scripts/fetch-model name or a GGUF path
#
# 1. `llama-perplexity -c WINDOW -b WINDOW` on the text (llama.cpp 0.3.36 from the sdist, as
#    bench/compare-llamacpp.sh builds it): llama.cpp cuts the text into WINDOW-token chunks, puts
#    BOS over each chunk's first token when the model asks for one, and scores the second half of
#    each chunk.
# 2. `bench quality --layout llama-perplexity` with `exact` as baseline and `fast` as candidate:
#    the same chunks and the same scored tokens (tools/src/quality/text.rs), in-process.
# 3. Prints both perplexities and their distance from our `exact`: the issue's target is
#    |fast - exact| <= |llama.cpp - exact|.
#
# Environment: THREADS (default: nproc), WINDOW (default 512), TEXT (default the shipped
# Pride and Prejudice chapters), LLAMACPP_VERSION (default 0.3.36), RESULTS (the folder for the
# logs and our JSON; default .cache/llamacpp-VERSION/quality-MODEL-TIME). Exit status: 0 when both ran
# (whether the target holds is printed, not the status), 2 for a missing model.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

threads="${THREADS:-$(nproc)}"
window="${WINDOW:-512}"
text="${TEXT:-fixtures/pride-and-prejudice-ch1-12.txt}"
model="${1:-}"
if [[ -z "$model" ]]; then
  model=$(scripts/fetch-model | tail -n 1)
elif [[ ! -f "$model" ]]; then
  model=$(scripts/fetch-model "$model" | tail -n 1)
fi
[[ -f "$model" ]] || { echo "quality-llamacpp: model $model not found" >&2; exit 2; }

# shellcheck source=bench/llamacpp-build.sh
source "$root/bench/llamacpp-build.sh"
llamacpp_build llama-perplexity
perplexity=$(llamacpp_bin llama-perplexity)
cargo build --release -q -p tools --bin bench

out="${RESULTS:-$llamacpp_cache/quality-$(basename "$model" .gguf)-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
echo "model: $model; text: $text; window: $window; threads: $threads"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1)"

"$perplexity" -m "$model" -f "$text" -c "$window" -b "$window" -t "$threads" >"$out/llama.log" 2>&1 ||
  { cat "$out/llama.log" >&2; exit 1; }
llama_ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$out/llama.log")
llama_chunks=$(sed -n 's/.*calculating perplexity over \([0-9]*\) chunks.*/\1/p' "$out/llama.log")
[[ -n "$llama_ppl" ]] || { cat "$out/llama.log" >&2; echo "quality-llamacpp: no final estimate" >&2; exit 1; }

target/release/bench quality --model "$model" --text "$text" --window "$window" \
  --layout llama-perplexity --threads "$threads" --json "$out/ours.json" >"$out/ours.txt"
cat "$out/ours.txt"

python3 - "$out/ours.json" "$llama_ppl" "$llama_chunks" <<'EOF'
import json, math, sys
ours = json.load(open(sys.argv[1]))
llama, chunks = float(sys.argv[2]), int(sys.argv[3])
s = ours  # the report's JSON: the run's and the summary's fields at the top level
exact = math.exp(s["mean_nll_baseline"])
fast = math.exp(s["mean_nll_candidate"])
windows = ours["windows"]
print()
print(f"chunks: llama-perplexity {chunks}, ours {windows}" + ("" if chunks == windows else "  (DIFFERENT: the tokenizations differ)"))
print(f"{'run':<28} {'perplexity':>10} {'vs our exact':>13}")
print(f"{'ours, exact':<28} {exact:>10.4f} {'':>13}")
print(f"{'ours, fast':<28} {fast:>10.4f} {100 * (fast / exact - 1):>+12.3f}%")
print(f"{'llama.cpp llama-perplexity':<28} {llama:>10.4f} {100 * (llama / exact - 1):>+12.3f}%")
held = abs(fast - exact) <= abs(llama - exact)
print(f"target |fast - exact| <= |llama.cpp - exact|: {'met' if held else 'MISSED'}")
EOF
