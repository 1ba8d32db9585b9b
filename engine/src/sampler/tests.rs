//! Sampler tests: every step against hand-computed distributions on small logit vectors, a naive
//! reference implementation on large random ones, the counter-based stream, and draw frequencies.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const LOGITS: [f32; 6] = [1.0, 3.0, 2.5, 3.0, -1.0, 0.0];

fn sampling(temperature: f32) -> SamplingConfig {
    SamplingConfig {
        temperature,
        ..SamplingConfig::default()
    }
}

/// `ln` of each probability (so the softmax of the result is `probs`, normalised).
fn ln(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|&p| p.ln() as f32).collect()
}

/// The distribution `config` gives for `logits` with an empty history.
fn dist(config: SamplingConfig, logits: &[f32]) -> Vec<(u32, f64)> {
    Sampler::new(config, 0).distribution(logits, &[], &[])
}

/// Asserts `got` is `want` (`(id, unnormalised weight)`), normalised, to 1e-6.
fn assert_dist(got: &[(u32, f64)], want: &[(u32, f64)]) {
    let total: f64 = want.iter().map(|w| w.1).sum();
    assert_eq!(
        got.iter().map(|g| g.0).collect::<Vec<_>>(),
        want.iter().map(|w| w.0).collect::<Vec<_>>(),
        "support of {got:?}"
    );
    for (g, w) in got.iter().zip(want) {
        assert!((g.1 - w.1 / total).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|v| (v - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|v| v / z).collect()
}

#[test]
fn greedy_picks_lowest_max_and_uses_no_draw() {
    let mut s = Sampler::new(sampling(0.0), 1);
    let t = s.sample(&LOGITS, &[], &[]);
    assert_eq!(t.token_id, 1);
    assert!(t.top_logprobs.is_empty());
    assert_eq!(s.distribution(&LOGITS, &[], &[]), vec![(1, 1.0)]);
    assert_eq!(argmax(&[f32::NAN, 1.0, 1.0]), 1);
    // top_k = 1 is greedy whatever the temperature.
    let mut s = Sampler::new(
        SamplingConfig {
            top_k: 1,
            ..sampling(5.0)
        },
        1,
    );
    for n in 0..20 {
        assert_eq!(s.sample(&LOGITS, &[], &vec![0; n]).token_id, 1);
    }
}

#[test]
fn temperature_scales_logits() {
    // probs ∝ 1, 2, 4
    let logits = ln(&[1.0, 2.0, 4.0]);
    assert_dist(
        &dist(sampling(1.0), &logits),
        &[(0, 1.0), (1, 2.0), (2, 4.0)],
    );
    // T = 2: ∝ sqrt(1, 2, 4)
    assert_dist(
        &dist(sampling(2.0), &logits),
        &[(0, 1.0), (1, 2f64.sqrt()), (2, 2.0)],
    );
    // T = 0.5: ∝ (1, 2, 4)^2
    assert_dist(
        &dist(sampling(0.5), &logits),
        &[(0, 1.0), (1, 4.0), (2, 16.0)],
    );
    // A tiny temperature leaves only the max (exp underflows for the rest), without overflow.
    assert_dist(&dist(sampling(1e-30), &logits), &[(2, 1.0)]);
}

#[test]
fn top_k_keeps_the_k_highest_ties_to_lower_ids() {
    let e = |v: f64| v.exp();
    let k = |top_k| SamplingConfig {
        top_k,
        ..sampling(1.0)
    };
    assert_dist(&dist(k(2), &LOGITS), &[(1, 1.0), (3, 1.0)]);
    assert_dist(
        &dist(k(3), &LOGITS),
        &[(1, e(3.0)), (2, e(2.5)), (3, e(3.0))],
    );
    // Ties at the boundary: the lower id stays.
    assert_dist(&dist(k(2), &[2.0, 1.0, 1.0, 1.0]), &[(0, e(1.0)), (1, 1.0)]);
    // k >= vocab keeps everything.
    assert_eq!(dist(k(100), &LOGITS).len(), 6);
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    let logits = ln(&[0.5, 0.3, 0.15, 0.05]);
    let p = |top_p, top_k| SamplingConfig {
        top_p,
        top_k,
        ..sampling(1.0)
    };
    assert_dist(&dist(p(0.75, 0), &logits), &[(0, 0.5), (1, 0.3)]);
    assert_dist(&dist(p(0.85, 0), &logits), &[(0, 0.5), (1, 0.3), (2, 0.15)]);
    assert_dist(&dist(p(0.4, 0), &logits), &[(0, 0.5)]);
    // top_p's mass is of the top-k distribution: top-2 renormalised is 0.625, 0.375.
    assert_dist(&dist(p(0.6, 2), &logits), &[(0, 0.5)]);
    assert_dist(&dist(p(0.6, 0), &logits), &[(0, 0.5), (1, 0.3)]);
    // ... and of the temperature-scaled one: T = 2 gives ∝ sqrt(p) = .379, .294, .208, .120.
    let t2 = SamplingConfig {
        temperature: 2.0,
        ..p(0.7, 0)
    };
    assert_dist(
        &dist(t2, &logits),
        &[(0, 0.5f64.sqrt()), (1, 0.3f64.sqrt()), (2, 0.15f64.sqrt())],
    );
    // Ties at the cut: the lower id is kept.
    assert_dist(&dist(p(0.5, 0), &[0.0; 4]), &[(0, 1.0), (1, 1.0)]);
}

#[test]
fn min_p_is_relative_to_the_most_likely_after_temperature() {
    let logits = ln(&[0.5, 0.3, 0.15, 0.05]);
    let m = |min_p, temperature| SamplingConfig {
        min_p,
        ..sampling(temperature)
    };
    // relative probs 1, .6, .3, .1
    assert_dist(
        &dist(m(0.25, 1.0), &logits),
        &[(0, 0.5), (1, 0.3), (2, 0.15)],
    );
    assert_dist(&dist(m(0.5, 1.0), &logits), &[(0, 0.5), (1, 0.3)]);
    assert_dist(&dist(m(1.0, 1.0), &logits), &[(0, 1.0)]);
    // T = 2: relative sqrt(1, .6, .3, .1) = 1, .775, .548, .316
    assert_dist(
        &dist(m(0.5, 2.0), &logits),
        &[(0, 0.5f64.sqrt()), (1, 0.3f64.sqrt()), (2, 0.15f64.sqrt())],
    );
    // After top_p: min_p's reference is still the most likely token.
    let both = SamplingConfig {
        top_p: 0.85,
        ..m(0.5, 1.0)
    };
    assert_dist(&dist(both, &logits), &[(0, 0.5), (1, 0.3)]);
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_once_per_id() {
    let logits = [2.0f32, -1.0, 0.5, 1.0];
    let config = SamplingConfig {
        repetition_penalty: 2.0,
        ..sampling(1.0)
    };
    let mut s = Sampler::new(config.clone(), 0);
    // prompt has 0 (twice), generated has 0 and 1 (twice): 0 -> 1.0, 1 -> -2.0, 2 and 3 unchanged.
    let got = s.distribution(&logits, &[0, 0], &[0, 1, 1]);
    let e = |v: f64| v.exp();
    assert_dist(&got, &[(0, e(1.0)), (1, e(-2.0)), (2, e(0.5)), (3, e(1.0))]);
    // Greedy sees the penalised logits: 3 (1.0) ties 0 (2.0 / 2) -> 0; 2.2 / 2 < 1.2 -> 2.
    let mut g = Sampler::new(
        SamplingConfig {
            temperature: 0.0,
            ..config.clone()
        },
        0,
    );
    assert_eq!(g.sample(&logits, &[0], &[]).token_id, 0);
    assert_eq!(g.sample(&[2.2, 1.0, 1.2], &[0], &[]).token_id, 2);
    // p < 1 favours repetition.
    let mut r = Sampler::new(
        SamplingConfig {
            repetition_penalty: 0.5,
            temperature: 0.0,
            ..SamplingConfig::default()
        },
        0,
    );
    assert_eq!(r.sample(&[1.0, 1.5], &[0], &[]).token_id, 0);
}

#[test]
fn frequency_and_presence_penalties_count_generated_tokens_only() {
    let logits = [1.0f32; 4];
    let e = |v: f64| v.exp();
    let fp = |frequency_penalty, presence_penalty| SamplingConfig {
        frequency_penalty,
        presence_penalty,
        ..sampling(1.0)
    };
    // generated: 2 twice, 3 once; the prompt's 0 does not count.
    let history = ([0u32, 0], [2u32, 2, 3]);
    let d = |c| Sampler::new(c, 0).distribution(&logits, &history.0, &history.1);
    assert_dist(
        &d(fp(0.5, 0.0)),
        &[(0, e(1.0)), (1, e(1.0)), (2, e(0.0)), (3, e(0.5))],
    );
    assert_dist(
        &d(fp(0.0, 0.25)),
        &[(0, e(1.0)), (1, e(1.0)), (2, e(0.75)), (3, e(0.75))],
    );
    assert_dist(
        &d(fp(0.5, 0.25)),
        &[(0, e(1.0)), (1, e(1.0)), (2, e(-0.25)), (3, e(0.25))],
    );
    // Negative values encourage: -1 frequency makes 2 (count 2) the greedy choice.
    let mut g = Sampler::new(
        SamplingConfig {
            temperature: 0.0,
            ..fp(-1.0, 0.0)
        },
        0,
    );
    assert_eq!(g.sample(&logits, &history.0, &history.1).token_id, 2);
    // Order: repetition first, then frequency: 1.0 / 2 - 0.5 * 2 = -0.5 for id 2.
    let both = SamplingConfig {
        repetition_penalty: 2.0,
        ..fp(0.5, 0.0)
    };
    assert_dist(
        &d(both),
        &[(0, e(0.5)), (1, e(1.0)), (2, e(-0.5)), (3, e(0.0))],
    );
}

#[test]
fn logit_bias_is_added_first() {
    let biased = |bias: Vec<(u32, f32)>, temperature| SamplingConfig {
        logit_bias: bias,
        ..sampling(temperature)
    };
    assert_dist(
        &dist(biased(vec![(2, 2f32.ln())], 1.0), &[0.0; 3]),
        &[(0, 1.0), (1, 1.0), (2, 2.0)],
    );
    let mut g = Sampler::new(biased(vec![(4, 100.0)], 0.0), 0);
    assert_eq!(g.sample(&LOGITS, &[], &[]).token_id, 4);
    // -100 bans (practically) the greedy token.
    let mut g = Sampler::new(biased(vec![(1, -100.0), (3, -100.0)], 0.0), 0);
    assert_eq!(g.sample(&LOGITS, &[], &[]).token_id, 2);
    // Before the repetition penalty: (1 - 2) * 2 = -2, not 1 / 2 - 2 = -1.5.
    let config = SamplingConfig {
        repetition_penalty: 2.0,
        ..biased(vec![(0, -2.0)], 1.0)
    };
    let got = Sampler::new(config, 0).distribution(&[1.0, 0.0], &[0], &[]);
    assert_dist(&got, &[(0, (-2.0f64).exp()), (1, 1.0)]);
    // Ids outside the logits are ignored.
    assert_dist(
        &dist(biased(vec![(99, 5.0)], 1.0), &[0.0; 2]),
        &[(0, 1.0), (1, 1.0)],
    );
}

#[test]
fn logprob_and_top_logprobs_are_raw_log_softmax() {
    let raw = softmax(&LOGITS.map(f64::from));
    let config = SamplingConfig {
        temperature: 0.5,
        top_k: 3,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.3,
        frequency_penalty: 0.4,
        presence_penalty: 0.2,
        logit_bias: vec![(4, 3.0)],
        top_logprobs: 3,
    };
    let mut s = Sampler::new(config, 7);
    let mut generated = Vec::new();
    for _ in 0..20 {
        let t = s.sample(&LOGITS, &[5], &generated);
        let want = raw[t.token_id as usize].ln();
        assert!((t.logprob as f64 - want).abs() < 1e-6, "{t:?}");
        // ids 1 and 3 tie at 3.0: 1 first; then 2.
        let ids: Vec<u32> = t.top_logprobs.iter().map(|a| a.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        for &(id, lp) in &t.top_logprobs {
            assert!((lp as f64 - raw[id as usize].ln()).abs() < 1e-6);
        }
        generated.push(t.token_id);
    }
    // More alternatives than tokens: all of them, sorted.
    let mut s = Sampler::new(
        SamplingConfig {
            top_logprobs: 20,
            ..SamplingConfig::default()
        },
        0,
    );
    let t = s.sample(&LOGITS, &[], &[]);
    let ids: Vec<u32> = t.top_logprobs.iter().map(|a| a.0).collect();
    assert_eq!(ids, [1, 3, 2, 0, 5, 4]);
    assert_eq!(t.top_logprobs[0], (t.token_id, t.logprob));
    // NaN logits: never chosen, logprob -inf.
    let mut s = Sampler::new(
        SamplingConfig {
            top_logprobs: 3,
            ..sampling(1.0)
        },
        0,
    );
    let t = s.sample(&[f32::NAN, 0.0, f32::NAN], &[], &[]);
    assert_eq!(t.token_id, 1);
    assert_eq!(t.logprob, 0.0);
    assert_eq!(
        t.top_logprobs,
        vec![(1, 0.0), (0, f32::NEG_INFINITY), (2, f32::NEG_INFINITY)]
    );
    assert!((log_softmax_at(&LOGITS, 2) as f64 - raw[2].ln()).abs() < 1e-6);
}

#[test]
fn degenerate_logits_do_not_panic() {
    let mut s = Sampler::new(sampling(1.0), 3);
    assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], &[], &[]).token_id, 0);
    assert_eq!(s.sample(&[f32::NAN; 3], &[], &[]).token_id, 0);
    assert_eq!(s.sample(&[0.0, f32::INFINITY], &[], &[]).token_id, 1);
    assert_eq!(s.sample(&[0.0, f32::INFINITY], &[], &[]).logprob, 0.0);
}

/// A full-sort, f64 implementation of the documented pipeline (no shortcuts).
fn reference(
    c: &SamplingConfig,
    logits: &[f32],
    prompt: &[u32],
    generated: &[u32],
) -> Vec<(u32, f64)> {
    let mut s: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    for &(id, b) in &c.logit_bias {
        s[id as usize] += b as f64;
    }
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &id in generated {
        *counts.entry(id).or_default() += 1;
    }
    let p = c.repetition_penalty as f64;
    for (id, v) in s.iter_mut().enumerate() {
        let id = id as u32;
        if prompt.contains(&id) || counts.contains_key(&id) {
            *v = if *v > 0.0 { *v / p } else { *v * p };
        }
        if let Some(&n) = counts.get(&id) {
            *v -= c.frequency_penalty as f64 * n as f64 + c.presence_penalty as f64;
        }
    }
    let mut cand: Vec<(u32, f64)> = s
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v / c.temperature as f64))
        .collect();
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if c.top_k > 0 {
        cand.truncate(c.top_k as usize);
    }
    let max = cand[0].1;
    for x in &mut cand {
        x.1 = (x.1 - max).exp();
    }
    if c.top_p < 1.0 {
        let total: f64 = cand.iter().map(|x| x.1).sum();
        let mut mass = 0.0;
        let keep = cand
            .iter()
            .position(|x| {
                mass += x.1 / total;
                mass >= c.top_p as f64
            })
            .map_or(cand.len(), |i| i + 1);
        cand.truncate(keep);
    }
    cand.retain(|x| x.1 >= c.min_p as f64);
    cand.sort_by_key(|x| x.0);
    let total: f64 = cand.iter().map(|x| x.1).sum();
    cand.iter().map(|&(id, w)| (id, w / total)).collect()
}

