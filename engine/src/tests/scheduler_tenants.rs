//! The scheduler's fair share between tenants (`crate::tenant_share`), stepped as the engine
//! would (the scheduler's `Sim`): a tenant's backlog does not delay another tenant's prompt, and
//! backlogged tenants' service splits by their weights.

use std::collections::HashMap;

use crate::scheduler::tests::Sim;
use crate::scheduler::SeqId;

#[test]
fn a_quiet_tenants_prompt_goes_ahead_of_a_noisy_tenants_backlog() {
    // Tenant a has 20 prompts of 128 tokens on the worker (4 steps of prefill work at 512 tokens a
    // step once its decodes run); tenant b's prompt arrives after them.
    let mut sim = Sim::with_blocks(512, 256, 4096);
    let backlog: Vec<SeqId> = (0..20).map(|_| sim.add_for("a", 1, 128, 8, 0)).collect();
    sim.step();
    let quiet = sim.add_for("b", 1, 128, 8, 0);
    let s = sim.step();
    // b's prompt is computed whole in the very next step, first among the prefill chunks.
    let prefills: Vec<_> = s.chunks.iter().filter(|c| c.num_tokens > 1).collect();
    assert_eq!(prefills[0].seq, quiet);
    assert_eq!(prefills[0].num_tokens, 128);
    assert_eq!(sim.first_token[&quiet], 2);
    // a's backlog still drains, first come first served within a.
    while !sim.seqs.is_empty() {
        sim.step();
    }
    let firsts: Vec<usize> = backlog.iter().map(|id| sim.first_token[id]).collect();
    assert!(firsts.windows(2).all(|w| w[0] <= w[1]), "{firsts:?}");
    assert_eq!(sim.pool.stats().used, 0);
}

#[test]
fn with_one_tenant_the_order_is_first_come_first_served() {
    // The default: every request of one tenant, equal prompts go in arrival order.
    let mut sim = Sim::with_blocks(512, 256, 4096);
    let ids: Vec<SeqId> = (0..12).map(|_| sim.add_for("t", 1, 128, 1, 0)).collect();
    while !sim.seqs.is_empty() {
        sim.step();
    }
    let firsts: Vec<usize> = ids.iter().map(|id| sim.first_token[id]).collect();
    assert!(firsts.windows(2).all(|w| w[0] <= w[1]), "{firsts:?}");
}

#[test]
fn backlogged_tenants_prefill_service_splits_by_weight() {
    // Two tenants keep 8 prompts of 256 tokens each queued (weights 3 and 1, one token generated
    // each, so the service is prefill); count the prompt tokens computed for each.
    let mut sim = Sim::with_blocks(256, 256, 1 << 16);
    let mut tenant_of: HashMap<SeqId, &str> = HashMap::new();
    let mut open: HashMap<&str, usize> = HashMap::from([("heavy", 0), ("light", 0)]);
    let mut served: HashMap<&str, usize> = HashMap::new();
    for _ in 0..400 {
        for (tenant, weight) in [("heavy", 3), ("light", 1)] {
            while open[tenant] < 8 {
                let id = sim.add_for(tenant, weight, 256, 1, 0);
                tenant_of.insert(id, tenant);
                *open.get_mut(tenant).unwrap() += 1;
            }
        }
        let s = sim.step();
        for c in &s.chunks {
            *served.entry(tenant_of[&c.seq]).or_default() += c.num_tokens;
        }
        for (id, tenant) in &tenant_of {
            if !sim.seqs.contains_key(id) && open[tenant] > 0 && sim.first_token.contains_key(id) {
                *open.get_mut(tenant).unwrap() -= 1;
            }
        }
        tenant_of.retain(|id, _| sim.seqs.contains_key(id));
    }
    let ratio = served["heavy"] as f64 / served["light"] as f64;
    assert!(
        (ratio - 3.0).abs() < 0.3,
        "heavy:light = {ratio:.3} ({served:?})"
    );
}
