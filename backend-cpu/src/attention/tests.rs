use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::kv_store::{KvDtype, PagedKvCache};
use super::*;

#[test]
fn single_key_returns_its_value() {
    let s = HeadShape {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 2,
    };
    let mut cache = PagedKvCache::new(1, 2, 2, 4);
    cache.write(0, 4, &[1.0, 0.0], &[3.0, -4.0]);
    let queries = [QueryPos {
        pos: 0,
        block_table: &[1],
    }];
    let out = attention(
        &[0.5, 0.5, -1.0, 2.0],
        &queries,
        cache.layer(0),
        4,
        s,
        AttnOptions::plain(2),
    );
    assert_eq!(out, [3.0, -4.0, 3.0, -4.0]);
}

#[test]
fn causal_and_weighted_across_blocks() {
    let s = HeadShape {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 2,
    };
    // Block size 1, table [2, 0]: position 0 in slot 2, position 1 in slot 0.
    let mut cache = PagedKvCache::new(1, 2, 3, 1);
    cache.write(0, 2, &[1.0, 0.0], &[1.0, 0.0]);
    cache.write(0, 0, &[0.0, 1.0], &[0.0, 1.0]);
    let table = [2u32, 0];
    let queries = [
        QueryPos {
            pos: 0,
            block_table: &table,
        },
        QueryPos {
            pos: 1,
            block_table: &table,
        },
    ];
    // Query 0 may only see position 0; query 1 (q = 0) sees both equally (a run of two: tiled).
    let out = attention(
        &[5.0, 5.0, 0.0, 0.0],
        &queries,
        cache.layer(0),
        1,
        s,
        AttnOptions::plain(2),
    );
    assert_eq!(&out[..2], &[1.0, 0.0]);
    assert!((out[2] - 0.5).abs() < 1e-6 && (out[3] - 0.5).abs() < 1e-6);
}

const BLOCK: usize = 16;

/// A one-layer cache of `blocks` blocks whose every slot holds random keys (spread wide enough
/// that the softmax is far from uniform) and values, and `seqs` block tables over a random
/// permutation of the blocks (`seqs[i]` blocks each).
fn random_cache(
    rng: &mut ChaCha8Rng,
    dtype: KvDtype,
    s: HeadShape,
    seqs: &[usize],
) -> (PagedKvCache, Vec<Vec<u32>>) {
    let kv_dim = s.n_kv_heads * s.head_dim;
    let blocks: usize = seqs.iter().sum();
    let mut cache = PagedKvCache::with_dtype(dtype, 1, kv_dim, blocks, BLOCK);
    for slot in 0..blocks * BLOCK {
        let k: Vec<f32> = (0..kv_dim).map(|_| rng.random_range(-2.0..2.0)).collect();
        let v: Vec<f32> = (0..kv_dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        cache.write(0, slot, &k, &v);
    }
    let mut ids: Vec<u32> = (0..blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    let mut tables = Vec::new();
    let mut rest = &ids[..];
    for &n in seqs {
        let (t, r) = rest.split_at(n);
        tables.push(t.to_vec());
        rest = r;
    }
    (cache, tables)
}

fn random_q(rng: &mut ChaCha8Rng, n: usize, s: HeadShape) -> Vec<f32> {
    (0..n * s.n_heads * s.head_dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect()
}

/// Queries at `start..start + n` of the sequence with `table`.
fn run_of(table: &[u32], start: usize, n: usize) -> Vec<QueryPos<'_>> {
    (start..start + n)
        .map(|pos| QueryPos {
            pos,
            block_table: table,
        })
        .collect()
}

/// The dispatching kernel (tiled for runs) on `path`.
fn tiled_with(
    path: SimdPath,
    q: &[f32],
    queries: &[QueryPos<'_>],
    cache: &PagedKvCache,
    s: HeadShape,
) -> Vec<f32> {
    tiled_opts(path, q, queries, cache, s, AttnOptions::plain(s.head_dim))
}

/// [`tiled_with`] with options.
fn tiled_opts(
    path: SimdPath,
    q: &[f32],
    queries: &[QueryPos<'_>],
    cache: &PagedKvCache,
    s: HeadShape,
    opts: AttnOptions,
) -> Vec<f32> {
    let mut out = AlignedVec::new();
    attention_into_with(path, q, queries, cache.layer(0), BLOCK, s, opts, &mut out);
    out.to_vec()
}

/// Asserts `got == want` bit for bit, naming the first differing query, head and element.
fn assert_bitwise(got: &[f32], want: &[f32], s: HeadShape, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let q_dim = s.n_heads * s.head_dim;
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: query {} head {} element {}: {} vs per-query {}",
            i / q_dim,
            i % q_dim / s.head_dim,
            i % s.head_dim,
            got[i],
            want[i]
        );
    }
}

/// Tiled against per-query, bitwise, for one sequence: `n` queries from position `start`, every
/// SIMD path, f32 and f16 caches.
fn check_run(s: HeadShape, start: usize, n: usize, seed: u64) {
    check_run_with(s, start, n, seed, AttnOptions::plain(s.head_dim));
}

/// [`check_run`] with options.
fn check_run_with(s: HeadShape, start: usize, n: usize, seed: u64, opts: AttnOptions) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let (cache, tables) = random_cache(&mut rng, dtype, s, &[(start + n).div_ceil(BLOCK)]);
        let q = random_q(&mut rng, n, s);
        let queries = run_of(&tables[0], start, n);
        for path in SimdPath::available() {
            let want = attention_per_query_with(path, &q, &queries, cache.layer(0), BLOCK, s, opts);
            let got = tiled_opts(path, &q, &queries, &cache, s, opts);
            let what = format!("{n} queries from {start}, {dtype:?}, {path:?}, {s:?}, {opts:?}");
            assert_bitwise(&got, &want, s, &what);
        }
    }
}

