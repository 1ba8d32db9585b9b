"""Completions' `echo` with `logprobs` (prompt logprobs, issue 29) driven by the official `openai`
Python SDK against a real router and worker.

Run by integration-tests/tests/prompt_logprobs.rs, which starts the processes and passes:
  OPENAI_BASE  the API under test (http://127.0.0.1:PORT/v1)
  MODEL        the served model name
  EXPECTED     a JSON file with a greedy gRPC generation: the prompt's ids (`prompt_ids`), the
               generated ids (`generated_ids`), their logprobs (`logprobs`, the f32 values widened
               to f64) and their top-5 alternatives (`top`, token text -> logprob), its prompt
               text (`prompt`) and generated text (`generated_text`), and `long_ids`, a long prompt
"""

import json
import os
import unittest

import openai

BASE = os.environ["OPENAI_BASE"]
MODEL = os.environ["MODEL"]
with open(os.environ["EXPECTED"], encoding="utf-8") as f:
    EXPECTED = json.load(f)


def client():
    return openai.OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=600)


class Echo(unittest.TestCase):
    def test_prompt_logprobs_equal_teacher_forced_generation_bitwise(self):
        prompt, generated = EXPECTED["prompt_ids"], EXPECTED["generated_ids"]
        r = client().completions.create(
            model=MODEL, prompt=prompt + generated, echo=True, logprobs=5, max_tokens=0
        )
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 0)
        self.assertEqual(r.usage.prompt_tokens, len(prompt) + len(generated))
        lp = choice.logprobs
        self.assertEqual(len(lp.token_logprobs), len(prompt) + len(generated))
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        # The generated tokens, scored as prompt tokens: exactly the generation's values.
        self.assertEqual(lp.token_logprobs[len(prompt):], EXPECTED["logprobs"])
        self.assertEqual(lp.top_logprobs[len(prompt):], EXPECTED["top"])
        self.assertTrue(all(v is not None and v <= 0 for v in lp.token_logprobs[1:]))
        # OpenAI's alternatives are a map keyed by token text: tokens that spell the same text
        # (the tiny model's random vocabulary has such) share one entry.
        self.assertTrue(all(1 <= len(t) <= 5 for t in lp.top_logprobs[1:]))
        self.assertEqual(lp.text_offset[0], 0)

    def test_echo_of_a_text_prompt_then_generation(self):
        r = client().completions.create(
            model=MODEL, prompt=EXPECTED["prompt"], echo=True, max_tokens=len(EXPECTED["generated_ids"]),
            temperature=0, extra_body={"ignore_eos": True},
        )
        self.assertEqual(r.choices[0].text, EXPECTED["prompt"] + EXPECTED["generated_text"])
        self.assertIsNone(r.choices[0].logprobs)
        # With logprobs: the prompt's tokens, then the generated ones with their own logprobs.
        r = client().completions.create(
            model=MODEL, prompt=EXPECTED["prompt"], echo=True, logprobs=5,
            max_tokens=len(EXPECTED["generated_ids"]), temperature=0, extra_body={"ignore_eos": True},
        )
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), len(EXPECTED["prompt_ids"]) + len(EXPECTED["generated_ids"]))
        self.assertEqual(lp.token_logprobs[len(EXPECTED["prompt_ids"]):], EXPECTED["logprobs"])

    def test_a_long_prompt_with_five_alternatives(self):
        ids = EXPECTED["long_ids"]
        r = client().completions.create(model=MODEL, prompt=ids, echo=True, logprobs=5, max_tokens=0)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.token_logprobs), len(ids))
        self.assertTrue(all(v is not None for v in lp.token_logprobs[1:]))

    def test_bad_echo_requests_are_400(self):
        c = client()
        with self.assertRaises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt="x", echo=True, stream=True, max_tokens=1)
        self.assertEqual(e.exception.body["param"], "echo")
        with self.assertRaises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt="x", echo=True, logprobs=21, max_tokens=0)
        with self.assertRaises(openai.BadRequestError):
            c.completions.create(model=MODEL, prompt="x", max_tokens=0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
