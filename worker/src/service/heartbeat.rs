//! The worker's liveness heartbeat on each router stream ([`with_heartbeats`]).
//!
//! A `Heartbeat` message goes out every [`HEARTBEAT_INTERVAL`] from a timer on the async runtime,
//! not from the engine thread, so a long engine step (a large prefill) never delays it: the router
//! takes a worker out of rotation when a stream that carried heartbeats falls silent for its
//! `heartbeat_timeout_ms` (a stopped or frozen process), which a busy engine never causes.

use std::time::Duration;

use futures::{Stream, StreamExt as _};
use inference_proto::worker::{worker_message, Heartbeat, WorkerMessage};

/// How often the worker sends a `Heartbeat` on each router stream (the first one right after the
/// stream's first message, the prefix cache's snapshot, which stays first).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);

/// The messages of `messages`, with a heartbeat right after the first one and then every `every`
/// between them; ends when `messages` ends. The first heartbeat comes at once because the router
/// applies its silence limit only to streams that carried one, and a worker whose steps follow
/// each other without a pause sends no timed heartbeat (a waiting step goes first): without it,
/// a worker busy from the moment its stream opened would never be taken out when it froze.
pub fn with_heartbeats(
    messages: impl Stream<Item = WorkerMessage> + Send + 'static,
    every: Duration,
) -> impl Stream<Item = WorkerMessage> + Send + 'static {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let heartbeat = WorkerMessage {
        kind: Some(worker_message::Kind::Heartbeat(Heartbeat {
            interval_ms: every.as_millis().try_into().unwrap_or(u32::MAX),
        })),
    };
    let messages = Box::pin(messages);
    futures::stream::unfold(
        (messages, tick, heartbeat, Stage::First),
        |(mut messages, mut tick, heartbeat, stage)| async move {
            if stage == Stage::HeartbeatDue {
                let next = heartbeat.clone();
                return Some((next, (messages, tick, heartbeat, Stage::Steady)));
            }
            let next = tokio::select! {
                biased;
                message = messages.next() => message?,
                _ = tick.tick() => heartbeat.clone(),
            };
            let stage = match stage {
                Stage::First => Stage::HeartbeatDue,
                _ => Stage::Steady,
            };
            Some((next, (messages, tick, heartbeat, stage)))
        },
    )
}

/// Where [`with_heartbeats`] is: before the first message, owing the heartbeat that follows it,
/// or sending messages and timed heartbeats.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    First,
    HeartbeatDue,
    Steady,
}

#[cfg(test)]
mod tests {
    use super::*;
    use inference_proto::worker::StepOutput;

    fn is_heartbeat(message: &WorkerMessage) -> bool {
        matches!(message.kind, Some(worker_message::Kind::Heartbeat(_)))
    }

    #[tokio::test]
    async fn heartbeats_flow_while_no_step_comes_and_end_with_the_stream() {
        let every = Duration::from_millis(50);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut stream = Box::pin(with_heartbeats(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            every,
        ));
        let step = WorkerMessage {
            kind: Some(worker_message::Kind::Step(StepOutput::default())),
        };
        tx.send(step.clone()).unwrap();
        // The step (the snapshot) comes first, then at once a heartbeat (which arms the router's
        // silence limit even if steps never pause).
        let started = std::time::Instant::now();
        assert_eq!(stream.next().await.unwrap(), step);
        assert!(is_heartbeat(&stream.next().await.unwrap()));
        assert!(started.elapsed() < every, "the first heartbeat came late");
        // No step (the engine is in a long step): heartbeats, one interval apart at least.
        for n in 1..=4u32 {
            let message = stream.next().await.unwrap();
            assert!(is_heartbeat(&message), "{message:?}");
            assert!(started.elapsed() >= every * n, "heartbeat {n} came early");
        }
        tx.send(step.clone()).unwrap();
        // A waiting step goes before a due heartbeat.
        tokio::time::sleep(every * 2).await;
        assert_eq!(stream.next().await.unwrap(), step);
        drop(tx);
        // The stream ends with the steps, heartbeats or not.
        tokio::time::sleep(every * 2).await;
        assert_eq!(stream.next().await, None);
    }
}