const SMOLLM: HeadShape = HeadShape {
    n_heads: 9,
    n_kv_heads: 3,
    head_dim: 64,
};

/// head_dim 20: lane tails on every path (20 = 16 + 4 = 2 * 8 + 4).
const ODD: HeadShape = HeadShape {
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 20,
};

#[test]
fn tiled_equals_per_query_few_queries() {
    for (start, n) in [(0, 1), (0, 3), (5, 3), (63, 17), (0, 64), (1, 64)] {
        check_run(SMOLLM, start, n, 1 + start as u64 * 7 + n as u64);
        check_run(ODD, start, n, 2 + start as u64 * 7 + n as u64);
    }
}

#[test]
fn tiled_equals_per_query_long_contexts() {
    let one_kv = HeadShape {
        n_heads: 3,
        n_kv_heads: 1,
        head_dim: 64,
    };
    // Up to 9,000 keys; a key-block and a WIDE_KEYS group boundary inside the run.
    check_run(one_kv, 8983, 17, 11);
    check_run(one_kv, 3000, 64, 12);
    check_run(ODD, 4093, 3, 13);
}

#[test]
fn tiled_equals_per_query_a_thousand_queries() {
    let one_kv = HeadShape {
        n_heads: 3,
        n_kv_heads: 1,
        head_dim: 64,
    };
    check_run(one_kv, 0, 1003, 21);
    check_run(ODD, 37, 1001, 22);
}

#[test]
fn several_sequences_in_one_batch() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for dtype in [KvDtype::F32, KvDtype::F16] {
        let (cache, t) = random_cache(&mut rng, dtype, SMOLLM, &[8, 320, 2, 48]);
        // A chunk, a decode, a short first chunk, a decode of the first sequence's table (not
        // consecutive with its chunk), a longer chunk, a run broken by a position gap.
        let mut queries = run_of(&t[0], 100, 17);
        queries.extend(run_of(&t[1], 5000, 1));
        queries.extend(run_of(&t[2], 0, 3));
        queries.extend(run_of(&t[0], 40, 1));
        queries.extend(run_of(&t[3], 700, 64));
        queries.extend(run_of(&t[1], 4000, 5));
        queries.extend(run_of(&t[1], 4010, 9));
        let q = random_q(&mut rng, queries.len(), SMOLLM);
        for path in SimdPath::available() {
            let want = attention_per_query_with(
                path,
                &q,
                &queries,
                cache.layer(0),
                BLOCK,
                SMOLLM,
                AttnOptions::plain(64),
            );
            let got = tiled_with(path, &q, &queries, &cache, SMOLLM);
            assert_bitwise(
                &got,
                &want,
                SMOLLM,
                &format!("mixed batch, {dtype:?}, {path:?}"),
            );
        }
    }
}

