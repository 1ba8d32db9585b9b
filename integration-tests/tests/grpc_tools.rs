//! Tool calling on the gRPC front (issue 29: `GenerateRequest.tools = 24`, `tool_choice = 25`,
//! `parallel_tool_calls = 26`, `ChatMessage.tool_calls = 3` / `tool_call_id = 4`,
//! `GenerateResponse.tool_calls = 8`, `FinishReason::TOOL_CALLS`), with real router and worker
//! processes on 127.0.0.1 and the tiny random-weight llama, whose template has no tool support
//! (the built-in Hermes format). Random weights sampled at temperature 1 write anything the call
//! grammar allows, which makes them a hard test of it.
//!
//! - `required`, a named function (one call, `parallel_tool_calls` false) and `auto` over many
//!   seeds and varied schemas: every returned call names an offered function and its arguments
//!   validate against the function's schema (Rust `jsonschema`); the streamed `text` carries no
//!   call markup; the finish reason is TOOL_CALLS; `none` returns text and no call.
//! - The same seeded requests through the OpenAI HTTP front return the same calls (names and
//!   arguments) and content: one implementation behind both fronts.
//! - A conversation that feeds a call and its result back generates.
//! - Bad input is `INVALID_ARGUMENT` with a message naming what is wrong.
//! - While the worker is busy (a long prompt prefilling, 8 plain greedy streams), tool requests
//!   still return valid calls and the plain streams' tokens equal their solo runs.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use inference_proto::public::{
    constraint, tool_choice, ChatMessage, Constraint, FinishReason, GenerateRequest, Tool,
    ToolCall, ToolChoice, ToolChoiceMode,
};
use integration_tests::openai::{post, start};
use integration_tests::{generate, greedy, stream_all, tiny_model_with_context, Generation};
use serde_json::{json, Value};
use tonic::Code;

/// Function `i`'s argument schema: nested objects, enums, bounded integers, numbers and arrays,
/// short strings, optional fields.
fn schema(i: usize) -> Value {
    let kinds = [
        json!({"type": "integer", "minimum": -5, "maximum": 40}),
        json!({"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]}),
        json!({"type": "string", "maxLength": 6}),
        json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "maxItems": 3}),
        json!({"type": "object", "properties": {
            "a": {"type": "boolean"},
            "b": {"type": "object", "properties": {"c": {"type": "integer", "minimum": 1,
                                                         "maximum": 3}},
                  "required": ["c"], "additionalProperties": false}},
            "required": ["a", "b"], "additionalProperties": false}),
        json!({"type": "number", "minimum": 0, "maximum": 10}),
        json!({"type": "boolean"}),
    ];
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    for j in 0..1 + i % 3 {
        let name = format!("p{j}");
        properties.insert(name.clone(), kinds[(i + 2 * j) % kinds.len()].clone());
        if (i + j).is_multiple_of(2) {
            required.push(name);
        }
    }
    json!({"type": "object", "properties": properties, "required": required,
           "additionalProperties": false})
}

fn tool(name: &str, parameters: &Value) -> Tool {
    Tool {
        name: name.into(),
        description: format!("Function {name}."),
        parameters: parameters.to_string(),
    }
}

fn user(content: &str) -> ChatMessage {
    ChatMessage {
        role: "user".into(),
        content: content.into(),
        ..Default::default()
    }
}

fn mode(mode: ToolChoiceMode) -> Option<ToolChoice> {
    Some(ToolChoice {
        kind: Some(tool_choice::Kind::Mode(mode as i32)),
    })
}

/// A chat request offering `tools` with `choice`, sampled at temperature 1 with `seed`.
fn tool_request(tools: Vec<Tool>, choice: Option<ToolChoice>, seed: u64) -> GenerateRequest {
    GenerateRequest {
        messages: vec![user("Call the functions you need.")],
        tools,
        tool_choice: choice,
        temperature: 1.0,
        seed: Some(seed),
        max_new_tokens: Some(320),
        ..Default::default()
    }
}

/// Checks every call of `g` against the offered `tools` (by name) and returns how many there
/// were. With calls, the text holds no call markup (without a complete call, as when
/// `max_new_tokens` cuts the only one short, the whole generation is text).
fn check_calls(g: &Generation, tools: &[Tool]) -> usize {
    if !g.tool_calls.is_empty() {
        assert!(
            !g.text.contains("<tool_call>"),
            "call markup in text: {g:?}"
        );
    }
    for call in &g.tool_calls {
        assert!(
            call.id.starts_with("call_") && call.id.len() == 29,
            "{call:?}"
        );
        let offered = tools
            .iter()
            .find(|t| t.name == call.name)
            .unwrap_or_else(|| panic!("call to a function not offered: {call:?}"));
        let schema: Value = serde_json::from_str(&offered.parameters).unwrap();
        let arguments: Value = serde_json::from_str(&call.arguments)
            .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {call:?}"));
        let validator = jsonschema::validator_for(&schema).unwrap();
        if let Err(e) = validator.validate(&arguments) {
            panic!("arguments do not validate ({e}): {call:?} against {schema}");
        }
    }
    if !g.tool_calls.is_empty() {
        assert_ne!(g.finish_reason, FinishReason::EosToken, "{g:?}");
    }
    g.tool_calls.len()
}

