#!/usr/bin/env python3
"""Speculative decoding benchmark client (issue 28), standard library only.

Runs one task of bench/speculation_tasks.py (document, code, json, story) against an
OpenAI-compatible server (ours or llama-server): POST /v1/chat/completions, streamed, --requests
requests, --concurrency at a time; greedy (`--sampling greedy`) or seeded sampling (`seeded`:
temperature 0.8, top_p 0.95, request i has seed 1000 + i). Writes every output text to --outputs
(JSON list, by request index) and prints one JSON object:
- decode_tokens_per_s_per_stream: mean over requests of (completion tokens - 1) / (time from the
  first to the last content chunk), requests of 8 tokens or more;
- tokens_per_s_per_stream: mean over requests of completion tokens / request latency;
- ttft_s_mean, prompt_tokens_mean, generated_tokens, wall_s;
- the worker's speculative counters over the run (from its /metrics, proposers ngram and draft)
  when --metrics is given.
"""
import argparse
import http.client
import json
import re
import threading
import time

import speculation_tasks


def metrics(addr):
    if not addr:
        return {}
    host, port = addr.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    # The model proposers' counters (ngram, draft), summed; tokens a grammar forces have their own
    # label (`grammar`) and are not counted here.
    for name in ("draft_tokens", "accepted_tokens"):
        found = re.findall(r'^worker_speculative_%s_total\{proposer="(ngram|draft)"\} (\d+)' % name, text, re.M)
        out[name] = sum(int(v) for _, v in found)
    return out


def run_one(conn, body):
    """Streams one request; returns (text, completion_tokens, prompt_tokens, t_first, t_last, t_end)
    with times from the request's start."""
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    text, usage, t_first, t_last, chunks = [], None, None, None, 0
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                now = time.monotonic() - t0
                t_first = now if t_first is None else t_first
                t_last = now
                chunks += 1
                text.append(piece)
    t_end = time.monotonic() - t0
    if usage is None:
        raise RuntimeError("the server sent no usage (stream_options.include_usage)")
    return "".join(text), usage["completion_tokens"], usage["prompt_tokens"], t_first, t_last, t_end


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="host:port of the server's HTTP front")
    p.add_argument("--model", default="", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--task", choices=sorted(speculation_tasks.TASKS), required=True)
    p.add_argument("--sampling", choices=["greedy", "seeded"], default="greedy")
    p.add_argument("--requests", type=int, default=22)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--metrics", default="")
    p.add_argument("--outputs", required=True)
    a = p.parse_args()
    host, port = a.url.split(":")
    if not a.model:
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("GET", "/v1/models")
        a.model = json.loads(c.getresponse().read())["data"][0]["id"]
    bodies = speculation_tasks.requests(a.task, a.requests)
    for i, body in enumerate(bodies):
        body.update({"model": a.model, "max_tokens": a.max_new_tokens, "stream": True,
                     "stream_options": {"include_usage": True}})
        if a.sampling == "greedy":
            body["temperature"] = 0
        else:
            body.update({"temperature": 0.8, "top_p": 0.95, "seed": 1000 + i})
    results = [None] * a.requests
    errors = []
    lock = threading.Lock()
    next_index = [0]

    def worker():
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= a.requests:
                return
            # One connection per request: llama-server closes a streamed response's connection.
            c = http.client.HTTPConnection(host, int(port), timeout=900)
            try:
                results[i] = run_one(c, bodies[i])
            except Exception as e:  # reported below, after every thread ends
                errors.append(f"request {i}: {e}")
            finally:
                c.close()

    before = metrics(a.metrics)
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    if errors:
        raise SystemExit("speculation.py: " + "; ".join(errors[:5]))
    after = metrics(a.metrics)
    with open(a.outputs, "w") as f:
        json.dump([r[0] for r in results], f)
    decode = [(n - 1) / (last - first) for _, n, _, first, last, _ in results if n >= 8 and last > first]
    drafted = after.get("draft_tokens", 0) - before.get("draft_tokens", 0)
    accepted = after.get("accepted_tokens", 0) - before.get("accepted_tokens", 0)
    print(json.dumps({
        "task": a.task, "sampling": a.sampling, "concurrency": a.concurrency,
        "decode_tokens_per_s_per_stream": sum(decode) / len(decode) if decode else None,
        "tokens_per_s_per_stream": sum(n / end for _, n, _, _, _, end in results) / len(results),
        "ttft_s_mean": sum(first for _, _, _, first, _, _ in results if first is not None) / len(results),
        "prompt_tokens_mean": sum(pt for _, _, pt, _, _, _ in results) / len(results),
        "generated_tokens": sum(r[1] for r in results), "wall_s": wall,
        "draft_tokens": drafted, "accepted_draft_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
    }))


if __name__ == "__main__":
    main()
