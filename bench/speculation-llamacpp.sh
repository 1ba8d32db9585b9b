#!/usr/bin/env bash
# Speculative decoding with a draft model side by side with llama.cpp (issue 28): llama-server with
# and without `--model-draft`, and our worker + router with `--speculation off` and `draft`, same
# target and draft files, 2 threads each, one stream, the tasks of bench/speculation.py (quote,
# story), in rounds that alternate the four servers. Prints tokens/s per stream per server and task
# (medians over rounds), and our ratio to llama.cpp's speculating server.
#
# Usage: bench/speculation-llamacpp.sh TARGET.gguf DRAFT.gguf. Env: THREADS (2), REQUESTS (8 per
# cell), MAX_NEW (96), ROUNDS (2). llama.cpp runs at its defaults for a draft model (draft-max 16,
# draft-min 0, draft-p-min 0.75: it stops drafting where the draft is unsure), repacking on.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?TARGET.gguf}; draft=${2:?DRAFT.gguf}
threads=${THREADS:-2}; requests=${REQUESTS:-8}; max_new=${MAX_NEW:-96}; rounds=${ROUNDS:-2}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}
out=$(mktemp -d); echo "speculation-llamacpp: logs and outputs in $out" >&2
bench_name=speculation-llamacpp
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
# shellcheck source=bench/llamacpp-build.sh
source "$root/bench/llamacpp-build.sh"
llamacpp_build llama-server >&2
llama_server=$(llamacpp_bin llama-server)

run_tasks() { # NAME HTTP_PORT [METRICS_PORT]
  for task in quote story; do
    python3 "$root/bench/speculation.py" --url "127.0.0.1:$2" --task "$task" --requests "$requests" \
      --concurrency 1 --max-new-tokens "$max_new" ${3:+--metrics "127.0.0.1:$3"} \
      --outputs "$out/$task-$1-$r.json" >"$out/$task-$1-$r.result"
  done
}

for r in $(seq 1 "$rounds"); do
  for server in llama llama-draft ours ours-draft; do
    case $server in
      llama*)
        port=$(free_port); extra=()
        [ "$server" = llama-draft ] && extra=(-md "$draft" -td "$threads")
        "$llama_server" -m "$target" "${extra[@]}" -t "$threads" -c 4096 --parallel 1 \
          --host 127.0.0.1 --port "$port" >"$out/$server-$r.log" 2>&1 &
        pids+=($!); spid=$!
        wait_for "$out/$server-$r.log" 'listening on\|server is listening' "$spid"
        run_tasks "$server" "$port"
        kill "$spid"; wait "$spid" 2>/dev/null || true ;;
      ours*)
        mode=off; extra=()
        [ "$server" = ours-draft ] && mode=draft && extra=(--draft-model "$draft")
        start_ours "$out/$server-$r" --threads "$threads" --model "$target" --speculation "$mode" \
          "${extra[@]}"
        run_tasks "$server" "$hport" "$mport"
        kill "$rpid" "$wpid"; wait "$rpid" "$wpid" 2>/dev/null || true ;;
    esac
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, pathlib, statistics, sys
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
servers = ["llama", "llama-draft", "ours", "ours-draft"]
print("| task | llama.cpp | llama.cpp -md | ours off | ours draft | ours draft / llama.cpp -md | ours draft outputs = ours off |")
print("|---|---|---|---|---|---|---|")
for task in ("quote", "story"):
    med = {}
    for s in servers:
        med[s] = statistics.median(json.loads((out / f"{task}-{s}-{r}.result").read_text())["tokens_per_s_per_stream"] for r in range(1, rounds + 1))
    same = all(json.loads((out / f"{task}-ours-{r}.json").read_text()) == json.loads((out / f"{task}-ours-draft-{r}.json").read_text()) for r in range(1, rounds + 1))
    print("| %s | %.1f | %.1f | %.1f | %.1f | %.2fx | %s |" % (task, med["llama"], med["llama-draft"], med["ours"], med["ours-draft"], med["ours-draft"] / med["llama-draft"], "yes" if same else "NO"))
PY