fn names_and_arguments(calls: &[ToolCall]) -> Vec<(String, String)> {
    calls
        .iter()
        .map(|c| (c.name.clone(), c.arguments.clone()))
        .collect()
}

/// The OpenAI HTTP form of a gRPC tool request.
fn http_body(req: &GenerateRequest) -> Value {
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t.name, "description": t.description,
                "parameters": serde_json::from_str::<Value>(&t.parameters).unwrap()}})
        })
        .collect();
    let choice = match req.tool_choice.as_ref().and_then(|c| c.kind.clone()) {
        None => json!("auto"),
        Some(tool_choice::Kind::Function(name)) => {
            json!({"type": "function", "function": {"name": name}})
        }
        Some(tool_choice::Kind::Mode(m)) => match ToolChoiceMode::try_from(m).unwrap() {
            ToolChoiceMode::Required => json!("required"),
            ToolChoiceMode::None => json!("none"),
            _ => json!("auto"),
        },
    };
    json!({
        "model": "tiny",
        "messages": req.messages.iter().map(|m| json!({"role": m.role, "content": m.content}))
            .collect::<Vec<_>>(),
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "temperature": req.temperature,
        "seed": req.seed,
        "max_tokens": req.max_new_tokens,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_tool_calls_parse_validate_and_match_the_http_front() {
    let (_dir, model) = tiny_model_with_context(29, 16384);
    let h = start(&model, &[], &["--served-model-name", "tiny"], &[]).await;
    let mut client = h.cluster.client().await;
    let http = reqwest::Client::new();

    // `required` and `auto` over varied schemas and seeds, three functions offered each time.
    let mut calls = 0;
    let mut tool_finishes = 0;
    for i in 0..24usize {
        let tools: Vec<Tool> = (0..3)
            .map(|k| tool(&format!("fn_{}", i + k), &schema(i + k)))
            .collect();
        let choice = if i % 3 == 2 {
            mode(ToolChoiceMode::Auto)
        } else {
            mode(ToolChoiceMode::Required)
        };
        let g = generate(
            &mut client,
            tool_request(tools.clone(), choice, 100 + i as u64),
        )
        .await
        .unwrap();
        calls += check_calls(&g, &tools);
        if g.finish_reason == FinishReason::ToolCalls && i % 3 != 2 {
            tool_finishes += 1;
            assert!(!g.tool_calls.is_empty());
        }
        if i % 3 != 2 && g.finish_reason == FinishReason::ToolCalls {
            assert!(g.text.trim().is_empty(), "required: calls only: {g:?}");
        }
    }
    eprintln!("{tool_finishes} of 24 requests ended in calls ({calls} calls)");
    // Seeded and batch invariant, so the same every run: one `required` request in 16 writes a
    // number longer than max_new_tokens allows (random weights), the others end in calls.
    assert!(
        tool_finishes >= 14 && calls >= 14,
        "{tool_finishes} of 16 `required` requests ended in calls ({calls} calls in all)"
    );

    // A named function, one call.
    let tools: Vec<Tool> = (0..3).map(|k| tool(&format!("f{k}"), &schema(k))).collect();
    for seed in 0..6 {
        let mut req = tool_request(
            tools.clone(),
            Some(ToolChoice {
                kind: Some(tool_choice::Kind::Function("f1".into())),
            }),
            seed,
        );
        req.parallel_tool_calls = Some(false);
        let g = generate(&mut client, req).await.unwrap();
        check_calls(&g, &tools);
        if g.finish_reason == FinishReason::ToolCalls {
            assert_eq!(g.tool_calls.len(), 1, "{g:?}");
            assert_eq!(g.tool_calls[0].name, "f1");
        }
    }

    // `none`: text only, the tools still shown to the model.
    let g = generate(
        &mut client,
        tool_request(tools.clone(), mode(ToolChoiceMode::None), 7),
    )
    .await
    .unwrap();
    assert!(g.tool_calls.is_empty(), "{g:?}");
    assert_ne!(g.finish_reason, FinishReason::ToolCalls);
    assert!(!g.text.is_empty());

    // The HTTP front gives the same calls and content for the same seeded requests.
    for (seed, choice) in [
        (3, mode(ToolChoiceMode::Required)),
        (4, mode(ToolChoiceMode::Auto)),
        (5, mode(ToolChoiceMode::Required)),
    ] {
        let req = tool_request(tools.clone(), choice, seed);
        let g = generate(&mut client, req.clone()).await.unwrap();
        let (status, body) = post(
            &http,
            &format!("{}/v1/chat/completions", h.base),
            &http_body(&req),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let message = &body["choices"][0]["message"];
        let http_calls: Vec<(String, String)> = message["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| {
                        (
                            c["function"]["name"].as_str().unwrap().to_string(),
                            c["function"]["arguments"].as_str().unwrap().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            http_calls,
            names_and_arguments(&g.tool_calls),
            "seed {seed}"
        );
        let content = message["content"].as_str().unwrap_or("");
        assert_eq!(content, g.text, "seed {seed}");
        let reason = body["choices"][0]["finish_reason"].as_str().unwrap();
        assert_eq!(
            reason == "tool_calls",
            g.finish_reason == FinishReason::ToolCalls,
            "seed {seed}: {reason} vs {:?}",
            g.finish_reason
        );
    }

    // A call and its result fed back.
    let made = generate(
        &mut client,
        tool_request(tools.clone(), mode(ToolChoiceMode::Required), 11),
    )
    .await
    .unwrap();
    let call = made.tool_calls.first().cloned().unwrap_or(ToolCall {
        id: "call_1".into(),
        name: "f0".into(),
        arguments: "{}".into(),
    });
    let mut req = tool_request(tools.clone(), mode(ToolChoiceMode::Auto), 12);
    req.messages.push(ChatMessage {
        role: "assistant".into(),
        tool_calls: vec![call.clone()],
        ..Default::default()
    });
    req.messages.push(ChatMessage {
        role: "tool".into(),
        content: "{\"ok\": true}".into(),
        tool_call_id: Some(call.id.clone()),
        ..Default::default()
    });
    let g = generate(&mut client, req).await.unwrap();
    check_calls(&g, &tools);
    assert!(g.usage.unwrap().prompt_tokens > made.usage.unwrap().prompt_tokens);

    // Bad input: INVALID_ARGUMENT, the message naming what is wrong.
    let weird = json!({"type": "object", "properties": {
        "x": {"type": "string", "pattern": "(?<=a)b"}}});
    let mut cases: Vec<(GenerateRequest, &str)> = Vec::new();
    let ask = tool_request(tools.clone(), mode(ToolChoiceMode::Required), 1);
    cases.push((
        GenerateRequest {
            tools: vec![tools[0].clone(), tools[0].clone()],
            ..ask.clone()
        },
        "given twice",
    ));
    let mut not_json = tools[0].clone();
    not_json.parameters = "{not json".into();
    cases.push((
        GenerateRequest {
            tools: vec![not_json],
            ..ask.clone()
        },
        "function \"f0\": parameters is not JSON",
    ));
    cases.push((
        GenerateRequest {
            tool_choice: Some(ToolChoice {
                kind: Some(tool_choice::Kind::Function("nope".into())),
            }),
            ..ask.clone()
        },
        "tool_choice names function \"nope\"",
    ));
    cases.push((
        GenerateRequest {
            messages: vec![],
            prompt: "hi".into(),
            ..ask.clone()
        },
        "tools need messages",
    ));
    cases.push((
        GenerateRequest {
            tools: vec![tool("weird", &weird)],
            ..ask.clone()
        },
        "function \"weird\"",
    ));
    cases.push((
        GenerateRequest {
            constraint: Some(Constraint {
                kind: Some(constraint::Kind::JsonObject(true)),
            }),
            ..ask.clone()
        },
        "cannot be combined with a constraint",
    ));
    let mut orphan = ask.clone();
    orphan.messages.push(ChatMessage {
        role: "tool".into(),
        content: "1".into(),
        tool_call_id: Some("call_x".into()),
        ..Default::default()
    });
    cases.push((orphan, "messages[1].tool_call_id \"call_x\""));
    for (req, needle) in cases {
        let status = generate(&mut client, req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(needle), "{needle}: {status:?}");
    }

    // Busy: a long prompt prefilling and 8 plain greedy streams beside 6 tool requests; the plain
    // streams' tokens equal their solo runs.
    let plain: Vec<GenerateRequest> = (0..8)
        .map(|k| greedy(&format!("Plain stream {k} counts"), 48))
        .collect();
    let solo: Vec<Vec<u32>> = {
        let mut out = Vec::new();
        for req in &plain {
            out.push(generate(&mut client, req.clone()).await.unwrap().token_ids);
        }
        out
    };
    let long = greedy(
        &"the long prompt keeps the worker prefilling ".repeat(300),
        4,
    );
    let mut together = plain.clone();
    together.push(long);
    for seed in 0..6 {
        together.push(tool_request(
            tools.clone(),
            mode(ToolChoiceMode::Required),
            200 + seed,
        ));
    }
    let results = stream_all(&client, &together, Arc::new(AtomicUsize::new(0))).await;
    for (k, result) in results.iter().enumerate() {
        let g = &result.as_ref().unwrap().generation;
        if k < plain.len() {
            assert_eq!(
                g.token_ids, solo[k],
                "plain stream {k} changed beside tool requests"
            );
        } else if k > plain.len() {
            check_calls(g, &tools);
        }
    }
    let long_usage = results[plain.len()]
        .as_ref()
        .unwrap()
        .generation
        .usage
        .unwrap();
    assert!(long_usage.prompt_tokens > 5000, "{long_usage:?}");
}
