#!/usr/bin/env python3
"""Prints bench/speculation.sh's tables from its output folder.

Usage: speculation_report.py OUT ROUNDS "TASKS" "SAMPLINGS" "STREAMS" SERVER...
One table per sampling and concurrency, a row per task: each server's decode tokens/s per stream
(median over rounds), our acceptance rates, our speculating servers' ratios to ours-off and to
llama.cpp's matching mode, and per speculating server how many outputs equal its engine's
non-speculating server's (ours-* against ours-off, llama-* against llama) of those compared.
"""
import json
import pathlib
import statistics
import sys

out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
tasks, samplings, streams, servers = sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split(), sys.argv[6:]
LLAMA_OF = {"ours-ngram": "llama-ngram", "ours-draft": "llama-draft"}


def result(server, task, sampling, c, r):
    return json.loads((out / f"{server}-{task}-{sampling}-{c}-{r}.result").read_text())


def outputs(server, task, sampling, c, r):
    return json.loads((out / f"{server}-{task}-{sampling}-{c}-{r}.json").read_text())


def equal_count(server, task, sampling, c):
    base = "ours-off" if server.startswith("ours") else "llama"
    if base not in servers or server == base:
        return None
    same = total = 0
    for r in range(1, rounds + 1):
        a, b = outputs(base, task, sampling, c, r), outputs(server, task, sampling, c, r)
        same += sum(x == y for x, y in zip(a, b))
        total += len(a)
    return same, total


for sampling in samplings:
    for c in streams:
        print(f"\n{sampling}, {c} stream(s): decode tokens/s per stream (median of {rounds})\n")
        spec = [s for s in servers if s not in ("ours-off", "llama")]
        head = ["task"] + servers + [f"{s} / ours-off" for s in spec if s.startswith("ours") and "ours-off" in servers]
        head += [f"{s} / {LLAMA_OF[s]}" for s in spec if LLAMA_OF.get(s) in servers]
        head += [f"{s} acceptance" for s in spec if s.startswith("ours")]
        head += [f"{s} outputs equal" for s in spec]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for task in tasks:
            med = {s: statistics.median(result(s, task, sampling, c, r)["decode_tokens_per_s_per_stream"] or 0
                                        for r in range(1, rounds + 1)) for s in servers}
            row = [task] + ["%.1f" % med[s] for s in servers]
            row += ["%.2fx" % (med[s] / med["ours-off"]) for s in spec if s.startswith("ours") and "ours-off" in servers]
            row += ["%.2fx" % (med[s] / med[LLAMA_OF[s]]) for s in spec if LLAMA_OF.get(s) in servers]
            for s in spec:
                if s.startswith("ours"):
                    d = sum(result(s, task, sampling, c, r)["draft_tokens"] for r in range(1, rounds + 1))
                    a = sum(result(s, task, sampling, c, r)["accepted_draft_tokens"] for r in range(1, rounds + 1))
                    row.append("%.0f %% of %d" % (100 * a / d, d) if d else "-")
            for s in spec:
                eq = equal_count(s, task, sampling, c)
                row.append("-" if eq is None else "%d / %d" % eq)
            print("| " + " | ".join(row) + " |")
