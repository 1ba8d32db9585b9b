//! The vocabulary of a SentencePiece `tokenizer.model` (a protobuf `ModelProto`; field numbers
//! from `sentencepiece_model.proto` in the sentencepiece repository). Only the pieces are read:
//! text, score and type.

use prost::Message;

/// `ModelProto`, pieces only (other fields are skipped by the decoder).
#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pieces: Vec<Piece>,
}

/// `ModelProto.SentencePiece`.
#[derive(Clone, PartialEq, Message)]
struct Piece {
    #[prost(string, optional, tag = "1")]
    piece: Option<String>,
    #[prost(float, optional, tag = "2")]
    score: Option<f32>,
    /// 1 normal (default), 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
    #[prost(int32, optional, tag = "3")]
    kind: Option<i32>,
}

/// One vocabulary entry with its GGUF token type.
#[derive(Debug, Clone, PartialEq)]
pub struct SpmPiece {
    /// The piece text (`▁` for spaces, `<0x0A>` for byte pieces).
    pub text: String,
    /// The piece's score.
    pub score: f32,
    /// GGUF token type as llama.cpp's converter assigns it: 2 unknown, 3 control, 5 unused,
    /// 6 byte, 1 for everything else (user-defined pieces included).
    pub token_type: i32,
}

/// Why a `tokenizer.model` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum SpmModelError {
    /// The bytes are not a `ModelProto` message.
    #[error("not a SentencePiece model: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The message has no pieces.
    #[error("not a SentencePiece model: no pieces")]
    NoPieces,
}

/// Decodes the pieces of a `tokenizer.model`.
///
/// Errors: [`SpmModelError`] (the protobuf decoder's message, or no pieces).
pub fn read_pieces(bytes: &[u8]) -> Result<Vec<SpmPiece>, SpmModelError> {
    let model = ModelProto::decode(bytes)?;
    if model.pieces.is_empty() {
        return Err(SpmModelError::NoPieces);
    }
    Ok(model
        .pieces
        .into_iter()
        .map(|p| SpmPiece {
            text: p.piece.unwrap_or_default(),
            score: p.score.unwrap_or(0.0),
            token_type: match p.kind.unwrap_or(1) {
                t @ (2 | 3 | 5 | 6) => t,
                _ => 1,
            },
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_round_trip_through_the_protobuf_encoding() {
        let model = ModelProto {
            pieces: vec![
                Piece {
                    piece: Some("<unk>".into()),
                    score: Some(0.0),
                    kind: Some(2),
                },
                Piece {
                    piece: Some("▁the".into()),
                    score: Some(-1.5),
                    kind: None,
                },
                Piece {
                    piece: Some("<user>".into()),
                    score: Some(0.0),
                    kind: Some(4),
                },
            ],
        };
        let pieces = read_pieces(&model.encode_to_vec()).unwrap();
        let types: Vec<i32> = pieces.iter().map(|p| p.token_type).collect();
        assert_eq!(types, [2, 1, 1]);
        assert_eq!(pieces[1].text, "▁the");
        assert_eq!(pieces[1].score, -1.5);
        assert!(read_pieces(b"\xff\xff garbage").is_err());
    }
}
