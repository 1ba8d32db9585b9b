//! Re-reading a file-backed setting on change, without a restart: one task per watched thing that
//! calls its `reload` every [`RELOAD_PERIOD`]. Used by the router's API key file and by the TLS
//! certificate files of the router and the worker.
//!
//! `reload` returns `Ok(true)` when it took a new content, `Ok(false)` when nothing changed, `Err`
//! when the new content is unusable (unreadable, invalid): the caller keeps its last good value,
//! and this loop logs one WARN per failing streak (not one per period) and one INFO when the file
//! is good again.

use std::fmt::Display;
use std::time::Duration;

/// How often a watched file is re-read.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(1);

/// Spawns the task that calls `reload` every `period` until the process exits; `what` names the
/// content in the logs (e.g. "API keys": "keeping the last good API keys").
pub fn poll<E, F>(
    what: &'static str,
    period: Duration,
    mut reload: F,
) -> tokio::task::JoinHandle<()>
where
    E: Display,
    F: FnMut() -> Result<bool, E> + Send + 'static,
{
    tokio::spawn(async move {
        let mut failing = false;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match reload() {
                Ok(_) => {
                    if failing {
                        tracing::info!("the file of the {what} is usable again");
                    }
                    failing = false;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "keeping the last good {what}");
                    }
                    failing = true;
                }
            }
        }
    })
}
