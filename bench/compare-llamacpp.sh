#!/usr/bin/env bash
# Side-by-side CPU comparison of this project and llama.cpp on the same GGUF and the same cores
# (issue 4). Not part of CI: the first run builds llama.cpp (~10 minutes on 2 cores).
#
#   bench/compare-llamacpp.sh            # everything, on the default model (SmolLM2 Q4_1)
#   bench/compare-llamacpp.sh gemma3-270m   # another model: a scripts/fetch-model name or a GGUF path
#   SKIP_SERVER=1 bench/compare-llamacpp.sh   # without the router / llama-server load test
#   BUILD_ONLY=1 bench/compare-llamacpp.sh    # only build llama.cpp into the cache, run nothing
#   RESULTS=<dir> SKIP_MICRO=1 bench/compare-llamacpp.sh  # only the server part, into an
#                                              # earlier run's folder (one table for both)
#
# 1. Builds llama.cpp once into .cache/llamacpp-<version>/ from the source shipped in the PyPI
#    sdist of llama-cpp-python (`pip download --no-binary llama-cpp-python --no-deps`), cmake Release,
#    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF, only the llama-bench, llama-batched-bench and
#    llama-server targets.
# 2. Runs, alternating engines, REPEATS times each (medians reported):
#    - prefill of a 512-token prompt: llama-bench pp512 vs our throughput report (one entry);
#    - single-stream decode: llama-bench tg128 vs our throughput report (batch of 1);
#    - aggregate decode at 16 and 32 streams, prompt 128 + 128 new: llama-batched-bench vs our
#      throughput report (batches of 16 / 32 with a 128-token context, 128 steps);
#    - through the servers, 64 streaming requests, 16 at a time, 16-token prompts, 64 new tokens,
#      greedy, ignore_eos: llama-server --parallel 16 (load from bench/openai_load.py) vs our
#      router + worker (load from the `bench` tool): aggregate tok/s, TTFT p50, ITL p50.
# 3. Prints one table: metric, ours, llama.cpp, ratio (ours / llama.cpp, or llama.cpp / ours for
#    latencies, so > 1 always means we are better), and the issue's target.
#
# llama.cpp runs with weight repacking off (`--repack 0` / `--no-repack`), which also keeps it off
# its AMX path: on the AMX-capable Xeon of the test VMs that path segfaults
# (ggml::cpu::amx::tensor_traits::compute_forward, llama.cpp 0.3.36 sdist); for Q4_1 weights
# repacking has no other effect.
#
# Environment: THREADS (default: nproc), REPEATS (default 3), LLAMACPP_VERSION (default 0.3.36),
# SMOLLM_MODEL (default: scripts/fetch-model's file), NUMERICS (default `exact`: our numerics
# settings, space-separated, e.g. "fast exact"; each runs in every round and gets its own rows, and
# the server part runs the first).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

version="${LLAMACPP_VERSION:-0.3.36}"
threads="${THREADS:-$(nproc)}"
repeats="${REPEATS:-3}"
cache="$root/.cache/llamacpp-$version"
build="$cache/build"
out="${RESULTS:-$cache/results-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$cache" "$out"

# The model: the first argument (a GGUF path, or a name scripts/fetch-model knows), else SMOLLM_MODEL,
# else the default model.
model="${1:-${SMOLLM_MODEL:-}}"
if [[ -z "$model" ]]; then
  model=$(scripts/fetch-model | tail -n 1)
elif [[ ! -f "$model" ]]; then
  model=$(scripts/fetch-model "$model" | tail -n 1)
fi
[[ -f "$model" ]] || { echo "compare: model $model not found" >&2; exit 2; }
echo "model: $model; threads: $threads; repeats: $repeats; results: $out"

# ---------------------------------------------------------------- llama.cpp build (cached)
# shellcheck source=bench/llamacpp-build.sh
source "$root/bench/llamacpp-build.sh"
llamacpp_build llama-bench llama-batched-bench llama-server
build="$llamacpp_build_dir"
[[ -z "${BUILD_ONLY:-}" ]] || { echo "compare: llama.cpp built in $build"; exit 0; }
llama_bench=$(llamacpp_bin llama-bench)
batched_bench=$(llamacpp_bin llama-batched-bench)
llama_server=$(llamacpp_bin llama-server)

