//! Tool calls on the gRPC front: a `Generate` call with `tools` (and a `tool_choice` other than
//! NONE) streams only its content as `text`, and its last message carries the calls parsed
//! (`GenerateResponse.tool_calls`, each with a fresh id) and the finish reason TOOL_CALLS where it
//! would have been EOS_TOKEN, STOP_SEQUENCE or CONSTRAINT_COMPLETE. The HTTP front splits the same
//! generation into OpenAI's `delta.tool_calls` instead (`openai::run`); both read the text with
//! `structured_output::tool_call`.
//!
//! What the client sees, concatenated over the stream:
//! - calls were made: `text` is the content before the first call (trailing whitespace removed),
//!   `tool_calls` the complete calls in order (a call whose arguments were cut by `max_new_tokens`
//!   or a stop string is left out, so
//!   every call returned parses and, under the call grammar, validates against its schema);
//! - no call was made: `text` is the whole generation, as without tools.
//!
//! `tokens` are left as the worker generated them (every token, calls included), so usage and
//! logprobs still count them.

use inference_proto::public::{FinishReason, GenerateResponse, ToolCall};
use structured_output::tool_call::{parse_tool_calls, CallDelta, StreamingCalls, ToolSyntax};

/// A fresh tool-call id: `call_` and 24 hex digits (the shape OpenAI's ids have).
pub fn tool_call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// Rewrites the messages of one sequence's stream in order (see the module docs).
#[derive(Debug, Clone)]
pub struct ToolCallStream {
    syntax: ToolSyntax,
    /// The parser, which also holds the whole generated text so far.
    calls: StreamingCalls,
    /// Bytes of the text sent as content.
    sent: usize,
}

impl ToolCallStream {
    /// A stream whose calls are written in `syntax` (the served model's).
    pub fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            calls: StreamingCalls::new(syntax),
            sent: 0,
        }
    }

    /// Rewrites `message`, the next one of the stream: its `text` becomes the content it adds;
    /// the last message (the one with a finish reason) also gets the calls and, when there are
    /// any, the finish reason TOOL_CALLS in place of a normal end.
    pub fn rewrite(&mut self, message: &mut GenerateResponse) {
        let last = message.finish_reason() != FinishReason::Unspecified;
        let mut deltas = self.calls.push(&message.text);
        if last {
            deltas.extend(self.calls.finish());
        }
        let mut content = String::new();
        for delta in deltas {
            if let CallDelta::Content(text) = delta {
                content.push_str(&text);
            }
        }
        self.sent += content.len();
        message.text = content;
        if !last {
            return;
        }
        let text = self.calls.text();
        let parsed = parse_tool_calls(&self.syntax, text);
        if parsed.calls.is_empty() {
            // No complete call: the held-back rest is content after all.
            message.text.push_str(&text[self.sent.min(text.len())..]);
            self.sent = text.len();
            return;
        }
        message.tool_calls = parsed
            .calls
            .into_iter()
            .map(|call| ToolCall {
                id: tool_call_id(),
                name: call.name,
                arguments: call.arguments,
            })
            .collect();
        if matches!(
            message.finish_reason(),
            FinishReason::EosToken | FinishReason::StopSequence | FinishReason::ConstraintComplete
        ) {
            message.set_finish_reason(FinishReason::ToolCalls);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str, finish: FinishReason) -> GenerateResponse {
        let mut m = GenerateResponse {
            text: text.into(),
            ..Default::default()
        };
        m.set_finish_reason(finish);
        m
    }

    /// Streams `pieces` (the last one ends with `finish`) through a Hermes splitter.
    fn run(pieces: &[&str], finish: FinishReason) -> (String, GenerateResponse) {
        let mut stream = ToolCallStream::new(ToolSyntax::builtin());
        let mut text = String::new();
        let mut last = GenerateResponse::default();
        for (i, piece) in pieces.iter().enumerate() {
            let reason = if i + 1 == pieces.len() {
                finish
            } else {
                FinishReason::Unspecified
            };
            let mut m = message(piece, reason);
            stream.rewrite(&mut m);
            text.push_str(&m.text);
            if i + 1 < pieces.len() {
                assert!(m.tool_calls.is_empty(), "calls only on the last message");
            }
            last = m;
        }
        (text, last)
    }

    #[test]
    fn content_streams_and_the_calls_arrive_parsed_at_the_end() {
        let pieces = [
            "Let me check.",
            " <tool",
            "_call>\n{\"name\": \"get_weather\", \"arg",
            "uments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", ",
            "\"arguments\": {}}\n</tool_call>",
        ];
        let (text, last) = run(&pieces, FinishReason::ConstraintComplete);
        assert_eq!(text, "Let me check.");
        assert_eq!(last.finish_reason(), FinishReason::ToolCalls);
        let calls: Vec<_> = last
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [("get_weather", "{\"city\": \"Oslo\"}"), ("now", "{}")]
        );
        assert!(last
            .tool_calls
            .iter()
            .all(|c| c.id.len() == 29 && c.id.starts_with("call_")));
        assert_ne!(last.tool_calls[0].id, last.tool_calls[1].id);
    }

    #[test]
    fn without_a_call_the_text_is_the_whole_generation() {
        let (text, last) = run(
            &["Plain ", "answer <tool", "s are fun"],
            FinishReason::EosToken,
        );
        assert_eq!(text, "Plain answer <tools are fun");
        assert_eq!(last.finish_reason(), FinishReason::EosToken);
        assert!(last.tool_calls.is_empty());
        // Held back at the very end (a possible trigger, trailing space): sent with the last.
        let (text, _) = run(&["ends with <tool_"], FinishReason::MaxNewTokens);
        assert_eq!(text, "ends with <tool_");
        let (text, _) = run(&["spaces  ", "\n"], FinishReason::EosToken);
        assert_eq!(text, "spaces  \n");
    }

    #[test]
    fn a_call_cut_short_is_left_out_and_the_length_reason_stays() {
        let pieces = [
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n",
            "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": ",
        ];
        let (text, last) = run(&pieces, FinishReason::MaxNewTokens);
        assert_eq!(text, "");
        assert_eq!(last.finish_reason(), FinishReason::MaxNewTokens);
        assert_eq!(last.tool_calls.len(), 1);
        assert_eq!(last.tool_calls[0].name, "a");
        // Only a cut call: no call, the generation is all content.
        let (text, last) = run(
            &["<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\""],
            FinishReason::MaxNewTokens,
        );
        assert_eq!(text, "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\"");
        assert!(last.tool_calls.is_empty());
    }
}
