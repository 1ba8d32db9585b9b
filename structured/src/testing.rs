//! Test vocabularies: constraint compilers over tiny vocabularies of single characters, for the
//! tests of this crate and of the engine (constrained decoding and speculation), where forced text
//! is forced tokens.

use crate::{ConstraintCompiler, VocabSource};

/// A compiler over `<eos>` (id 0, a control token and the only EOS) followed by one token per
/// character of `chars`, in order (the i-th character is id `i + 1`).
///
/// Panics when llguidance refuses the vocabulary (a test helper).
pub fn single_char_compiler(chars: impl IntoIterator<Item = char>) -> ConstraintCompiler {
    let mut tokens = vec!["<eos>".to_string()];
    tokens.extend(chars.into_iter().map(String::from));
    let mut types = vec![1; tokens.len()];
    types[0] = 3;
    ConstraintCompiler::new(VocabSource {
        model: "gpt2",
        tokens: &tokens,
        token_types: &types,
        vocab_size: tokens.len(),
        eos_token_ids: &[0],
    })
    .expect("a single-character vocabulary")
}
