//! The HTTP front's helpers that vLLM users reach for (issue 30), on real router and worker
//! processes: `POST /tokenize` with a text or chat `messages`, `POST /detokenize` and `GET
//! /tokenizer_info` in vLLM's shapes, CORS for browser clients (`--allowed-origins`: preflight answered before the API-key
//! check, other origins refused), and `max_tokens` (not the router's `max_new_tokens`) in the
//! errors of the HTTP body's field.

use std::time::Duration;

use integration_tests::openai::{post, wait_healthy};
use integration_tests::{free_port, run_to_exit, start_router, start_worker, tiny_model};
use serde_json::{json, Value};

const KEY: &str = "sk-browser";
const ORIGIN: &str = "http://app.example:3000";

/// `POST {base}{path}` with the API key; the status and the JSON answer.
async fn call(http: &reqwest::Client, base: &str, path: &str, body: Value) -> (u16, Value) {
    let response = http
        .post(format!("{base}{path}"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .expect("POST");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_cors_and_max_tokens_wording() {
    let (_dir, model) = tiny_model(41);
    let (_worker, worker_addr) = start_worker(&model).await;
    let http_addr = format!("127.0.0.1:{}", free_port());
    let (_router, _) = start_router(
        &[&worker_addr],
        &[
            "--http-listen",
            &http_addr,
            "--api-key",
            KEY,
            "--allowed-origins",
            &format!("{ORIGIN},https://other.example"),
        ],
    )
    .await;
    let base = &format!("http://{http_addr}");
    wait_healthy(base, Duration::from_secs(30)).await;
    let http = reqwest::Client::new();

    // A text: ids, their count, the context length; the vocabulary strings when asked.
    let (status, plain) = call(
        &http,
        base,
        "/tokenize",
        json!({"prompt": "hello world, hello", "add_special_tokens": false, "return_token_strs": true}),
    )
    .await;
    assert_eq!(status, 200, "{plain}");
    let ids: Vec<u32> = serde_json::from_value(plain["tokens"].clone()).unwrap();
    assert!(!ids.is_empty());
    assert_eq!(plain["count"], ids.len());
    assert!(
        plain["max_model_len"].as_u64().is_some_and(|n| n > 0),
        "{plain}"
    );
    assert_eq!(plain["token_strs"].as_array().unwrap().len(), ids.len());
    // llama.cpp's names, special tokens added by default: at least as many ids.
    let (_, special) = call(
        &http,
        base,
        "/tokenize",
        json!({"content": "hello world, hello"}),
    )
    .await;
    assert!(special["count"].as_u64().unwrap() >= ids.len() as u64);
    assert!(special.get("token_strs").is_none());
    // Back to the same text.
    let (status, text) = call(&http, base, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["prompt"], "hello world, hello");
    assert_eq!(text["content"], text["prompt"]);
    // vLLM's tokenizer description (lm-evaluation-harness's remote tokenizer reads it).
    let info: Value = http
        .get(format!("{base}/tokenizer_info"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("GET /tokenizer_info")
        .json()
        .await
        .expect("a JSON answer");
    // The first of the model's end-of-sequence tokens (the tiny model has two).
    assert_eq!(info["eos_token"], "<|endoftext|>", "{info}");
    assert_eq!(info["bos_token"], "<|im_start|>", "{info}");
    assert_eq!(info["add_bos_token"], false, "{info}");
    assert_eq!(info["model_max_length"], 256, "{info}");
    assert!(info["chat_template"].is_string(), "{info}");

    // Messages: exactly the ids a chat request with them prefills.
    let messages = json!([{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Name a colour."}]);
    let (status, chat_ids) = call(&http, base, "/tokenize", json!({"messages": messages})).await;
    assert_eq!(status, 200, "{chat_ids}");
    let (status, chat) = call(
        &http,
        base,
        "/v1/chat/completions",
        json!({"messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat_ids["count"], chat["usage"]["prompt_tokens"]);
    // Without the assistant turn's opening: fewer ids.
    let (_, closed) = call(
        &http,
        base,
        "/tokenize",
        json!({"messages": messages, "add_generation_prompt": false}),
    )
    .await;
    assert!(closed["count"].as_u64().unwrap() < chat_ids["count"].as_u64().unwrap());

    // Bad bodies: 400 naming the field, with OpenAI's error object.
    for (path, body, param) in [
        ("/tokenize", json!({}), "prompt"),
        (
            "/tokenize",
            json!({"prompt": "a", "messages": messages}),
            "prompt",
        ),
        (
            "/tokenize",
            json!({"messages": messages, "add_special_tokens": true}),
            "add_special_tokens",
        ),
        ("/detokenize", json!({"tokens": [1, 99999999]}), "tokens"),
        ("/detokenize", json!({"tokens": [-1]}), "tokens"),
    ] {
        let (status, e) = call(&http, base, path, body.clone()).await;
        assert_eq!(status, 400, "{path} {body}: {e}");
        assert_eq!(e["error"]["param"], param, "{path} {body}: {e}");
    }
    let (status, e) = call(&http, base, "/tokenize", json!({"prompt": 5})).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("invalid_json"))
    );
    let (status, e) = call(
        &http,
        base,
        "/detokenize",
        json!({"model": "nope", "tokens": [1]}),
    )
    .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );

    // The body's field is max_tokens: so is the message.
    let (status, e) = call(
        &http,
        base,
        "/v1/completions",
        json!({"prompt": "a", "max_tokens": 100000000}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "max_tokens");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_tokens"), "{message}");
    assert!(!message.contains("max_new_tokens"), "{message}");

    // CORS: the preflight carries no key and is answered for an allowed origin.
    let preflight = |origin: &str| {
        http.request(
            reqwest::Method::OPTIONS,
            format!("{base}/v1/chat/completions"),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .send()
    };
    let r = preflight(ORIGIN).await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_ascii_lowercase())
    };
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(ORIGIN)
    );
    let allowed = header(&r, "access-control-allow-headers").unwrap_or_default();
    assert!(allowed.contains("authorization"), "{allowed}");
    assert!(header(&r, "access-control-allow-methods")
        .unwrap_or_default()
        .contains("post"));
    // Another origin gets no permission (the browser refuses the call).
    let r = preflight("http://evil.example").await.unwrap();
    assert_eq!(header(&r, "access-control-allow-origin"), None);
    // The real call: answered with the origin's permission.
    let r = http
        .post(format!("{base}/v1/completions"))
        .bearer_auth(KEY)
        .header("origin", ORIGIN)
        .json(&json!({"prompt": "a", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "access-control-allow-origin").as_deref(),
        Some(ORIGIN)
    );
    // Still no call without the key.
    let (status, _) = post(
        &http,
        &format!("{base}/v1/completions"),
        &json!({"prompt": "a"}),
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn an_allowed_origin_that_is_not_an_origin_is_refused_at_start() {
    let (ok, output) = run_to_exit(
        "router",
        &[
            "--workers",
            "127.0.0.1:1",
            "--allowed-origins",
            "https://app.example/path",
            "--check-config",
        ],
        Duration::from_secs(30),
    )
    .await;
    assert!(!ok, "{output}");
    assert!(
        output.contains("allowed_origins entry \"https://app.example/path\" is not an origin"),
        "{output}"
    );
}
