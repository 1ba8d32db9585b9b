"""Tool calling through the official `openai` SDK on the real Gemma 3 270M (its template has no tool
support: the built-in Hermes format, rendered inside Gemma's own turns): `required`, a named
function, streaming assembled by the SDK's helper equal to the non-streamed calls of the same seed,
the tool result fed back, and a few calls sampled at temperature 1 over varied schemas, each
parsing and validating with `jsonschema`.

Environment: OPENAI_BASE (the router's /v1 URL), MODEL.
"""
import json
import os
import sys
import unittest
import urllib.request

import openai

from tool_schemas import ASK, SCHEMAS, TIME, WEATHER, check_calls, tool, varied_schema

BASE = os.environ["OPENAI_BASE"]
ROOT = BASE.rsplit("/v1", 1)[0]
MODEL = os.environ["MODEL"]
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)


def post(path, body):
    request = urllib.request.Request(ROOT + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def create(**kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 120)
    kw.setdefault("parallel_tool_calls", False)
    return client.chat.completions.create(**kw)


class Gemma3Tools(unittest.TestCase):
    def test_required_and_the_result_fed_back_in_gemma_turns(self):
        r = create(tools=[WEATHER, TIME], tool_choice="required", temperature=1, seed=1)
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertIsNone(choice.message.content)
        self.assertEqual(len(choice.message.tool_calls), 1)
        check_calls(self, choice.message, SCHEMAS)
        call = choice.message.tool_calls[0]
        messages = ASK + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "21 degrees and sunny"},
        ]
        ids = post("/tokenize", {"model": MODEL, "messages": messages,
                                 "tools": [WEATHER, TIME]})["tokens"]
        prompt = post("/detokenize", {"model": MODEL, "tokens": ids})["prompt"]
        # The built-in format (compact tool list, Hermes calls and results) in Gemma's turns.
        self.assertIn('<start_of_turn>user\n', prompt)
        self.assertIn('<tools>\n{"type":"function","function":{"name":"get_weather",', prompt)
        self.assertIn(f'<start_of_turn>model\n<tool_call>\n{{"name": "{call.function.name}", '
                      f'"arguments": {call.function.arguments}}}\n</tool_call><end_of_turn>',
                      prompt)
        self.assertIn("<start_of_turn>user\n<tool_response>\n21 degrees and sunny\n"
                      "</tool_response><end_of_turn>\n<start_of_turn>model\n", prompt)

    def test_named_function_is_the_one_called(self):
        r = create(tools=[WEATHER, TIME], temperature=1, seed=2,
                   tool_choice={"type": "function", "function": {"name": "get_time"}})
        message = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual([c.function.name for c in message.tool_calls], ["get_time"])
        check_calls(self, message, SCHEMAS)

    def test_streaming_assembles_to_the_same_calls(self):
        strict = [tool(t["function"]["name"], t["function"]["parameters"], strict=True)
                  for t in [WEATHER, TIME]]
        kw = dict(model=MODEL, messages=ASK, tools=strict, tool_choice="required",
                  temperature=1, seed=7, max_tokens=120, parallel_tool_calls=False)
        whole = client.chat.completions.create(**kw).choices[0]
        with client.chat.completions.stream(**kw) as stream:
            pieces = sum(1 for event in stream
                         if event.type == "tool_calls.function.arguments.delta")
            final = stream.get_final_completion().choices[0]
        self.assertEqual(final.finish_reason, "tool_calls")
        self.assertIsNone(final.message.content)
        self.assertGreater(pieces, 1, "arguments come in fragments")
        got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
        want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
        self.assertEqual(got, want)
        check_calls(self, final.message, SCHEMAS)

    def test_sampled_calls_validate(self):
        total = 0
        for i in range(3):
            schema = varied_schema(i)
            name = f"fn_{i}"
            r = create(tools=[tool(name, schema)], tool_choice="required", temperature=1,
                       seed=50 + i, n=2, max_tokens=160,
                       messages=[{"role": "user", "content": f"Call {name}."}])
            for choice in r.choices:
                self.assertEqual(choice.finish_reason, "tool_calls")
                self.assertEqual(len(choice.message.tool_calls), 1)
                check_calls(self, choice.message, {name: schema})
                total += 1
        self.assertEqual(total, 6)
        print(f"sampled: {total} calls validated", file=sys.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