/// One sequence's 2,600 positions attended to alone in one call, in chunks of 512 and of 129,
/// and as a chunk beside other sequences' chunks and decodes: every query's output is the same
/// bits each way.
#[test]
fn chunked_batched_and_alone_agree_at_long_context() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let len = 2600;
    let (cache, t) = random_cache(&mut rng, KvDtype::F32, SMOLLM, &[len / BLOCK + 1, 40]);
    let q_dim = SMOLLM.n_heads * SMOLLM.head_dim;
    let q = random_q(&mut rng, len, SMOLLM);
    let path = SimdPath::detect();
    let whole = tiled_with(path, &q, &run_of(&t[0], 0, len), &cache, SMOLLM);
    for chunk in [512, 129] {
        for start in (0..len).step_by(chunk) {
            let n = chunk.min(len - start);
            let rows = &q[start * q_dim..(start + n) * q_dim];
            let got = tiled_with(path, rows, &run_of(&t[0], start, n), &cache, SMOLLM);
            let want = &whole[start * q_dim..(start + n) * q_dim];
            assert_bitwise(&got, want, SMOLLM, &format!("chunk {chunk} at {start}"));
        }
    }
    // Positions 2200..2500 beside a decode and a chunk of another sequence, both before it.
    let other_q = random_q(&mut rng, 21, SMOLLM);
    let mut queries = run_of(&t[1], 600, 1);
    queries.extend(run_of(&t[1], 300, 20));
    queries.extend(run_of(&t[0], 2200, 300));
    let mut rows = other_q.clone();
    rows.extend_from_slice(&q[2200 * q_dim..2500 * q_dim]);
    let got = tiled_with(path, &rows, &queries, &cache, SMOLLM);
    assert_bitwise(
        &got[21 * q_dim..],
        &whole[2200 * q_dim..2500 * q_dim],
        SMOLLM,
        "batched chunk",
    );
}

#[test]
fn query_blocks_fit_the_score_budget_and_spread_over_threads() {
    // 8,192 keys, 3 heads per KV head: 32 queries keep 3 MiB of scores (within 6 MiB).
    assert_eq!(tiled::query_block(512, 8192, 3, 3, 2), 32);
    // 32,768 keys: 16 queries keep 6 MiB.
    assert_eq!(tiled::query_block(512, 32_768, 3, 3, 2), 16);
    // Short contexts: capped at 32 queries.
    assert_eq!(tiled::query_block(512, 512, 3, 3, 2), 32);
    // A 3-query run on 2 threads and 3 KV heads: 2 blocks (4 wanted tasks / 3 heads).
    assert_eq!(tiled::query_block(3, 3, 3, 3, 2), 2);
    // Never 0, even for a 1,000,000-key context.
    assert_eq!(tiled::query_block(5, 1_000_000, 3, 3, 2), 1);
}

/// Gemma 3 270M's heads: 4 query heads on one KV head of 256.
const GEMMA3: HeadShape = HeadShape {
    n_heads: 4,
    n_kv_heads: 1,
    head_dim: 256,
};

fn windowed(head_dim: usize, window: usize, softcap: Option<f32>) -> AttnOptions {
    AttnOptions {
        window: Some(window),
        softcap,
        ..AttnOptions::plain(head_dim)
    }
}

#[test]
fn sliding_window_tiled_equals_per_query() {
    // Windows shorter and longer than a key block, runs starting before and after the window
    // fills, crossing key-block boundaries (the window's first key is rarely block-aligned).
    for (window, start, n) in [
        (8, 0, 30),
        (8, 5, 3),
        (100, 0, 150),
        (100, 37, 200),
        (512, 400, 300),
    ] {
        let seed = (window * 1000 + start * 10 + n) as u64;
        check_run_with(SMOLLM, start, n, seed, windowed(64, window, None));
        check_run_with(ODD, start, n, seed + 1, windowed(20, window, Some(50.0)));
    }
    check_run_with(GEMMA3, 500, 40, 7, windowed(256, 512, None));
    check_run_with(SMOLLM, 90, 70, 8, windowed(64, 64, None));
}

