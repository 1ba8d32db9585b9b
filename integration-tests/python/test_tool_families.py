"""Tool calling through the official `openai` SDK on several models behind one router, each
through its own chat template: tiny random-weight Qwen 2.5, Qwen 3 and Llama 3.1 models carrying
those models' own Hugging Face templates (their tool support), and a tiny llama whose template
has none (the built-in Hermes format). Every returned call's arguments must parse and validate
with `jsonschema` against the function's schema.

Environment: OPENAI_BASE (the router's /v1 URL), MODELS (comma-separated `served-name=family`,
family one of qwen2.5, qwen3, llama3.1, builtin), PLAIN_MODEL (the model of the batch test).
"""
import json
import os
import random
import sys
import threading
import time
import unittest
import urllib.request

import openai

from tool_schemas import (ASK, SCHEMAS, TIME, WEATHER, assemble_stream, check_calls, sdk_stream, tool,
                          varied_schema)

BASE = os.environ["OPENAI_BASE"]
ROOT = BASE.rsplit("/v1", 1)[0]
MODELS = [tuple(m.split("=")) for m in os.environ["MODELS"].split(",")]
PLAIN_MODEL = os.environ["PLAIN_MODEL"]
client = openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=120)
RESULT = "21 degrees and sunny"
# The end-of-text ids of the models here (2: `</s>` of the tiny-arch folders, `<|im_end|>` of the
# tiny llama; 0: the tiny llama's `<|endoftext|>`, `<unk>` of the others), barred by `logit_bias`.
NO_END = {"0": -100, "2": -100}
WORDS = ["red", "cat", "sky", "blue", "river", "stone", "seven", "north", "quick", "lamp", "snow",
         "tea", "gold", "ship", "wind", "ring"]

# What each family's template writes, in the prompt of a conversation with a call and its result:
# the offered tools, the earlier call, the tool result. Qwen's and Llama's own templates write the
# tool list with Python's `json.dumps` spacing; the built-in prompt writes compact JSON.
ARGS = "ARGS"  # stands for the call's arguments in the expected text
RENDERED = {
    "qwen2.5": [
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
        "\n\n# Tools\n",
        '<tools>\n{"type": "function", "function": {"name": "get_weather", ',
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ARGS}\n'
        "</tool_call><|im_end|>\n",
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    ],
    "qwen3": [
        "<|im_start|>system\n# Tools\n",
        '<tools>\n{"type": "function", "function": {"name": "get_weather", ',
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ARGS}\n'
        "</tool_call><|im_end|>\n",
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    ],
    "llama3.1": [
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n",
        'Respond in the format {"name": function name, "parameters": dictionary of argument name '
        'and its value}.',
        '{\n    "type": "function",\n    "function": {\n        "name": "get_weather",',
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
        'ARGS}<|eot_id|>',
        f'<|start_header_id|>ipython<|end_header_id|>\n\n"{RESULT}"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ],
    "builtin": [
        '<tools>\n{"type":"function","function":{"name":"get_weather",',
        '<tool_call>\n{"name": "get_weather", "arguments": ARGS}\n</tool_call>',
        f"<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
    ],
}


