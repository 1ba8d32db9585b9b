#!/usr/bin/env bash
# Structured output under load (issue 14): the 32-stream throughput with half the streams constrained
# by a JSON schema, against all unconstrained, and the worker's mask time per token. Not part of CI
# (a few minutes on 2 cores; the numbers are only meaningful on a quiet machine).
#
#   bench/structured-load.sh                  # defaults below
#   STREAMS=32 REQUESTS=128 NEW_TOKENS=128 bench/structured-load.sh
#
# 1. Starts a worker (the default model, SmolLM2-135M Q4_1, or SMOLLM_MODEL) with its metrics
#    endpoint, and a router, on free 127.0.0.1 ports.
# 2. `bench` runs REQUESTS (64) streaming requests, STREAMS (32) at a time, of PROMPT_TOKENS (32)
#    prompt tokens and NEW_TOKENS (64) new tokens, temperature 1, fixed seeds (--seed 1), twice:
#    - all unconstrained (ignore_eos, so each generates exactly NEW_TOKENS);
#    - the same requests with every second one constrained (`--constraint json-schema:...
#      --constrained-fraction 0.5`) by a small object schema (name, age, city; bounded strings).
#      Constrained requests are sent without ignore_eos (the router refuses the combination) and
#      end when their JSON is complete, usually before NEW_TOKENS; their slot then takes the next
#      request, so all STREAMS stay busy and the comparison is aggregate generated tokens/s over
#      all streams (this run also does more prefills per generated token).
#    Both runs start with WARMUP (8) unmeasured requests. With `--worker-metrics` the second run
#    reads the worker's `worker_constraint_mask_seconds` histogram before and after.
# 3. Prints generated tokens/s of both runs and their ratio (constrained run / unconstrained), the
#    constrained and unconstrained halves apart, how many constrained outputs validate, and the mask
#    time per token (mean exact; p50 / p99 estimated from the histogram's buckets by linear
#    interpolation). Writes the two `bench` JSON files and summary.json into RESULTS.
#
# Environment: THREADS (default: nproc), STREAMS, REQUESTS, PROMPT_TOKENS, NEW_TOKENS, WARMUP,
# SMOLLM_MODEL, RESULTS (folder; default a new one under .cache/bench-results/), RUN_TIMEOUT_S
# (limit on each bench run, default 150).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

threads="${THREADS:-$(nproc)}"
streams="${STREAMS:-32}"
requests="${REQUESTS:-64}"
prompt_tokens="${PROMPT_TOKENS:-32}"
new_tokens="${NEW_TOKENS:-64}"
warmup="${WARMUP:-8}"
run_timeout="${RUN_TIMEOUT_S:-150}"
model="${SMOLLM_MODEL:-$(scripts/fetch-model | tail -n1)}"
out="${RESULTS:-$root/.cache/bench-results/structured-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"

cargo build --release --locked --bins >&2
bin="$root/target/release"

bench_name=structured-load
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"

cat >"$out/schema.json" <<'JSON'
{"type": "object",
 "properties": {"name": {"type": "string", "maxLength": 24},
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "city": {"type": "string", "maxLength": 24}},
 "required": ["name", "age", "city"], "additionalProperties": false}
JSON

wport=$(free_port); mport=$(free_port); rport=$(free_port)
"$bin/worker" --threads "$threads" --model "$model" --listen "127.0.0.1:$wport" \
  --metrics-listen "127.0.0.1:$mport" >"$out/worker.log" 2>&1 &
pids+=($!)
wait_for "$out/worker.log" "worker ready" "${pids[-1]}"
"$bin/router" --workers "127.0.0.1:$wport" --listen "127.0.0.1:$rport" >"$out/router.log" 2>&1 &
pids+=($!)
wait_for "$out/router.log" "router ready" "${pids[-1]}"

common=(--router "127.0.0.1:$rport" --requests "$requests" --concurrency "$streams"
  --prompt-tokens "$prompt_tokens" --max-new-tokens "$new_tokens" --temperature 1 --seed 1
  --ignore-eos true --warmup "$warmup" --timeout-secs "$run_timeout")
echo "structured-load: $streams streams, $requests requests, all unconstrained" >&2
timeout "$run_timeout" "$bin/bench" "${common[@]}" --label unconstrained \
  --json "$out/unconstrained.json" >"$out/unconstrained.txt"
echo "structured-load: the same with half constrained" >&2
timeout "$run_timeout" "$bin/bench" "${common[@]}" --label half-constrained \
  --constraint "json-schema:$out/schema.json" --constrained-fraction 0.5 \
  --worker-metrics "127.0.0.1:$mport" --json "$out/half-constrained.json" >"$out/half-constrained.txt"

python3 - "$out" "$streams" <<'PY'
import json, pathlib, sys
out, streams = pathlib.Path(sys.argv[1]), int(sys.argv[2])
load = lambda name: json.loads((out / f"{name}.json").read_text())
plain, half = load("unconstrained"), load("half-constrained")
tps = lambda r: r["summary"]["generated_tokens_per_s"]
split, mask = half["constrained"], half["mask_time"]
fmt = lambda x, unit="": "-" if x is None else f"{x:.1f}{unit}"
ratio = tps(half) / tps(plain) if tps(plain) else None
print(f"results: {out}")
print("| metric | value |")
print("|---|---|")
print(f"| {streams} streams, all unconstrained: generated tok/s | {tps(plain):.1f} |")
print(f"| {streams} streams, half constrained: generated tok/s (all streams) | {tps(half):.1f} |")
print(f"| ratio (half constrained / unconstrained) | {'-' if ratio is None else f'{ratio:.3f}'} |")
for name in ("constrained", "unconstrained"):
    s = split[name]
    print(f"| half-constrained run, {name} requests: tokens, tok/s, TTFT p50 | "
          f"{s['generated_tokens']}, {s['generated_tokens_per_s']:.1f}, {fmt(s['ttft_ms']['p50'], ' ms')} |")
print(f"| constrained outputs valid / invalid / truncated | "
      f"{split['valid_outputs']} / {split['invalid_outputs']} / {split['truncated_outputs']} |")
print(f"| mask time per token: masks, mean | {mask['masks']}, {fmt(mask['mean_us'], ' us')} |")
print(f"| mask time per token: p50 / p99 (estimated from histogram buckets) | "
      f"{fmt(mask['p50_us'], ' us')} / {fmt(mask['p99_us'], ' us')} |")
summary = {
    "streams": streams,
    "unconstrained_tokens_per_s": tps(plain),
    "half_constrained_tokens_per_s": tps(half),
    "ratio": ratio,
    "constrained_valid_outputs": split["valid_outputs"],
    "constrained_invalid_outputs": split["invalid_outputs"],
    "constrained_truncated_outputs": split["truncated_outputs"],
    "mask_time": mask,
}
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
