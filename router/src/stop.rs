//! Stop strings on streamed text: [`StopMatcher`] sits between the
//! detokenizer and the client, holding back any text that might be the start
//! of a stop string, and cutting the output before the first stop string
//! that appears.
//!
//! Semantics: a stop string matches as soon as it is complete in the text
//! generated so far (generation is then stopped, so a longer stop string that
//! starts earlier but is not yet complete does not win). Among stop strings
//! complete at the same delta, the one starting first wins, then the longest.
//! The stop string itself and everything after it are never emitted.
//! Positions are byte offsets into UTF-8 text; every cut falls on a char
//! boundary because stop strings are themselves valid UTF-8.

/// Why a set of stop strings is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopError {
    /// Stop string at this index is empty (it would match before any text).
    #[error("stop string {0} is empty")]
    Empty(usize),
}

/// Checks request stop strings: each must be non-empty. (Limits on their
/// number or length are the request validator's business.)
///
/// # Errors
/// [`StopError::Empty`] with the index of the first empty stop string.
pub fn validate_stops(stops: &[String]) -> Result<(), StopError> {
    match stops.iter().position(|s| s.is_empty()) {
        Some(i) => Err(StopError::Empty(i)),
        None => Ok(()),
    }
}

/// What [`StopMatcher::push`] lets through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to send to the client now.
    pub emit: String,
    /// The stop string that matched (generation must stop); `None` to go on.
    pub matched: Option<String>,
}