# ---------------------------------------------------------------- floors (bandwidth, FMA peak)
gcc -O3 -march=native -pthread "$root/bench/floors.c" -o "$cache/floors"
"$cache/floors" "$threads" | tee "$out/floors.txt"

# ---------------------------------------------------------------- our side: build
cargo build --release --locked --bins
cargo test --release --locked -p worker --test reference --no-run
bin="$root/target/release"

# Our in-process throughput report with the given settings; prints its lines.
numerics="${NUMERICS:-exact}"
read -r -a numerics_list <<<"$numerics"
ours_report() { # prefill batches context steps numerics
  THROUGHPUT_NUMERICS="$5" \
    THROUGHPUT_PREFILL="$1" THROUGHPUT_BATCHES="$2" THROUGHPUT_CONTEXT="$3" THROUGHPUT_STEPS="$4" \
    THROUGHPUT_THREADS="$threads" SMOLLM_MODEL="$model" \
    cargo test --release --locked -q -p worker --test reference -- --ignored --nocapture \
    throughput_report 2>&1 | grep -E '^(prefill|decode)'
}

# ---------------------------------------------------------------- alternating runs
for r in $(seq 1 "$repeats"); do
  [[ -z "${SKIP_MICRO:-}" ]] || break
  echo "--- round $r / $repeats"
  # llama.cpp: pp512 and tg128 (one repetition each per round; -r 1 keeps rounds interleaved).
  "$llama_bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 --repack 0 -o json >"$out/llama-bench-$r.json"
  "$batched_bench" -m "$model" -t "$threads" --no-repack -c 8448 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 16,32 \
    >"$out/batched-bench-$r.txt" 2>"$out/batched-bench-$r.log"
  # Ours: 512-token prefill and one stream (context 128, 128 steps), then 16 and 32 streams.
  for n in "${numerics_list[@]}"; do
    echo "ours, numerics = $n"
    ours_report 512 1,16,32 128 128 "$n" >"$out/ours-$n-$r.txt"
    cat "$out/ours-$n-$r.txt"
  done
done

# ---------------------------------------------------------------- servers under load
bench_name=compare
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
if [[ -z "${SKIP_SERVER:-}" ]]; then
  for r in $(seq 1 "$repeats"); do
    # llama-server, 16 slots of (16 + 64) tokens at least.
    port=$(free_port)
    "$llama_server" -m "$model" -t "$threads" --no-repack --parallel 16 --cont-batching -c 4096 \
      --host 127.0.0.1 --port "$port" >"$out/llama-server-$r.log" 2>&1 &
    pids+=($!)
    wait_for "$out/llama-server-$r.log" 'listening on\|server is listening' "${pids[-1]}"
    python3 "$root/bench/openai_load.py" --url "http://127.0.0.1:$port" --requests 64 \
      --concurrency 16 --prompt-tokens 16 --max-new-tokens 64 --warmup 4 >"$out/llama-server-$r.json"
    kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

    # Our router + worker.
    wport=$(free_port); rport=$(free_port)
    WORKER_NUMERICS="${numerics_list[0]}" \
      "$bin/worker" --threads "$threads" --model "$model" --listen "127.0.0.1:$wport" \
      >"$out/worker-$r.log" 2>&1 &
    pids+=($!)
    wait_for "$out/worker-$r.log" "worker ready" "${pids[-1]}"
    "$bin/router" --workers "127.0.0.1:$wport" --listen "127.0.0.1:$rport" >"$out/router-$r.log" 2>&1 &
    pids+=($!)
    wait_for "$out/router-$r.log" "router ready" "${pids[-1]}"
    "$bin/bench" --router "127.0.0.1:$rport" --requests 64 --concurrency 16 --prompt-tokens 16 \
      --max-new-tokens 64 --ignore-eos true --warmup 4 --json "$out/ours-server-$r.json" \
      --label "compare-llamacpp round $r" >"$out/ours-server-$r.txt"
    cleanup; pids=()
  done
