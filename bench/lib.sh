# Shell helpers shared by the scripts that start servers (sourced, not run): the bench scripts, and
# scripts/check-avx2-cpu.
#
#   free_port                 prints a free TCP port on 127.0.0.1
#   pids+=($!)                register a background server; `cleanup` (run on EXIT) kills them all
#   wait_for FILE PATTERN PID waits (up to 120 s) until PATTERN appears in FILE; fails, printing the
#                             log, when PID exits first
#   start_ours PREFIX ARGS... starts our worker (`$bin/worker` with ARGS, metrics on) and a router on
#                             free ports, logs in PREFIX-worker.log / PREFIX-router.log, and waits
#                             until both are ready; sets wpid, rpid, hport (HTTP) and mport (metrics)
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
start_ours() { # log prefix, worker args...
  local prefix=$1 wport rport; shift
  wport=$(free_port); rport=$(free_port); hport=$(free_port); mport=$(free_port)
  "$bin/worker" --listen "127.0.0.1:$wport" --metrics-listen "127.0.0.1:$mport" "$@" \
    >"$prefix-worker.log" 2>&1 &
  pids+=($!); wpid=$!
  wait_for "$prefix-worker.log" "worker ready" "$wpid"
  "$bin/router" --workers "127.0.0.1:$wport" --listen "127.0.0.1:$rport" \
    --http-listen "127.0.0.1:$hport" >"$prefix-router.log" 2>&1 &
  pids+=($!); rpid=$!
  wait_for "$prefix-router.log" "router ready" "$rpid"
}
