//! How one step's prefill token budget is split between the sequences that still have prompt
//! tokens to compute (the scheduler's step 2; see [`crate::scheduler`] for the whole policy).
//!
//! Rules, in this order:
//! 1. **Strict priority between classes.** Only the candidates of the highest priority present
//!    (the *top class*) get prefill tokens in the step; lower classes wait for a step without
//!    higher-priority prefill work. A higher-priority prompt therefore never shares its step's
//!    prefill budget with lower-priority prompts, so its step is as short as its own work and the
//!    step's decodes allow (decodes of every class still run: they are one token each). With every
//!    priority equal (the default) there is one class and this rule does nothing.
//! 2. **Fair share between tenants inside the class.** The class's candidates are served tenant
//!    by tenant in the order of their tenants' fair-share rank ([`crate::tenant_share`]: least
//!    weighted service on this worker first); a tenant's candidates share what the tenants ranked
//!    before it left, by rules 3 and 4. With one tenant (the default) this rule does nothing. A
//!    tenant's backlog therefore never delays another tenant's prompt past its own turn, and the
//!    counters (charged with every token served) keep any tenant from starving.
//! 3. **Aging inside a tenant.** The oldest candidate of the tenant (running prefills come first,
//!    in admission order, then new admissions in queue order) is first guaranteed
//!    `max(1, budget / 4)` tokens of what is left, so a stream of short arrivals slows a long
//!    prompt down to a quarter of the budget but never starves it.
//! 4. **Shortest remaining prompt first** for the rest (ties: the older first), so a short
//!    request that arrives while a long prompt prefills runs whole in the next step.
//!
//! Sheddable work (a negative top class) shares at most what the step's sheddable token cap
//! leaves after the sheddable decodes. No chunk exceeds `cap` (the contended long-chunk cap) or
//! what the candidate has left; the
//! shares never sum above the budget; and the split is work-conserving within the top class
//! (budget is left over only when every top-class candidate is at its limit).

use crate::priority::{is_sheddable, Priority};

/// A sequence with prompt tokens still to compute, in the order the scheduler lists them (running
/// prefills by priority then admission, then new admissions by priority then arrival).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate<Id> {
    /// The sequence.
    pub(crate) seq: Id,
    /// Known tokens not yet in the KV cache.
    pub(crate) remaining: usize,
    /// The sequence's scheduling priority (higher first).
    pub(crate) priority: Priority,
    /// Its tenant's fair-share rank (0 = served first; see rule 2).
    pub(crate) rank: usize,
}

