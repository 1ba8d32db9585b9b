//! The gRPC codec of both protocols: prost encoding, and decoding that reports a malformed message as
//! the sender's error.
//!
//! tonic's stock `ProstCodec` maps every `prost::DecodeError` to `INTERNAL` ("failed to decode
//! Protobuf message"), so a client that sends garbage, a truncated message, a field with the wrong
//! wire type or a string that is not UTF-8 is told the server failed. [`WireCodec`] answers
//! `INVALID_ARGUMENT` instead, with prost's own description, which names the field path and the
//! problem, e.g. `failed to decode Protobuf message: GenerateRequest.prompt: invalid string value:
//! data is not UTF-8 encoded`. The generated clients and servers of both packages use it
//! (`codec_path` in `build.rs`); on a client, `INVALID_ARGUMENT` then says the peer's answer was
//! malformed.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// `application/grpc+proto` through prost, decoding errors as `INVALID_ARGUMENT` (see the module
/// docs). `T` is the type sent, `U` the type received.
#[derive(Debug, Clone)]
pub struct WireCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Default for WireCodec<T, U> {
    fn default() -> Self {
        Self {
            _types: PhantomData,
        }
    }
}

impl<T, U> Codec for WireCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = WireDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder { _type: PhantomData }
    }
}

/// Decodes one `U` from a gRPC frame's payload; a payload that is not a valid `U` is
/// `INVALID_ARGUMENT` with prost's description (field path and problem).
#[derive(Debug, Clone)]
pub struct WireDecoder<U> {
    _type: PhantomData<U>,
}

impl<U: prost::Message + Default> Decoder for WireDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(decode_status)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The status of a payload that does not decode: `INVALID_ARGUMENT` with prost's description.
pub fn decode_status(error: prost::DecodeError) -> Status {
    Status::invalid_argument(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::public::{ChatMessage, GenerateRequest};
    use prost::Message as _;
    use tonic::Code;

    fn decode(bytes: &[u8]) -> Result<GenerateRequest, Status> {
        GenerateRequest::decode(bytes).map_err(decode_status)
    }

    /// Field `number` as a length-delimited record holding `payload`.
    fn field(number: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, payload.len() as u8];
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn invalid_utf8_is_invalid_argument_naming_the_field() {
        let prompt_field = 1; // GenerateRequest.prompt
        let status = decode(&field(prompt_field, b"ok \xff\xfe")).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("GenerateRequest.prompt")
                && status.message().contains("not UTF-8"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn invalid_utf8_in_a_message_content_names_the_nested_field() {
        let bad = ChatMessage {
            role: "user".into(),
            content: "x".into(),
            ..Default::default()
        }
        .encode_to_vec();
        // Replace the content byte "x" with an invalid UTF-8 byte.
        let mut bad = bad;
        let last = bad.len() - 1;
        bad[last] = 0xff;
        let messages_field = 2; // GenerateRequest.messages
        let request = field(messages_field, &bad);
        let status = decode(&request).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("messages") && status.message().contains("UTF-8"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn truncated_and_garbage_payloads_are_invalid_argument() {
        let whole = GenerateRequest {
            prompt: "The capital of France is".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let truncated = decode(&whole[..whole.len() - 3]).unwrap_err();
        assert_eq!(truncated.code(), Code::InvalidArgument);
        assert!(
            truncated.message().contains("buffer underflow"),
            "{}",
            truncated.message()
        );
        let garbage = decode(&[0xff; 16]).unwrap_err();
        assert_eq!(garbage.code(), Code::InvalidArgument);
    }

    #[test]
    fn wrong_wire_type_is_invalid_argument() {
        // prompt (field 1) sent as a varint instead of a length-delimited string.
        let status = decode(&[1 << 3, 7]).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("wire type"),
            "{}",
            status.message()
        );
    }
}
