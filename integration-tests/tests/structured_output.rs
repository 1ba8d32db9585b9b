//! Structured output through real processes on the real model (SmolLM2): sampled at temperature 1,
//! every JSON output parses and validates against its schema, regex and choice outputs match; a
//! constrained request leaves the unconstrained ones beside it bitwise unchanged and is itself the
//! same alone, batched and preempted; invalid constraints are refused with `INVALID_ARGUMENT`.

use std::time::Duration;

use inference_proto::public::{
    constraint::Kind, ChoiceList, Constraint, FinishReason, GenerateRequest,
};
use integration_tests::{
    animal_schema, constrained, generate, generate_concurrently, real_model, Cluster, Generation,
    PublicClient,
};
use serde_json::{json, Value};

/// A complete constrained output ends because the constraint is complete (or with EOS, allowed only
/// where it is).
fn assert_complete(g: &Generation, what: &str) {
    assert!(
        matches!(
            g.finish_reason,
            FinishReason::ConstraintComplete | FinishReason::EosToken
        ),
        "{what}: finished with {:?} after {} tokens: {:?}",
        g.finish_reason,
        g.token_ids.len(),
        g.text
    );
}

/// Same tokens, text and finish reason.
fn assert_same_output(got: &Generation, want: &Generation, what: &str) {
    assert_eq!(got.token_ids, want.token_ids, "{what}");
    assert_eq!(got.text, want.text, "{what}");
    assert_eq!(got.finish_reason, want.finish_reason, "{what}");
}

