//! The task that keeps one worker link connected ([`maintain`]): it connects, checks health,
//! fetches `Info` (the first worker to answer defines the served model), opens the `Generate`
//! stream and routes the worker's step messages to the requests in flight. A health probe runs
//! beside the stream.
//!
//! When the stream breaks (process killed, connection cut, worker shut down), the link leaves
//! rotation at once, every request in flight on it hears `WorkerEvent::Lost` (and fails over), and
//! the task reconnects with exponential backoff. A probe that gets no answer within the interval
//! changes nothing (a busy worker is not a down one; logged at debug, counted in
//! `router_health_probe_misses_total`); the stall rule is applied after each probe (see
//! `progress`). A worker that sends heartbeats on its stream and then falls silent (no step, no
//! heartbeat) for `heartbeat_timeout` (a stopped or frozen process, a cut network) is handled as a
//! broken stream at once, instead of after the HTTP/2 keep-alive (10 s + 5 s); a long engine step
//! never delays a worker's heartbeats (`worker::service::heartbeat`).
//!
//! A worker that cannot be reached is logged when it first fails (WARN, with the error), then at
//! most once a minute while it stays unreachable, and at INFO when it is back (`unreachable`).
//!
//! The task reaches its pool only through [`LinkOwner`], so that the pool can start links without
//! the links knowing the pool.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inference_proto::worker::{
    worker_client::WorkerClient, worker_message, HealthRequest, HealthResponse, InfoRequest,
    InfoResponse, KvCacheEvents,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;

use super::kv_fit::KvCapacity;
use super::link::WorkerLink;
use super::progress::{Change, Progress};
use super::settings::{PoolCounters, PoolSettings};
use super::unreachable::{Unreachable, UnreachableLog};

/// What a link's task asks of the pool it belongs to.
pub(super) trait LinkOwner: Send + Sync + 'static {
    /// The pool's settings.
    fn settings(&self) -> &PoolSettings;

    /// The pool's event counters.
    fn counters(&self) -> &PoolCounters;

    /// Takes the `Info` of the worker at `address`: the first worker to answer defines the served
    /// model; a later one must serve the same.
    ///
    /// Errors: a worker that serves another model, or whose model cannot be described (its
    /// tokenizer or chat template); the link then counts as unreachable and retries.
    fn adopt_model(&self, address: &str, info: &InfoResponse) -> anyhow::Result<()>;

    /// Recounts the ready workers (a link's readiness may have changed).
    fn refresh_ready(&self);

    /// Sends waiting requests while a worker has room (a link has new room).
    fn pump(self: &Arc<Self>);
}

/// `e` and its causes joined by `: `, each cause left out when the message before it already
/// says it (tonic's transport errors repeat their source: `tcp connect error: tcp connect error:
/// Connection refused`).
fn cause_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}