#[test]
fn matches_reference_on_large_random_vocabularies() {
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let vocab = 49_152;
    for case in 0..40 {
        // Peaked logits like a real model's: a few high, a long low tail.
        let logits: Vec<f32> = (0..vocab)
            .map(|_| rng.random::<f32>() * 4.0 + (rng.random::<f32>() < 0.01) as u8 as f32 * 8.0)
            .collect();
        let prompt: Vec<u32> = (0..30).map(|_| rng.random_range(0..vocab as u32)).collect();
        let generated: Vec<u32> = (0..30).map(|_| rng.random_range(0..vocab as u32)).collect();
        let c = SamplingConfig {
            temperature: [0.3, 0.7, 1.0, 1.5][case % 4],
            top_k: [0, 0, 50, 1000, 5][case % 5],
            top_p: [1.0, 0.9, 0.5, 0.99][case % 4],
            min_p: [0.0, 0.0, 0.05, 0.3][(case / 2) % 4],
            repetition_penalty: [1.0, 1.2][case % 2],
            frequency_penalty: [0.0, 0.5, -0.3][case % 3],
            presence_penalty: [0.0, 0.7][(case / 3) % 2],
            logit_bias: vec![(7, 5.0), (100, -3.0)],
            top_logprobs: 0,
        };
        let got = Sampler::new(c.clone(), 0).distribution(&logits, &prompt, &generated);
        let want = reference(&c, &logits, &prompt, &generated);
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            want.iter().map(|w| w.0).collect::<Vec<_>>(),
            "case {case}: {c:?}"
        );
        for (g, w) in got.iter().zip(&want) {
            assert!((g.1 - w.1).abs() < 1e-6 + 1e-4 * w.1, "case {case}");
        }
    }
}

