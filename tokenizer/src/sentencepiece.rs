//! GGUF SentencePiece-style vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral,
//! Gemma) reproduced with the `tokenizers` crate.
//!
//! SentencePiece's BPE (Kudo & Richardson 2018, <https://arxiv.org/abs/1808.06226>) encodes a text
//! by replacing every space with `▁` (U+2581), optionally prepending one (`add_space_prefix`),
//! starting from single characters and repeatedly merging the adjacent pair whose concatenation
//! is the vocabulary piece with the highest score; characters left outside the vocabulary become
//! byte tokens `<0xXX>` (byte fallback). GGUF stores the pieces, their scores and their types but
//! no merge list, so [`merges_from_scores`] derives one the way Hugging Face's converter does
//! (`SentencePieceExtractor`): every split of a normal piece into two vocabulary pieces is a merge,
//! ranked by the merged piece's score. A BPE over that list with byte fallback produces the same
//! ids as llama.cpp's `llm_tokenizer_spm` and Hugging Face's `GemmaTokenizer` (checked on the
//! Gemma 3 reference cases in this crate's tests).
//!
//! Token types (GGUF `tokenizer.ggml.token_type`): control tokens (3: `<bos>`,
//! `<start_of_turn>`) are special added tokens, matched verbatim in text and dropped by
//! `decode(.., skip_special)`; user-defined tokens (4: Gemma's `\n`, runs of spaces or tabs) are
//! ordinary added tokens matched verbatim in the raw text before anything else, and decode as
//! their text; byte tokens (6) are the fallback.

use std::collections::{HashMap, HashSet};

use inference_proto::worker::TokenizerSpec;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, Tokenizer};

use crate::error::TokenizerError;

/// GGUF token type of normal pieces.
const TYPE_NORMAL: i32 = 1;
/// GGUF token type of control tokens.
const TYPE_CONTROL: i32 = 3;
/// GGUF token type of user-defined tokens.
const TYPE_USER_DEFINED: i32 = 4;
/// GGUF token type of byte-fallback tokens (`<0x41>`).
const TYPE_BYTE: i32 = 6;
/// SentencePiece's whitespace symbol.
const SPACE: char = '\u{2581}';

/// A SentencePiece vocabulary assembled as a `tokenizers` BPE.
pub struct SpmTokenizer {
    /// The tokenizer (normalizer, BPE with byte fallback, added tokens, decoder).
    pub tokenizer: Tokenizer,
    /// Ids of control tokens.
    pub special_ids: HashSet<u32>,
    /// Each token's decoded bytes, when decoding is a pure concatenation of per-token bytes (no
    /// `add_space_prefix`, whose leading space the decoder strips); `None` otherwise.
    pub token_bytes: Option<Vec<Vec<u8>>>,
}

