#!/usr/bin/env bash
# Speculative decoding side by side with llama.cpp (issue 28): bench/speculation.sh with all six
# servers (ours off / ngram / draft, llama-server plain / n-gram / draft model), same target and draft
# files. Usage: bench/speculation-llamacpp.sh TARGET.gguf DRAFT.gguf; the other settings are
# bench/speculation.sh's (TASKS, SAMPLINGS, STREAMS, REQUESTS, MAX_NEW, ROUNDS, THREADS, ...).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export DRAFT_MODEL=${2:?DRAFT.gguf}
export SERVERS=${SERVERS:-llama llama-ngram llama-draft ours-off ours-ngram ours-draft}
exec "$root/bench/speculation.sh" "${1:?TARGET.gguf}"
