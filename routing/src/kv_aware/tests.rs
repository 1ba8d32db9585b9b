use rand::{Rng, SeedableRng};

use super::*;

/// The unweighted cost without the decode term (`prefill + load`): the tests below state their
/// thresholds in it.
const POLICY: KvAwarePolicy = KvAwarePolicy {
    load_factor: 0.5,
    prefill_weight: 1.0,
    decode_weight: 0.0,
};
/// The tokens a request may generate, where the decode term is off.
const M: usize = 8;
const ADDRS: [&str; 3] = ["10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061"];

fn idle() -> Vec<KvCandidate<'static>> {
    ADDRS
        .iter()
        .map(|a| KvCandidate {
            address: a,
            has_room: true,
            cached_blocks: 0,
            load_tokens: 0,
            sequences: 0,
        })
        .collect()
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| i.wrapping_mul(31) ^ salt).collect()
}

#[test]
fn the_chain_is_the_workers_chain_and_the_last_token_is_always_computed() {
    let p = prompt(40, 1);
    let chain = PromptChain::new(&p, 16);
    assert_eq!(chain.hashes, block_hash::block_hashes(&p, 16));
    assert_eq!(chain.hashes.len(), 2);
    assert_eq!(chain.key, chain.hashes[0]);
    assert_eq!(chain.cached_tokens(2), 32);
    assert_eq!(chain.cached_tokens(9), 32);
    // 32 tokens = 2 full blocks, but the worker recomputes the last token: 1 block reused.
    let exact = PromptChain::new(&p[..32], 16);
    assert_eq!(exact.cached_tokens(2), 16);
    // Shorter than a block: keyed by the whole prompt, nothing cached.
    let short = PromptChain::new(&p[..5], 16);
    assert!(short.hashes.is_empty());
    assert_ne!(short.key, PromptChain::new(&p[..6], 16).key);
    assert_eq!(short.cached_tokens(3), 0);
    assert_eq!(PromptChain::new(&p, 0).cached_tokens(1), 0);
}

#[test]
fn a_salted_chain_is_the_workers_salted_chain_and_shares_nothing_with_the_plain_one() {
    let p = prompt(40, 1);
    let root = block_hash::salted_seed("tenant:a");
    let salted = PromptChain::rooted(root, &p, 16);
    assert_eq!(salted.hashes, block_hash::block_hashes_from(root, &p, 16));
    let plain = PromptChain::new(&p, 16);
    assert!(salted.hashes.iter().all(|h| !plain.hashes.contains(h)));
    assert_eq!(PromptChain::rooted(block_hash::SEED, &p, 16), plain);
}

#[test]
fn a_hit_wins_over_an_equally_loaded_miss() {
    let chain = PromptChain::new(&prompt(100, 2), 16);
    for holder in 0..3 {
        let mut c = idle();
        c[holder].cached_blocks = 6;
        assert_eq!(POLICY.pick(&chain, M, &c), Some(holder));
        let e = POLICY.evaluate(&chain, M, &c);
        assert_eq!(
            e[holder],
            Evaluation {
                cached_tokens: 96,
                cost: 4
            }
        );
        assert_eq!(e[(holder + 1) % 3].cost, 100);
    }
}

#[test]
fn cost_trades_prefill_against_load() {
    let chain = PromptChain::new(&prompt(100, 3), 16);
    let mut c = idle();
    c[0].cached_blocks = 6; // cost 4 + load
    c[0].load_tokens = 90;
    c[1].load_tokens = 0; // cost 100
    c[2].load_tokens = 50;
    // 94 < 100: the hit still pays.
    assert_eq!(POLICY.pick(&chain, M, &c), Some(0));
    c[0].load_tokens = 97; // 101 > 100
    assert_eq!(POLICY.pick(&chain, M, &c), Some(1));
}

