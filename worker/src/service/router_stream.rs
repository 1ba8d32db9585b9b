//! The inbound side of one router stream: each [`RouterMessage`] decoded from the stream is
//! validated at the service's edge and becomes an engine command, or a refusal sent back on the
//! stream at once:
//!
//! - an `add` while the worker drains: refused with `UNAVAILABLE` (the router fails it over);
//! - an `add` whose constraint cannot be followed ([`super::constraint`]): refused with its code;
//! - any other `add`: [`Command::Add`] (the engine validates the rest: ids, lengths, sampling, KV
//!   room, and answers with a request error or tokens);
//! - a `cancel`: [`Command::Cancel`] (a cancel of an id the engine does not run is ignored);
//! - a `hold` or `resume` (flow control for a client that stopped reading): [`Command::Hold`],
//!   [`Command::Resume`] (ignored for an id the engine does not run, or not in that state);
//! - a message of no kind: ignored.
//!
//! [`WorkerService::open_stream`] opens one (the gRPC handler does, and so does the `router-stream`
//! fuzz target, which drives this same code with arbitrary message sequences).

use std::sync::Arc;

use inference_proto::worker::{router_message, RouterMessage, StepOutput};
use tokio::sync::mpsc;
use tonic::{Code, Status};

use super::backlog::Backlog;
use super::constraint::{compile_off_runtime, Constraints, Refused};
use super::convert::{engine_request, refusal, WireSink};
use super::WorkerService;
use crate::health::Lifecycle;
use crate::telemetry::ConnectionSpans;
use engine::{Command, ConnId, EngineHandle};

/// The refusal of a new request while the worker drains (with `UNAVAILABLE`: the router fails it
/// over to another worker).
const DRAINING: &str = "the worker is shutting down and takes no new requests";

/// One open router stream's inbound side (see the module).
pub struct RouterStream {
    conn: ConnId,
    engine: EngineHandle,
    constraints: Arc<Constraints>,
    lifecycle: Option<Arc<Lifecycle>>,
    spans: Option<Arc<ConnectionSpans>>,
    out: mpsc::UnboundedSender<StepOutput>,
    backlog: Arc<Backlog>,
}

impl WorkerService {
    /// Opens a router stream: registers its output with the engine (whose first message is the
    /// prefix cache's snapshot, then every step's load and cache changes) and returns the
    /// stream's inbound side with the receiver of its step messages. `spans` follows its
    /// requests in traces, when tracing is on.
    ///
    /// Errors: `UNAVAILABLE` when the engine has stopped.
    pub fn open_stream(
        &self,
        spans: Option<Arc<ConnectionSpans>>,
    ) -> Result<(RouterStream, mpsc::UnboundedReceiver<StepOutput>), Status> {
        let conn = self.engine.new_connection();
        let (out, steps) = mpsc::unbounded_channel();
        let stream = RouterStream {
            conn,
            engine: self.engine.clone(),
            constraints: self.constraints.clone(),
            lifecycle: self.lifecycle.clone(),
            spans,
            out,
            backlog: Backlog::new(self.router_backlog_bytes),
        };
        if !self.engine.send(Command::Connect {
            conn,
            out: Box::new(stream.sink()),
        }) {
            return Err(Status::unavailable("the engine has stopped"));
        }
        Ok((stream, steps))
    }
}

impl RouterStream {
    /// The stream's connection id in the engine.
    pub fn conn(&self) -> ConnId {
        self.conn
    }

    /// What the stream has left unread: its reader calls [`Backlog::read`] for every message it
    /// takes from the receiver [`WorkerService::open_stream`] returned.
    pub fn backlog(&self) -> Arc<Backlog> {
        self.backlog.clone()
    }

    /// The engine's sink for this stream's outputs (counted against its backlog).
    fn sink(&self) -> WireSink {
        WireSink {
            out: self.out.clone(),
            backlog: self.backlog.clone(),
        }
    }

    /// Queues `step` (a refusal answering the router's own message: counted, never refused).
    fn answer(&self, step: StepOutput) {
        self.backlog.count(prost::Message::encoded_len(&step));
        let _ = self.out.send(step);
    }

    /// Handles one message of the stream (see the module): sends its command to the engine, or
    /// its refusal back on the stream. Returns false when the engine has stopped (the stream
    /// should end).
    pub async fn handle(&self, message: RouterMessage) -> bool {
        let conn = self.conn;
        let command = match message.kind {
            Some(router_message::Kind::Add(request)) => {
                if self.lifecycle.as_ref().is_some_and(|l| l.is_draining()) {
                    let refused = refusal(request.request_id, Code::Unavailable, DRAINING.into());
                    self.answer(refused);
                    return true;
                }
                let (request, constraint) =
                    match compile_off_runtime(&self.constraints, request).await {
                        Ok(compiled) => compiled,
                        Err(Refused { request_id, reason }) => {
                            let message = reason.to_string();
                            self.answer(refusal(request_id, reason.code(), message));
                            return true;
                        }
                    };
                if let Some(spans) = &self.spans {
                    spans.on_add(&request);
                }
                Command::Add {
                    conn,
                    request: Box::new(engine_request(request)),
                    constraint,
                    out: Box::new(self.sink()),
                }
            }
            Some(router_message::Kind::Cancel(cancel)) => {
                if let Some(spans) = &self.spans {
                    spans.on_cancel(&cancel.request_id);
                }
                Command::Cancel {
                    conn,
                    request_id: cancel.request_id,
                }
            }
            Some(router_message::Kind::Hold(hold)) => Command::Hold {
                conn,
                request_id: hold.request_id,
            },
            Some(router_message::Kind::Resume(resume)) => Command::Resume {
                conn,
                request_id: resume.request_id,
            },
            None => return true,
        };
        self.engine.send(command)
    }

    /// The stream closed: the engine cancels its requests and forgets its output.
    pub fn close(self) {
        self.engine
            .send(Command::CloseConnection { conn: self.conn });
    }
}
