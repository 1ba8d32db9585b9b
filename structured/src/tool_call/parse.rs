//! Reading tool calls back out of generated text, whole ([`parse_tool_calls`]) or while it streams
//! ([`StreamingCalls`]). The text is the family's run of calls ([`ToolSyntax`]), after free text
//! under `tool_choice: "auto"`; the grammar keeps constrained generations in that shape.

use super::syntax::ToolSyntax;

/// One complete call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// The arguments, as the JSON text the model wrote.
    pub arguments: String,
}

/// A whole generation, split.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// The text before the calls (trailing whitespace removed); `None` when empty.
    pub content: Option<String>,
    /// The complete calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// A call as far as it has been generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartialCall<'a> {
    name: &'a str,
    arguments: &'a str,
    done: bool,
}

/// How far the run of calls got.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Scan<'a> {
    calls: Vec<PartialCall<'a>>,
    /// The text breaks the syntax (never under the grammar).
    broken: bool,
}

enum Step {
    Matched,
    Incomplete,
    Broken,
}

/// Consumes `literal` from `rest`.
fn expect(rest: &mut &str, literal: &str) -> Step {
    if let Some(after) = rest.strip_prefix(literal) {
        *rest = after;
        Step::Matched
    } else if literal.starts_with(*rest) {
        Step::Incomplete
    } else {
        Step::Broken
    }
}

/// The length of the JSON value at the start of `text`, or `None` while it is unfinished.
/// (Strings and nesting are tracked; a bare number or literal ends at the next delimiter.)
fn json_value_len(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            ',' | '}' | ']' | ' ' | '\n' if depth == 0 && i > 0 => return Some(i),
            _ => {}
        }
    }
    None
}

/// Scans a run of calls starting at `text` (at the trigger).
fn scan<'a>(syntax: &ToolSyntax, text: &'a str) -> Scan<'a> {
    let mut out = Scan::default();
    let mut rest = text;
    let name_close = syntax.name_close();
    let call_end = format!("}}{}", syntax.call_suffix);
    macro_rules! step {
        ($literal:expr) => {
            match expect(&mut rest, $literal) {
                Step::Matched => {}
                Step::Incomplete => return out,
                Step::Broken => {
                    out.broken = true;
                    return out;
                }
            }
        };
    }
    step!(syntax.section_prefix);
    loop {
        if !out.calls.is_empty() {
            if rest.is_empty() {
                return out;
            }
            if !syntax.section_suffix.is_empty() && rest.starts_with(syntax.section_suffix) {
                return out;
            }
            step!(syntax.separator);
        }
        step!(syntax.call_prefix);
        step!(ToolSyntax::NAME_OPEN);
        let Some(name_end) = rest.find('"') else {
            return out;
        };
        let name = &rest[..name_end];
        rest = &rest[name_end..];
        step!(&name_close);
        let index = out.calls.len();
        out.calls.push(PartialCall {
            name,
            arguments: rest,
            done: false,
        });
        let Some(len) = json_value_len(rest) else {
            return out;
        };
        // Complete once its arguments are: what the call's closing text adds carries nothing,
        // and a streamed call has its last fragment then (so both readings agree when the
        // length limit cuts the closing text).
        out.calls[index].arguments = &rest[..len];
        out.calls[index].done = true;
        rest = &rest[len..];
        step!(&call_end);
    }
}

/// Splits a whole generation into its text and its calls. Text without the trigger, or whose run
/// of calls breaks the syntax, is all content; a call whose arguments were cut short (the length
/// limit, a stop string) is left out, and one whose arguments are whole counts even when its
/// closing text was cut.
pub fn parse_tool_calls(syntax: &ToolSyntax, text: &str) -> ParsedOutput {
    let whole = |text: &str| ParsedOutput {
        content: (!text.is_empty()).then(|| text.to_string()),
        calls: Vec::new(),
    };
    let Some(start) = text.find(syntax.trigger) else {
        return whole(text);
    };
    let scanned = scan(syntax, &text[start..]);
    let calls: Vec<ParsedCall> = scanned
        .calls
        .iter()
        .filter(|c| c.done)
        .map(|c| ParsedCall {
            name: c.name.to_string(),
            arguments: c.arguments.to_string(),
        })
        .collect();
    if scanned.broken || calls.is_empty() {
        return whole(text);
    }
    let content = text[..start].trim_end();
    ParsedOutput {
        content: (!content.is_empty()).then(|| content.to_string()),
        calls,
    }
}

