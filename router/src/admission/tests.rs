use super::*;

fn queue() -> AdmissionQueue<&'static str> {
    AdmissionQueue::new(AdmissionLimits {
        max_waiting_requests: 3,
        max_waiting_tokens: 100,
    })
}

fn big_queue() -> AdmissionQueue<String> {
    AdmissionQueue::new(AdmissionLimits {
        max_waiting_requests: 10_000,
        max_waiting_tokens: u64::MAX / 2,
    })
}

fn at(tenant: &str, weight: u32, priority: i32) -> Placement {
    Placement {
        tenant: Arc::from(tenant),
        weight,
        priority,
        max_queued: None,
    }
}

fn plain() -> Placement {
    Placement::default_tenant()
}

#[test]
fn request_limit_refuses_with_the_number() {
    let mut q = queue();
    for name in ["a", "b", "c"] {
        q.push_new(10, plain(), name).unwrap();
    }
    let err = q.push_new(1, plain(), "d").unwrap_err();
    assert_eq!(err, QueueFull::Requests { waiting: 3, max: 3 });
    assert_eq!((q.len(), q.tokens()), (3, 30));
}

#[test]
fn token_limit_refuses_with_the_number() {
    let mut q = queue();
    q.push_new(60, plain(), "a").unwrap();
    let err = q.push_new(41, plain(), "b").unwrap_err();
    assert_eq!(
        err,
        QueueFull::Tokens {
            waiting: 60,
            adding: 41,
            max: 100
        }
    );
    q.push_new(40, plain(), "c").unwrap();
    assert_eq!(q.tokens(), 100);
}

#[test]
fn fifo_within_one_tenant_with_resumed_first_and_removal() {
    let mut q = queue();
    q.push_new(1, plain(), "n1").unwrap();
    let n2 = q.push_new(2, plain(), "n2").unwrap().id;
    q.push_resumed(50, "r1");
    q.push_resumed(60, "r2");
    // Resumed requests ignore the limits but count against them.
    assert_eq!((q.len(), q.tokens()), (4, 113));
    assert!(q.push_new(1, plain(), "n3").is_err());
    assert_eq!(q.remove(n2).unwrap().item, "n2");
    assert!(q.remove(n2).is_none());
    let order: Vec<_> = std::iter::from_fn(|| q.pop_front().map(|e| e.item)).collect();
    assert_eq!(order, ["r1", "r2", "n1"]);
    assert_eq!((q.len(), q.tokens()), (0, 0));
    assert!(q.is_empty());
}

#[test]
fn the_highest_class_goes_first_whatever_the_counters() {
    let mut q = big_queue();
    q.push_new(10, at("a", 1, 0), "a0".into()).unwrap();
    q.push_new(10, at("b", 1, -1), "b-1".into()).unwrap();
    q.push_new(10, at("c", 1, 5), "c5".into()).unwrap();
    // c has been served a lot; its class still wins.
    q.charge("c", 1_000_000);
    let order: Vec<_> = std::iter::from_fn(|| q.pop_front().map(|e| e.item)).collect();
    assert_eq!(order, ["c5", "a0", "b-1"]);
}

#[test]
fn a_higher_class_displaces_the_newest_lowest_sheddable_request() {
    let mut q = queue();
    q.push_new(10, at("batch", 1, -1), "s1").unwrap();
    q.push_new(10, at("batch", 1, -2), "s2").unwrap();
    q.push_new(10, at("batch", 1, -2), "s3").unwrap();
    // Never over its own class.
    assert_eq!(
        q.push_new(1, at("batch", 1, -2), "s4").unwrap_err(),
        QueueFull::Requests { waiting: 3, max: 3 }
    );
    let pushed = q.push_new(5, at("web", 1, 0), "w").unwrap();
    let displaced = pushed.displaced.expect("one was displaced");
    assert_eq!(displaced.item, "s3");
    let reason = QueueFull::Displaced {
        priority: -2,
        by: 0,
    };
    assert!(reason.to_string().contains("displaced"), "{reason}");
    assert_eq!((q.len(), q.tokens()), (3, 25));
    // Non-sheddable requests are never displaced.
    let mut q = queue();
    for name in ["a", "b", "c"] {
        q.push_new(1, at("x", 1, 0), name).unwrap();
    }
    assert!(q.push_new(1, at("y", 1, 10), "hi").is_err());
}

#[test]
fn a_tenant_past_max_queued_is_refused_alone() {
    let mut q = big_queue();
    let limited = Placement {
        max_queued: Some(2),
        ..at("a", 1, 0)
    };
    q.push_new(1, limited.clone(), "a1".into()).unwrap();
    q.push_new(1, limited.clone(), "a2".into()).unwrap();
    let err = q.push_new(1, limited, "a3".into()).unwrap_err();
    assert_eq!(
        err,
        QueueFull::TenantQueue {
            tenant: Arc::from("a"),
            waiting: 2,
            max: 2
        }
    );
    q.push_new(1, at("b", 1, 0), "b1".into()).unwrap();
    assert_eq!(q.tenant_queues().waiting.len(), 2);
}