/// Splits `budget` prefill tokens between `candidates` by the module's rules and returns each
/// one's chunk in tokens, index for index (0 = no tokens this step). No share exceeds `cap` or
/// the candidate's `remaining`; the sum never exceeds `budget`, nor `sheddable_budget` when the
/// top class is sheddable (negative priority: the scheduler's cap on sheddable tokens per step).
pub(crate) fn share_prefill_budget<Id>(
    candidates: &[Candidate<Id>],
    mut budget: usize,
    cap: usize,
    sheddable_budget: usize,
) -> Vec<usize> {
    let mut shares = vec![0; candidates.len()];
    let Some(top) = candidates.iter().map(|c| c.priority).max() else {
        return shares;
    };
    if is_sheddable(top) {
        budget = budget.min(sheddable_budget);
        if budget == 0 {
            return shares;
        }
    }
    let limit = |i: usize| candidates[i].remaining.min(cap);
    let mut class: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].priority == top)
        .collect();
    // Stable: inside a tenant the candidates keep their order (oldest first).
    class.sort_by_key(|&i| candidates[i].rank);
    for tenant in class.chunk_by(|&i, &j| candidates[i].rank == candidates[j].rank) {
        if budget == 0 {
            break;
        }
        let oldest = tenant[0];
        let floor = (budget / 4).max(1).min(limit(oldest)).min(budget);
        shares[oldest] = floor;
        budget -= floor;
        let mut order = tenant.to_vec();
        order.sort_by_key(|&i| (candidates[i].remaining, i));
        for i in order {
            if budget == 0 {
                break;
            }
            let more = (limit(i) - shares[i]).min(budget);
            shares[i] += more;
            budget -= more;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift64 stream from `seed` (non-zero), for the randomized property tests.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    fn cand(seq: u64, remaining: usize) -> Candidate<u64> {
        prio(seq, remaining, 0)
    }

    fn prio(seq: u64, remaining: usize, priority: Priority) -> Candidate<u64> {
        Candidate {
            seq,
            remaining,
            priority,
            rank: 0,
        }
    }

    #[test]
    fn a_lone_prompt_takes_the_whole_budget() {
        assert_eq!(
            share_prefill_budget(&[cand(1, 5000)], 512, usize::MAX, usize::MAX),
            [512]
        );
        assert_eq!(
            share_prefill_budget(&[cand(1, 40)], 512, usize::MAX, usize::MAX),
            [40]
        );
        assert_eq!(
            share_prefill_budget(&[cand(1, 5000)], 1, 256, usize::MAX),
            [1]
        );
        assert!(share_prefill_budget::<u64>(&[], 512, 256, usize::MAX).is_empty());
    }

    #[test]
    fn a_short_arrival_is_served_whole_beside_a_long_prefill() {
        // The long prompt is older; the short one still gets all of its 16 tokens.
        let shares = share_prefill_budget(&[cand(1, 6000), cand(2, 16)], 512, 256, usize::MAX);
        assert_eq!(shares, [256, 16]);
        let shares =
            share_prefill_budget(&[cand(1, 6000), cand(2, 16)], 512, usize::MAX, usize::MAX);
        assert_eq!(shares, [496, 16]);
    }

    #[test]
    fn the_oldest_prefill_keeps_a_quarter_of_the_budget_under_short_arrivals() {
        let mut c = vec![cand(1, 6000)];
        c.extend((2..40).map(|i| cand(i, 30)));
        let shares = share_prefill_budget(&c, 512, 256, usize::MAX);
        assert_eq!(shares[0], 128);
        assert_eq!(shares.iter().sum::<usize>(), 512);
        // Shortest first among the rest: 12 of the 30-token arrivals fit whole, one partly.
        assert_eq!(shares[1..13], [30; 12]);
        assert_eq!(shares[13], 24);
        assert!(shares[14..].iter().all(|&s| s == 0));
    }

    #[test]
    fn equal_prompts_are_served_first_come_first_served() {
        let c: Vec<_> = (1..=8).map(|i| cand(i, 128)).collect();
        let shares = share_prefill_budget(&c, 512, 256, usize::MAX);
        assert_eq!(shares, [128, 128, 128, 128, 0, 0, 0, 0]);
    }

    #[test]
    fn shares_never_exceed_the_budget_the_cap_or_what_is_left() {
        let mut next = xorshift(0x9e37_79b9);
        for _ in 0..2000 {
            let n = (next() % 12) as usize;
            let c: Vec<_> = (0..n)
                .map(|i| cand(i as u64, 1 + (next() % 3000) as usize))
                .collect();
            let budget = 1 + (next() % 1024) as usize;
            let cap = if next().is_multiple_of(3) {
                usize::MAX
            } else {
                1 + (next() % 600) as usize
            };
            let shares = share_prefill_budget(&c, budget, cap, usize::MAX);
            assert!(shares.iter().sum::<usize>() <= budget);
            for (c, &s) in c.iter().zip(&shares) {
                assert!(s <= c.remaining && s <= cap);
            }
            if let Some(first) = c.first() {
                assert!(shares[0] >= (budget / 4).max(1).min(first.remaining).min(cap));
            }
            // Work-conserving: budget is left only when every candidate is at its limit.
            if shares.iter().sum::<usize>() < budget {
                for (c, &s) in c.iter().zip(&shares) {
                    assert_eq!(s, c.remaining.min(cap));
                }
            }
        }
    }

    #[test]
    fn only_the_highest_priority_class_gets_prefill_tokens() {
        // Two sheddable prefills in progress (older, fewer tokens left), then a priority-10 and a
        // priority-0 arrival: only the priority-10 prompt runs, whole, and the rest of the budget
        // stays unused so its step is as short as its own work.
        let c = [
            prio(1, 40, -1),
            prio(2, 60, -1),
            prio(3, 128, 10),
            prio(4, 10, 0),
        ];
        assert_eq!(
            share_prefill_budget(&c, 512, 256, usize::MAX),
            [0, 0, 128, 0]
        );
        // Inside the class the usual rules hold: aging for its oldest, then shortest first.
        let c = [
            prio(1, 6000, 5),
            prio(2, 30, 0),
            prio(3, 20, 5),
            prio(4, 900, 5),
        ];
        assert_eq!(
            share_prefill_budget(&c, 512, 256, usize::MAX),
            [236, 0, 20, 256]
        );
        // Without a higher class, the lower classes' oldest gets the aging floor again.
        let c = [prio(1, 6000, -1), prio(2, 30, -1)];
        assert_eq!(
            share_prefill_budget(&c, 512, usize::MAX, usize::MAX),
            [482, 30]
        );
        // A sheddable class shares at most the step's sheddable cap; a higher one ignores it.
        assert_eq!(share_prefill_budget(&c, 512, usize::MAX, 64), [34, 30]);
        assert_eq!(share_prefill_budget(&c, 512, usize::MAX, 0), [0, 0]);
        let c = [prio(1, 6000, 0), prio(2, 30, -1)];
        assert_eq!(share_prefill_budget(&c, 512, usize::MAX, 64), [512, 0]);
    }

    #[test]
    fn inside_a_class_tenants_are_served_in_rank_order() {
        let tenant = |seq: u64, remaining: usize, rank: usize| Candidate {
            rank,
            ..cand(seq, remaining)
        };
        // Tenant 1's backlog (older) and tenant 0's new prompt: tenant 0's prompt runs whole, then
        // tenant 1 shares what is left (its oldest with the aging floor of what is left).
        let c = [
            tenant(1, 128, 1),
            tenant(2, 128, 1),
            tenant(3, 128, 1),
            tenant(4, 128, 0),
        ];
        assert_eq!(
            share_prefill_budget(&c, 512, 256, usize::MAX),
            [128, 128, 128, 128]
        );
        assert_eq!(
            share_prefill_budget(&c, 256, 256, usize::MAX),
            [128, 0, 0, 128]
        );
        assert_eq!(
            share_prefill_budget(&c, 128, 256, usize::MAX),
            [0, 0, 0, 128]
        );
        // A higher class still comes first, whatever the ranks.
        let c = [
            tenant(1, 100, 0),
            Candidate {
                rank: 3,
                ..prio(2, 50, 5)
            },
        ];
        assert_eq!(share_prefill_budget(&c, 100, 256, usize::MAX), [0, 50]);
    }

    #[test]
    fn lower_classes_wait_and_the_class_is_work_conserving() {
        let mut next = xorshift(0x2545_f491);
        for _ in 0..2000 {
            let n = 1 + (next() % 10) as usize;
            let c: Vec<_> = (0..n)
                .map(|i| {
                    let priority = (next() % 3) as Priority - 1;
                    prio(i as u64, 1 + (next() % 900) as usize, priority)
                })
                .collect();
            let budget = 1 + (next() % 1024) as usize;
            let shares = share_prefill_budget(&c, budget, 256, usize::MAX);
            let top = c.iter().map(|c| c.priority).max().unwrap();
            assert!(shares.iter().sum::<usize>() <= budget);
            for (c, &s) in c.iter().zip(&shares) {
                assert!(s <= c.remaining.min(256));
                if c.priority < top {
                    assert_eq!(s, 0, "a lower class got tokens");
                }
            }
            if shares.iter().sum::<usize>() < budget {
                for (c, &s) in c.iter().zip(&shares).filter(|(c, _)| c.priority == top) {
                    assert_eq!(s, c.remaining.min(256));
                }
            }
        }
    }
}
