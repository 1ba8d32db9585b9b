#!/usr/bin/env bash
# Speculative decoding side by side (issue 28): for each server of SERVERS, in rounds that alternate
# them, runs every task of bench/speculation_tasks.py (document, code, json, story) at each
# sampling (greedy, seeded) and each concurrency of STREAMS with bench/speculation.py, then prints one
# table per sampling and concurrency: decode tokens/s per stream (medians over rounds), our
# acceptance rates, the ratios to speculation off and to llama.cpp's speculating servers, and how many
# outputs equal the same engine's non-speculating output.
#
# Servers (2 threads each by default, same target model; ours with `--kv-cache-mib $KV_MIB`):
#   ours-off, ours-ngram, ours-draft        worker + router with --speculation off|ngram|draft
#   llama, llama-ngram, llama-draft         llama-server 0.3.36: plain; $LLAMA_NGRAM
#                                           (default "--spec-type ngram-simple": its defaults); -md DRAFT at its
#                                           defaults. Repacking on, --parallel = the concurrency.
#
# Usage: bench/speculation.sh [TARGET.gguf] (default: the fetched SmolLM2 Q4_1). Env:
#   SERVERS   (default "ours-off ours-ngram", plus ours-draft with DRAFT_MODEL)
#   DRAFT_MODEL (the draft's file, for ours-draft and llama-draft), TASKS ("document code json
#   story"), SAMPLINGS ("greedy seeded"), STREAMS ("1 32"), REQUESTS (22 per cell at 1 stream; at
#   N > 1 streams max(REQUESTS, N)), MAX_NEW (128), ROUNDS (1), THREADS (2), KV_MIB (4096),
#   NUMERICS (exact), LLAMA_NGRAM (llama-server's n-gram arguments), OUT (the output folder; default a
#   new temporary one; a later run may add servers to it, then the tables cover them all).
# bench/speculation-llamacpp.sh runs all six servers.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-$root/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2}; requests=${REQUESTS:-22}; max_new=${MAX_NEW:-128}; rounds=${ROUNDS:-1}
servers=${SERVERS:-ours-off ours-ngram${DRAFT_MODEL:+ ours-draft}}
tasks=${TASKS:-document code json story}; samplings=${SAMPLINGS:-greedy seeded}; streams=${STREAMS:-1 32}
bin=${BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"; echo "speculation: logs and outputs in $out" >&2
bench_name=speculation
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
case " $servers " in
  *" llama"*)
    # shellcheck source=bench/llamacpp-build.sh
    source "$root/bench/llamacpp-build.sh"
    llamacpp_build llama-server >&2
    llama_server=$(llamacpp_bin llama-server) ;;
esac

run_tasks() { # SERVER ROUND CONCURRENCY HTTP_PORT [METRICS_PORT]
  local n=$requests; [ "$3" -gt "$n" ] && n=$3
  for task in $tasks; do
    for sampling in $samplings; do
      python3 "$root/bench/speculation.py" --url "127.0.0.1:$4" --task "$task" --sampling "$sampling" \
        --requests "$n" --concurrency "$3" --max-new-tokens "$max_new" ${5:+--metrics "127.0.0.1:$5"} \
        --outputs "$out/$1-$task-$sampling-$3-$2.json" >"$out/$1-$task-$sampling-$3-$2.result"
    done
  done
}

for r in $(seq 1 "$rounds"); do
  for c in $streams; do
    for server in $servers; do
      echo "speculation: round $r, $c streams, $server" >&2
      case $server in
        llama*)
          port=$(free_port); extra=()
          case $server in
            llama-draft) extra=(-md "${DRAFT_MODEL:?DRAFT_MODEL}" -td "$threads") ;;
            # shellcheck disable=SC2206 # LLAMA_NGRAM is a list of arguments
            llama-ngram) extra=(${LLAMA_NGRAM:---spec-type ngram-simple}) ;;
          esac
          "$llama_server" -m "$target" "${extra[@]}" -t "$threads" -c $((c * 2560)) --parallel "$c" \
            --host 127.0.0.1 --port "$port" >"$out/$server-$c-$r.log" 2>&1 &
          pids+=($!); spid=$!
          wait_for "$out/$server-$c-$r.log" 'listening on\|server is listening' "$spid"
          run_tasks "$server" "$r" "$c" "$port"
          kill "$spid"; wait "$spid" 2>/dev/null || true ;;
        ours-*)
          mode=${server#ours-}; extra=()
          [ "$mode" = draft ] && extra=(--draft-model "${DRAFT_MODEL:?DRAFT_MODEL}")
          start_ours "$out/$server-$c-$r" --threads "$threads" --model "$target" --speculation "$mode" \
            --kv-cache-mib "${KV_MIB:-4096}" --numerics "${NUMERICS:-exact}" "${extra[@]}"
          run_tasks "$server" "$r" "$c" "$hport" "$mport"
          kill "$rpid" "$wpid"; wait "$rpid" "$wpid" 2>/dev/null || true ;;
        *) echo "speculation: unknown server $server" >&2; exit 2 ;;
      esac
    done
  done
done
python3 "$root/bench/speculation_report.py" "$out" "$rounds" "$tasks" "$samplings" "$streams" $servers
