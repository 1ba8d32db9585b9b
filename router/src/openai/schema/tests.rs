use super::*;
use serde_json::json;

fn requests(
    endpoint: Endpoint,
    body: serde_json::Value,
) -> Result<(Vec<GenerationRequest>, Shape), ApiError> {
    let text = body.to_string();
    parse(text.as_bytes())?.into_requests(endpoint, text.len())
}

#[test]
fn chat_body_maps_every_field() {
    let (reqs, shape) = requests(
        Endpoint::Chat,
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
            ],
            "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "top_p": 0.5, "n": 3,
            "stop": "x", "seed": 5, "presence_penalty": 0.5, "frequency_penalty": -0.5,
            "logit_bias": {"42": -100}, "logprobs": true, "top_logprobs": 2, "stream": true,
            "stream_options": {"include_usage": true}, "user": "u", "top_k": -1, "min_p": 0.1,
            "repetition_penalty": 1.2, "ignore_eos": true, "some_future_field": {"x": 1},
        }),
    )
    .unwrap();
    assert_eq!(
        shape,
        Shape {
            n: 3,
            stream: true,
            include_usage: true,
            logprobs: true,
            tool_calls: false,
            echo: None,
            token_ids: false,
        }
    );
    let [r] = &reqs[..] else {
        panic!("one request")
    };
    assert_eq!(
        r.prompt,
        Prompt::Chat(vec![
            ChatMessage::new("system", "be brief"),
            ChatMessage::new("user", "ab"),
            ChatMessage::new("assistant", ""),
        ])
    );
    assert_eq!(r.max_new_tokens, Some(7), "max_completion_tokens wins");
    assert_eq!(
        (r.temperature, r.top_p, r.top_k, r.min_p),
        (0.0, Some(0.5), 0, 0.1)
    );
    assert_eq!(
        (
            r.presence_penalty,
            r.frequency_penalty,
            r.repetition_penalty
        ),
        (0.5, -0.5, 1.2)
    );
    assert_eq!(r.logit_bias, vec![(42, -100.0)]);
    assert_eq!((r.top_logprobs, r.seed, r.ignore_eos), (2, Some(5), true));
    assert_eq!(r.stop, vec!["x"]);
    assert_eq!(r.constraint, None);
}

#[test]
fn completions_prompts_and_defaults() {
    let (reqs, shape) = requests(
        Endpoint::Completions,
        json!({"prompt": ["a", "b"], "logprobs": 2}),
    )
    .unwrap();
    assert_eq!(reqs.len(), 2);
    assert!(shape.logprobs);
    assert_eq!(
        reqs[1].prompt,
        Prompt::Text {
            text: "b".into(),
            plain_text: false
        }
    );
    assert_eq!(reqs[0].max_new_tokens, Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
    assert_eq!(reqs[0].temperature, 1.0, "OpenAI's default temperature");
    assert_eq!(reqs[0].top_logprobs, 2);
    let (reqs, _) = requests(Endpoint::Completions, json!({"prompt": [[1, 2], [3]]})).unwrap();
    assert_eq!(reqs[1].prompt, Prompt::Ids(vec![3]));
    let (reqs, _) = requests(Endpoint::Completions, json!({"prompt": [7, 8]})).unwrap();
    assert_eq!(reqs[0].prompt, Prompt::Ids(vec![7, 8]));
    let (reqs, _) = requests(
        Endpoint::Chat,
        json!({"messages": [{"role": "user", "content": "q"}]}),
    )
    .unwrap();
    assert_eq!(reqs[0].max_new_tokens, None, "chat: the router's default");
}

#[test]
fn structured_output_maps_onto_the_constraint() {
    let kind = |body: serde_json::Value| {
        let mut body = body;
        body["prompt"] = json!("p");
        requests(Endpoint::Completions, body).unwrap().0[0]
            .constraint
            .clone()
            .and_then(|c| c.kind)
    };
    assert_eq!(
        kind(json!({"response_format": {"type": "json_object"}})),
        Some(Kind::JsonObject(true))
    );
    assert_eq!(kind(json!({"response_format": {"type": "text"}})), None);
    assert_eq!(
        kind(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}, "strict": true}}})
        ),
        Some(Kind::JsonSchema(r#"{"type":"integer"}"#.into()))
    );
    assert_eq!(
        kind(json!({"guided_json": "{}"})),
        Some(Kind::JsonSchema("{}".into()))
    );
    assert_eq!(
        kind(json!({"guided_regex": "a+"})),
        Some(Kind::Regex("a+".into()))
    );
    assert_eq!(
        kind(json!({"guided_grammar": "start: \"x\""})),
        Some(Kind::Lark("start: \"x\"".into()))
    );
    assert_eq!(
        kind(json!({"guided_choice": ["yes", "no"]})),
        Some(Kind::Choice(ChoiceList {
            choices: vec!["yes".into(), "no".into()]
        }))
    );
}

