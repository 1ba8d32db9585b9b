//! The n-gram prompt-lookup proposer (model-free; the idea of Saxena's "prompt lookup decoding" and
//! vLLM's `ngram` speculator): find the most recent earlier occurrence of the sequence's last n
//! tokens, n from `ngram_max` down to `ngram_min`, in the prompt and the generated text, and propose
//! the tokens that followed it.

/// Up to `k` tokens that followed the most recent earlier occurrence of the last n tokens of
/// `tokens` (prompt followed by the generated tokens), trying n = `max_n` down to `min_n` and
/// taking the first n that matches; empty when none matches or `k` is 0. The occurrence must end
/// before the last token (the suffix itself is not a match), and its continuation is cut at the
/// end of `tokens`. O(len * n) per call, no allocation besides the result.
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    if k == 0 || min_n == 0 {
        return Vec::new();
    }
    let len = tokens.len();
    for n in (min_n..=max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // Candidate starts, most recent first; the match must end before `len`.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == suffix {
                let from = start + n;
                let to = (from + k).min(len);
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn proposes_what_followed_the_most_recent_match() {
        // ... 1 2 3 [9 9] ... 1 2 3 [7 8] ... 1 2 3
        let t = [1, 2, 3, 9, 9, 0, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(propose(&t, 1, 3, 2), [7, 8]);
        assert_eq!(propose(&t, 1, 3, 5), [7, 8, 5, 1, 2]);
    }

    #[test]
    fn longest_n_wins_over_a_more_recent_shorter_match() {
        // Last 2 tokens "4 5": "4 5" occurs at 0 (followed by 6); "5" alone occurs later at 4.
        let t = [4, 5, 6, 0, 5, 1, 4, 5];
        assert_eq!(propose(&t, 1, 2, 1), [6]);
        // With n capped at 1, the most recent "5" (followed by 1) wins.
        assert_eq!(propose(&t, 1, 1, 1), [1]);
    }

    #[test]
    fn continuation_is_cut_at_the_end_and_self_overlap_works() {
        // A run of one token: the suffix "7 7" also occurs one position earlier.
        let t = [7, 7, 7, 7];
        assert_eq!(propose(&t, 1, 2, 5), [7]);
        let t = [1, 2, 1, 2, 1];
        assert_eq!(propose(&t, 1, 3, 4), [2, 1]);
    }

    #[test]
    fn nothing_to_propose() {
        assert!(propose(&[1, 2, 3, 4], 1, 3, 5).is_empty());
        assert!(propose(&[1, 1], 1, 3, 0).is_empty());
        assert!(propose(&[1], 1, 3, 4).is_empty());
        assert!(propose(&[], 1, 3, 4).is_empty());
        // ngram_min 2: a single repeated token is not enough.
        assert!(propose(&[5, 6, 7, 5], 2, 3, 4).is_empty());
    }
}