/// A tenant that returns from idle starts at the least backlogged counter: no banked credit.
#[test]
fn a_returning_tenant_starts_at_the_current_minimum() {
    let mut q = big_queue();
    // b was served early on, then went idle while a was served a lot.
    q.push_new(100, at("b", 1, 0), "b0".into()).unwrap();
    q.pop_front().unwrap();
    for i in 0..20 {
        q.push_new(100, at("a", 1, 0), format!("a{i}")).unwrap();
    }
    for _ in 0..10 {
        q.pop_front().unwrap();
    }
    let a_counter = q.fair_share().counter("a");
    assert!(a_counter > q.fair_share().counter("b"));
    q.push_new(100, at("b", 1, 0), "b1".into()).unwrap();
    assert_eq!(q.fair_share().counter("b"), a_counter);
    // b gets its turn within one request of a's, not ten in a row.
    let order: Vec<_> = (0..4).map(|_| q.pop_front().unwrap().item).collect();
    assert_eq!(
        order.iter().filter(|n| n.starts_with('b')).count(),
        1,
        "{order:?}"
    );
    assert!(order[..2].contains(&"b1".to_string()), "{order:?}");
    // With nothing waiting, a returning tenant starts at the virtual time.
    let mut q = big_queue();
    q.dispatched_directly(&at("a", 1, 0), 500);
    q.dispatched_directly(&at("a", 1, 0), 500);
    q.dispatched_directly(&at("b", 1, 0), 10);
    assert_eq!(q.fair_share().counter("b"), 510.0);
}

/// The invariant of the module docs, over a long run: each dispatched tenant has the least
/// counter of the backlogged ones in its class, backlogged tenants stay within one request's
/// charge, and two saturating tenants weighted 3:1 are served 3:1.
#[test]
fn weighted_backlogged_tenants_share_by_tokens() {
    let mut q = big_queue();
    let (prompt, generated) = (40u64, 60u64);
    let weights = [("a", 3u32), ("b", 1u32)];
    let mut served = [0u64; 2];
    // Both keep 5 requests waiting throughout.
    for _ in 0..5 {
        for (name, w) in weights {
            q.push_new(prompt, at(name, w, 0), name.to_string())
                .unwrap();
        }
    }
    let max_charge = (prompt + generated) as f64;
    for _ in 0..4000 {
        let next = q.front().unwrap();
        let tenant = next.placement.as_ref().unwrap().tenant.clone();
        let chosen = q.fair_share().counter(&tenant);
        for (name, _) in weights {
            assert!(
                chosen <= q.fair_share().counter(name),
                "{tenant} chosen above {name}"
            );
        }
        let gap = (q.fair_share().counter("a") - q.fair_share().counter("b")).abs();
        assert!(gap <= max_charge, "counters {gap} apart");
        let entry = q.pop_front().unwrap();
        // Its tokens stream (charged as generated), then its tenant queues another request.
        q.charge(&tenant, generated);
        let i = weights.iter().position(|(n, _)| **n == *tenant).unwrap();
        served[i] += prompt + generated;
        let (name, w) = weights[i];
        q.push_new(prompt, at(name, w, 0), entry.item).unwrap();
    }
    let ratio = served[0] as f64 / served[1] as f64;
    assert!(
        (ratio - 3.0).abs() < 0.03 * 3.0,
        "served {served:?}, ratio {ratio}"
    );
}

#[test]
fn the_heads_list_each_class_and_tenant_as_dispatch_would_take_them() {
    let mut q = big_queue();
    q.push_new(10, at("a", 1, 0), "a1".into()).unwrap();
    q.push_new(10, at("shed", 1, -1), "s1".into()).unwrap();
    q.push_new(10, at("a", 1, 0), "a2".into()).unwrap();
    q.push_new(10, at("v", 1, 10), "v1".into()).unwrap();
    q.push_new(10, at("b", 1, 0), "b1".into()).unwrap();
    let resumed = q.push_resumed(10, "r1".into());
    let names = |q: &AdmissionQueue<String>| -> Vec<String> {
        (q.heads().iter())
            .map(|&id| q.get(id).unwrap().item.clone())
            .collect()
    };
    // Resumed first, then the priority-10 class, then priority 0 by counter (all equal: oldest
    // first; a2 is behind a1), then the sheddable one.
    assert_eq!(names(&q), ["r1", "v1", "a1", "b1", "s1"]);
    assert_eq!(q.heads()[0], q.front().unwrap().id);
    assert_eq!(q.take(resumed).unwrap().item, "r1");
    // Taking a1 past the front charges tenant a: b's request now goes before a's second.
    let a1 = q.heads()[1];
    assert_eq!(q.take(a1).unwrap().item, "a1");
    assert_eq!(names(&q), ["v1", "b1", "a2", "s1"]);
    assert!(q.fair_share().counter("a") > q.fair_share().counter("b"));
    assert_eq!((q.len(), q.tokens()), (4, 40));
    assert!(q.take(a1).is_none());
    let queues = q.tenant_queues();
    assert_eq!(
        queues.waiting,
        [
            ("a".into(), 1),
            ("b".into(), 1),
            ("shed".into(), 1),
            ("v".into(), 1)
        ]
    );
}