fi

# ---------------------------------------------------------------- table
python3 - "$out" "$repeats" "$numerics" <<'PY'
import json, pathlib, re, statistics, sys

out, repeats, numerics = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split()
med = lambda xs: statistics.median(xs) if xs else float("nan")
# A part that was skipped (SKIP_MICRO, SKIP_SERVER) has no files: its rows print nan.
text = lambda name: (out / name).read_text() if (out / name).exists() else ""

def llama_bench(kind):  # kind: "pp" (n_prompt=512) or "tg" (n_gen=128)
    vals = []
    for r in range(1, repeats + 1):
        for row in json.loads(text(f"llama-bench-{r}.json") or "[]"):
            if kind == "pp" and row["n_prompt"] > 0 and row["n_gen"] == 0:
                vals.append(row["avg_ts"])
            if kind == "tg" and row["n_gen"] > 0 and row["n_prompt"] == 0:
                vals.append(row["avg_ts"])
    return med(vals)

def batched(npl):  # S_TG t/s of the markdown row with B == npl
    vals = []
    for r in range(1, repeats + 1):
        header = None
        for line in text(f"batched-bench-{r}.txt").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if "S_TG t/s" in cells:
                header = cells
            elif header and len(cells) == len(header) and cells[header.index("B")] == str(npl):
                vals.append(float(cells[header.index("S_TG t/s")]))
    return med(vals)

def ours(pattern, n):
    vals = []
    for r in range(1, repeats + 1):
        m = re.search(pattern, text(f"ours-{n}-{r}.txt"))
        if m:
            vals.append(float(m.group(1)))
    return med(vals)

rows = []
for n in numerics:
    # Targets: issue 26's for `fast`, issue 4's for `exact`.
    fast = n == "fast"
    rows += [
        (f"prefill 512 tok/s ({n})", ours(r"prefill 512 tokens: median ([\d.]+)", n), llama_bench("pp"), ">= 2" if fast else ">= 1.5", False),
        (f"decode 1 stream tok/s ({n})", ours(r"batch of 1: median [\d.]+ ms/step = ([\d.]+)", n), llama_bench("tg"), ">= 1.3" if fast else ">= 1.2", False),
        (f"decode 16 streams tok/s ({n})", ours(r"batch of 16: median [\d.]+ ms/step = ([\d.]+)", n), batched(16), "", False),
        (f"decode 32 streams tok/s ({n})", ours(r"batch of 32: median [\d.]+ ms/step = ([\d.]+)", n), batched(32), ">= 2", False),
    ]

srv = lambda prefix: [json.loads(p.read_text()) for p in sorted(out.glob(f"{prefix}-*.json"))]
ours_srv, llama_srv = srv("ours-server"), srv("llama-server")
if ours_srv and llama_srv:
    o = lambda k, q=None: med([(s["summary"][k] if q is None else s["summary"][k][q]) for s in ours_srv])
    l = lambda k: med([s[k] for s in llama_srv])
    rows += [
        ("server 16 conc. tok/s", o("generated_tokens_per_s"), l("generated_tokens_per_s"), "> 1", False),
        ("server TTFT p50 ms", o("ttft_ms", "p50"), l("ttft_p50_ms"), "> 1", True),
        ("server ITL p50 ms", o("itl_ms", "p50"), l("itl_p50_ms"), "> 1", True),
    ]

print(f"\n{'metric':<34}{'ours':>10}{'llama.cpp':>12}{'ratio':>8}  target")
for name, a, b, target, lower_better in rows:
    ratio = (b / a) if lower_better else (a / b)
    print(f"{name:<34}{a:>10.1f}{b:>12.1f}{ratio:>8.2f}  {target}")
print("\nratio > 1 means ours is better (throughput ours/llama.cpp, latency llama.cpp/ours)")
PY