#[test]
fn bad_bodies_are_400_naming_the_field() {
    let err = |endpoint, body: serde_json::Value| requests(endpoint, body).unwrap_err();
    let e = parse(b"{nope").unwrap_err();
    assert_eq!((e.status.as_u16(), e.code), (400, "invalid_json"));
    let e = parse(b"[1]").unwrap_err();
    assert_eq!(e.code, "invalid_type");
    let e = err(
        Endpoint::Chat,
        json!({"messages": [], "temperature": "hot"}),
    );
    assert_eq!(
        (e.code, e.param.as_deref()),
        ("invalid_type", Some("temperature"))
    );
    assert!(
        e.message.starts_with("temperature: invalid type"),
        "{}",
        e.message
    );
    let e = err(Endpoint::Chat, json!({"messages": [{"role": 1}]}));
    assert_eq!(e.param.as_deref(), Some("messages"));
    let cases = [
        (
            Endpoint::Chat,
            json!({}),
            "messages",
            "messages is required",
        ),
        (
            Endpoint::Completions,
            json!({}),
            "prompt",
            "prompt is required",
        ),
        (
            Endpoint::Completions,
            json!({"prompt": []}),
            "prompt",
            "prompt is an empty list",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [], "n": 0}),
            "n",
            "n must be in [1, 16], got 0",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [], "logprobs": 3}),
            "logprobs",
            "logprobs must be a boolean",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [], "top_logprobs": 3}),
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        ),
        (
            Endpoint::Completions,
            json!({"prompt": "p", "logprobs": true}),
            "logprobs",
            "logprobs must be an integer (alternatives per token)",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [], "logit_bias": {"x": 1}}),
            "logit_bias",
            "logit_bias key \"x\" is not a token id",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages",
            "messages[0].content[0] is of type \"image_url\"; only text parts are served",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [], "response_format": {"type": "xml"}}),
            "response_format",
            "response_format.type must be text, json_object or json_schema, got \"xml\"",
        ),
        (
            Endpoint::Chat,
            json!({"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
            "response_format.json_schema.schema is required with type json_schema",
        ),
    ];
    for (endpoint, body, param, message) in cases {
        let e = err(endpoint, body);
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref(), e.message.as_str()),
            (400, Some(param), message)
        );
    }
    let e = err(
        Endpoint::Chat,
        json!({"messages": [], "guided_regex": "a", "guided_choice": ["a"]}),
    );
    assert!(
        e.message.starts_with("give at most one of"),
        "{}",
        e.message
    );
}

