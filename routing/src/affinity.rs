//! Which worker serves a request: prefix affinity with a load bound, else the least loaded worker.
//!
//! # Policy
//!
//! 1. **Eligible workers** are the ready ones (stream open, last health probe ready) with room: fewer
//!    than `max_inflight_per_worker` requests from this router in flight on them.
//! 2. **Load** of a worker is the larger of the requests this router has in flight on it and the
//!    `running + waiting` sequences the worker last reported on its stream (reports older than
//!    [`LOAD_REPORT_TTL`] are ignored: an idle worker sends none). The larger of the two covers both a
//!    burst this router just sent (not yet reported) and load from other routers.
//! 3. **Affinity key**: a stable 64-bit hash of the first `affinity_prefix_tokens` token ids of the
//!    prompt (the whole prompt when it is shorter). Requests that share those tokens, e.g. the same
//!    system prompt or chat preamble, share a key. `affinity_prefix_tokens = 0` turns affinity off.
//! 4. **Preferred worker**: rendezvous (highest-random-weight) hashing of the key over all ready workers:
//!    each worker scores `hash(key, address)`, the highest score wins. When a worker joins or leaves,
//!    only the keys it wins or won move, so prefix caches elsewhere stay warm.
//! 5. The preferred worker is used when it is eligible and its load is within the bound
//!    `load <= (1 + affinity_load_factor) * average_load + 1` (average over the ready workers).
//!    Otherwise, and for requests without a key, the **least loaded** eligible worker is used; ties
//!    go to the higher rendezvous score (so equal loads still keep related prompts together and
//!    unrelated ones spread).
//!
//! The result: a shared prefix lands on one worker (whose prefix cache then hits) until that worker
//! carries clearly more than its share, after which the excess spills to the least loaded workers.

use std::time::Duration;

/// How long a worker's load report counts after it arrived.
pub const LOAD_REPORT_TTL: Duration = Duration::from_secs(1);

/// One ready worker as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate<'a> {
    /// The worker's address (its identity for rendezvous hashing).
    pub address: &'a str,
    /// Its load (see the module docs).
    pub load: usize,
    /// Whether it may take another request (below `max_inflight_per_worker`).
    pub has_room: bool,
}

/// The picking policy's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityPolicy {
    /// Leading prompt tokens hashed into the affinity key; 0 disables affinity.
    pub prefix_tokens: usize,
    /// Slack of the load bound above the average load (0.5 = 50 % above average, plus one).
    pub load_factor: f64,
}

impl AffinityPolicy {
    /// The affinity key of a prompt, `None` when affinity is off or the prompt is empty.
    pub fn key(&self, prompt_ids: &[u32]) -> Option<u64> {
        if self.prefix_tokens == 0 || prompt_ids.is_empty() {
            return None;
        }
        let prefix = &prompt_ids[..prompt_ids.len().min(self.prefix_tokens)];
        let mut h = FNV_OFFSET;
        for id in prefix {
            h = fnv(h, &id.to_le_bytes());
        }
        Some(mix(h))
    }

    /// Index of the worker to use among `candidates`, `None` when none has room.
    pub fn pick(&self, key: Option<u64>, candidates: &[Candidate<'_>]) -> Option<usize> {
        let score = |c: &Candidate<'_>| key.map_or(0, |k| rendezvous_score(k, c.address));
        let least_loaded = candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.has_room)
            .min_by(|(_, a), (_, b)| a.load.cmp(&b.load).then(score(b).cmp(&score(a))))
            .map(|(i, _)| i);
        let Some(key) = key else {
            return least_loaded;
        };
        let preferred = candidates
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| rendezvous_score(key, c.address))
            .map(|(i, _)| i)?;
        let total: usize = candidates.iter().map(|c| c.load).sum();
        let average = total as f64 / candidates.len() as f64;
        let bound = (1.0 + self.load_factor.max(0.0)) * average + 1.0;
        let p = &candidates[preferred];
        if p.has_room && p.load as f64 <= bound {
            Some(preferred)
        } else {
            least_loaded
        }
    }
}

