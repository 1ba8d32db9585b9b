//! `ChatTemplate` with the real SmolLM2 template.

use router::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};

use crate::common::*;

/// `tokenizer.chat_template` of SmolLM2-135M-Instruct, copied verbatim
/// (checked against the model file below).
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn smollm2() -> ChatTemplate {
    ChatTemplate::new(
        SMOLLM2_TEMPLATE,
        Some("<|im_start|>".into()),
        Some("<|im_end|>".into()),
    )
    .unwrap()
}

#[test]
fn renders_reference_chat_prompt() {
    let messages = [
        ChatMessage::new(
            "system",
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        ),
        ChatMessage::new("user", "What is the capital of France?"),
    ];
    let expected = prompt("chat_template")["text"].as_str().unwrap();
    assert_eq!(smollm2().render(&messages, true).unwrap(), expected);
    // (role, content) pairs and the public API's message type render the same.
    let pairs = [
        ("system", messages[0].content.as_str()),
        ("user", messages[1].content.as_str()),
    ];
    assert_eq!(smollm2().render(&pairs, true).unwrap(), expected);
    let proto: Vec<inference_proto::public::ChatMessage> = messages
        .iter()
        .map(|m| inference_proto::public::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect();
    assert_eq!(smollm2().render(&proto, true).unwrap(), expected);
}

#[test]
fn user_only_gets_default_system_prompt() {
    let out = smollm2()
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert_eq!(out, prompt("chat_template")["text"].as_str().unwrap());
    let out = smollm2()
        .render(&[ChatMessage::new("user", "hi")], false)
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
    assert_eq!(
        smollm2().render::<ChatMessage>(&[], true).unwrap(),
        "<|im_start|>assistant\n"
    );
}

#[test]
fn template_matches_the_model_file_and_tokenizes_to_reference_ids() {
    assert_eq!(
        real_metadata().chat_template.as_deref(),
        Some(SMOLLM2_TEMPLATE)
    );
    let text = smollm2()
        .render(
            &[ChatMessage::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    let ids = real_tokenizer().encode(&text, false).unwrap();
    assert_eq!(
        ids,
        crate::common::ids(&prompt("chat_template")["prompt_ids"])
    );
}

#[test]
fn bad_templates_are_clear_errors() {
    let err = ChatTemplate::new("{% if %}", None, None).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err}");
    let err = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}", None, None)
        .unwrap()
        .render(&[ChatMessage::new("user", "x")], true)
        .unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render(_)), "{err}");
}
