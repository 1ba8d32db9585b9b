#!/usr/bin/env python3
"""Closed-loop streaming load on a llama-server (its native /completion endpoint), standard library only.

Sends --requests requests, --concurrency at a time, each a prompt of --prompt-tokens token ids
(deterministic pseudo-random ids, fixed per request index), --max-new-tokens new tokens, greedy,
ignore_eos, no prompt cache reuse. Prints one JSON object: generated_tokens_per_s (all generated tokens
over the wall time of the measured phase), ttft_p50_ms / ttft_p95_ms (send -> first token),
itl_p50_ms / itl_p95_ms (gaps between consecutive streamed tokens), e2e_p50_ms, failed.
Used by bench/compare-llamacpp.sh against `bench --router` on our side (same shape of load).
"""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse


def percentile(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def one(url, index, args):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    prompt = [100 + (index * 7919 + i * 104729) % 40000 for i in range(args.prompt_tokens)]
    body = json.dumps({
        "prompt": prompt, "n_predict": args.max_new_tokens, "temperature": 0, "top_k": 1,
        "ignore_eos": True, "stream": True, "cache_prompt": False,
    })
    t0 = time.perf_counter()
    conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    stamps, tokens = [], 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        msg = json.loads(line[5:])
        now = time.perf_counter()
        n = len(msg.get("tokens") or []) or (1 if msg.get("content") else 0)
        if n and not msg.get("stop"):
            stamps.append(now)
            tokens += n
        if msg.get("stop"):
            tokens = max(tokens, msg.get("tokens_predicted", tokens))
            break
    conn.close()
    end = time.perf_counter()
    ttft = (stamps[0] - t0) * 1e3 if stamps else None
    itl = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
    return ttft, itl, tokens, (end - t0) * 1e3


def run(url, indices, args, results):
    lock = threading.Lock()
    queue = list(indices)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            try:
                r = one(url, i, args)
            except Exception as e:  # noqa: BLE001 - reported as a failure
                r = e
            with lock:
                results.append(r)

    ts = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=0)
    args = p.parse_args()
    if args.warmup:
        run(args.url, range(10_000, 10_000 + args.warmup), args, [])
    results = []
    t0 = time.perf_counter()
    run(args.url, range(args.requests), args, results)
    wall = time.perf_counter() - t0
    ok = [r for r in results if not isinstance(r, Exception)]
    ttfts = [r[0] for r in ok if r[0] is not None]
    itls = [x for r in ok for x in r[1]]
    print(json.dumps({
        "requests": args.requests,
        "failed": len(results) - len(ok),
        "generated_tokens": sum(r[2] for r in ok),
        "generated_tokens_per_s": sum(r[2] for r in ok) / wall,
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p95_ms": percentile(ttfts, 0.95),
        "itl_p50_ms": percentile(itls, 0.5),
        "itl_p95_ms": percentile(itls, 0.95),
        "e2e_p50_ms": statistics.median([r[3] for r in ok]) if ok else None,
        "wall_s": wall,
    }))


if __name__ == "__main__":
    main()
