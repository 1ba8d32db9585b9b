"""The router's OpenAI HTTP API driven by the official `openai` Python SDK (pinned by
scripts/install-openai-sdk), against a real router and worker on the real SmolLM2 model.

Run by integration-tests/tests/openai_sdk.rs, which starts the processes and passes:
  OPENAI_BASE     the API under test (http://127.0.0.1:PORT/v1)
  OVERLOAD_BASE   a router over the same worker with one request in flight and no queue
  DEAD_BASE       a router with no reachable worker
  KEYED_BASE      a router that requires the API key KEYED_KEY and serves TLS
                  (https://localhost:PORT/v1) with a certificate of the test CA in TLS_CA
  MODEL           the served model name
  EXPECTED        a JSON file with the gRPC front's texts for the same requests
"""

import json
import os
import ssl
import unittest

import httpx
import openai

BASE = os.environ["OPENAI_BASE"]
MODEL = os.environ["MODEL"]
with open(os.environ["EXPECTED"], encoding="utf-8") as f:
    EXPECTED = json.load(f)

CHAT = [{"role": "user", "content": EXPECTED["chat_prompt"]}]


def client(base=BASE, api_key="unused", ca=None):
    # No retries: every status must reach the test as the server sent it. With `ca`, HTTPS that
    # trusts only that CA file (Python's default context verifies strictly, names included).
    http_client = httpx.Client(verify=ssl.create_default_context(cafile=ca)) if ca else None
    return openai.OpenAI(
        base_url=base, api_key=api_key, max_retries=0, timeout=120, http_client=http_client
    )


def joined(chunks, index=0):
    text, reasons = "", []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.index != index:
                continue
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text += piece or ""
            if choice.finish_reason is not None:
                reasons.append(choice.finish_reason)
    return text, reasons