/// The rendezvous weight of `address` for `key`.
pub fn rendezvous_score(key: u64, address: &str) -> u64 {
    mix(fnv(key ^ FNV_OFFSET, address.as_bytes()))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a over `bytes`, continuing from `h` (stable across processes and builds).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The splitmix64 finaliser: spreads FNV's weak low bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: AffinityPolicy = AffinityPolicy {
        prefix_tokens: 4,
        load_factor: 0.5,
    };
    const ADDRS: [&str; 3] = ["10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061"];

    fn idle() -> Vec<Candidate<'static>> {
        ADDRS
            .iter()
            .map(|a| Candidate {
                address: a,
                load: 0,
                has_room: true,
            })
            .collect()
    }

    #[test]
    fn same_prefix_same_worker() {
        let a = POLICY.key(&[1, 2, 3, 4, 5, 6]);
        let b = POLICY.key(&[1, 2, 3, 4, 99, 98, 97]);
        assert_eq!(a, b, "only the first 4 tokens count");
        assert_ne!(a, POLICY.key(&[1, 2, 3, 5, 5, 6]));
        let first = POLICY.pick(a, &idle());
        assert!(first.is_some());
        for _ in 0..10 {
            assert_eq!(POLICY.pick(b, &idle()), first);
        }
        // Candidate order does not matter: the choice is by address.
        let mut reversed = idle();
        reversed.reverse();
        let again = POLICY.pick(a, &reversed).unwrap();
        assert_eq!(reversed[again].address, ADDRS[first.unwrap()]);
    }

    #[test]
    fn keys_spread_over_workers() {
        let mut counts = [0usize; 3];
        for p in 0..300u32 {
            let key = POLICY.key(&[p, p + 1, 7, 7]);
            counts[POLICY.pick(key, &idle()).unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| c > 60), "{counts:?}");
    }

    #[test]
    fn overloaded_preferred_worker_spills_to_least_loaded() {
        let key = POLICY.key(&[9, 8, 7, 6]);
        let preferred = POLICY.pick(key, &idle()).unwrap();
        let mut c = idle();
        // Within the bound: 3 <= 1.5 * (3 + 1 + 2) / 3 + 1 = 4.
        c[preferred].load = 3;
        c[(preferred + 1) % 3].load = 1;
        c[(preferred + 2) % 3].load = 2;
        assert_eq!(POLICY.pick(key, &c), Some(preferred));
        // Beyond it: 10 > 1.5 * 13 / 3 + 1 = 7.5, so the least loaded worker takes it.
        c[preferred].load = 10;
        assert_eq!(POLICY.pick(key, &c), Some((preferred + 1) % 3));
        // A preferred worker without room spills too, whatever its load.
        c[preferred].load = 0;
        c[preferred].has_room = false;
        assert_eq!(POLICY.pick(key, &c), Some((preferred + 1) % 3));
    }

    #[test]
    fn without_affinity_least_loaded_wins_and_no_room_means_none() {
        let off = AffinityPolicy {
            prefix_tokens: 0,
            ..POLICY
        };
        assert_eq!(off.key(&[1, 2, 3]), None);
        let mut c = idle();
        c[0].load = 2;
        c[1].load = 1;
        c[2].load = 3;
        assert_eq!(off.pick(None, &c), Some(1));
        for x in &mut c {
            x.has_room = false;
        }
        assert_eq!(off.pick(None, &c), None);
        assert_eq!(POLICY.pick(POLICY.key(&[1]), &c), None);
        assert_eq!(POLICY.pick(None, &[]), None);
    }

    #[test]
    fn a_leaving_worker_moves_only_its_own_keys() {
        let all = idle();
        let two: Vec<_> = all[..2].to_vec();
        for p in 0..100u32 {
            let key = POLICY.key(&[p, 1, 2, 3]);
            let before = all[POLICY.pick(key, &all).unwrap()].address;
            let after = two[POLICY.pick(key, &two).unwrap()].address;
            if before != ADDRS[2] {
                assert_eq!(before, after, "key {p} moved although its worker stayed");
            }
        }
    }
}
