//! The allowed-token mask of structured output, applied to a sequence's processed logits.

/// Sets every logit whose token `allowed` does not allow to `-inf`: token `i` is allowed iff bit
/// `i % 32` of `allowed[i / 32]` is set (ids past the words are not allowed). The layout is
/// llguidance's token set (`structured_output::TokenMask::words`).
pub fn apply_mask(logits: &mut [f32], allowed: &[u32]) {
    for (block, chunk) in logits.chunks_mut(32).enumerate() {
        let word = allowed.get(block).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        for (bit, v) in chunk.iter_mut().enumerate() {
            if word >> bit & 1 == 0 {
                *v = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::{Sampler, SamplingConfig};

    /// A bitset allowing exactly `ids`.
    fn bits(ids: &[u32], words: usize) -> Vec<u32> {
        let mut w = vec![0u32; words];
        for &id in ids {
            w[id as usize / 32] |= 1 << (id % 32);
        }
        w
    }

    fn logits(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32) / 10.0 - 3.0)
            .collect()
    }

    #[test]
    fn masks_exactly_the_disallowed_tokens() {
        let mut l = logits(70);
        let original = l.clone();
        // 70 logits, two words given: ids 64..70 lie past them and are masked too.
        let allowed = [0u32, 5, 31, 32, 63];
        apply_mask(&mut l, &bits(&allowed, 2));
        for (i, (&v, &o)) in l.iter().zip(&original).enumerate() {
            if allowed.contains(&(i as u32)) {
                assert_eq!(v.to_bits(), o.to_bits(), "id {i}");
            } else {
                assert_eq!(v, f32::NEG_INFINITY, "id {i}");
            }
        }
    }

    #[test]
    fn masked_sampling_draws_only_allowed_tokens() {
        let l = logits(100);
        let allowed = [3u32, 40, 41, 77];
        let mask = bits(&allowed, 4);
        let config = SamplingConfig {
            temperature: 1.0,
            ..SamplingConfig::default()
        };
        let mut seen = std::collections::HashSet::new();
        for seed in 0..200 {
            let t = Sampler::new(config.clone(), seed).sample_masked(&l, &[1], &[], Some(&mask));
            assert!(allowed.contains(&t.token_id), "{t:?}");
            // The logprob is the raw model distribution's, not the masked one's.
            assert_eq!(
                t.logprob,
                crate::sampler::log_softmax_at(&l, t.token_id as usize)
            );
            seen.insert(t.token_id);
        }
        assert!(
            seen.len() > 1,
            "temperature 1 over four tokens drew only {seen:?}"
        );
        // Greedy: the best allowed token.
        let best = *allowed
            .iter()
            .max_by(|&&a, &&b| l[a as usize].total_cmp(&l[b as usize]).then(b.cmp(&a)))
            .unwrap();
        let g = Sampler::new(SamplingConfig::default(), 0).sample_masked(&l, &[], &[], Some(&mask));
        assert_eq!(g.token_id, best);
    }

    #[test]
    fn an_all_allowing_mask_changes_nothing() {
        let l = logits(300);
        let all = vec![u32::MAX; 10];
        let config = SamplingConfig {
            temperature: 0.8,
            top_p: 0.9,
            ..SamplingConfig::default()
        };
        for seed in 0..50 {
            let plain = Sampler::new(config.clone(), seed).sample(&l, &[], &[7, 8]);
            let masked =
                Sampler::new(config.clone(), seed).sample_masked(&l, &[], &[7, 8], Some(&all));
            assert_eq!(plain, masked);
        }
    }
}
