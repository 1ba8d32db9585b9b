//! Where the router's chat template comes from: the `chat_template` setting (a file) overrides the
//! model file's own template; a file that cannot be read or compiled stops the router at start
//! (exit code 2, naming the file). `ModelInfo` says which template is used and where it came from.

use inference_proto::public::{ChatMessage, GenerateRequest, ModelInfoRequest, TokenizeRequest};
use integration_tests::{
    bin_path, connect_ready, generate, start_router, start_worker, tiny_model,
};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_template_setting_overrides_the_model_files_template() {
    let (dir, model) = tiny_model(31);
    let template = dir.path().join("override.jinja");
    let source = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}\
                  {% if add_generation_prompt %}<<assistant>>{% endif %}";
    std::fs::write(&template, source).unwrap();
    let template = template.to_str().unwrap().to_string();
    let (_worker, worker_addr) = start_worker(&model).await;

    // Without the setting: the tiny model's own (SmolLM2's ChatML) template.
    let (_plain_router, plain_addr) = start_router(&[&worker_addr], &[]).await;
    let mut plain = connect_ready(&plain_addr, Duration::from_secs(30)).await;
    let info = plain
        .model_info(ModelInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.chat_template_origin, "model file");
    assert!(
        info.chat_template.contains("<|im_start|>"),
        "{}",
        info.chat_template
    );

    let (_router, router_addr) =
        start_router(&[&worker_addr], &["--chat-template", &template]).await;
    let mut client = connect_ready(&router_addr, Duration::from_secs(30)).await;
    let info = client
        .model_info(ModelInfoRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.chat_template_origin, format!("setting {template}"));
    assert_eq!(info.chat_template, source);

    // The chat prompt is the override's rendering: its token count is that text's.
    let request = GenerateRequest {
        messages: vec![ChatMessage {
            role: "user".into(),
            content: "hello there".into(),
            ..Default::default()
        }],
        max_new_tokens: Some(1),
        ignore_eos: true,
        ..Default::default()
    };
    let usage = generate(&mut client, request.clone())
        .await
        .expect("chat through the override")
        .usage
        .expect("usage");
    let rendered = client
        .tokenize(TokenizeRequest {
            text: "<<user>>hello there<<assistant>>".into(),
            add_special_tokens: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(usage.prompt_tokens as usize, rendered.ids.len());
    let plain_usage = generate(&mut plain, request)
        .await
        .expect("chat through the model's template")
        .usage
        .expect("usage");
    assert_ne!(plain_usage.prompt_tokens, usage.prompt_tokens);
}

#[test]
fn a_chat_template_file_that_cannot_be_used_stops_the_router_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}{{ m.content }").unwrap();
    let missing = dir.path().join("missing.jinja");
    for (path, why) in [
        (&broken, "invalid chat template"),
        (&missing, "cannot read it"),
    ] {
        let path = path.to_str().unwrap();
        for check_only in [true, false] {
            let mut command = std::process::Command::new(bin_path("router"));
            command.args([
                "--workers",
                "127.0.0.1:1",
                "--listen",
                "127.0.0.1:0",
                "--chat-template",
                path,
            ]);
            if check_only {
                command.arg("--check-config");
            }
            let output = command.output().expect("running the router");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{path}: {stderr}");
            assert!(
                stderr.contains(path) && stderr.contains(why),
                "{path}: {stderr}"
            );
        }
    }
}
