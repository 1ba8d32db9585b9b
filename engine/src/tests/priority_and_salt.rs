//! The engine with request priorities (admission order, shedding of sheddable sequences) and cache
//! salts (prefix-cache isolation), on the fake model of the parent module.

use super::*;
use crate::kv::salted_seed;

fn with_priority(mut request: EngineRequest, priority: i32) -> EngineRequest {
    request.priority = priority;
    request
}

fn with_salt(mut request: EngineRequest, salt: &str) -> EngineRequest {
    request.prefix_root = salted_seed(salt);
    request
}

#[tokio::test]
async fn a_priority_request_overtakes_a_sheddable_flood_whose_outputs_stay_identical() {
    // 12 blocks of 4 tokens; each sheddable stream needs 8 of them by its end: they preempt one
    // another, and the priority request must be served ahead of all of them.
    let mut c = Client::new(config(12, 64, true));
    let flood: Vec<Vec<u32>> = (0..4).map(|i| prompt(12, 20 + i)).collect();
    let ids = ["s0", "s1", "s2", "s3", "high"];
    for (id, p) in ids.iter().zip(&flood) {
        c.add(with_priority(add(id, p.clone(), 20, vec![]), -1));
    }
    // The flood has started (prefilled and sampled) before the priority request arrives.
    while c.stats().await.generated_tokens < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let high = prompt(8, 3);
    c.add(with_priority(add("high", high.clone(), 4, vec![]), 10));
    let got = c.collect(&ids).await;
    for (i, p) in flood.iter().enumerate() {
        assert_eq!(got[i], Ok((expected(p, 20), StopReason::Length)), "{i}");
    }
    assert_eq!(got[4], Ok((expected(&high, 4), StopReason::Length)));
    assert_eq!(c.finished[0], "high", "finish order {:?}", c.finished);
    let stats = c.stats().await;
    assert!(stats.preemptions > 0, "{stats:?}");
    assert_eq!((stats.kv_blocks_used, stats.running_sequences), (0, 0));
}

#[tokio::test]
async fn a_cache_salt_hits_only_its_own_prefix() {
    let shared = prompt(12, 7);
    let mut c = Client::new(config(64, 64, true));
    let mut hits = Vec::new();
    for (id, salt) in [
        ("a", "tenant-a"),
        ("b", "tenant-b"),
        ("plain", ""),
        ("a2", "tenant-a"),
    ] {
        let mut p = shared.clone();
        p.push(id.len() as u32);
        c.add(with_salt(add(id, p.clone(), 3, vec![]), salt));
        assert_eq!(
            c.collect(&[id]).await[0],
            Ok((expected(&p, 3), StopReason::Length))
        );
        hits.push(c.stats().await.prefix_cache_hit_tokens);
    }
    // Neither another salt nor no salt hits tenant-a's 12 cached tokens; tenant-a itself does.
    assert_eq!(hits, [0, 0, 0, 12]);
    assert_eq!(c.stats().await.kv_blocks_used, 0);
}