/// Builds the tokenizer of a `"llama"` (SentencePiece) GGUF vocabulary.
///
/// `add_space_prefix` follows the file, and llama.cpp's default (`true`) when the file does not
/// say.
///
/// # Errors
/// [`TokenizerError::InvalidSpec`] for an empty vocabulary, token types or scores whose count
/// differs from the tokens', or a vocabulary the BPE cannot be built from.
pub fn build(spec: &TokenizerSpec) -> Result<SpmTokenizer, TokenizerError> {
    let n = spec.tokens.len();
    if n == 0 {
        return Err(TokenizerError::InvalidSpec("empty token list".into()));
    }
    if spec.scores.len() != n {
        return Err(TokenizerError::InvalidSpec(format!(
            "a SentencePiece vocabulary needs one score per token: {} scores for {n} tokens",
            spec.scores.len()
        )));
    }
    if !spec.token_types.is_empty() && spec.token_types.len() != n {
        return Err(TokenizerError::InvalidSpec(format!(
            "{} token types for {n} tokens",
            spec.token_types.len()
        )));
    }
    let ty = |id: usize| spec.token_types.get(id).copied().unwrap_or(TYPE_NORMAL);
    let add_space_prefix = spec.add_space_prefix.unwrap_or(true);

    let mut vocab = Vocab::with_capacity(n);
    for (id, token) in spec.tokens.iter().enumerate() {
        vocab.entry(token.clone()).or_insert(id as u32);
    }
    let merges = merges_from_scores(&spec.tokens, &spec.token_types, &spec.scores);
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = (0..n).find(|&id| ty(id) == 2) {
        bpe = bpe.unk_token(spec.tokens[unk].clone());
    }
    let bpe = bpe
        .build()
        .map_err(|e| TokenizerError::InvalidSpec(e.to_string()))?;

    let mut tokenizer = Tokenizer::new(bpe);
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| TokenizerError::InvalidSpec(e.to_string()))
    };
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_string()).into());
    }
    normalizers.push(replace(" ", &SPACE.to_string())?.into());
    tokenizer.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace(&SPACE.to_string(), " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));

    let mut special_ids = HashSet::new();
    let (mut control, mut user) = (Vec::new(), Vec::new());
    for (id, token) in spec.tokens.iter().enumerate() {
        if token.is_empty() {
            continue;
        }
        match ty(id) {
            TYPE_CONTROL => {
                special_ids.insert(id as u32);
                control.push(AddedToken::from(token.clone(), true));
            }
            TYPE_USER_DEFINED => {
                user.push(AddedToken::from(token.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&control);
    tokenizer.add_tokens(&user);

    let token_bytes = (!add_space_prefix).then(|| {
        (0..n)
            .map(|id| piece_bytes(&spec.tokens[id], ty(id)))
            .collect()
    });
    Ok(SpmTokenizer {
        tokenizer,
        special_ids,
        token_bytes,
    })
}

/// The bytes piece `piece` of GGUF type `ty` decodes to: a byte token `<0xAB>` its byte, any other
/// piece its text with `▁` as a space.
fn piece_bytes(piece: &str, ty: i32) -> Vec<u8> {
    if ty == TYPE_BYTE {
        if let Some(b) = piece
            .strip_prefix("<0x")
            .and_then(|s| s.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            return vec![b];
        }
    }
    piece.replace(SPACE, " ").into_bytes()
}

/// The BPE merge list of a SentencePiece vocabulary: for every normal piece, each split into two
/// vocabulary pieces (at character boundaries), ordered by the piece's score, highest first (ties:
/// lower merged id, then lower left and right ids). Control, user-defined and byte pieces are never
/// the result of a merge, so plain text cannot spell a control token.
pub fn merges_from_scores(
    tokens: &[String],
    types: &[i32],
    scores: &[f32],
) -> Vec<(String, String)> {
    let mut index: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        index.entry(t.as_str()).or_insert(id as u32);
    }
    let mut found: Vec<(f32, u32, u32, u32, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(TYPE_NORMAL) != TYPE_NORMAL {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                found.push((scores[id], id as u32, li, ri, at));
            }
        }
    }
    found.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    found
        .into_iter()
        .map(|(_, id, _, _, at)| {
            let (l, r) = tokens[id as usize].split_at(at);
            (l.to_string(), r.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pieces: &[(&str, f32, i32)], add_space_prefix: Option<bool>) -> TokenizerSpec {
        TokenizerSpec {
            model: "llama".into(),
            tokens: pieces.iter().map(|p| p.0.to_string()).collect(),
            scores: pieces.iter().map(|p| p.1).collect(),
            token_types: pieces.iter().map(|p| p.2).collect(),
            add_space_prefix,
            ..Default::default()
        }
    }

    /// A small vocabulary: control `<s>`, user-defined `\n`, bytes for `a`..`c` and `!`, pieces.
    fn small(add_space_prefix: Option<bool>) -> SpmTokenizer {
        let mut p = vec![("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("\n", 0.0, 4)];
        for b in [b'!', b'a', b'b', b'c'] {
            p.push((Box::leak(format!("<0x{b:02X}>").into_boxed_str()), 0.0, 6));
        }
        p.extend([
            ("▁", -1.0, 1),
            ("a", -2.0, 1),
            ("b", -3.0, 1),
            ("ab", -4.0, 1),
            ("▁ab", -5.0, 1),
            ("ba", -0.5, 1), // outranks "ab": "bab" -> "ba" + "b"
            ("s>", -0.1, 1),
            ("<", -6.0, 1),
        ]);
        build(&spec(&p, add_space_prefix)).unwrap()
    }

    fn ids(t: &SpmTokenizer, text: &str) -> Vec<u32> {
        t.tokenizer.encode(text, false).unwrap().get_ids().to_vec()
    }

    #[test]
    fn merges_follow_the_merged_pieces_scores() {
        let t = small(Some(false));
        // "ab" -> one piece; " ab" -> "▁ab"; "bab": "ba" (score -0.5) before "ab" (-4).
        assert_eq!(ids(&t, "ab"), [10]);
        assert_eq!(ids(&t, " ab"), [11]);
        assert_eq!(ids(&t, "bab"), [12, 9]);
        // 'c' is only a byte; '!' too.
        assert_eq!(ids(&t, "c!"), [6, 3]);
    }

    #[test]
    fn user_defined_and_control_tokens_are_matched_whole_and_never_merged_into() {
        let t = small(Some(false));
        assert_eq!(ids(&t, "a\nb"), [8, 2, 9]);
        assert_eq!(ids(&t, "<s>ab"), [1, 10]);
        // "<" + "s>" are pieces, but no merge forms the control token from text.
        assert_eq!(t.special_ids, HashSet::from([1]));
        assert!(!merges_from_scores(
            &["<s>".into(), "<".into(), "s>".into()],
            &[3, 1, 1],
            &[0.0, -1.0, -1.0]
        )
        .iter()
        .any(|(l, r)| l == "<" && r == "s>"));
    }

    #[test]
    fn space_prefix_is_added_and_stripped_when_the_file_asks() {
        let t = small(None); // llama.cpp's default for "llama" vocabularies: true
        assert_eq!(ids(&t, "ab"), [11]);
        assert!(t.token_bytes.is_none());
        assert_eq!(t.tokenizer.decode(&[11, 6], false).unwrap(), "abc");
        let t = small(Some(false));
        let bytes = t.token_bytes.as_ref().unwrap();
        assert_eq!(bytes[11], b" ab");
        assert_eq!(bytes[3], b"!");
        assert_eq!(bytes[2], b"\n");
    }

    #[test]
    fn inconsistent_specs_are_refused() {
        let mut s = spec(&[("a", 0.0, 1)], Some(false));
        s.scores.clear();
        assert!(matches!(build(&s), Err(TokenizerError::InvalidSpec(_))));
        assert!(build(&spec(&[], None)).is_err());
    }
}