#[test]
fn softcap_tiled_equals_per_query() {
    let capped = AttnOptions {
        softcap: Some(5.0),
        ..AttnOptions::plain(64)
    };
    check_run_with(SMOLLM, 0, 70, 3, capped);
    check_run_with(SMOLLM, 130, 20, 4, capped);
}

/// Window and soft-cap against a direct computation: scores `5 tanh(q·k / (4 · 5))`
/// over keys `pos + 1 - window ..= pos` only, softmax, weighted sum of values.
#[test]
fn sliding_window_and_softcap_follow_the_definition() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let s = HeadShape {
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 16,
    };
    let opts = windowed(16, 5, Some(5.0));
    let (cache, t) = random_cache(&mut rng, KvDtype::F32, s, &[2]);
    let queries = run_of(&t[0], 0, 20);
    let q = random_q(&mut rng, 20, s);
    let got = attention(&q, &queries, cache.layer(0), BLOCK, s, opts);
    for (i, qp) in queries.iter().enumerate() {
        for h in 0..2 {
            let qh = &q[(i * 2 + h) * 16..(i * 2 + h + 1) * 16];
            let keys: Vec<usize> = (qp.pos.saturating_sub(4)..=qp.pos).collect();
            let slot = |p: usize| cache.slot(qp.block_table, p);
            let scores: Vec<f64> = keys
                .iter()
                .map(|&p| {
                    let k = cache.key(0, slot(p));
                    let d: f64 = qh.iter().zip(k).map(|(&a, b)| a as f64 * b as f64).sum();
                    5.0 * (d * 0.25 / 5.0).tanh()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..16 {
                let want: f64 = keys
                    .iter()
                    .zip(&e)
                    .map(|(&p, &w)| w / sum * cache.value(0, slot(p))[d] as f64)
                    .sum();
                let g = got[(i * 2 + h) * 16 + d] as f64;
                assert!(
                    (g - want).abs() < 1e-5,
                    "query {i} head {h} dim {d}: {g} vs {want}"
                );
            }
        }
    }
}

/// A lone deep decode token with fewer (token, KV head) pairs than threads goes to the split
/// kernel (`split.rs`: scores by key ranges, values by dimension ranges); its output is bitwise
/// what the tiled kernel gives the same query inside a run, on every path, f32 and f16 caches,
/// plain, windowed and soft-capped, head widths with lane tails.
#[test]
fn split_lone_deep_token_equals_the_tiled_kernel() {
    let shapes = [
        HeadShape {
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 64,
        },
        HeadShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 84, // 5 * 16 + 4: a lane tail, two dimension tasks
        },
    ];
    for (i, s) in shapes.into_iter().enumerate() {
        // Past SHARED_KV_BYTES (2 MiB of f32 K and V) at this kv_dim.
        let pos = (2 << 20) / (s.head_dim * 8) + 37 + 100 * i;
        for opts in [
            AttnOptions::plain(s.head_dim),
            windowed(s.head_dim, pos - 5, None),
            windowed(s.head_dim, pos + 10, Some(2.0)),
        ] {
            let mut rng = ChaCha8Rng::seed_from_u64(40 + i as u64);
            for dtype in [KvDtype::F32, KvDtype::F16] {
                let (cache, tables) =
                    random_cache(&mut rng, dtype, s, &[(pos + 1).div_ceil(BLOCK)]);
                let q = random_q(&mut rng, 2, s);
                let q_dim = s.n_heads * s.head_dim;
                let run = run_of(&tables[0], pos - 1, 2);
                let lone = run_of(&tables[0], pos, 1);
                for path in SimdPath::available() {
                    let want = tiled_opts(path, &q, &run, &cache, s, opts);
                    let got = tiled_opts(path, &q[q_dim..], &lone, &cache, s, opts);
                    let what = format!("lone token at {pos}, {dtype:?}, {path:?}, {s:?}, {opts:?}");
                    assert_bitwise(&got, &want[q_dim..], s, &what);
                }
            }
        }
    }
}
