"""Tool calling through the official `openai` SDK (issue 29), against a router over the real SmolLM2
model (its template has no tool support: the built-in Hermes format). Every returned call's
arguments must parse and validate with `jsonschema` against the function's schema.

Environment: OPENAI_BASE (the router's /v1 URL), MODEL.
"""
import json
import os
import random
import sys
import threading
import unittest

import openai

from tool_schemas import ASK, SCHEMAS, TIME, WEATHER, check_calls, sdk_stream, tool

BASE = os.environ["OPENAI_BASE"]
MODEL = os.environ["MODEL"]
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0)


def varied_schema(i):
    """A schema of its own for function i: nested objects, enums, bounded arrays and numbers,
    optional fields."""
    rng = random.Random(i)
    props, required = {}, []
    for j in range(rng.randint(1, 4)):
        kind = rng.choice(["int", "num", "enum", "str", "arr", "obj", "bool"])
        name = f"p{j}_{kind}"
        if kind == "int":
            lo = rng.randint(-50, 50)
            s = {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 100)}
        elif kind == "num":
            s = {"type": "number", "minimum": 0, "maximum": rng.choice([1, 10, 1000])}
        elif kind == "enum":
            s = {"type": "string", "enum": [f"v{k}" for k in range(rng.randint(1, 4))]}
        elif kind == "str":
            s = {"type": "string", "maxLength": rng.randint(1, 12)}
        elif kind == "arr":
            s = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                 "maxItems": 3}
        elif kind == "obj":
            s = {"type": "object", "properties": {
                "a": {"type": "boolean"},
                "b": {"type": "string", "enum": ["x", "y"]},
                "c": {"type": "object", "properties": {"d": {"type": "integer", "minimum": 1,
                                                             "maximum": 3}},
                      "required": ["d"], "additionalProperties": False}},
                 "required": ["a", "c"], "additionalProperties": False}
        else:
            s = {"type": "boolean"}
        props[name] = s
        if rng.random() < 0.6:
            required.append(name)
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