#[test]
fn a_hit_never_goes_beyond_the_load_bound() {
    let chain = PromptChain::new(&prompt(64, 4), 16);
    let mut c = idle();
    c[0].cached_blocks = 3;
    c[0].load_tokens = 1_000;
    c[1].load_tokens = 990;
    c[2].load_tokens = 990;
    // Within: 1000 <= 1.5 * 993.3 + 64 = 1554: the hit wins (cost 16 + 1000 < 64 + 990).
    assert_eq!(POLICY.pick(&chain, M, &c), Some(0));
    // Beyond: average 433.3, bound 714 < 1000: cache ignored, the least loaded worker takes it.
    c[1].load_tokens = 200;
    c[2].load_tokens = 100;
    assert_eq!(POLICY.evaluate(&chain, M, &c)[0].cached_tokens, 0);
    assert_eq!(POLICY.pick(&chain, M, &c), Some(2));
    // Even when the other costs are higher than the overloaded hit would have been, a hit beyond
    // the bound does not count.
    let mut c = idle();
    c[0].cached_blocks = 3;
    c[0].load_tokens = 5_000;
    c[1].load_tokens = 100;
    c[2].load_tokens = 100;
    // Average 1733, bound 2664 < 5000: workers 1 and 2 tie at 164; rendezvous picks one.
    let pick = POLICY.pick(&chain, M, &c);
    assert!(matches!(pick, Some(1) | Some(2)), "{pick:?}");
}

#[test]
fn a_miss_goes_to_the_least_loaded_worker_and_no_room_means_none() {
    let chain = PromptChain::new(&prompt(50, 5), 16);
    let mut c = idle();
    c[0].load_tokens = 300;
    c[1].load_tokens = 20;
    c[2].load_tokens = 100;
    assert_eq!(POLICY.pick(&chain, M, &c), Some(1));
    c[1].has_room = false;
    assert_eq!(POLICY.pick(&chain, M, &c), Some(2));
    for x in &mut c {
        x.has_room = false;
    }
    assert_eq!(POLICY.pick(&chain, M, &c), None);
    assert_eq!(POLICY.pick(&chain, M, &[]), None);
}

#[test]
fn equal_choices_spread_and_the_same_prefix_sticks() {
    let mut counts = [0usize; 3];
    for salt in 0..600u32 {
        let chain = PromptChain::new(&prompt(40, salt * 7919), 16);
        counts[POLICY.pick(&chain, M, &idle()).unwrap()] += 1;
    }
    assert!(counts.iter().all(|&n| n > 150), "{counts:?}");
    // Same first block, different tails: same key, same worker while loads are equal.
    let a = PromptChain::new(&prompt(40, 9), 16);
    let mut other = prompt(40, 9);
    other[20..].iter_mut().for_each(|t| *t += 1);
    let b = PromptChain::new(&other, 16);
    assert_eq!(POLICY.pick(&a, M, &idle()), POLICY.pick(&b, M, &idle()));
    // The choice is by address, not by candidate order.
    let mut reversed = idle();
    reversed.reverse();
    let first = idle()[POLICY.pick(&a, M, &idle()).unwrap()].address;
    assert_eq!(
        reversed[POLICY.pick(&a, M, &reversed).unwrap()].address,
        first
    );
}

/// Property: the choice always has the lowest cost among the workers with room, and never uses a
/// cache beyond the load bound.
#[test]
fn the_choice_is_a_lowest_cost_worker_with_room() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let addrs: Vec<String> = (0..8).map(|i| format!("10.0.0.{i}:1")).collect();
    for _ in 0..2_000 {
        let chain = PromptChain::new(&prompt(rng.random_range(1..300), rng.random()), 16);
        let c: Vec<KvCandidate<'_>> = addrs
            .iter()
            .map(|a| KvCandidate {
                address: a,
                has_room: rng.random_bool(0.8),
                cached_blocks: rng.random_range(0..20),
                load_tokens: rng.random_range(0..2_000),
                sequences: rng.random_range(0..20),
            })
            .collect();
        let policy = KvAwarePolicy {
            decode_weight: rng.random_range(0.0..2.0),
            ..POLICY
        };
        let new_tokens = rng.random_range(0..300);
        let e = policy.evaluate(&chain, new_tokens, &c);
        let best = c
            .iter()
            .zip(&e)
            .filter(|(c, _)| c.has_room)
            .map(|(_, e)| e.cost)
            .min();
        let pick = policy.pick(&chain, new_tokens, &c);
        assert_eq!(pick.map(|i| e[i].cost), best);
        for (c, e) in c.iter().zip(&e) {
            let want = (chain.tokens - e.cached_tokens) as f64
                + c.load_tokens as f64
                + policy.decode_weight
                    * (new_tokens.min(DECODE_HORIZON_TOKENS) * c.sequences) as f64;
            assert_eq!(e.cost, want.round() as u64);
        }
        let average = c.iter().map(|c| c.load_tokens).sum::<u64>() as f64 / c.len() as f64;
        for (c, e) in c.iter().zip(&e) {
            if c.load_tokens as f64 > 1.5 * average + chain.tokens as f64 {
                assert_eq!(e.cached_tokens, 0);
            }
        }
    }
}