/// Keeps `link` connected until the task is aborted (the link was removed).
pub(super) async fn maintain<P: LinkOwner>(pool: Arc<P>, link: Arc<WorkerLink>) {
    let (initial, max) = pool.settings().backoff;
    let mut delay = initial;
    let mut unreachable = UnreachableLog::new(UNREACHABLE_LOG_EVERY);
    loop {
        let result = run(&pool, &link, &mut unreachable).await;
        link.set_last_error(result.as_ref().err().map(cause_chain));
        match result {
            Ok(()) => {
                tracing::warn!(worker = %link.address, "worker stream ended");
                delay = initial;
            }
            Err(e) => match unreachable.failed(Instant::now()) {
                Some(Unreachable::First) => tracing::warn!(
                    worker = %link.address,
                    error = %cause_chain(&e),
                    "worker unreachable; retrying with backoff"
                ),
                Some(Unreachable::Still { attempts, down_for }) => tracing::warn!(
                    worker = %link.address,
                    error = %cause_chain(&e),
                    attempts,
                    down_for_s = down_for.as_secs(),
                    "worker still unreachable"
                ),
                None => {
                    tracing::debug!(worker = %link.address, error = %cause_chain(&e), "worker unreachable")
                }
            },
        }
        link.kv.disconnected();
        let lost = link.fail_all(&format!(
            "worker {} disconnected while the request was running",
            link.address
        ));
        link.set_healthy(false);
        pool.refresh_ready();
        if lost > 0 {
            tracing::warn!(worker = %link.address, requests = lost, "worker lost with requests in flight; failing them over");
        }
        // While new requests wait for this worker (it was ready when its stream was lost, within
        // `reconnect_grace_ms`), retry at the first delay: a doubling backoff would leave gaps of
        // up to a second in which a worker that is back already is not seen.
        let in_grace = link
            .reconnect_grace_end(pool.settings().reconnect_grace)
            .is_some();
        if in_grace {
            delay = initial;
        }
        tokio::time::sleep(delay).await;
        if !in_grace {
            delay = (delay * 2).min(max);
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often a worker that stays unreachable is logged again.
const UNREACHABLE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Longest wait for a connected worker's `Info` (answered from published state, so at once unless
/// the process is stopped or hung).
const INFO_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 stream window of a worker connection. The worker's stream carries many small messages
/// (a step's load report and cache events: tens of bytes). h2 (0.4.20, `Counts::record_data_frame`)
/// ends a connection (GOAWAY `ENHANCE_YOUR_CALM`, "too_many_data_frames") when the DATA frames under
/// 256 bytes it received and the application has not read yet cost more than half the connection
/// window, each counted as 256 minus its length. A router waking from a pause finds its stream's
/// whole window of them at once: with hyper's defaults (2 MiB stream, 5 MiB connection) that broke
/// both worker connections of a router stopped for 30 s under load (found by a helper's trial,
/// 2026-12-07). A 256 KiB window of 20-byte messages costs 3.0 MiB, under the 4 MiB budget of
/// [`CONNECTION_WINDOW_BYTES`]; it also bounds what a stopped router leaves in flight, so the
/// worker's `router_backlog_kib` counts sooner.
const STREAM_WINDOW_BYTES: u32 = 256 << 10;

/// HTTP/2 connection window of a worker connection (see [`STREAM_WINDOW_BYTES`]).
const CONNECTION_WINDOW_BYTES: u32 = 8 << 20;

/// Connects once and serves the stream until it ends. Returns `Err` when the worker could not be
/// reached or described, `Ok` when an established stream ended.
async fn run<P: LinkOwner>(
    pool: &Arc<P>,
    link: &Arc<WorkerLink>,
    unreachable: &mut UnreachableLog,
) -> anyhow::Result<()> {
    let tls = pool.settings().worker_tls.as_ref();
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(tls_certs::ClientTls::uri(tls, &link.address))?;
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls.tonic_config())?;
    }
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES);
    let channel = endpoint.connect().await?;
    let mut client = WorkerClient::new(channel).max_decoding_message_size(64 << 20);
    let info = tokio::time::timeout(INFO_TIMEOUT, client.info(InfoRequest {}))
        .await
        .map_err(|_| anyhow::anyhow!("no Info answer within {INFO_TIMEOUT:?}"))??
        .into_inner();
    if let Some((down_for, attempts)) = unreachable.reached(Instant::now()) {
        tracing::info!(
            worker = %link.address,
            down_for_s = down_for.as_secs(),
            attempts,
            "worker reachable again"
        );
    }
    pool.adopt_model(&link.address, &info)?;
    // Not ready until a `Health` answer says so.
    let healthy = match probe(&mut client.clone(), pool.settings().health_interval).await {
        Ok(answer) => answer.ready,
        Err(_) => false,
    };
    // A new stream: whatever the worker held before is gone from the index at once; the snapshot
    // that comes first on the stream fills it.
    let capacity = KvCapacity::of(&info);
    link.kv.reset(
        capacity.map_or(0, |c| c.block_size as usize),
        capacity.map_or(0, |c| c.blocks as usize),
    );
    let (tx, rx) = mpsc::unbounded_channel();
    let mut inbound = client
        .generate(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let progress = Progress::new(Instant::now(), pool.settings().stall_timeout);
    if !link.connected(tx, capacity, healthy, progress) {
        return Ok(());
    }
    pool.refresh_ready();
    pool.pump();
    tracing::info!(worker = %link.address, model = %info.model_name, healthy, "worker connected");
    let _prober = AbortOnDrop(tokio::spawn(probe_loop(
        pool.clone(),
        link.clone(),
        client.clone(),
    )));
    let mut liveness = Liveness::new(pool.settings().heartbeat_timeout);
    loop {
        let message = match liveness.deadline() {
            Some(deadline) => match tokio::time::timeout_at(deadline, inbound.message()).await {
                Ok(message) => message,
                Err(_) if liveness.woke_late(tokio::time::Instant::now()) => {
                    // This router was not running (stopped, paused, starved of CPU) for part of
                    // the silence: what the worker sent meanwhile may be waiting unread. It gets
                    // a grace of a quarter of the timeout to arrive.
                    tracing::info!(
                        worker = %link.address,
                        "the heartbeat deadline passed while this router was not running; \
                         waiting a quarter of the timeout for what the worker sent meanwhile"
                    );
                    liveness.rearm();
                    continue;
                }
                Err(_) => {
                    pool.counters()
                        .heartbeat_losses
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(anyhow::anyhow!(
                        "no heartbeat for {} ms (heartbeat_timeout_ms): the worker is frozen or \
                         cut off; out of rotation",
                        liveness.timeout_ms()
                    ));
                }
            },
            None => inbound.message().await,
        };
        let Some(message) = message.transpose() else {
            break;
        };
        let mut step = match message.map(|m| m.kind) {
            Ok(Some(worker_message::Kind::Step(step))) => {
                liveness.heard(false);
                step
            }
            Ok(Some(worker_message::Kind::Heartbeat(_))) => {
                liveness.heard(true);
                continue;
            }
            Ok(None) => continue,
            Err(status) => {
                tracing::warn!(worker = %link.address, %status, "worker stream failed");
                break;
            }
        };
        if let Some(events) = step.kv_events.take() {
            apply_kv_events(pool.as_ref(), link, &events);
        }
        link.kv.on_step(step.step, step.load.as_ref());
        let had_errors = !step.errors.is_empty();
        let (freed, moving) = link.on_step(step);
        if moving {
            tracing::info!(worker = %link.address, "stalled worker makes progress again; back in rotation");
        }
        if had_errors || moving {
            // A hand-back may have taken the worker out of rotation; a stalled one is back.
            pool.refresh_ready();
        }
        if freed > 0 || moving {
            pool.pump();
        }
    }
    Ok(())
}

/// When a stream must next carry a message: once a worker has sent a `Heartbeat` on it, anything
/// it sends (a step or a heartbeat) must follow within the heartbeat timeout. A worker that never
/// sent one (an older build) is left to the HTTP/2 keep-alive.
struct Liveness {
    timeout: Option<Duration>,
    /// The worker sends heartbeats on this stream.
    armed: bool,
    last: tokio::time::Instant,
    /// After a late wake ([`Liveness::woke_late`]): the grace in which what waits unread must
    /// arrive; cleared by the next message.
    grace: Option<tokio::time::Instant>,
}

impl Liveness {
    fn new(timeout: Option<Duration>) -> Self {
        Self {
            timeout,
            armed: false,
            last: tokio::time::Instant::now(),
            grace: None,
        }
    }

    /// A message arrived now (`heartbeat`: it was a heartbeat).
    fn heard(&mut self, heartbeat: bool) {
        self.armed |= heartbeat;
        self.last = tokio::time::Instant::now();
        self.grace = None;
    }

    /// By when the next message must arrive (`None`: no limit).
    fn deadline(&self) -> Option<tokio::time::Instant> {
        let timeout = self.timeout.filter(|_| self.armed)?;
        Some(self.grace.unwrap_or(self.last + timeout))
    }

    /// Whether the deadline fired at `now` well after it passed (by more than a quarter of the
    /// timeout) with no grace given since the last message: the router itself was not running,
    /// so the silence is partly its own, and messages the worker sent meanwhile may wait unread in
    /// the connection (found in
    /// `kv_routing::a_frozen_router_holds_up_no_worker_and_catches_up_when_it_thaws`: a router
    /// stopped for 4 s took both live workers out of rotation on waking and refused its next
    /// request with `UNAVAILABLE`). One grace per silence: a router paused again and again must
    /// still drop a worker that is really frozen.
    fn woke_late(&self, now: tokio::time::Instant) -> bool {
        match (self.deadline(), self.timeout) {
            (Some(deadline), Some(timeout)) if self.grace.is_none() => {
                now.saturating_duration_since(deadline) > timeout / 4
            }
            _ => false,
        }
    }

    /// Gives what waits unread a quarter of the timeout from now to arrive.
    fn rearm(&mut self) {
        let quarter = self.timeout.unwrap_or_default() / 4;
        self.grace = Some(tokio::time::Instant::now() + quarter);
    }

    fn timeout_ms(&self) -> u128 {
        self.timeout.map_or(0, |t| t.as_millis())
    }
}

/// Applies one message's KV cache events to the link's index; counts and (at most once a minute
/// per worker) logs those that do not fit it.
fn apply_kv_events<P: LinkOwner>(pool: &P, link: &WorkerLink, events: &KvCacheEvents) {
    let anomalies = link.kv.apply(events);
    if anomalies.total() == 0 {
        return;
    }
    pool.counters().count_kv_anomalies(anomalies);
    if link.kv.should_log_anomalies(Instant::now()) {
        tracing::warn!(
            worker = %link.address,
            duplicate_stores = anomalies.duplicate_stores,
            unknown_evicts = anomalies.unknown_evicts,
            over_capacity = anomalies.over_capacity,
            "KV cache events that do not fit this router's index of the worker (ignored; counted \
             in router_kv_event_anomalies_total; logged at most once a minute per worker)"
        );
    }
}

/// Why a health probe got no answer.
#[derive(Debug, thiserror::Error)]
enum ProbeMiss {
    /// The call failed.
    #[error("Health failed: {0}")]
    Failed(tonic::Status),
    /// No answer within the timeout.
    #[error("no Health answer within {0:?}")]
    Timeout(Duration),
}

/// The worker's `Health` answer within `timeout`.
///
/// Errors: why there was none ([`ProbeMiss`]).
async fn probe(
    client: &mut WorkerClient<Channel>,
    timeout: Duration,
) -> Result<HealthResponse, ProbeMiss> {
    match tokio::time::timeout(timeout, client.health(HealthRequest {})).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(ProbeMiss::Failed(status)),
        Err(_) => Err(ProbeMiss::Timeout(timeout)),
    }
}

