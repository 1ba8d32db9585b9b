"""Function schemas and checks shared by the tool-calling SDK tests (test_tool_families.py,
test_tools_gemma3.py): the tools they offer, a generator of varied argument schemas, and the check
that every returned call parses and validates with `jsonschema`."""
import json
import random

import jsonschema


def tool(name, parameters, description="A function.", strict=None):
    """An OpenAI `tools` entry."""
    function = {"name": name, "description": description, "parameters": parameters}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


WEATHER = tool("get_weather", {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False,
}, "Current weather in a city.")
TIME = tool("get_time", {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"], "additionalProperties": False,
}, "Current time in a time zone.")
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in [WEATHER, TIME]}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in UTC?"}]

# Hand-written schemas of the kind real tools have.
HANDWRITTEN = [
    {"type": "object", "properties": {
        "origin": {"type": "string", "maxLength": 3, "minLength": 3},
        "destination": {"type": "string", "maxLength": 3, "minLength": 3},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]}},
     "required": ["origin", "destination", "passengers"], "additionalProperties": False},
    {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 30},
        "filters": {"type": "object", "properties": {
            "year_from": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                     "minItems": 1, "maxItems": 3}},
            "required": ["tags"], "additionalProperties": False},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
     "required": ["query"], "additionalProperties": False},
    {"type": "object", "properties": {
        "amount": {"type": "number", "minimum": 0.01, "maximum": 10000},
        "currency": {"type": "string", "enum": ["EUR", "USD", "JPY"]},
        "memo": {"type": "string", "maxLength": 16}},
     "required": ["amount", "currency"], "additionalProperties": False},
    {"type": "object", "properties": {
        "points": {"type": "array", "minItems": 2, "maxItems": 4, "items": {
            "type": "object", "properties": {
                "x": {"type": "number", "minimum": -1, "maximum": 1},
                "y": {"type": "number", "minimum": -1, "maximum": 1}},
            "required": ["x", "y"], "additionalProperties": False}},
        "closed": {"type": "boolean"}},
     "required": ["points", "closed"], "additionalProperties": False},
    {"type": "object", "properties": {
        "event": {"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 24},
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "month": {"type": "string", "enum": ["jan", "feb", "mar", "apr"]},
            "attendees": {"type": "array", "items": {"type": "string", "maxLength": 10},
                          "maxItems": 2}},
            "required": ["title", "day", "month"], "additionalProperties": False},
        "notify": {"type": "boolean"}},
     "required": ["event"], "additionalProperties": False},
    {"type": "object", "properties": {
        "sql": {"type": "string", "maxLength": 40},
        "timeout_s": {"type": "number", "minimum": 0, "maximum": 60}},
     "required": ["sql"], "additionalProperties": False},
    {"type": "object", "properties": {
        "rgb": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255},
                "minItems": 3, "maxItems": 3},
        "name": {"type": "string", "maxLength": 12}},
     "required": ["rgb"], "additionalProperties": False},
    {"type": "object", "properties": {
        "level": {"type": "string", "enum": ["debug", "info", "warn", "error"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 3},
        "since": {"type": "object", "properties": {
            "hours": {"type": "integer", "minimum": 0, "maximum": 23},
            "minutes": {"type": "integer", "minimum": 0, "maximum": 59}},
            "required": ["hours"], "additionalProperties": False}},
     "required": ["level"], "additionalProperties": False},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": "object", "properties": {
        "matrix": {"type": "array", "maxItems": 2, "items": {
            "type": "array", "minItems": 1, "maxItems": 2,
            "items": {"type": "integer", "minimum": -9, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
]


def _leaf(rng):
    kind = rng.choice(["int", "num", "enum", "str", "bool", "arr"])
    if kind == "int":
        lo = rng.randint(-100, 100)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
    if kind == "num":
        lo = rng.choice([-5, 0, 0.5, 10])
        return {"type": "number", "minimum": lo, "maximum": lo + rng.choice([1, 10, 1000])}
    if kind == "enum":
        return {"type": "string", "enum": [f"e{k}" for k in range(rng.randint(1, 5))]}
    if kind == "str":
        return {"type": "string", "maxLength": rng.randint(1, 16)}
    if kind == "bool":
        return {"type": "boolean"}
    lo = rng.randint(0, 2)
    return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "minItems": lo, "maxItems": lo + rng.randint(0, 3)}


def _object(rng, depth):
    props, required = {}, []
    for j in range(rng.randint(1, 4)):
        if depth > 0 and rng.random() < 0.3:
            s = _object(rng, depth - 1)
            if rng.random() < 0.4:
                s = {"type": "array", "items": s, "maxItems": rng.randint(1, 2)}
        else:
            s = _leaf(rng)
        name = f"f{j}_{s['type']}"
        props[name] = s
        if rng.random() < 0.6:
            required.append(name)
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def varied_schema(i):
    """Schema i: a hand-written one first, then generated ones (nested objects and arrays of them,
    enums, bounded arrays, numbers with bounds, strings with maxLength, optional fields)."""
    if i < len(HANDWRITTEN):
        return HANDWRITTEN[i]
    return _object(random.Random(7919 * i), 2)


def check_calls(test, message, schemas):
    """Each call of `message`: a `call_` id, a known function, arguments that parse and validate."""
    for call in message.tool_calls or []:
        test.assertEqual(call.type, "function")
        test.assertTrue(call.id.startswith("call_"), call.id)
        test.assertIn(call.function.name, schemas)
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, schemas[call.function.name])


def sdk_stream(client, kw):
    """Streams the chat request `kw` with the SDK's stream helper: (argument fragments seen, the
    final choice as the helper assembled it)."""
    with client.chat.completions.stream(**kw) as stream:
        pieces = 0
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                pieces += 1
        return pieces, stream.get_final_completion().choices[0]


def assemble_stream(chunks):
    """The calls and finish reason of each choice of a raw chat stream, assembled from
    `delta.tool_calls` the way the SDK's helpers do: {index: ([(name, arguments)], reason)}."""
    out = {}
    for chunk in chunks:
        for choice in chunk.choices:
            calls, reason = out.setdefault(choice.index, ([], None))
            for delta in choice.delta.tool_calls or []:
                while len(calls) <= delta.index:
                    calls.append(["", ""])
                if delta.function and delta.function.name:
                    calls[delta.index][0] += delta.function.name
                if delta.function and delta.function.arguments:
                    calls[delta.index][1] += delta.function.arguments
            if choice.finish_reason:
                reason = choice.finish_reason
            out[choice.index] = (calls, reason)
    return {k: ([tuple(c) for c in calls], reason) for k, (calls, reason) in out.items()}
