//! GPT-2's byte-to-unicode alphabet, in which byte-level BPE vocabularies (GGUF
//! `tokenizer.ggml.model = "gpt2"`: SmolLM2, Llama 3, Qwen 2) write their token strings.
//!
//! From `bytes_to_unicode` in OpenAI's GPT-2 `encoder.py` (Radford et al. 2019,
//! <https://github.com/openai/gpt-2/blob/master/src/encoder.py>): the printable bytes `!`..`~`,
//! `¡`..`¬` and `®`..`ÿ` stand for themselves; the other 68 bytes stand for U+0100 onwards, in byte
//! order (`Ġ` = U+0120 is the space, `Ċ` = U+010A the newline).
//!
//! The one copy of the table in the workspace: the tokenizer's per-token bytes, structured output's
//! vocabulary and the tiny test model's token strings (`gguf::testing`) all read it here.

/// Whether byte `b` stands for itself in the alphabet.
const fn is_printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The first code point past the alphabet: 256 + the 68 bytes that are not printable.
const ALPHABET_END: usize = 256 + 68;

/// Each byte's symbol.
const BYTE_TO_UNICODE: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    let mut b = 0;
    while b < 256 {
        let code = if is_printable(b as u8) {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        table[b] = match char::from_u32(code) {
            Some(c) => c,
            None => panic!("U+0000..U+0143 are valid chars"),
        };
        b += 1;
    }
    table
};

/// Each symbol's byte, indexed by code point (`None` outside the alphabet).
const UNICODE_TO_BYTE: [Option<u8>; ALPHABET_END] = {
    let mut inverse = [None; ALPHABET_END];
    let mut b = 0;
    while b < 256 {
        inverse[BYTE_TO_UNICODE[b] as usize] = Some(b as u8);
        b += 1;
    }
    inverse
};

/// GPT-2's `bytes_to_unicode`: the symbol standing for each byte (index = byte value).
pub fn byte_to_unicode() -> [char; 256] {
    BYTE_TO_UNICODE
}

/// The byte that symbol `c` stands for, or `None` for a character outside the alphabet (the
/// inverse of [`byte_to_unicode`]).
pub fn unicode_to_byte(c: char) -> Option<u8> {
    UNICODE_TO_BYTE.get(c as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], '\u{0143}', "the last of the 68 shifted bytes");
        let mut sorted = t.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
    }

    #[test]
    fn gpt2_alphabet_inverts() {
        for (b, &c) in byte_to_unicode().iter().enumerate() {
            assert_eq!(unicode_to_byte(c), Some(b as u8), "byte {b} as {c:?}");
        }
        assert_eq!(unicode_to_byte('Ġ'), Some(b' '));
        assert_eq!(unicode_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(unicode_to_byte('\u{0144}'), None);
        assert_eq!(
            unicode_to_byte('\u{00AD}'),
            None,
            "soft hyphen is not printable"
        );
        assert_eq!(unicode_to_byte(' '), None);
        assert_eq!(unicode_to_byte('€'), None);
    }
}