#[test]
fn draw_is_the_inverse_cdf_of_the_stream_uniform() {
    let config = SamplingConfig {
        top_k: 4,
        ..sampling(1.0)
    };
    let key = stream_key(17);
    for n in 0..200usize {
        let generated = vec![0; n];
        let mut s = Sampler::new(config.clone(), 17);
        let d = s.distribution(&LOGITS, &[], &generated);
        let u = uniform(&key, n as u64);
        let mut acc = 0.0;
        let want = d
            .iter()
            .find(|(_, p)| {
                acc += p;
                u < acc
            })
            .unwrap()
            .0;
        assert_eq!(s.sample(&LOGITS, &[], &generated).token_id, want, "n={n}");
    }
}

#[test]
fn stream_uniforms_are_uniform_and_keyed() {
    let key = stream_key(5);
    let u: Vec<f64> = (0..20_000).map(|n| uniform(&key, n)).collect();
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = u.iter().sum::<f64>() / u.len() as f64;
    assert!((mean - 0.5).abs() < 0.01, "{mean}");
    // Deciles within 10% of their share.
    let mut bins = [0usize; 10];
    for &x in &u {
        bins[(x * 10.0) as usize] += 1;
    }
    assert!(bins.iter().all(|&b| (1800..=2200).contains(&b)), "{bins:?}");
    assert_eq!(uniform(&key, 3), uniform(&stream_key(5), 3));
    assert_ne!(uniform(&key, 3), uniform(&stream_key(6), 3));
    assert_ne!(uniform(&key, 3), uniform(&key, 4));
}

