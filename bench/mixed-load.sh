#!/usr/bin/env bash
# Head-of-line blocking check through the router (issue 12): a long prompt arrives while short streams
# decode, and a short request arrives shortly after it. Not part of CI (minutes on 2 cores).
#
#   bench/mixed-load.sh                      # defaults below
#   LONG_TOKENS=6000 STREAMS=8 DELAY_S=2 bench/mixed-load.sh
#   WORKER_ARGS="--long-prefill-token-threshold 128" bench/mixed-load.sh
#
# 1. Starts a worker (the default model, or SMOLLM_MODEL) and a router on free 127.0.0.1 ports.
# 2. `bench` runs STREAMS (8) streaming requests of 16 prompt tokens and DECODE_TOKENS (300) new
#    tokens; once they decode, a LONG_TOKENS (6000)-token prompt is sent (1 new token); DELAY_S (2)
#    seconds later a 16-token request with 16 new tokens.
# 3. Prints: the short request's time to first token (target: under 1 s), the long prompt's time to
#    first token (its prefill rate), and the largest inter-token gap of the decoding streams, with
#    their p50 ITL. The raw `bench` JSON files stay in the results folder it names.
#
# Environment: THREADS (default: nproc), LONG_TOKENS, STREAMS, DECODE_TOKENS, DELAY_S, WORKER_ARGS,
# SMOLLM_MODEL, RESULTS (folder; default a new one under .cache/bench-results/).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

threads="${THREADS:-$(nproc)}"
long_tokens="${LONG_TOKENS:-6000}"
streams="${STREAMS:-8}"
decode_tokens="${DECODE_TOKENS:-300}"
delay_s="${DELAY_S:-2}"
model="${SMOLLM_MODEL:-$(scripts/fetch-model | tail -n1)}"
out="${RESULTS:-$root/.cache/bench-results/mixed-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"

cargo build --release --locked --bins >&2
bin="$root/target/release"

bench_name=mixed-load
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

wport=$(free_port); rport=$(free_port)
# shellcheck disable=SC2086 # WORKER_ARGS is a list of flags
"$bin/worker" --threads "$threads" --model "$model" --listen "127.0.0.1:$wport" ${WORKER_ARGS:-} \
  >"$out/worker.log" 2>&1 &
pids+=($!)
wait_for "$out/worker.log" "worker ready" "${pids[-1]}"
"$bin/router" --workers "127.0.0.1:$wport" --listen "127.0.0.1:$rport" >"$out/router.log" 2>&1 &
pids+=($!)
wait_for "$out/router.log" "router ready" "${pids[-1]}"

common=(--router "127.0.0.1:$rport" --warmup 0 --ignore-eos true --timeout-secs 900)
"$bin/bench" "${common[@]}" --requests "$streams" --concurrency "$streams" --prompt-tokens 16 \
  --max-new-tokens "$decode_tokens" --seed 1 --json "$out/streams.json" --label streams \
  >"$out/streams.txt" 2>&1 &
streams_pid=$!
sleep 3 # the streams are admitted and decoding
"$bin/bench" "${common[@]}" --requests 1 --concurrency 1 --prompt-tokens "$long_tokens" \
  --max-new-tokens 1 --seed 2 --json "$out/long.json" --label long >"$out/long.txt" 2>&1 &
long_pid=$!
# The long prompt is tokenized and fitted by the tool before it is sent; wait until it is sent.
sleep "$delay_s"
"$bin/bench" "${common[@]}" --requests 1 --concurrency 1 --prompt-tokens 16 --max-new-tokens 16 \
  --seed 3 --json "$out/short.json" --label short >"$out/short.txt" 2>&1
wait "$long_pid" "$streams_pid"

python3 - "$out" "$long_tokens" "$streams" "$delay_s" <<'PY'
import json, pathlib, sys
out, long_tokens, streams, delay = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
load = lambda name: json.loads((out / f"{name}.json").read_text())
short, long_, st = load("short"), load("long"), load("streams")
s_ttft = short["requests"][0]["ttft_ms"]
l_rec = long_["requests"][0]
long_start = long_["started_unix_ms"] + l_rec["sent_at_ms"]
long_end = long_start + (l_rec["ttft_ms"] or 0)
print(f"results: {out}")
print(f"| metric | value |")
print(f"|---|---|")
print(f"| short request (16 tokens, sent {delay} s after the long prompt) TTFT | {s_ttft:.0f} ms |")
print(f"| long prompt ({long_tokens} tokens) TTFT | {l_rec['ttft_ms']:.0f} ms ({long_tokens / l_rec['ttft_ms'] * 1000:.0f} prompt tok/s) |")
print(f"| {streams} decoding streams: largest inter-token gap | {st['summary']['itl_ms']['max']:.0f} ms |")
print(f"| {streams} decoding streams: ITL p50 | {st['summary']['itl_ms']['p50']:.1f} ms |")
short_sent = short["started_unix_ms"] + short["requests"][0]["sent_at_ms"]
print(f"| short request's first token before the long prompt's | {'yes' if short_sent + s_ttft < long_end else 'no'} |")
PY
