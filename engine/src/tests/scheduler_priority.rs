//! The scheduler applying the priority orders (`crate::priority`), stepped as the engine would
//! (the scheduler's `Sim`: blocks of 16 tokens, every sequence generates until its `max_new`):
//! admission by priority, shedding of sheddable sequences, preemption of the lowest priority.

use crate::scheduler::tests::Sim;
use crate::scheduler::Chunk;

fn chunk(seq: u64, num_tokens: usize) -> Chunk {
    Chunk { seq, num_tokens }
}

/// Steps until every sequence finished; returns the steps taken.
fn run_to_end(sim: &mut Sim) -> usize {
    let mut steps = 0;
    while !sim.seqs.is_empty() {
        sim.step();
        steps += 1;
        assert!(steps < 10_000, "the simulation does not end");
    }
    assert_eq!(sim.pool.stats().used, 0);
    steps
}

#[test]
fn a_later_higher_priority_request_is_admitted_first() {
    let mut sim = Sim::with_blocks(512, 0, 4096);
    let low = sim.add_with_priority(300, 1, -1);
    let mid = sim.add_with_priority(300, 1, 0);
    let high = sim.add_with_priority(300, 1, 10);
    let s = sim.step();
    // High runs alone: the budget has room for mid too, but a lower class gets no prefill tokens
    // beside a higher one (its step stays as short as its own work); low, first to arrive, waits.
    assert_eq!(s.chunks, [chunk(high, 300)]);
    assert!(sim.seqs[&low].blocks.is_none() && sim.seqs[&mid].blocks.is_none());
    assert_eq!(sim.scheduler.first_waiting(), Some(mid));
    // Then mid, then low.
    let s = sim.step();
    assert_eq!(s.chunks, [chunk(mid, 300)]);
    let s = sim.step();
    assert_eq!(s.chunks, [chunk(low, 300)]);
    run_to_end(&mut sim);
}

#[test]
fn a_higher_priority_arrival_sheds_the_most_recent_sheddable_sequence() {
    // 12 blocks: three sheddable 60-token prompts take 4 blocks each, the whole pool.
    let mut sim = Sim::with_blocks(512, 0, 12);
    let shed: Vec<u64> = (0..3).map(|_| sim.add_with_priority(60, 30, -1)).collect();
    sim.step();
    assert_eq!(sim.pool.num_available(), 0);
    let high = sim.add_with_priority(20, 5, 10);
    let s = sim.step();
    // The most recently admitted sheddable sequence makes room, and the other sheddable decodes
    // yield the step to the higher-priority prefill (it runs alone).
    assert_eq!(s.preempted, [shed[2]]);
    assert_eq!(s.chunks, [chunk(high, 20)]);
    assert_eq!(sim.first_token[&high], 2);
    // Then they decode beside it again.
    let s = sim.step();
    assert_eq!(
        s.chunks,
        [chunk(high, 1), chunk(shed[0], 1), chunk(shed[1], 1)]
    );
    assert_eq!(sim.scheduler.first_waiting(), Some(shed[2]));
    run_to_end(&mut sim);
    assert!(sim.first_token.contains_key(&shed[2]));
}

#[test]
fn only_sheddable_sequences_below_the_arrival_are_shed() {
    for (running, arriving) in [(0, 10), (-1, -1), (-2, 0)] {
        let mut sim = Sim::with_blocks(512, 0, 12);
        for _ in 0..3 {
            sim.add_with_priority(60, 30, running);
        }
        sim.step();
        let late = sim.add_with_priority(20, 5, arriving);
        let s = sim.step();
        if running < 0 && running < arriving {
            assert_eq!(s.preempted.len(), 1, "{running} {arriving}");
        } else {
            assert!(s.preempted.is_empty(), "{running} {arriving}");
            assert!(sim.seqs[&late].blocks.is_none());
        }
        run_to_end(&mut sim);
    }
}

#[test]
fn nothing_is_shed_when_shedding_could_not_make_enough_room() {
    let mut sim = Sim::with_blocks(512, 0, 12);
    let keep = sim.add_with_priority(120, 30, 0); // 8 blocks
    let shed = sim.add_with_priority(60, 30, -1); // 4 blocks
    sim.step(); // keep's prefill alone: the sheddable one gets no prefill tokens beside it
    sim.step(); // keep's decode and shed's prefill
                // 13 blocks: more than the sheddable 4 plus the 0 free.
    let big = sim.add_with_priority(200, 1, 10);
    let s = sim.step();
    assert!(s.preempted.is_empty());
    assert_eq!(s.chunks, [chunk(keep, 1), chunk(shed, 1)]);
    assert!(sim.seqs[&big].blocks.is_none());
}

#[test]
fn a_decode_short_of_blocks_preempts_the_lowest_priority_first() {
    // 8 blocks: two 63-token prompts of 4 blocks each; the 65th token needs a fifth block.
    let mut sim = Sim::with_blocks(512, 0, 8);
    let sheddable = sim.add_with_priority(63, 10, -1);
    let normal = sim.add_with_priority(63, 10, 0);
    sim.step();
    sim.step();
    let s = sim.step();
    // The earlier admitted but sheddable sequence goes, not the later normal one.
    assert_eq!(s.preempted, [sheddable]);
    assert_eq!(s.chunks, [chunk(normal, 1)]);
    run_to_end(&mut sim);
}

#[test]
fn a_priority_prefill_takes_a_step_without_sheddable_work() {
    // A sheddable flood: 8 decoding, 4 more prefilling (300-token prompts).
    let mut sim = Sim::with_blocks(512, 256, 4096);
    let flood: Vec<u64> = (0..8).map(|_| sim.add_with_priority(40, 50, -1)).collect();
    sim.step();
    let long: Vec<u64> = (0..4).map(|_| sim.add_with_priority(300, 50, -1)).collect();
    sim.step();
    let interactive = sim.add_with_priority(20, 5, 0); // decoding priority-0 stream
    sim.step();
    let high = sim.add_with_priority(128, 5, 10);
    let s = sim.step();
    // Only the priority-0 decode runs beside the priority-10 prompt: no sheddable decode, no
    // sheddable prefill chunk.
    assert_eq!(s.chunks, [chunk(interactive, 1), chunk(high, 128)]);
    assert_eq!(sim.first_token[&high], 4);
    // The next step is everyone's again.
    let s = sim.step();
    for id in flood.iter().chain(&long) {
        assert!(s.chunks.iter().any(|c| c.seq == *id), "{id} waits");
    }
    run_to_end(&mut sim);
}

#[test]
fn sheddable_work_takes_at_most_its_cap_per_step() {
    let mut sim = Sim::with_blocks(512, 256, 4096).cap_sheddable(64);
    for _ in 0..40 {
        sim.add_with_priority(100, 20, -1);
    }
    let normal = sim.add_with_priority(200, 20, 0);
    let mut steps = 0;
    while !sim.seqs.is_empty() {
        let s = sim.step();
        let sheddable: usize = (s.chunks.iter())
            .filter(|c| c.seq != normal)
            .map(|c| c.num_tokens)
            .sum();
        assert!(
            sheddable <= 64,
            "step {steps}: {sheddable} sheddable tokens"
        );
        steps += 1;
        assert!(steps < 10_000);
    }
    // The priority-0 request went first, whole, though it arrived last.
    assert_eq!(sim.first_token[&normal], 1);
    assert_eq!(sim.pool.stats().used, 0);
}