class ToolCalls(unittest.TestCase):
    def create(self, **kw):
        kw.setdefault("model", MODEL)
        kw.setdefault("messages", ASK)
        kw.setdefault("max_tokens", 200)
        return client.chat.completions.create(**kw)

    def test_required_gives_valid_calls_only(self):
        r = self.create(tools=[WEATHER, TIME], tool_choice="required", temperature=1, seed=1)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertIsNone(choice.message.content)
        self.assertGreaterEqual(len(choice.message.tool_calls), 1)
        check_calls(self, choice.message, SCHEMAS)

    def test_named_function_is_the_one_called(self):
        r = self.create(tools=[WEATHER, TIME], temperature=1, seed=2, parallel_tool_calls=False,
                        tool_choice={"type": "function", "function": {"name": "get_time"}})
        message = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual([c.function.name for c in message.tool_calls], ["get_time"])
        check_calls(self, message, SCHEMAS)

    def test_auto_gives_text_or_valid_calls(self):
        for seed in range(3):
            r = self.create(tools=[WEATHER, TIME], tool_choice="auto", temperature=1, seed=seed)
            choice = r.choices[0]
            check_calls(self, choice.message, SCHEMAS)
            if choice.message.tool_calls:
                self.assertEqual(choice.finish_reason, "tool_calls")
            else:
                self.assertIn(choice.finish_reason, ["stop", "length"])
                self.assertIsNotNone(choice.message.content)

    def test_none_gives_plain_text(self):
        r = self.create(tools=[WEATHER, TIME], tool_choice="none", temperature=0, max_tokens=24)
        choice = r.choices[0]
        self.assertIsNone(choice.message.tool_calls)
        self.assertIn(choice.finish_reason, ["stop", "length"])
        self.assertTrue(choice.message.content)

    def test_parallel_calls_and_single_calls(self):
        counts = []
        for seed in range(4):
            r = self.create(tools=[WEATHER, TIME], tool_choice="required", temperature=1,
                            seed=100 + seed, n=2)
            for choice in r.choices:
                check_calls(self, choice.message, SCHEMAS)
                counts.append(len(choice.message.tool_calls))
            r = self.create(tools=[WEATHER, TIME], tool_choice="required", temperature=1,
                            seed=200 + seed, parallel_tool_calls=False)
            self.assertEqual(len(r.choices[0].message.tool_calls), 1)
        self.assertTrue(all(c >= 1 for c in counts), counts)
        print(f"parallel: calls per answer {counts}", file=sys.stderr)

    def test_tool_result_fed_back(self):
        first = self.create(tools=[WEATHER], tool_choice="required", temperature=0,
                            parallel_tool_calls=False)
        call = first.choices[0].message.tool_calls[0]
        messages = ASK + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "21 degrees and sunny"},
        ]
        r = self.create(messages=messages, tools=[WEATHER], tool_choice="none", temperature=0,
                        max_tokens=32)
        self.assertTrue(r.choices[0].message.content)
        self.assertGreater(r.usage.prompt_tokens, first.usage.prompt_tokens)
        auto = self.create(messages=messages, tools=[WEATHER], temperature=1, seed=3)
        check_calls(self, auto.choices[0].message, SCHEMAS)

    def test_streaming_assembles_to_the_same_calls(self):
        # The SDK's stream helper parses only `strict` tools.
        strict = [{"type": "function", "function": dict(t["function"], strict=True)}
                  for t in [WEATHER, TIME]]
        kw = dict(model=MODEL, messages=ASK, tools=strict, tool_choice="required",
                  temperature=1, seed=7, max_tokens=200)
        whole = client.chat.completions.create(**kw).choices[0]
        pieces, final = sdk_stream(client, kw)
        self.assertEqual(final.finish_reason, "tool_calls")
        self.assertGreater(pieces, 1, "arguments come in fragments")
        for call in final.message.tool_calls:
            self.assertEqual(call.function.parsed_arguments, json.loads(call.function.arguments))
        got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
        want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        self.assertEqual(got, want)
        check_calls(self, final.message, SCHEMAS)
        # The raw chunks: the id and name come first, then the arguments.
        chunks = list(client.chat.completions.create(stream=True, **kw))
        firsts = [c.choices[0].delta.tool_calls[0] for c in chunks
                  if c.choices and c.choices[0].delta.tool_calls]
        self.assertTrue(firsts[0].id and firsts[0].function.name)
        self.assertEqual(firsts[0].function.arguments, "")

    def test_many_sampled_calls_validate(self):
        """12 schemas, 2 choices per request: 24 calls at temperature 1 (CI has 2 cores)."""
        failures, total = [], [0]
        lock = threading.Lock()

        def run(i):
            schema = varied_schema(i)
            tools = [tool(f"fn_{i}", schema)]
            for seed in range(1):
                r = self.create(tools=tools, tool_choice="required", temperature=1,
                                seed=1000 * i + seed, n=2, parallel_tool_calls=False,
                                messages=[{"role": "user", "content": f"Call fn_{i}."}])
                for choice in r.choices:
                    try:
                        self.assertEqual(choice.finish_reason, "tool_calls")
                        check_calls(self, choice.message, {f"fn_{i}": schema})
                        with lock:
                            total[0] += len(choice.message.tool_calls)
                    except Exception as e:  # gathered, reported below
                        with lock:
                            failures.append((i, seed, repr(e), choice.message))

        threads = [threading.Thread(target=lambda k=k: [run(i) for i in range(k, 12, 6)])
                   for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(failures, [])
        self.assertEqual(total[0], 24)
        print(f"sampled: {total[0]} calls validated", file=sys.stderr)

    def test_bad_tools_get_400_naming_the_field(self):
        cases = [
            ({"tools": [WEATHER, WEATHER]}, "tools", "twice"),
            ({"tools": [tool("bad name", {"type": "object"})]}, "tools", "bad name"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                                  "function": {"name": "nope"}}},
             "tool_choice", "nope"),
            ({"tools": [tool("weird", {"type": "object", "properties": {
                "x": {"type": "string", "pattern": "(?<=a)b"}}})], "tool_choice": "required"},
             "tools", "weird"),
            ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
             "messages", "call_x"),
        ]
        for extra, param, needle in cases:
            with self.assertRaises(openai.BadRequestError) as caught:
                self.create(**extra)
            body = caught.exception.body
            self.assertEqual(body.get("param"), param, body)
            self.assertIn(needle, body["message"])

    def test_a_tool_request_leaves_a_batch_of_plain_ones_unchanged(self):
        prompts = [f"Count from {k} to {k + 5}." for k in range(7)]

        def plain(p):
            return client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": p}], temperature=0,
                max_tokens=40).choices[0].message.content

        alone = [plain(p) for p in prompts]
        together = [None] * len(prompts)

        def run(k):
            together[k] = plain(prompts[k])

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(prompts))]
        threads.append(threading.Thread(target=lambda: check_calls(self, self.create(
            tools=[WEATHER, TIME], tool_choice="required", temperature=1, seed=9,
            n=2).choices[0].message, SCHEMAS)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(together, alone)


if __name__ == "__main__":
    unittest.main(verbosity=2)
