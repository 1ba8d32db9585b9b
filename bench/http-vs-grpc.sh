#!/usr/bin/env bash
# What the OpenAI HTTP front adds over the gRPC front of the same router (issue 14; target: under
# 1 ms per request, and no change in tokens/s). Not part of CI (a few minutes on 2 cores; the
# numbers are only meaningful on a quiet machine).
#
#   bench/http-vs-grpc.sh                     # defaults below
#   ROUNDS=3 SEQ_REQUESTS=100 bench/http-vs-grpc.sh
#
# 1. Starts a worker (the default model, SmolLM2-135M Q4_1, or SMOLLM_MODEL) and one router with
#    both fronts (`--listen` gRPC, `--http-listen` HTTP) on free 127.0.0.1 ports.
# 2. `bench` runs the same load through each front (gRPC: `--router`; HTTP: `--openai`, streamed
#    `/v1/completions`), alternating fronts, ROUNDS (2) times each:
#    - added latency: SEQ_REQUESTS (40) requests one at a time (concurrency 1), 16-token prompts,
#      8 new tokens, greedy, ignore_eos, after 4 warmup requests;
#    - throughput: STREAM_REQUESTS (48) requests, STREAMS (16) at a time, 32-token prompts,
#      64 new tokens, greedy, ignore_eos, after 8 warmup requests.
#    TTFT runs from sending the request to the first message (gRPC) / event (HTTP) with text; E2E
#    to the end of the stream / `data: [DONE]`.
# 3. Prints, per phase, the medians over the rounds of each front's TTFT p50 and E2E p50 and their
#    difference (HTTP - gRPC, per request), and the generated tokens/s of both fronts and their
#    ratio. Writes every `bench` JSON file and summary.json into RESULTS.
#
# Environment: THREADS (default: nproc), ROUNDS, SEQ_REQUESTS, STREAM_REQUESTS, STREAMS,
# SMOLLM_MODEL, RESULTS (folder; default a new one under .cache/bench-results/), RUN_TIMEOUT_S
# (limit on each bench run, default 120).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

threads="${THREADS:-$(nproc)}"
rounds="${ROUNDS:-2}"
seq_requests="${SEQ_REQUESTS:-40}"
stream_requests="${STREAM_REQUESTS:-48}"
streams="${STREAMS:-16}"
run_timeout="${RUN_TIMEOUT_S:-120}"
model="${SMOLLM_MODEL:-$(scripts/fetch-model | tail -n1)}"
out="${RESULTS:-$root/.cache/bench-results/http-vs-grpc-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"

cargo build --release --locked --bins >&2
bin="$root/target/release"

bench_name=http-vs-grpc
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

wport=$(free_port); rport=$(free_port); hport=$(free_port)
"$bin/worker" --threads "$threads" --model "$model" --listen "127.0.0.1:$wport" \
  >"$out/worker.log" 2>&1 &
pids+=($!)
wait_for "$out/worker.log" "worker ready" "${pids[-1]}"
"$bin/router" --workers "127.0.0.1:$wport" --listen "127.0.0.1:$rport" \
  --http-listen "127.0.0.1:$hport" >"$out/router.log" 2>&1 &
pids+=($!)
wait_for "$out/router.log" "router ready" "${pids[-1]}"

declare -A front=([grpc]="--router 127.0.0.1:$rport" [http]="--openai http://127.0.0.1:$hport")
sequential=(--requests "$seq_requests" --concurrency 1 --prompt-tokens 16 --max-new-tokens 8
  --warmup 4)
streaming=(--requests "$stream_requests" --concurrency "$streams" --prompt-tokens 32
  --max-new-tokens 64 --warmup 8)
for round in $(seq 1 "$rounds"); do
  for phase in sequential streaming; do
    declare -n load="$phase"
    for f in grpc http; do
      echo "http-vs-grpc: round $round, $phase, $f" >&2
      # shellcheck disable=SC2086 # front holds a flag and its value
      timeout "$run_timeout" "$bin/bench" ${front[$f]} "${load[@]}" --temperature 0 --seed 1 \
        --ignore-eos true --timeout-secs "$run_timeout" --label "$phase $f round $round" \
        --json "$out/$phase-$f-$round.json" >"$out/$phase-$f-$round.txt"
    done
    unset -n load
  done
done

python3 - "$out" "$rounds" "$streams" <<'PY'
import json, pathlib, statistics, sys
out, rounds, streams = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def runs(phase, front):
    return [json.loads((out / f"{phase}-{front}-{r}.json").read_text())["summary"]
            for r in range(1, rounds + 1)]
med = lambda xs: statistics.median(xs)
summary = {}
print(f"results: {out} (medians over {rounds} rounds)")
print("| metric | gRPC | HTTP | HTTP - gRPC |")
print("|---|---|---|---|")
for phase, what in (("sequential", "1 stream"), (f"streaming", f"{streams} streams")):
    g, h = runs(phase, "grpc"), runs(phase, "http")
    row = {}
    for key, name in (("ttft_ms", "TTFT p50"), ("e2e_ms", "E2E p50")):
        a, b = med([s[key]["p50"] for s in g]), med([s[key]["p50"] for s in h])
        row[f"{key}_p50"] = {"grpc": a, "http": b, "http_minus_grpc": b - a}
        print(f"| {what}: {name} (ms) | {a:.2f} | {b:.2f} | {b - a:+.2f} |")
    a = med([s["generated_tokens_per_s"] for s in g])
    b = med([s["generated_tokens_per_s"] for s in h])
    row["generated_tokens_per_s"] = {"grpc": a, "http": b, "http_over_grpc": b / a if a else None}
    print(f"| {what}: generated tok/s | {a:.1f} | {b:.1f} | ratio {b / a if a else float('nan'):.3f} |")
    summary[phase] = row
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
