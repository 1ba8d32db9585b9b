# Shell helpers shared by the bench scripts that start servers (sourced, not run).
#
#   free_port                 prints a free TCP port on 127.0.0.1
#   pids+=($!)                register a background server; `cleanup` (run on EXIT) kills them all
#   wait_for FILE PATTERN PID waits (up to 120 s) until PATTERN appears in FILE; fails, printing the
#                             log, when PID exits first
#
# The caller sets `bench_name` (used in messages) before sourcing.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
wait_for() { # file, pattern, pid
  for _ in $(seq 1 1200); do
    grep -q "$2" "$1" && return 0
    kill -0 "$3" 2>/dev/null || { echo "${bench_name:-bench}: process exited; its log:" >&2; cat "$1" >&2; return 1; }
    sleep 0.1
  done
  echo "${bench_name:-bench}: timed out waiting for '$2' in $1" >&2; return 1
}