class Generation(unittest.TestCase):
    def test_models_lists_the_served_name(self):
        ids = [m.id for m in client().models.list()]
        self.assertEqual(ids, [MODEL])

    def test_chat_equals_grpc_whole_and_streamed(self):
        c = client()
        r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=32, temperature=0)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].message.content, EXPECTED["chat"]["text"])
        self.assertEqual(r.choices[0].finish_reason, EXPECTED["chat"]["finish_reason"])
        self.assertEqual(r.usage.prompt_tokens, EXPECTED["chat"]["prompt_tokens"])
        self.assertEqual(r.usage.completion_tokens, EXPECTED["chat"]["generated_tokens"])
        chunks = list(
            c.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=32, temperature=0, stream=True
            )
        )
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text, reasons = joined(chunks)
        self.assertEqual(text, EXPECTED["chat"]["text"])
        self.assertEqual(reasons, [EXPECTED["chat"]["finish_reason"]])

    def test_completion_equals_grpc_and_streams_usage(self):
        c = client()
        prompt = EXPECTED["completion_prompt"]
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        self.assertEqual(r.choices[0].text, EXPECTED["completion"]["text"])
        chunks = list(
            c.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=24,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text, reasons = joined(chunks)
        self.assertEqual(text, EXPECTED["completion"]["text"])
        self.assertEqual(len(reasons), 1)
        last = chunks[-1]
        self.assertEqual(last.choices, [])
        self.assertEqual(last.usage.completion_tokens, EXPECTED["completion"]["generated_tokens"])
        self.assertEqual(last.usage.prompt_tokens, EXPECTED["completion"]["prompt_tokens"])
        self.assertTrue(all(ch.usage is None for ch in chunks[:-1]))

    def test_n_choices_and_seed_reproducibility(self):
        c = client()
        ask = dict(
            model=MODEL, messages=CHAT, max_tokens=16, temperature=0.9, seed=123, n=3
        )
        first = c.chat.completions.create(**ask)
        second = c.chat.completions.create(**ask)
        self.assertEqual([ch.index for ch in first.choices], [0, 1, 2])
        texts = [ch.message.content for ch in first.choices]
        self.assertEqual(texts, [ch.message.content for ch in second.choices])
        # Choice i samples with seed + i: each equals the gRPC front's run with that seed.
        self.assertEqual(texts, EXPECTED["seeded"])
        chunks = list(c.chat.completions.create(stream=True, **ask))
        for i in range(3):
            text, reasons = joined(chunks, i)
            self.assertEqual(text, texts[i])
            self.assertEqual(len(reasons), 1)

    def test_stop_strings(self):
        c = client()
        full = EXPECTED["completion"]["text"]
        words = full.split()
        self.assertGreater(len(words), 3)
        stop = " " + words[2]
        r = c.completions.create(
            model=MODEL, prompt=EXPECTED["completion_prompt"], max_tokens=24, temperature=0, stop=[stop]
        )
        self.assertEqual(r.choices[0].text, full[: full.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_logprobs(self):
        c = client()
        r = c.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
        )
        content = r.choices[0].logprobs.content
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 2)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
        r = c.completions.create(
            model=MODEL, prompt=EXPECTED["completion_prompt"], max_tokens=6, temperature=0, logprobs=3
        )
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertTrue(all(len(alts) == 3 for alts in lp.top_logprobs))


class Errors(unittest.TestCase):
    def check(self, error, status, code, param=None):
        self.assertEqual(error.status_code, status)
        self.assertEqual(error.body["code"], code)
        self.assertEqual(error.body["param"], param)
        self.assertTrue(error.body["message"])

    def test_400_bad_values_and_types(self):
        c = client()
        with self.assertRaises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=100000)
        self.check(e.exception, 400, "invalid_value", "max_tokens")
        with self.assertRaises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=CHAT, extra_body={"top_k": "many"})
        self.check(e.exception, 400, "invalid_type", "top_k")

    def test_404_unknown_model(self):
        with self.assertRaises(openai.NotFoundError) as e:
            client().chat.completions.create(model="gpt-4o", messages=CHAT)
        self.check(e.exception, 404, "model_not_found", "model")

    def test_413_body_too_large(self):
        with self.assertRaises(openai.APIStatusError) as e:
            client().completions.create(model=MODEL, prompt="x" * (2 << 20))
        self.check(e.exception, 413, "request_too_large")

    def test_structured_output_json_object_and_schema(self):
        c = client()
        r = c.chat.completions.create(
            model=MODEL, messages=CHAT, response_format={"type": "json_object"}, max_tokens=200, seed=3
        )
        self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "rank": {"type": "integer"}},
            "required": ["city", "rank"],
            "additionalProperties": False,
        }
        r = c.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=200,
            temperature=1.0,
            seed=5,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        )
        value = json.loads(r.choices[0].message.content)
        self.assertEqual(set(value), {"city", "rank"})
        self.assertIsInstance(value["rank"], int)
        with self.assertRaises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=CHAT, extra_body={"guided_regex": "(a"})
        self.check(e.exception, 400, "invalid_value", "response_format")

    def test_429_when_the_queue_is_full(self):
        c = client(os.environ["OVERLOAD_BASE"])
        running = c.completions.create(
            model=MODEL, prompt="Count:", max_tokens=2000, extra_body={"ignore_eos": True}, stream=True
        )
        next(iter(running))
        with self.assertRaises(openai.RateLimitError) as e:
            c.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        self.check(e.exception, 429, "overloaded")
        running.close()

    def test_401_without_the_right_api_key_over_tls(self):
        base, ca = os.environ["KEYED_BASE"], os.environ["TLS_CA"]
        for key in ["wrong-key", "unused"]:
            with self.assertRaises(openai.AuthenticationError) as e:
                client(base, key, ca).models.list()
            self.check(e.exception, 401, "invalid_api_key")
            self.assertNotIn(key, e.exception.body["message"])
        keyed = client(base, os.environ["KEYED_KEY"], ca)
        self.assertEqual([m.id for m in keyed.models.list()], [MODEL])
        chunks = list(
            keyed.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=32, temperature=0, stream=True
            )
        )
        self.assertEqual(joined(chunks)[0], EXPECTED["chat"]["text"])
        # Without the test CA the certificate does not verify.
        with self.assertRaises(openai.APIConnectionError):
            openai.OpenAI(base_url=base, api_key="unused", max_retries=0).models.list()

    def test_503_without_a_worker(self):
        with self.assertRaises(openai.InternalServerError) as e:
            client(os.environ["DEAD_BASE"]).chat.completions.create(model=MODEL, messages=CHAT)
        self.check(e.exception, 503, "unavailable")


if __name__ == "__main__":
    unittest.main(verbosity=2)
