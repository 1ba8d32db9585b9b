//! Micro-benchmark of the router's admission work per request with many tenants (issue 27's
//! "admission overhead per request, target under 50 us at 32 tenants"): the tenant's quotas
//! (`QuotaBook::acquire`: `requests_per_second`, `tokens_per_minute`, `max_concurrent`), a push
//! into the fair-share admission queue holding a backlog, the dispatch of the next request (the
//! priority-class and Virtual Token Counter choice over the heads of the per-class, per-tenant queues), the
//! generated tokens charged to the counter, and the lease's release. Not a test: run it in release
//! mode and read the figures. One thread, as the router's queue is behind one lock.
//!
//! ```text
//! cargo run --release -p router --example admission_cost -- [TENANTS] [BACKLOG]
//! ```
//!
//! Defaults: 32 tenants (weights 1-4, priorities -1, 0 and 5), backlogs of 0, 64, 256 and 1,024
//! waiting requests (or only BACKLOG when given), 50,000 measured requests each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use router::admission::{AdmissionLimits, AdmissionQueue, Placement};
use router::tenants::quota::CallPart;
use router::tenants::{QuotaBook, Tenant, TenantLimits};

const REQUESTS: usize = 50_000;

fn arg(n: usize) -> Option<usize> {
    std::env::args()
        .nth(n)
        .map(|a| a.parse().expect("a number"))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

fn tenants(n: usize) -> Vec<(Tenant, Placement)> {
    (0..n)
        .map(|i| {
            let name: Arc<str> = Arc::from(format!("tenant-{i}").as_str());
            let tenant = Tenant {
                name: name.clone(),
                weight: 1 + (i % 4) as u32,
                limits: TenantLimits {
                    max_concurrent: Some(1_000_000),
                    max_queued: None,
                    requests_per_second: Some(1e9),
                    tokens_per_minute: Some(u64::MAX / 4),
                },
                ..Tenant::builtin_default()
            };
            let placement = Placement {
                tenant: name,
                weight: tenant.weight,
                priority: [-1, 0, 5][i % 3],
                max_queued: None,
            };
            (tenant, placement)
        })
        .collect()
}

/// Per-request admission times with `backlog` requests waiting throughout.
fn run(n_tenants: usize, backlog: usize) -> Vec<Duration> {
    let tenants = tenants(n_tenants);
    let quotas = QuotaBook::new();
    let mut queue: AdmissionQueue<usize> = AdmissionQueue::new(AdmissionLimits {
        max_waiting_requests: backlog + 16,
        max_waiting_tokens: u64::MAX / 2,
    });
    let mut leases = std::collections::VecDeque::new();
    let mut times = Vec::with_capacity(REQUESTS);
    for i in 0..backlog + REQUESTS {
        let (tenant, placement) = &tenants[(i * 7) % tenants.len()];
        let prompt = 64 + (i % 512) as u64;
        let started = Instant::now();
        let lease = quotas
            .acquire(tenant, CallPart::First, prompt, 128, Instant::now())
            .expect("quotas far above the load");
        queue
            .push_new(prompt, placement.clone(), i)
            .expect("room in the queue");
        leases.push_back(lease);
        if queue.len() > backlog {
            let entry = queue.pop_front().expect("a request waits");
            let tenant = entry
                .placement
                .as_ref()
                .expect("a new request")
                .tenant
                .clone();
            queue.charge(&tenant, 128);
            drop(leases.pop_front());
        }
        if i >= backlog {
            times.push(started.elapsed());
        }
        std::hint::black_box(&queue);
    }
    times
}

fn main() {
    let n_tenants = arg(1).unwrap_or(32);
    let backlogs = match arg(2) {
        Some(b) => vec![b],
        None => vec![0, 64, 256, 1024],
    };
    println!(
        "admission per request, {n_tenants} tenants, {REQUESTS} requests: quotas + queue push + \
         dispatch + charge + release"
    );
    println!("backlog  mean us  p50 us  p99 us");
    for backlog in backlogs {
        let mut times = run(n_tenants, backlog);
        let mean = times.iter().sum::<Duration>().as_secs_f64() * 1e6 / times.len() as f64;
        times.sort();
        println!(
            "{backlog:>7}  {mean:>7.2}  {:>6.2}  {:>6.2}",
            percentile(&times, 0.5),
            percentile(&times, 0.99)
        );
    }
}