def post(path, body):
    request = urllib.request.Request(ROOT + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def rendered_prompt(model, messages, tools):
    """The prompt text a chat request with `messages` and `tools` prefills (/tokenize, then
    /detokenize)."""
    ids = post("/tokenize", {"model": model, "messages": messages, "tools": tools})["tokens"]
    return post("/detokenize", {"model": model, "tokens": ids})["prompt"]


def create(model, **kw):
    kw.setdefault("messages", ASK)
    kw.setdefault("max_tokens", 300)
    return client.chat.completions.create(model=model, **kw)


def run_threads(jobs, threads):
    """Runs the callables `jobs` on `threads` threads; returns the exceptions raised."""
    errors, lock = [], threading.Lock()
    pending = list(jobs)

    def work():
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop()
            try:
                job()
            except Exception as e:  # gathered, reported by the caller
                with lock:
                    errors.append(e)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors


class ToolFamilies(unittest.TestCase):
    def test_required_gives_valid_calls_only(self):
        for model, family in MODELS:
            with self.subTest(model=model):
                r = create(model, tools=[WEATHER, TIME], tool_choice="required", temperature=1,
                           seed=1, n=2)
                for choice in r.choices:
                    self.assertEqual(choice.finish_reason, "tool_calls")
                    self.assertIsNone(choice.message.content)
                    self.assertGreaterEqual(len(choice.message.tool_calls), 1)
                    check_calls(self, choice.message, SCHEMAS)

    def test_named_function_is_the_one_called(self):
        for model, family in MODELS:
            with self.subTest(model=model):
                r = create(model, tools=[WEATHER, TIME], temperature=1, seed=2, n=2,
                           parallel_tool_calls=False,
                           tool_choice={"type": "function", "function": {"name": "get_time"}})
                for choice in r.choices:
                    self.assertEqual(choice.finish_reason, "tool_calls")
                    self.assertIsNone(choice.message.content)
                    self.assertEqual([c.function.name for c in choice.message.tool_calls],
                                     ["get_time"])
                    check_calls(self, choice.message, SCHEMAS)

    def test_auto_gives_text_or_valid_calls(self):
        for model, family in MODELS:
            with self.subTest(model=model):
                r = create(model, tools=[WEATHER, TIME], tool_choice="auto", temperature=1,
                           seed=3, n=3, max_tokens=60)
                for choice in r.choices:
                    check_calls(self, choice.message, SCHEMAS)
                    if choice.message.tool_calls:
                        self.assertEqual(choice.finish_reason, "tool_calls")
                    else:
                        self.assertIn(choice.finish_reason, ["stop", "length"])
                        self.assertIsInstance(choice.message.content, str)

    def test_none_gives_plain_text(self):
        for model, family in MODELS:
            with self.subTest(model=model):
                r = create(model, tools=[WEATHER, TIME], tool_choice="none", temperature=1,
                           seed=4, max_tokens=24)
                choice = r.choices[0]
                self.assertIsNone(choice.message.tool_calls)
                self.assertIn(choice.finish_reason, ["stop", "length"])
                self.assertIsInstance(choice.message.content, str)
                self.assertGreater(r.usage.completion_tokens, 0)

    def test_parallel_calls_and_single_calls(self):
        counts = {}
        for model, family in MODELS:
            with self.subTest(model=model):
                r = create(model, tools=[WEATHER, TIME], tool_choice="required", temperature=1,
                           seed=100, n=2)
                for choice in r.choices:
                    self.assertEqual(choice.finish_reason, "tool_calls")
                    self.assertGreaterEqual(len(choice.message.tool_calls), 1)
                    check_calls(self, choice.message, SCHEMAS)
                # Random weights end after the first call: with the end tokens barred the model
                # chains calls until max_tokens; the complete ones are returned, each valid, and
                # the one cut short is left out.
                r = create(model, tools=[WEATHER, TIME], tool_choice="required", temperature=1,
                           seed=101, logit_bias=NO_END, max_tokens=240)
                choice = r.choices[0]
                self.assertEqual(choice.finish_reason, "length")
                self.assertIsNone(choice.message.content)
                check_calls(self, choice.message, SCHEMAS)
                counts[model] = len(choice.message.tool_calls)
                self.assertGreater(counts[model], 1, counts)
                r = create(model, tools=[WEATHER, TIME], tool_choice="required", temperature=1,
                           seed=200, n=2, parallel_tool_calls=False, logit_bias=NO_END)
                for choice in r.choices:
                    # One call, then the grammar ends the answer (EOS barred or not).
                    self.assertEqual(choice.finish_reason, "tool_calls")
                    self.assertEqual(len(choice.message.tool_calls), 1)
                    check_calls(self, choice.message, SCHEMAS)
        print(f"parallel: calls in 240 tokens {counts}", file=sys.stderr)

    def test_tool_result_fed_back_through_the_models_own_template(self):
        for model, family in MODELS:
            with self.subTest(model=model):
                first = create(model, tools=[WEATHER], tool_choice="required", temperature=1,
                               seed=5, parallel_tool_calls=False)
                call = first.choices[0].message.tool_calls[0]
                messages = ASK + [
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": call.id, "type": "function",
                         "function": {"name": call.function.name,
                                      "arguments": call.function.arguments}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": RESULT},
                ]
                prompt = rendered_prompt(model, messages, [WEATHER])
                # The call's arguments as the template writes them: Qwen's and Llama's `tojson`
                # (Python's json.dumps spacing); the built-in format keeps the text.
                arguments = json.loads(call.function.arguments)
                written = (call.function.arguments if family == "builtin"
                           else json.dumps(arguments, ensure_ascii=False))
                for expected in RENDERED[family]:
                    self.assertIn(expected.replace(ARGS, written), prompt)
                r = create(model, messages=messages, tools=[WEATHER], tool_choice="none",
                           temperature=1, seed=6, max_tokens=16)
                self.assertIsNone(r.choices[0].message.tool_calls)
                self.assertIsInstance(r.choices[0].message.content, str)
                self.assertGreater(r.usage.prompt_tokens, first.usage.prompt_tokens)
                again = create(model, messages=messages, tools=[WEATHER], tool_choice="required",
                               temperature=1, seed=7, parallel_tool_calls=False)
                self.assertEqual(again.choices[0].finish_reason, "tool_calls")
                check_calls(self, again.choices[0].message, SCHEMAS)

    def test_streaming_assembles_to_the_same_calls(self):
        # The SDK's stream helper parses only `strict` tools.
        strict = [tool(t["function"]["name"], t["function"]["parameters"], strict=True)
                  for t in [WEATHER, TIME]]
        for model, family in MODELS:
            with self.subTest(model=model):
                kw = dict(model=model, messages=ASK, tools=strict, tool_choice="required",
                          temperature=1, seed=8, max_tokens=300)
                whole = client.chat.completions.create(**kw).choices[0]
                pieces, final = sdk_stream(client, kw)
                self.assertEqual(final.finish_reason, "tool_calls")
                self.assertIsNone(final.message.content)
                self.assertGreater(pieces, 1, "arguments come in fragments")
                for call in final.message.tool_calls:
                    self.assertEqual(call.function.parsed_arguments,
                                     json.loads(call.function.arguments))
                got = [(c.function.name, c.function.arguments) for c in final.message.tool_calls]
                want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
                self.assertEqual(got, want)
                check_calls(self, final.message, SCHEMAS)
                # Several choices, raw chunks accumulated from `delta.tool_calls`.
                kw.update(n=3, seed=9)
                whole = client.chat.completions.create(**kw)
                chunks = list(client.chat.completions.create(stream=True, **kw))
                firsts = [c.choices[0].delta.tool_calls[0] for c in chunks
                          if c.choices and c.choices[0].delta.tool_calls]
                self.assertTrue(firsts[0].id and firsts[0].function.name)
                streamed = assemble_stream(chunks)
                want = {c.index: ([(t.function.name, t.function.arguments)
                                   for t in c.message.tool_calls], c.finish_reason)
                        for c in whole.choices}
                self.assertEqual(streamed, want)

    def test_many_sampled_calls_validate(self):
        """40 schemas spread over the models, 7 requests each (seeds and prompts of their own),
        one call per request: 280 answers at temperature 1."""
        n_schemas, per_schema = 40, 7
        calls, cut, lock = [], [], threading.Lock()
        schemas = {}
        failures = []

        def job(i, k):
            model = MODELS[i % len(MODELS)][0]
            schema = varied_schema(i)
            name = f"fn_{i}"
            with lock:
                schemas[name] = json.dumps(schema, sort_keys=True)
            # The random-weight models are nearly deterministic under the grammar: the prompt
            # varies as well as the seed.
            rng = random.Random(100 * i + k)
            ask = f"Call {name} for " + " ".join(rng.choice(WORDS) for _ in range(6)) + "."
            r = create(model, tools=[tool(name, schema)], tool_choice="required",
                       temperature=1, seed=1000 * i + k, parallel_tool_calls=False,
                       max_tokens=400, messages=[{"role": "user", "content": ask}])
            choice = r.choices[0]
            try:
                if choice.finish_reason == "length":
                    # A call cut at max_tokens (a random model repeating a number's digits) is
                    # not returned: its text is the content.
                    self.assertIsNone(choice.message.tool_calls)
                    with lock:
                        cut.append((model, name, choice.message.content[-40:]))
                    return
                self.assertEqual(choice.finish_reason, "tool_calls")
                self.assertIsNone(choice.message.content)
                self.assertEqual(len(choice.message.tool_calls), 1)
                check_calls(self, choice.message, {name: schema})
                call = choice.message.tool_calls[0].function
                with lock:
                    calls.append((call.name, call.arguments))
            except Exception as e:  # gathered, reported below
                with lock:
                    failures.append((model, name, k, repr(e), choice.message))

        started = time.monotonic()
        errors = run_threads([lambda i=i, k=k: job(i, k) for i in range(n_schemas)
                              for k in range(per_schema)], threads=8)
        self.assertEqual(errors, [])
        self.assertEqual(failures, [])
        self.assertEqual(len(calls) + len(cut), n_schemas * per_schema)
        for c in cut:
            print(f"cut at max_tokens: {c}", file=sys.stderr)
        distinct_schemas = len(set(schemas.values()))
        self.assertGreaterEqual(distinct_schemas, 30)
        self.assertGreaterEqual(len(calls), 200)
        print(f"sampled: {len(calls)} calls validated over {distinct_schemas} schemas "
              f"({len(set(calls))} distinct calls, {len(cut)} answers cut at max_tokens, "
              f"{time.monotonic() - started:.1f} s)", file=sys.stderr)

    def test_a_tool_request_leaves_a_batch_of_31_plain_ones_unchanged(self):
        prompts = [f"Count from {k} to {k + 5}." for k in range(31)]

        def plain(p):
            return client.chat.completions.create(
                model=PLAIN_MODEL, messages=[{"role": "user", "content": p}], temperature=0,
                max_tokens=40).choices[0].message.content

        alone = [plain(p) for p in prompts]
        together = [None] * len(prompts)
        tool_answer = []

        def run(k):
            together[k] = plain(prompts[k])

        def tool_request():
            tool_answer.append(create(PLAIN_MODEL, tools=[WEATHER, TIME], tool_choice="required",
                                      temperature=1, seed=10, n=2))

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(prompts))]
        threads.insert(len(threads) // 2, threading.Thread(target=tool_request))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(together, alone)
        self.assertEqual(len(tool_answer), 1)
        for choice in tool_answer[0].choices:
            self.assertEqual(choice.finish_reason, "tool_calls")
            check_calls(self, choice.message, SCHEMAS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
