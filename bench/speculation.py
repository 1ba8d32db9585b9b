#!/usr/bin/env python3
"""Speculative decoding benchmark client (issue 28), standard library only.

Runs one task against a router's OpenAI endpoint (POST /v1/completions, non-streaming, greedy,
ignore_eos extension): --requests requests, --concurrency at a time. Tasks: `quote` (answer questions
about a passage by quoting it, issue 28's task (a) in small) and `story` (free writing, task (d)).
Writes every output text to --outputs (JSON list, by request index) and prints one JSON object:
tokens_per_s_per_stream (mean over requests of generated tokens / request latency), generated_tokens,
wall_s, and the worker's speculative counters over the run (from its /metrics) when --metrics is given.
"""
import argparse
import http.client
import json
import re
import threading
import time

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a brass lantern "
    "and a notebook in which he wrote the names of the ships that passed the rocks below. In forty "
    "years he had never missed a night, and the harbour master said that no vessel had been lost on "
    "that coast since he arrived. The village children called him the Captain, although he had never "
    "commanded a ship, and every spring they painted the door of the lighthouse a different colour. "
)
QUESTIONS = [
    "What did the keeper carry?", "What did the harbour master say?", "What did the children call him?",
    "What happened every spring?", "How long had he kept the light?", "What did he write in the notebook?",
    "When did he climb the stairs?", "Had he commanded a ship?",
]
STORIES = [
    "Write a story about a dragon who learns to bake bread.", "Write a story about a robot lost in a forest.",
    "Write a story about two friends who find a map.", "Write a story about a cat who becomes mayor.",
    "Write a story about a storm at sea.", "Write a story about a clock that runs backwards.",
    "Write a story about a library at night.", "Write a story about the last train home.",
]


def prompt(task, i):
    if task == "quote":
        text = PASSAGE * 3
        return f"Text: {text}\nQuestion: {QUESTIONS[i % len(QUESTIONS)]}\nQuote the whole text, then answer.\nQuote: The lighthouse keeper"
    return f"{STORIES[i % len(STORIES)]}\nOnce upon a time"


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="host:port of the router's HTTP front")
    p.add_argument("--model", default="", help="model name (default: the first of GET /v1/models)")
    p.add_argument("--task", choices=["quote", "story"], required=True)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--metrics", default="")
    p.add_argument("--outputs", required=True)
    a = p.parse_args()
    host, port = a.url.split(":")
    if not a.model:
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        c.request("GET", "/v1/models")
        a.model = json.loads(c.getresponse().read())["data"][0]["id"]
    results = [None] * a.requests
    lock = threading.Lock()
    next_index = [0]

    def worker():
        c = http.client.HTTPConnection(host, int(port), timeout=600)
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= a.requests:
                return
            body = {"model": a.model, "prompt": prompt(a.task, i), "max_tokens": a.max_new_tokens,
                    "temperature": 0, "ignore_eos": True}
            t0 = time.monotonic()
            c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            r = json.loads(c.getresponse().read())
            dt = time.monotonic() - t0
            results[i] = (r["choices"][0]["text"], r["usage"]["completion_tokens"], dt)

    before = metrics(a.metrics)
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    after = metrics(a.metrics)
    with open(a.outputs, "w") as f:
        json.dump([r[0] for r in results], f)
    drafted = after.get("draft_tokens", 0) - before.get("draft_tokens", 0)
    accepted = after.get("accepted_tokens", 0) - before.get("accepted_tokens", 0)
    print(json.dumps({
        "task": a.task, "concurrency": a.concurrency,
        "tokens_per_s_per_stream": sum(n / dt for _, n, dt in results) / len(results),
        "generated_tokens": sum(n for _, n, _ in results), "wall_s": wall,
        "draft_tokens": drafted, "accepted_draft_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
    }))


if __name__ == "__main__":
    main()