/// What a streamed step adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDelta {
    /// More content text.
    Content(String),
    /// Call `index` begins: its name is complete.
    Start {
        /// The call's index in the run (0-based).
        index: usize,
        /// The function's name.
        name: String,
    },
    /// More of call `index`'s arguments JSON.
    Arguments {
        /// The call's index.
        index: usize,
        /// The next fragment.
        fragment: String,
    },
}

/// Splits a streamed generation as it grows: content until the trigger (holding back text that
/// may be the start of the trigger, and trailing whitespace), then each call's name once complete
/// and its arguments in fragments. The fragments of a call concatenate to its arguments.
#[derive(Debug, Clone)]
pub struct StreamingCalls {
    syntax: ToolSyntax,
    text: String,
    content_sent: usize,
    /// Per call started: bytes of its arguments sent.
    arguments_sent: Vec<usize>,
}

impl StreamingCalls {
    /// A parser for `syntax`, nothing read yet.
    pub fn new(syntax: ToolSyntax) -> Self {
        Self {
            syntax,
            text: String::new(),
            content_sent: 0,
            arguments_sent: Vec::new(),
        }
    }

    /// The generation read so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether a call has started (its name was sent).
    pub fn has_calls(&self) -> bool {
        !self.arguments_sent.is_empty()
    }

    /// Whether a call is complete so far (its arguments whole): what [`parse_tool_calls`] would
    /// return a call for, and what makes a finish reason `tool_calls`.
    pub fn has_complete_calls(&self) -> bool {
        let Some(start) = self.text.find(self.syntax.trigger) else {
            return false;
        };
        let scanned = scan(&self.syntax, &self.text[start..]);
        !scanned.broken && scanned.calls.iter().any(|c| c.done)
    }

    /// Reads the next piece of generated text; returns what it adds.
    pub fn push(&mut self, piece: &str) -> Vec<CallDelta> {
        self.text.push_str(piece);
        let mut out = Vec::new();
        let trigger = self.syntax.trigger;
        let Some(start) = self.text.find(trigger) else {
            let held = (1..trigger.len())
                .rev()
                .find(|&n| {
                    self.text
                        .is_char_boundary(self.text.len().saturating_sub(n))
                        && self.text.ends_with(&trigger[..n])
                })
                .unwrap_or(0);
            let safe = self.text[..self.text.len() - held].trim_end().len();
            self.send_content(safe, &mut out);
            return out;
        };
        let content_end = self.text[..start].trim_end().len();
        self.send_content(content_end, &mut out);
        let scanned = scan(&self.syntax, &self.text[start..]);
        for (index, call) in scanned.calls.iter().enumerate() {
            if index == self.arguments_sent.len() {
                self.arguments_sent.push(0);
                out.push(CallDelta::Start {
                    index,
                    name: call.name.to_string(),
                });
            }
            let sent = self.arguments_sent[index];
            if call.arguments.len() > sent {
                out.push(CallDelta::Arguments {
                    index,
                    fragment: call.arguments[sent..].to_string(),
                });
                self.arguments_sent[index] = call.arguments.len();
            }
        }
        out
    }

    /// The end of the text: content held back is sent when no call started.
    pub fn finish(&mut self) -> Vec<CallDelta> {
        let mut out = Vec::new();
        if !self.has_calls() {
            self.send_content(self.text.len(), &mut out);
        }
        out
    }

    fn send_content(&mut self, end: usize, out: &mut Vec<CallDelta>) {
        if end > self.content_sent {
            out.push(CallDelta::Content(
                self.text[self.content_sent..end].to_string(),
            ));
            self.content_sent = end;
        }
    }
}