/// Probes the worker every health interval: a "not ready" answer takes it out of rotation (a ready
/// one puts it back), no answer changes nothing; then applies the stall rule.
async fn probe_loop<P: LinkOwner>(
    pool: Arc<P>,
    link: Arc<WorkerLink>,
    mut client: WorkerClient<Channel>,
) {
    let interval = pool.settings().health_interval;
    loop {
        tokio::time::sleep(interval).await;
        let mut changed = false;
        let mut back = false;
        match probe(&mut client, interval).await {
            Ok(answer) => {
                if link.kv.on_probe(answer.steps) {
                    tracing::debug!(worker = %link.address, steps = answer.steps, "the worker's stream lags behind its steps; routing it by load only");
                }
                let (ready_changed, progress) = link.on_health(&answer);
                if ready_changed {
                    if answer.ready {
                        tracing::info!(worker = %link.address, "worker healthy again; back in rotation");
                    } else {
                        tracing::warn!(worker = %link.address, status = %answer.status, "worker not ready; out of rotation");
                    }
                }
                if progress == Change::Moving {
                    tracing::info!(
                        worker = %link.address,
                        steps = answer.steps,
                        "stalled worker makes progress again; back in rotation"
                    );
                }
                changed = ready_changed || progress == Change::Moving;
                back = answer.ready;
            }
            Err(reason) => {
                pool.counters()
                    .health_probe_misses
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(worker = %link.address, %reason, "health probe got no answer; a busy worker is not a down one");
            }
        }
        if let Some((since, failed_over)) = link.check_stall() {
            pool.counters().stalls.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                worker = %link.address,
                since_progress_ms = since.as_millis() as u64,
                stall_timeout_ms = pool.settings().stall_timeout.as_millis() as u64,
                requests_failed_over = failed_over,
                "worker has work but made no progress within the stall timeout; out of rotation"
            );
            changed = true;
            back = false;
        }
        if changed {
            pool.refresh_ready();
            if back {
                pool.pump();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cause_chain, Liveness};
    use std::time::Duration;

    #[tokio::test]
    async fn the_silence_limit_starts_with_the_first_heartbeat() {
        let timeout = Duration::from_secs(2);
        let mut liveness = Liveness::new(Some(timeout));
        // A worker that sends no heartbeat (an older build): no limit, steps or not.
        assert_eq!(liveness.deadline(), None);
        liveness.heard(false);
        assert_eq!(liveness.deadline(), None);
        liveness.heard(true);
        let first = liveness.deadline().expect("armed");
        assert!(first <= tokio::time::Instant::now() + timeout);
        // Any message (a step too) moves the limit.
        tokio::time::sleep(Duration::from_millis(5)).await;
        liveness.heard(false);
        assert!(liveness.deadline().unwrap() > first);
        // Off: never a limit.
        let mut off = Liveness::new(None);
        off.heard(true);
        assert_eq!(off.deadline(), None);
    }

    #[tokio::test]
    async fn a_deadline_found_long_past_is_the_routers_own_pause_once() {
        let timeout = Duration::from_secs(2);
        let mut liveness = Liveness::new(Some(timeout));
        liveness.heard(true);
        let deadline = liveness.deadline().unwrap();
        // Woken on time (timer slack well under a quarter of the timeout): a real silence.
        assert!(!liveness.woke_late(deadline + Duration::from_millis(20)));
        assert!(!liveness.woke_late(deadline + timeout / 4));
        // Woken 2 s after the deadline: the router was not running.
        let late = deadline + Duration::from_secs(2);
        assert!(liveness.woke_late(late));
        let before = tokio::time::Instant::now();
        liveness.rearm();
        // A grace of a quarter of the timeout from now...
        let grace = liveness.deadline().unwrap();
        assert!(grace >= before + timeout / 4);
        assert!(grace <= tokio::time::Instant::now() + timeout / 4);
        // ...and only one: found late again (the router paused again), the silence is the worker's.
        assert!(!liveness.woke_late(grace + Duration::from_secs(3)));
        // A message ends the grace: the next silence is measured from it, with a grace of its own.
        liveness.heard(false);
        let next = liveness.deadline().unwrap();
        assert!(next >= tokio::time::Instant::now() + timeout - Duration::from_millis(50));
        assert!(liveness.woke_late(next + Duration::from_secs(1)));
        // Off or not armed: never late.
        assert!(!Liveness::new(None).woke_late(late));
        assert!(!Liveness::new(Some(timeout)).woke_late(late));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("tcp connect error")]
    struct Connect(#[source] std::io::Error);

    #[test]
    fn a_cause_its_parent_already_says_is_left_out() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = anyhow::Error::new(Connect(io))
            .context("tcp connect error")
            .context("transport error");
        assert_eq!(
            cause_chain(&e),
            "transport error: tcp connect error: Connection refused"
        );
        assert_eq!(cause_chain(&anyhow::anyhow!("plain")), "plain");
    }
}
