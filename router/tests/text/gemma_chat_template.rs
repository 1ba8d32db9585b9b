//! The built-in Gemma chat template with the real Gemma 3 vocabulary, against the chat prompts of
//! `fixtures/gemma3-270m.json`.

use crate::common::{gemma_reference as fixture, gemma_tokenizer as gemma, ids};

#[test]
fn the_builtin_gemma_template_gives_the_reference_chat_prompts() {
    let tok = gemma();
    let builtin = router::chat_template::builtin_template("gemma3", |t| tok.token_id(t).is_some())
        .expect("a built-in template for gemma3");
    assert_eq!(builtin.name, "gemma");
    let template = router::chat_template::ChatTemplate::new(
        builtin.source,
        tok.id_to_piece(2),
        tok.id_to_piece(1),
    )
    .unwrap();
    let mut chats = 0;
    for p in fixture()["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().unwrap();
        let Some(message) = text
            .strip_prefix("<start_of_turn>user\n")
            .and_then(|t| t.strip_suffix("<end_of_turn>\n<start_of_turn>model\n"))
        else {
            continue;
        };
        chats += 1;
        let pieces = template.render_pieces(&[("user", message)], true).unwrap();
        // The template writes <bos> itself (chat prompts are tokenized without adding one).
        assert_eq!(
            tok.encode_pieces(&pieces).unwrap(),
            ids(&p["prompt_ids"]),
            "prompt {:?}",
            p["name"]
        );
    }
    assert_eq!(chats, 2, "the fixture's two chat prompts");
}