/// 60 small schemas of varied shapes: flat and nested objects, arrays, enums, bounded integers and
/// numbers, optional fields, `$ref`s to `$defs`, `anyOf`, patterns, constants, top-level scalars.
/// Strings and arrays are bounded so a complete value fits in the token budget.
fn schemas() -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..5i64 {
        let n = 4 + 2 * i;
        // Flat object, all required.
        out.push(json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": n},
            "age": {"type": "integer", "minimum": i, "maximum": 20 + i * 10}},
            "required": ["name", "age"], "additionalProperties": false}));
        // Nested objects.
        out.push(json!({"type": "object", "properties": {
            "user": {"type": "object", "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 999},
                "email": {"type": "string", "maxLength": 12}},
                "required": ["id", "email"], "additionalProperties": false},
            "active": {"type": "boolean"}},
            "required": ["user", "active"], "additionalProperties": false}));
        // Array of enum strings.
        out.push(
            json!({"type": "array", "items": {"enum": ["red", "green", "blue"]},
            "minItems": 1, "maxItems": 2 + i}),
        );
        // Numbers with exclusive bounds.
        out.push(json!({"type": "object", "properties": {
            "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 100 * (i + 1)},
            "ratio": {"type": "number", "minimum": -1, "maximum": 1}},
            "required": ["price", "ratio"], "additionalProperties": false}));
        // Optional fields.
        out.push(json!({"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 10},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
            "genre": {"enum": ["drama", "comedy", "horror"]}},
            "required": ["title"], "additionalProperties": false}));
        // $ref to $defs.
        out.push(json!({"$defs": {"point": {"type": "object", "properties": {
                "x": {"type": "integer", "minimum": -i - 5, "maximum": i + 5},
                "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["x", "y"], "additionalProperties": false}},
            "type": "object", "properties": {
                "from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
            "required": ["from", "to"], "additionalProperties": false}));
        // anyOf.
        out.push(json!({"type": "object", "properties": {
            "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50},
                                {"type": "string", "maxLength": 6}, {"type": "null"}]}},
            "required": ["value"], "additionalProperties": false}));
        // Top-level string enum.
        out.push(json!({"enum": ["north", "south", "east", "west", format!("up{i}")]}));
        // Array of objects.
        out.push(
            json!({"type": "array", "maxItems": 2, "items": {"type": "object",
            "properties": {"k": {"type": "string", "maxLength": 5},
                           "v": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["k", "v"], "additionalProperties": false}}),
        );
        // Pattern and const.
        out.push(json!({"type": "object", "properties": {
            "code": {"type": "string", "pattern": format!("^[A-Z]{{{}}}$", 2 + i)},
            "version": {"const": i},
            "ok": {"type": "boolean"}},
            "required": ["code", "version", "ok"], "additionalProperties": false}));
        // Top-level bounded integer.
        out.push(json!({"type": "integer", "minimum": -10 * i, "maximum": 10 + i}));
        // Nested arrays of numbers.
        out.push(json!({"type": "object", "properties": {
            "matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2,
                "items": {"type": "integer", "minimum": 0, "maximum": 99}}}},
            "required": ["matrix"], "additionalProperties": false}));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schemas_sampled_at_temperature_1_always_parse_and_validate() {
    let cluster = Cluster::start(&real_model()).await;
    let client = cluster.client().await;
    let schemas = schemas();
    assert!(schemas.len() >= 50);
    let mut requests: Vec<GenerateRequest> = schemas
        .iter()
        .enumerate()
        .map(|(i, schema)| {
            let question = format!("Reply with JSON for this schema: {schema}");
            let kind = Kind::JsonSchema(schema.to_string());
            constrained(&question, kind, 160, 100 + i as u64)
        })
        .collect();
    // Any JSON object: nothing bounds it but the prompt, so a little cooler.
    for seed in 0..4 {
        let question = "Reply with a short JSON object with a cat's name and age.";
        let mut request = constrained(question, Kind::JsonObject(true), 160, seed);
        request.temperature = 0.5;
        requests.push(request);
    }
    let results = generate_concurrently(&client, requests).await;
    for (i, result) in results.iter().enumerate() {
        let g = result
            .as_ref()
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_complete(g, &format!("request {i}"));
        let value: Value = serde_json::from_str(&g.text)
            .unwrap_or_else(|e| panic!("request {i}: {e}: {:?}", g.text));
        match schemas.get(i) {
            Some(schema) => {
                let validator = jsonschema::validator_for(schema).expect("a valid schema");
                assert!(
                    validator.is_valid(&value),
                    "request {i}: {value} does not validate against {schema}"
                );
            }
            None => assert!(value.is_object(), "json_object gave {value}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_and_choice_outputs_match() {
    let cluster = Cluster::start(&real_model()).await;
    let client = cluster.client().await;
    let regexes = [
        ("A phone number?", r"\+?[0-9]{1,3}-[0-9]{3}-[0-9]{4}"),
        (
            "Today's date?",
            r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
        ),
        ("A hex color?", r"#[0-9a-f]{6}"),
        ("Name a fruit.", r"[A-Z][a-z]{2,9}"),
        ("Yes or no?", r"(yes|no)\."),
    ];
    let choices = vec![
        "Paris".to_string(),
        "London".into(),
        "Rome (Italy)".into(),
        "a.b*c".into(),
    ];
    let mut requests = Vec::new();
    for seed in 0..3 {
        for (question, regex) in regexes {
            requests.push(constrained(question, Kind::Regex(regex.into()), 40, seed));
        }
        let kind = Kind::Choice(ChoiceList {
            choices: choices.clone(),
        });
        requests.push(constrained("Name a capital city.", kind, 20, seed));
    }
    let results = generate_concurrently(&client, requests.clone()).await;
    for (request, result) in requests.iter().zip(results) {
        let g = result.expect("generation");
        assert_complete(&g, &format!("{:?}", request.constraint));
        match &request.constraint.as_ref().unwrap().kind {
            Some(Kind::Regex(regex)) => {
                let whole = regex::Regex::new(&format!("^(?:{regex})$")).unwrap();
                assert!(whole.is_match(&g.text), "{:?} !~ {regex}", g.text);
            }
            Some(Kind::Choice(_)) => assert!(choices.contains(&g.text), "{:?}", g.text),
            other => unreachable!("{other:?}"),
        }
    }
    // A constraint that cannot be complete within max_new_tokens ends with MAX_NEW_TOKENS, its text
    // a prefix of the language (not a complete output).
    let mut c = client.clone();
    let g = generate(
        &mut c,
        constrained("Count.", Kind::Regex("[0-9]{40}".into()), 5, 1),
    )
    .await
    .unwrap();
    assert_eq!(g.finish_reason, FinishReason::MaxNewTokens);
    assert!(
        !g.text.is_empty() && g.text.bytes().all(|b| b.is_ascii_digit()),
        "{:?}",
        g.text
    );
}

/// 31 unconstrained requests of mixed sampling settings (short, EOS ignored).
fn unconstrained() -> Vec<GenerateRequest> {
    (0..31u64)
        .map(|i| {
            let mut r = integration_tests::greedy(
                &format!("Write a list of {} animals:", 3 + i % 5),
                12 + (i % 4) as u32 * 4,
            );
            if i % 2 == 1 {
                r.temperature = 1.0;
                r.seed = Some(i);
            }
            r
        })
        .collect()
}

/// The constrained request of the batch tests: a small schema at temperature 1.
fn the_constrained_one() -> GenerateRequest {
    let kind = Kind::JsonSchema(animal_schema().to_string());
    constrained("An animal as JSON, please.", kind, 60, 5)
}

/// Runs the 31 unconstrained requests and, a moment later (so it is admitted last and is the one a
/// full KV cache preempts first), the constrained one; returns (the 31, the constrained one).
async fn batch(client: &PublicClient) -> (Vec<Generation>, Generation) {
    let others = tokio::spawn({
        let client = client.clone();
        async move { generate_concurrently(&client, unconstrained()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = client.clone();
    let constrained = generate(&mut c, the_constrained_one()).await.unwrap();
    let others = others.await.unwrap();
    (
        others.into_iter().map(Result::unwrap).collect(),
        constrained,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constrained_request_is_the_same_alone_batched_and_preempted_and_leaves_its_batch_untouched(
) {
    let model = real_model();
    let cluster = Cluster::start(&model).await;
    let client = cluster.client().await;
    let mut c = client.clone();
    let alone = generate(&mut c, the_constrained_one()).await.unwrap();
    assert_complete(&alone, "alone");
    serde_json::from_str::<Value>(&alone.text).expect("JSON");
    let others_alone: Vec<Generation> = generate_concurrently(&client, unconstrained())
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let (others, batched) = batch(&client).await;
    assert_same_output(&batched, &alone, "batched");
    for (i, (got, want)) in others.iter().zip(&others_alone).enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "unconstrained request {i}");
    }
    drop(cluster);

    // A KV cache of 40 blocks of 16 tokens: the 32 sequences do not fit at once.
    let small = Cluster::start_with(&model, &["--kv-cache-blocks", "40"]).await;
    let client = small.client().await;
    let (others, preempted) = batch(&client).await;
    let stats = small.worker_stats().await;
    assert!(stats.preemptions > 0, "expected preemptions: {stats:?}");
    assert_same_output(&preempted, &alone, "preempted");
    for (i, (got, want)) in others.iter().zip(&others_alone).enumerate() {
        assert_eq!(got.token_ids, want.token_ids, "unconstrained request {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_constraints_are_refused_with_invalid_argument() {
    let cluster = Cluster::start(&real_model()).await;
    let mut client = cluster.client().await;
    let cases = [
        (
            Kind::JsonSchema("{\"type\": ".into()),
            "json_schema is not valid JSON",
        ),
        (
            Kind::JsonSchema(r##"{"$ref": "#/$defs/nowhere"}"##.into()),
            "constraint.json_schema is invalid",
        ),
        (
            Kind::JsonSchema(r#"{"type": "integer", "minimum": 9, "maximum": 1}"#.into()),
            "constraint.json_schema is invalid",
        ),
        (Kind::Regex("[a-z".into()), "constraint.regex is invalid"),
        (
            Kind::Lark("start: missing_rule".into()),
            "constraint.lark is invalid",
        ),
        (
            Kind::Choice(ChoiceList { choices: vec![] }),
            "constraint.choice needs at least one choice",
        ),
    ];
    for (kind, expected) in cases {
        let request = constrained("Hi", kind.clone(), 10, 1);
        let status = generate(&mut client, request).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{kind:?}: {status:?}"
        );
        assert!(status.message().contains(expected), "{kind:?}: {status:?}");
    }
    let mut request = constrained("Hi", Kind::JsonObject(true), 10, 1);
    request.constraint = Some(Constraint { kind: None });
    let status = generate(&mut client, request.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("constraint is empty"),
        "{status:?}"
    );
    request.constraint = Some(Constraint {
        kind: Some(Kind::Regex("a+".into())),
    });
    request.ignore_eos = true;
    let status = generate(&mut client, request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("ignore_eos"), "{status:?}");
    // Nothing reached the worker.
    assert_eq!(cluster.worker_stats().await.prompt_tokens, 0);
}
