//! The counter-based random stream: draw `n` of a request is a pure function of `(seed, n)`.
//!
//! A sequential RNG would make token `n`'s draw depend on how many draws came before it in this
//! process; keyed by position instead, a request resumed at any position (after a preemption, or on
//! another worker) draws exactly what it would have drawn in one uninterrupted run.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The 256-bit ChaCha key of a request's random stream: `seed` expanded by
/// `ChaCha8Rng::seed_from_u64` (rand_core's value-stable PCG32 expansion).
pub fn stream_key(seed: u64) -> [u8; 32] {
    ChaCha8Rng::seed_from_u64(seed).get_seed()
}

/// The uniform number in `[0, 1)` of draw `n` under `key` (from [`stream_key`]).
///
/// Definition (stable; changing it changes every seeded output): ChaCha8 keyed with `key`, stream
/// (nonce) `n`, block counter 0; its first 64-bit output word `w` (two little-endian 32-bit words),
/// then `(w >> 11) * 2^-53`, i.e. a multiple of `2^-53`.
pub fn uniform(key: &[u8; 32], n: u64) -> f64 {
    let mut rng = ChaCha8Rng::from_seed(*key);
    rng.set_stream(n);
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
