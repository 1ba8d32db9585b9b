#!/usr/bin/env bash
# Speculative decoding side by side (issue 28): one worker + router with `--speculation off`, then one
# per speculating mode (`ngram`, and `draft` when DRAFT_MODEL is set), same model and threads, in one
# sitting; for each task (quote, story) and each concurrency (1, and $streams) runs
# bench/speculation.py and prints a table of tokens/s per stream, the acceptance rate and whether
# every output equals speculation off's.
#
# Usage: bench/speculation.sh [MODEL.gguf] (default: the fetched SmolLM2). Env: THREADS (default 2),
# STREAMS (default 32), REQUESTS (default 8 per cell at 1 stream, STREAMS at STREAMS), MAX_NEW (96),
# MODES (default "ngram", plus "draft" with DRAFT_MODEL), DRAFT_MODEL (the draft model's file),
# ORDER (the order the servers run in; default "off" then MODES).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$root/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2}; streams=${STREAMS:-32}; requests=${REQUESTS:-8}; max_new=${MAX_NEW:-96}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}
out=$(mktemp -d); echo "speculation: logs and outputs in $out" >&2
bench_name=speculation
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
modes=${MODES:-ngram${DRAFT_MODEL:+ draft}}
# ORDER: the order the servers run in (default off first); e.g. "draft off" to see an order effect.
for mode in ${ORDER:-off $modes}; do
  draft_args=(); [ "$mode" = draft ] && draft_args=(--draft-model "$DRAFT_MODEL")
  start_ours "$out/$mode" --threads "$threads" --model "$model" --speculation "$mode" \
    "${draft_args[@]}"
  for task in quote story; do
    for c in 1 "$streams"; do
      n=$requests; [ "$c" -gt 1 ] && n=$c
      python3 "$root/bench/speculation.py" --url "127.0.0.1:$hport" \
        --task "$task" --requests "$n" --concurrency "$c" --max-new-tokens "$max_new" \
        --metrics "127.0.0.1:$mport" --outputs "$out/$task-$c-$mode.json" >"$out/$task-$c-$mode.result"
    done
  done
  kill "$rpid" "$wpid"; wait "$rpid" "$wpid" 2>/dev/null || true
done
python3 - "$out" "$streams" $modes <<'PY'
import json, pathlib, sys
out, streams, modes = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
print("| task | streams | mode | tok/s/stream off | tok/s/stream mode | speed-up | acceptance | outputs identical |")
print("|---|---|---|---|---|---|---|---|")
for task in ("quote", "story"):
    for c in ("1", streams):
        for mode in modes:
            r = {m: json.loads((out / f"{task}-{c}-{m}.result").read_text()) for m in ("off", mode)}
            same = json.loads((out / f"{task}-{c}-off.json").read_text()) == json.loads((out / f"{task}-{c}-{mode}.json").read_text())
            off, spec = r["off"]["tokens_per_s_per_stream"], r[mode]["tokens_per_s_per_stream"]
            acc = r[mode]["acceptance_rate"]
            acc = "-" if acc is None else "%.0f%% of %d" % (100 * acc, r[mode]["draft_tokens"])
            print("| %s | %s | %s | %.1f | %.1f | %.2fx | %s | %s |" % (task, c, mode, off, spec, spec / off, acc, "yes" if same else "NO"))
PY