#[test]
fn a_request_brings_its_tokens_and_a_capped_generation() {
    assert_eq!(request_work_tokens(100, 8), 108);
    assert_eq!(
        request_work_tokens(100, 50_000),
        100 + DECODE_HORIZON_TOKENS as u64
    );
}

#[test]
fn a_holder_running_a_similar_request_keeps_the_hit() {
    // 9 blocks of 16; worker 0 holds 8 and decodes one request (1 pending + 8 left), worker 1 idle.
    let p = prompt(144, 9);
    let chain = PromptChain::new(&p, 16);
    let mut c = idle();
    c[0].cached_blocks = 8;
    c[0].load_tokens = request_work_tokens(1, 8);
    assert_eq!(POLICY.pick(&chain, M, &c[..2]), Some(0));
}

#[test]
fn the_prefill_weight_keeps_a_hit_until_the_holder_is_that_many_times_busier() {
    // 160-token prompt; worker 0 holds 9 blocks (144 tokens saved, 16 to prefill).
    let p = prompt(160, 5);
    let chain = PromptChain::new(&p, 16);
    let mut workers = idle();
    workers[0].cached_blocks = 9;
    // Worker 0 has 300 tokens of work more than the others: more than the 144 saved, less than
    // 4 x 144 = 576 (all within the load bound: (1.5 x 100 + 160) = 310 >= 300).
    workers[0].load_tokens = 300;
    // Unweighted: 16 + 300 = 316 > 160 + 0, a miss on a less loaded worker.
    let e = POLICY.evaluate(&chain, M, &workers);
    assert_eq!((e[0].cost, e[1].cost), (316, 160));
    assert_ne!(POLICY.pick(&chain, M, &workers), Some(0));
    let weighted = KvAwarePolicy::default();
    assert_eq!(weighted.prefill_weight, DEFAULT_PREFILL_WEIGHT);
    let e = weighted.evaluate(&chain, M, &workers);
    assert_eq!((e[0].cost, e[1].cost), (4 * 16 + 300, 4 * 160));
    assert_eq!(weighted.pick(&chain, M, &workers), Some(0));
    // Past 4 x 144 more work the holder loses it too (the load bound is raised by the others'
    // load so that it does not decide).
    for w in &mut workers[1..] {
        w.load_tokens = 1_000;
    }
    workers[0].load_tokens = 1_000 + 4 * 144 + 1;
    assert_ne!(weighted.pick(&chain, M, &workers), Some(0));
    workers[0].load_tokens = 1_000 + 4 * 144 - 1;
    assert_eq!(weighted.pick(&chain, M, &workers), Some(0));
}

#[test]
fn the_decode_term_moves_a_long_request_off_a_holder_crowded_with_short_decodes() {
    // 160-token prompt; worker 0 holds 9 blocks (4 x 144 = 576 saved by the default weight) and
    // runs 20 sequences with 8 tokens left each (180 tokens of work: within the load bound of
    // 1.5 x 60 + 160 = 250); worker 1 is idle.
    let chain = PromptChain::new(&prompt(160, 6), 16);
    let mut workers = idle();
    workers[0].cached_blocks = 9;
    workers[0].sequences = 20;
    workers[0].load_tokens = 20 * request_work_tokens(1, 8);
    let policy = KvAwarePolicy::default();
    assert_eq!(policy.decode_weight, DEFAULT_DECODE_WEIGHT);
    // 64 new tokens: 64 x 20 = 1,280 tokens of batch-mates in its decode steps outweigh the 576.
    let e = policy.evaluate(&chain, 64, &workers);
    assert_eq!(e[0].cost, 4 * 16 + 180 + 64 * 20);
    assert_eq!(e[1].cost, 4 * 160);
    assert_ne!(policy.pick(&chain, 64, &workers), Some(0));
    // 8 new tokens: 160 do not; the hit stays.
    assert_eq!(policy.pick(&chain, 8, &workers), Some(0));
    // The term is capped like the load: 50,000 new tokens count as 128.
    let capped = policy.evaluate(&chain, 50_000, &workers);
    assert_eq!(
        capped[0].cost,
        4 * 16 + 180 + (DECODE_HORIZON_TOKENS * 20) as u64
    );
    // Weight 0 is the old cost: the holder keeps it.
    let old = KvAwarePolicy {
        decode_weight: 0.0,
        ..policy
    };
    assert_eq!(old.pick(&chain, 64, &workers), Some(0));
}
