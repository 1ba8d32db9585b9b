"""`serve`'s OpenAI HTTP API driven by the official `openai` Python SDK, as a new user would call it.

Run by integration-tests/tests/serve.rs with OPENAI_BASE (http://127.0.0.1:PORT/v1); prints one JSON
line: the listed model ids, and the text, finish reason and usage of a whole and a streamed chat
answer, and what a request with `tools` got.
"""

import json
import os

import openai

client = openai.OpenAI(
    base_url=os.environ["OPENAI_BASE"],
    api_key=os.environ.get("OPENAI_API_KEY", "unused"),
    max_retries=0,
    timeout=60,
)
models = [m.id for m in client.models.list()]
messages = [{"role": "user", "content": "Say hello."}]
whole = client.chat.completions.create(model=models[0], messages=messages, max_tokens=8, seed=1)
text, reasons, usage = "", [], None
stream = client.chat.completions.create(
    model=models[0],
    messages=messages,
    max_tokens=8,
    seed=1,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    for choice in chunk.choices:
        text += choice.delta.content or ""
        if choice.finish_reason is not None:
            reasons.append(choice.finish_reason)
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
# Tool calling: `tool_choice: "required"` gets a call to the one function offered.
try:
    answer = client.chat.completions.create(
        model=models[0],
        messages=messages,
        max_tokens=128,
        parallel_tool_calls=False,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": False}}}],
        tool_choice="required",
    ).choices[0]
    tools = {"status": 200, "finish_reason": answer.finish_reason,
             "calls": [[c.function.name, c.function.arguments] for c in answer.message.tool_calls or []]}
except openai.BadRequestError as e:
    tools = {"status": e.status_code, "param": e.body.get("param"), "code": e.body.get("code")}
print(
    json.dumps(
        {
            "models": models,
            "whole": {
                "text": whole.choices[0].message.content,
                "finish_reason": whole.choices[0].finish_reason,
                "completion_tokens": whole.usage.completion_tokens,
            },
            "streamed": {"text": text, "finish_reasons": reasons, "completion_tokens": usage},
            "tools": tools,
        }
    )
)
