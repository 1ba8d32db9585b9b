#!/usr/bin/env bash
# Side by side at context depth (issue 12): this project against llama.cpp on the same GGUF and
# the same cores, in one sitting, rounds alternating between the two. Not part of CI.
#
#   bench/compare-depth.sh
#   REPEATS=1 PREFILL_DEPTHS="0 2048" DECODE_DEPTHS="0" bench/compare-depth.sh   # quicker
#
# Measures, REPEATS rounds (medians reported):
#   - prefill of one 512-token chunk after D tokens of context: `llama-bench -p 512 -n 0 -d D`
#     against our throughput report (`THROUGHPUT_PREFILL=512 THROUGHPUT_DEPTH=D`);
#   - single-stream decode of 128 tokens after D tokens of context: `llama-bench -p 0 -n 128 -d D`
#     against our throughput report (batch of 1, `THROUGHPUT_CONTEXT=D`, 128 steps).
# Depths: PREFILL_DEPTHS (default "0 2048 7680") and DECODE_DEPTHS (default "0 2048 8064"): the
# model's context is 8,192 positions and our worker refuses positions past it, so "depth 8192"
# is run as the deepest chunk that still fits (7,680 + 512, 8,064 + 128), by both engines.
#
# llama.cpp is built (once, cached in .cache/llamacpp-<version>/) by bench/compare-llamacpp.sh
# (BUILD_ONLY=1) unless its llama-bench is already there, and runs with weight repacking off (`--repack 0`), which keeps it off its AMX
# path (SIGILL / segfault on the test VMs); for Q4_1 weights repacking has no other effect.
# Our side: the context before a timed chunk is filled by prefilling its first 256 positions and
# copying their K/V blocks over the rest (see `throughput_report` in worker/tests/reference.rs);
# llama-bench computes its depth for real. Neither is timed.
#
# Environment: THREADS (default: nproc), REPEATS (default 3), LLAMACPP_VERSION (default 0.3.36),
# SMOLLM_MODEL (default: scripts/fetch-model's file), RESULTS (output folder), THROUGHPUT_NUMERICS
# (our numerics setting, `exact` by default; `fast` for the 8-bit activation kernels).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

version="${LLAMACPP_VERSION:-0.3.36}"
threads="${THREADS:-$(nproc)}"
repeats="${REPEATS:-3}"
prefill_depths="${PREFILL_DEPTHS:-0 2048 7680}"
decode_depths="${DECODE_DEPTHS:-0 2048 8064}"
cache="$root/.cache/llamacpp-$version"
out="${RESULTS:-$cache/depth-$(date -u +%Y%m%dT%H%M%SZ)}"
model="${SMOLLM_MODEL:-$(scripts/fetch-model | tail -n 1)}"
[[ -f "$model" ]] || { echo "compare-depth: model $model not found" >&2; exit 2; }
export SMOLLM_MODEL="$model"

find_bench() { find "$cache/build" -type f -name llama-bench -perm -u+x 2>/dev/null | head -n 1; }
if [[ -z "$(find_bench)" ]]; then
  BUILD_ONLY=1 LLAMACPP_VERSION="$version" "$root/bench/compare-llamacpp.sh" >/dev/null
fi
llama_bench=$(find_bench)
[[ -x "$llama_bench" ]] || { echo "compare-depth: llama-bench not built in $cache/build" >&2; exit 2; }
mkdir -p "$out"
echo "model: $model; threads: $threads; repeats: $repeats; results: $out"

cargo build --release --locked -q -p worker --tests
# Our throughput report; env assignments as arguments, its prefill/decode lines on stdout.
ours() {
  env "$@" THROUGHPUT_THREADS="$threads" \
    cargo test --release --locked -q -p worker --test reference -- --ignored --nocapture \
    throughput_report 2>&1 | grep -E '^(prefill|decode)'
}
comma() { tr ' ' ',' <<<"$1"; }

for r in $(seq 1 "$repeats"); do
  echo "--- round $r / $repeats"
  "$llama_bench" -m "$model" -t "$threads" --repack 0 -r 1 -o json \
    -p 512 -n 0 -d "$(comma "$prefill_depths")" >"$out/llama-prefill-$r.json"
  "$llama_bench" -m "$model" -t "$threads" --repack 0 -r 1 -o json \
    -p 0 -n 128 -d "$(comma "$decode_depths")" >"$out/llama-decode-$r.json"
  {
    ours THROUGHPUT_PREFILL=512 THROUGHPUT_DEPTH="$(comma "$prefill_depths")" THROUGHPUT_REPEATS=1 \
      THROUGHPUT_BATCHES=1 THROUGHPUT_CONTEXT=0 THROUGHPUT_STEPS=1 | grep '^prefill'
    for d in $decode_depths; do
      ours THROUGHPUT_PREFILL=16 THROUGHPUT_DEPTH=0 THROUGHPUT_REPEATS=1 THROUGHPUT_BATCHES=1 \
        THROUGHPUT_CONTEXT="$d" THROUGHPUT_STEPS=128 | grep '^decode' | sed "s/^decode/decode at depth $d/"
    done
  } >"$out/ours-$r.txt"
  cat "$out/ours-$r.txt"
done

python3 - "$out" "$repeats" "$prefill_depths" "$decode_depths" <<'PY'
import json, pathlib, re, statistics, sys

out, repeats = pathlib.Path(sys.argv[1]), int(sys.argv[2])
prefill_depths = [int(d) for d in sys.argv[3].split()]
decode_depths = [int(d) for d in sys.argv[4].split()]
med = lambda xs: statistics.median(xs) if xs else float("nan")

def llama(kind, depth):  # avg_ts of the row with this depth, per round
    vals = []
    for r in range(1, repeats + 1):
        for row in json.loads((out / f"llama-{kind}-{r}.json").read_text()):
            if row.get("n_depth", 0) == depth:
                vals.append(row["avg_ts"])
    return med(vals)

def ours(pattern):
    vals = []
    for r in range(1, repeats + 1):
        m = re.search(pattern, (out / f"ours-{r}.txt").read_text())
        if m:
            vals.append(float(m.group(1)))
    return med(vals)

rows = []
for d in prefill_depths:
    at = f" at depth {d}" if d else ""
    rows.append((f"prefill 512 @ {d} tok/s",
                 ours(rf"prefill 512 tokens{at}: median ([\d.]+)"), llama("prefill", d), ">= 1.5"))
for d in decode_depths:
    rows.append((f"decode 1 stream @ {d} tok/s",
                 ours(rf"decode at depth {d}, batch of 1: median [\d.]+ ms/step = ([\d.]+)"),
                 llama("decode", d), ">= 1.2"))
table = [f"{'metric':<28}{'ours':>10}{'llama.cpp':>12}{'ratio':>8}  target"]
for name, a, b, target in rows:
    table.append(f"{name:<28}{a:>10.1f}{b:>12.1f}{a / b:>8.2f}  {target}")
text = "\n".join(table) + f"\n\nmedians of {repeats} alternating rounds; ratio = ours / llama.cpp\n"
(out / "table.txt").write_text(text)
print("\n" + text)
PY