/// Finds stop strings in streamed text deltas of one sequence.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not emitted: a suffix that is a proper prefix of
    /// some stop string (never longer than the longest stop minus one byte,
    /// plus the latest delta while it is scanned).
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored here (reject them
    /// earlier with [`validate_stops`]); duplicates are harmless.
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched (later pushes emit nothing).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds the next text delta. Returns the text that can no longer be
    /// part of a stop string; on a match, the text before it and the stop
    /// string, after which the matcher emits nothing more.
    pub fn push(&mut self, delta: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::default();
        }
        if self.stops.is_empty() {
            return StopOutcome {
                emit: delta.to_string(),
                matched: None,
            };
        }
        self.held.push_str(delta);

        // Earliest start, then longest. `held` had no complete stop before
        // this delta, so any match found now ends inside `delta`.
        let best = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|pos| (pos, s)))
            .min_by(|(pa, sa), (pb, sb)| pa.cmp(pb).then(sb.len().cmp(&sa.len())));
        if let Some((pos, stop)) = best {
            let matched = Some(stop.clone());
            self.held.truncate(pos);
            self.stopped = true;
            return StopOutcome {
                emit: std::mem::take(&mut self.held),
                matched,
            };
        }

        let keep_from = self.partial_match_start();
        let rest = self.held.split_off(keep_from);
        StopOutcome {
            emit: std::mem::replace(&mut self.held, rest),
            matched: None,
        }
    }

    /// Releases the held text, when the sequence ends for another reason
    /// (length, EOS, cancellation). Empty after a match.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Start of the longest suffix of `held` that is a proper prefix of some
    /// stop string (`held.len()` when there is none).
    fn partial_match_start(&self) -> usize {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.held.len().saturating_sub(longest.saturating_sub(1));
        while !self.held.is_char_boundary(from) {
            from += 1;
        }
        self.held[from..]
            .char_indices()
            .map(|(i, _)| from + i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Feeds `deltas`, then `finish` if nothing matched; returns the emitted
    /// text and the match.
    fn run(stops: &[&str], deltas: &[&str]) -> (String, Option<String>) {
        let mut m = matcher(stops);
        let mut out = String::new();
        for d in deltas {
            let o = m.push(d);
            out += &o.emit;
            if o.matched.is_some() {
                assert!(m.is_stopped());
                assert_eq!(m.finish(), "");
                return (out, o.matched);
            }
        }
        out += &m.finish();
        (out, None)
    }

    #[test]
    fn stop_straddling_two_deltas() {
        let mut m = matcher(&["###"]);
        assert_eq!(m.push("Hello #").emit, "Hello ");
        let o = m.push("## world");
        assert_eq!(o.emit, "");
        assert_eq!(o.matched.as_deref(), Some("###"));
        assert_eq!(m.push("more").emit, "");
    }

    #[test]
    fn stop_inside_one_delta_drops_the_rest() {
        assert_eq!(
            run(&["END"], &["abc", "dEND and more"]),
            ("abcd".to_string(), Some("END".to_string()))
        );
    }

    #[test]
    fn partial_match_held_then_released() {
        let mut m = matcher(&["<|im_end|>"]);
        assert_eq!(m.push("Paris.<|im").emit, "Paris.");
        assert_eq!(m.push("_sta").emit, "<|im_sta");
        assert_eq!(m.push("rt|").emit, "rt|");
        assert_eq!(m.push("<").emit, "");
        assert_eq!(m.finish(), "<");
    }

    #[test]
    fn hold_uses_the_longest_possible_prefix() {
        // "aab": suffix "ab" is a prefix of "abc"; "b" alone is not.
        let mut m = matcher(&["abc"]);
        assert_eq!(m.push("aab").emit, "a");
        assert_eq!(m.push("x").emit, "abx");
    }

    #[test]
    fn multiple_stops_earliest_then_longest() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]).1.as_deref(),
            Some("lo")
        );
        assert_eq!(
            run(&["ab", "abc"], &["xxabcd"]),
            ("xx".into(), Some("abc".into()))
        );
        // Two stops complete in the same delta: the earlier one wins.
        assert_eq!(
            run(&["cd", "ab"], &["_", "abcd"]),
            ("_".into(), Some("ab".into()))
        );
        // A stop completes while a longer one starting earlier is still open.
        assert_eq!(
            run(&["abcd", "bc"], &["a", "bc", "d"]),
            ("a".into(), Some("bc".into()))
        );
    }

    #[test]
    fn no_stops_passes_everything() {
        let mut m = StopMatcher::new(vec![]);
        assert_eq!(m.push("abc").emit, "abc");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn empty_stops_rejected_and_ignored() {
        assert_eq!(
            validate_stops(&["a".into(), String::new()]),
            Err(StopError::Empty(1))
        );
        assert!(validate_stops(&["a".into()]).is_ok());
        assert!(validate_stops(&[]).is_ok());
        assert_eq!(
            run(&["", "x"], &["ab", "cxd"]),
            ("abc".into(), Some("x".into()))
        );
    }

    #[test]
    fn unicode_stops_and_text() {
        assert_eq!(
            run(&["。終"], &["日本語", "。", "終わり"]),
            ("日本語".into(), Some("。終".into()))
        );
        // A partial match that shares a char's leading bytes must not split it.
        let mut m = matcher(&["é!"]);
        assert_eq!(m.push("caf").emit, "caf");
        assert_eq!(m.push("é").emit, "");
        assert_eq!(m.push("e").emit, "ée");
        assert_eq!(
            run(&["🙂🙂"], &["a🙂", "b🙂", "🙂c"]),
            ("a🙂b".into(), Some("🙂🙂".into()))
        );
        // "è" and "é" share their first byte: no false partial match.
        let mut m = matcher(&["é"]);
        assert_eq!(m.push("è").emit, "è");
    }

    #[test]
    fn equals_offline_truncation() {
        let text = "The answer is 42.\nUser: thanks\nAssistant: ok";
        let stops = ["\nUser:", "42"];
        let expected = "The answer is ";
        for chunk in 1..8 {
            let deltas: Vec<String> = text
                .chars()
                .collect::<Vec<_>>()
                .chunks(chunk)
                .map(|c| c.iter().collect())
                .collect();
            let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
            assert_eq!(
                run(&stops, &refs),
                (expected.into(), Some("42".into())),
                "chunk {chunk}"
            );
        }
    }
}
