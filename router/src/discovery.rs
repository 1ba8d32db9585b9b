//! DNS discovery of workers: a `name:port` (e.g. a Kubernetes headless service,
//! `worker-headless.ns.svc.cluster.local:50061`, whose A/AAAA records are the ready pods) resolved
//! every `discovery_interval_ms` with the system resolver (`tokio::net::lookup_host`). Each resolved
//! address becomes a worker; an address that is no longer resolved is removed from the pool and
//! its running requests fail over to the others.
//!
//! The router replicas find each other the same way ([`run_replicas`]): the count of addresses of
//! their own headless service shares each tenant's limits among them
//! ([`crate::tenants::QuotaBook::set_replicas`]).
//!
//! A failed lookup keeps the current set (a resolver hiccup must not drop every worker); workers that
//! are really gone fail their streams and leave rotation by themselves. A lookup that succeeds with
//! no address (possible with some resolvers) empties the discovered set.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::pool::WorkerPool;
use crate::tenants::QuotaBook;

/// Resolves `target` (`name:port`) to `ip:port` strings (IPv6 as `[ip]:port`).
///
/// Errors: the lookup failed (unknown name, no resolver, malformed target).
pub async fn resolve(target: &str) -> std::io::Result<BTreeSet<String>> {
    Ok(tokio::net::lookup_host(target)
        .await?
        .map(|a| a.to_string())
        .collect())
}

/// Re-resolves `target` every `interval` and syncs the pool's discovered workers; runs forever.
pub async fn run(pool: Arc<WorkerPool>, target: String, interval: Duration) {
    let mut last_error: Option<String> = None;
    loop {
        match resolve(&target).await {
            Ok(addresses) => {
                last_error = None;
                let (added, removed) = pool.sync_discovered(&addresses);
                if added + removed > 0 {
                    tracing::info!(
                        %target, added, removed, workers = ?addresses,
                        "discovered workers changed"
                    );
                }
            }
            Err(e) => {
                let message = e.to_string();
                // Log a persisting error once, not every interval.
                if last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(%target, error = %message, "worker discovery lookup failed; keeping the current workers");
                }
                last_error = Some(message);
            }
        }
        tokio::time::sleep(interval).await;
    }
}

/// Re-resolves `target` (the router replicas' `name:port`) every `interval` and shares the
/// tenants' limits in `quotas` among the addresses found (at least 1); runs forever. A failed or
/// empty lookup keeps the last count (a resolver hiccup must not multiply every limit).
pub async fn run_replicas(quotas: Arc<QuotaBook>, target: String, interval: Duration) {
    let mut last_error: Option<String> = None;
    loop {
        match resolve(&target).await {
            Ok(addresses) if !addresses.is_empty() => {
                last_error = None;
                let replicas = u32::try_from(addresses.len()).unwrap_or(u32::MAX);
                if replicas != quotas.replicas() {
                    tracing::info!(
                        %target, replicas, "router replicas changed; each enforces 1/{replicas} of every tenant limit"
                    );
                    quotas.set_replicas(replicas);
                }
            }
            Ok(_) => {}
            Err(e) => {
                let message = e.to_string();
                if last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(%target, error = %message, "router replica lookup failed; keeping the replica count");
                }
                last_error = Some(message);
            }
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_literals_and_localhost() {
        let got = resolve("127.0.0.1:50061").await.unwrap();
        assert_eq!(got, BTreeSet::from(["127.0.0.1:50061".to_string()]));
        let got = resolve("[::1]:7").await.unwrap();
        assert_eq!(got, BTreeSet::from(["[::1]:7".to_string()]));
        let local = resolve("localhost:9").await.unwrap();
        assert!(!local.is_empty() && local.iter().all(|a| a.ends_with(":9")));
        assert!(resolve("no-port-given").await.is_err());
    }

    #[tokio::test]
    async fn replicas_are_the_addresses_of_the_routers_name() {
        let quotas = QuotaBook::new();
        let expected = resolve("localhost:9").await.unwrap().len() as u32;
        let task = tokio::spawn(run_replicas(
            quotas.clone(),
            "localhost:9".into(),
            Duration::from_millis(20),
        ));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while quotas.replicas() != expected && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(quotas.replicas(), expected);
        task.abort();
        // A failing lookup keeps the last count.
        quotas.set_replicas(3);
        let task = tokio::spawn(run_replicas(
            quotas.clone(),
            "no-port-given".into(),
            Duration::from_millis(20),
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(quotas.replicas(), 3);
        task.abort();
    }
}