fn full_config() -> SamplingConfig {
    SamplingConfig {
        temperature: 1.3,
        top_k: 5,
        top_p: 0.95,
        min_p: 0.01,
        repetition_penalty: 1.1,
        frequency_penalty: 0.3,
        presence_penalty: 0.2,
        logit_bias: vec![(0, 0.5)],
        top_logprobs: 2,
    }
}

/// Logits that depend on the history, like a model's.
fn model(step: usize) -> Vec<f32> {
    (0..8)
        .map(|i| ((i * 7 + step * 3) % 11) as f32 * 0.3)
        .collect()
}

/// A continuous run of `n` tokens with one sampler.
fn run(config: &SamplingConfig, seed: u64, prompt: &[u32], n: usize) -> Vec<SampledToken> {
    let mut s = Sampler::new(config.clone(), seed);
    let mut generated = Vec::new();
    let mut out = Vec::new();
    for step in 0..n {
        let t = s.sample(&model(step), prompt, &generated);
        generated.push(t.token_id);
        out.push(t);
    }
    out
}

#[test]
fn seeded_runs_are_reproducible() {
    let config = full_config();
    let ids = |seed| {
        run(&config, seed, &[1, 2], 60)
            .iter()
            .map(|t| t.token_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(&config, 3, &[1, 2], 60), run(&config, 3, &[1, 2], 60));
    assert_ne!(ids(3), ids(4));
}

#[test]
fn token_n_is_a_function_of_seed_and_position() {
    // Resuming at any position with a fresh sampler draws what the continuous run drew.
    let config = full_config();
    let prompt = [1, 2, 3];
    let all = run(&config, 11, &prompt, 60);
    let ids: Vec<u32> = all.iter().map(|t| t.token_id).collect();
    for n in 0..ids.len() {
        let mut fresh = Sampler::new(config.clone(), 11);
        assert_eq!(fresh.sample(&model(n), &prompt, &ids[..n]), all[n], "n={n}");
    }
    // One sampler jumping between histories (a rewind, another prefix) recounts its penalties.
    let mut s = Sampler::new(config.clone(), 11);
    for n in [50, 10, 59, 0, 30, 31, 5] {
        assert_eq!(s.sample(&model(n), &prompt, &ids[..n]), all[n], "n={n}");
    }
    let mut other = ids.clone();
    other[3] = (other[3] + 1) % 8;
    let mut fresh = Sampler::new(config.clone(), 11);
    assert_eq!(
        s.sample(&model(40), &prompt, &other[..40]),
        fresh.sample(&model(40), &prompt, &other[..40])
    );
    // A changed prompt rebuilds the prompt ids.
    let mut fresh = Sampler::new(config, 11);
    assert_eq!(
        s.sample(&model(40), &[4], &other[..40]),
        fresh.sample(&model(40), &[4], &other[..40])
    );
}

#[test]
fn incremental_counts_follow_the_history() {
    let config = SamplingConfig {
        frequency_penalty: 1.0,
        ..sampling(1.0)
    };
    let mut p = penalties::Penalties::default();
    let mut logits = [0.0f32; 4];
    p.apply(&config, &mut logits, &[], &[1, 1, 2]);
    assert_eq!((p.count(1), p.count(2)), (2, 1));
    p.apply(&config, &mut logits, &[], &[1, 1, 2, 2]);
    assert_eq!((p.count(1), p.count(2)), (2, 2));
    p.apply(&config, &mut logits, &[], &[3]);
    assert_eq!((p.count(1), p.count(2), p.count(3)), (0, 0, 1));
    p.apply(&config, &mut logits, &[], &[]);
    assert_eq!(p.count(3), 0);
}

/// Chi-square statistic of `counts` against probabilities `dist`.
fn chi_square(counts: &[usize], dist: &[(u32, f64)], n: usize) -> f64 {
    dist.iter()
        .map(|&(id, p)| {
            let expected = p * n as f64;
            (counts[id as usize] as f64 - expected).powi(2) / expected
        })
        .sum()
}

#[test]
fn draw_frequencies_match_the_distribution() {
    // Chi-square critical values at p = 0.001, by degrees of freedom (support - 1).
    const CRIT: [f64; 6] = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52];
    let logits = [0.0f32, 1.0, 2.0, 0.5, -3.0, 1.5];
    let n = 40_000;
    let cases = [
        // Everything.
        (sampling(1.0), 6),
        // top_k drops id 4; at T = 0.8 the top-5 cumulative mass is .486, .746, .885, .960, 1.
        (
            SamplingConfig {
                temperature: 0.8,
                top_k: 5,
                top_p: 0.95,
                ..sampling(1.0)
            },
            4,
        ),
        // T = 2: relative weights .368, .607, 1, .472, .082, .779; min_p 0.3 drops id 4.
        (
            SamplingConfig {
                temperature: 2.0,
                min_p: 0.3,
                ..sampling(1.0)
            },
            5,
        ),
    ];
    let generated = vec![0u32; n];
    for (config, support) in cases {
        let mut s = Sampler::new(config.clone(), 1234);
        let d = s.distribution(&logits, &[], &[]);
        assert_eq!(d.len(), support, "{config:?}: {d:?}");
        let mut counts = [0usize; 6];
        for i in 0..n {
            counts[s.sample(&logits, &[], &generated[..i]).token_id as usize] += 1;
        }
        let outside: usize = (0..6u32)
            .filter(|id| !d.iter().any(|x| x.0 == *id))
            .map(|id| counts[id as usize])
            .sum();
        assert_eq!(outside, 0, "{counts:?}");
        let chi = chi_square(&counts, &d, n);
        assert!(
            chi < CRIT[support - 1],
            "{config:?}: chi2 {chi}, {counts:?} vs {d:?}"
        );
    }
    // The plain softmax, by hand: p ∝ e^logits.
    let want = softmax(&logits.map(f64::from));
    let got = Sampler::new(sampling(1.0), 0).distribution(&logits, &[], &[]);
    for (g, w) in got.iter().zip(&want) {
        assert!((g.1 - w).abs() < 1e-6);
    }
}