/// Fields that take one of several shapes say which shapes, not serde's internal enum names.
#[test]
fn fields_of_several_shapes_name_the_shapes_they_take() {
    let cases = [
        (
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages",
            "messages[0].content: expected a string or a list of content parts ({\"type\": \
             \"text\", \"text\": ...})",
        ),
        (
            Endpoint::Completions,
            json!({"prompt": {}}),
            "prompt",
            "prompt: expected a string, a list of strings, a list of token ids or a list of \
             lists of token ids",
        ),
        (
            Endpoint::Completions,
            json!({"prompt": [1, "two"]}),
            "prompt",
            "prompt: expected a string, a list of strings, a list of token ids or a list of \
             lists of token ids",
        ),
        (
            Endpoint::Completions,
            json!({"prompt": "p", "stop": 5}),
            "stop",
            "stop: expected a string or a list of strings",
        ),
        (
            Endpoint::Completions,
            json!({"prompt": "p", "logprobs": "x"}),
            "logprobs",
            "logprobs: expected a boolean (chat) or a non-negative integer (completions)",
        ),
    ];
    for (endpoint, body, param, message) in cases {
        let e = requests(endpoint, body).unwrap_err();
        assert_eq!(
            (
                e.status.as_u16(),
                e.code,
                e.param.as_deref(),
                e.message.as_str()
            ),
            (400, "invalid_type", Some(param), message)
        );
    }
}

#[test]
fn tools_are_parsed_and_the_deprecated_functions_refused() {
    let chat = |extra: serde_json::Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "weather?"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        requests(Endpoint::Chat, body)
    };
    let tool = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]);
    for (extra, parses) in [
        (json!({"tools": tool}), true),
        (json!({"tools": tool, "tool_choice": "required"}), true),
        (
            json!({"tools": tool, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
            true,
        ),
        (json!({"tools": tool, "tool_choice": "none"}), false),
        (json!({"tools": []}), false),
        (json!({"tools": null, "tool_choice": "auto"}), false),
    ] {
        let (reqs, shape) = chat(extra.clone()).unwrap();
        assert_eq!(shape.tool_calls, parses, "{extra}");
        assert_eq!(
            reqs[0].tools.is_some(),
            parses || extra["tool_choice"] == "none",
            "{extra}"
        );
    }
    let e = chat(json!({"functions": [{"name": "f", "parameters": {}}]})).unwrap_err();
    assert_eq!(e.status, 400);
    assert_eq!(e.param.as_deref(), Some("functions"));
    assert_eq!(e.code, "unsupported_parameter");
    assert!(chat(json!({"functions": [{"name": "f"}], "function_call": "none"})).is_ok());
    let e = requests(Endpoint::Completions, json!({"prompt": "x", "tools": tool})).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools"));
}

#[test]
fn echo_scores_the_prompt_and_max_tokens_zero_hides_the_one_token_run() {
    let body = |v: serde_json::Value| parse(v.to_string().as_bytes()).unwrap();
    let (reqs, shape) =
        body(json!({"prompt": ["a b", "c"], "echo": true, "logprobs": 3, "max_tokens": 0}))
            .into_requests(Endpoint::Completions, 10)
            .unwrap();
    assert_eq!(
        shape.echo,
        Some(Echo {
            prompt_texts: vec![Some("a b".into()), Some("c".into())],
            generate: false
        })
    );
    assert!(reqs
        .iter()
        .all(|r| r.prompt_logprobs == Some(3) && r.max_new_tokens == Some(1)));
    let (reqs, shape) = body(json!({"prompt": [1, 2], "echo": true, "max_tokens": 4}))
        .into_requests(Endpoint::Completions, 10)
        .unwrap();
    assert_eq!(shape.echo.unwrap().prompt_texts, vec![None]);
    assert_eq!(
        (reqs[0].prompt_logprobs, reqs[0].max_new_tokens),
        (None, Some(4))
    );
    for bad in [
        json!({"messages": [{"role": "user", "content": "x"}], "echo": true}),
        json!({"prompt": "x", "echo": true, "stream": true}),
    ] {
        let endpoint = if bad.get("messages").is_some() {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        let err = body(bad).into_requests(endpoint, 10).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("echo"), "{}", err.message);
    }
}
