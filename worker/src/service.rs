//! The worker's gRPC service (`inference.worker.v1.Worker`): turns each router stream into engine
//! commands and engine outputs back into stream messages.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use inference_proto::worker::{
    router_message, worker_message, worker_server::Worker, HealthRequest, HealthResponse,
    InfoRequest, InfoResponse, RouterMessage, WorkerMessage,
};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::engine::{Command, EngineHandle};

/// The worker gRPC service.
pub struct WorkerService {
    engine: EngineHandle,
    /// The static part of `Info` (model and tokenizer description); stats are filled per call.
    description: Arc<InfoResponse>,
}

impl WorkerService {
    /// Serves `engine`; `description` is the model's `Info` (its `stats` field is ignored).
    pub fn new(engine: EngineHandle, description: InfoResponse) -> Self {
        Self {
            engine,
            description: Arc::new(description),
        }
    }
}

type WorkerStream = Pin<Box<dyn Stream<Item = Result<WorkerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl Worker for WorkerService {
    type GenerateStream = WorkerStream;

    async fn generate(
        &self,
        request: Request<Streaming<RouterMessage>>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let mut inbound = request.into_inner();
        let engine = self.engine.clone();
        let conn = engine.new_connection();
        let (out_tx, out_rx) = tokio::sync::mpsc::unbounded_channel();
        tracing::info!(conn, "router stream opened");
        tokio::spawn(async move {
            loop {
                let message = match inbound.next().await {
                    Some(Ok(m)) => m,
                    Some(Err(status)) => {
                        tracing::warn!(conn, %status, "router stream failed");
                        break;
                    }
                    None => break,
                };
                let command = match message.kind {
                    Some(router_message::Kind::Add(request)) => Command::Add {
                        conn,
                        request,
                        out: out_tx.clone(),
                    },
                    Some(router_message::Kind::Cancel(cancel)) => Command::Cancel {
                        conn,
                        request_id: cancel.request_id,
                    },
                    None => continue,
                };
                if !engine.send(command) {
                    break;
                }
            }
            tracing::info!(conn, "router stream closed; cancelling its requests");
            engine.send(Command::CloseConnection { conn });
        });
        let outbound = UnboundedReceiverStream::new(out_rx).map(|step| {
            Ok(WorkerMessage {
                kind: Some(worker_message::Kind::Step(step)),
            })
        });
        Ok(Response::new(Box::pin(outbound)))
    }

    async fn info(&self, _request: Request<InfoRequest>) -> Result<Response<InfoResponse>, Status> {
        let stats = self
            .engine
            .stats()
            .await
            .ok_or_else(|| Status::unavailable("the engine has stopped"))?;
        let mut info = (*self.description).clone();
        info.stats = Some(stats);
        Ok(Response::new(info))
    }

    async fn health(
        &self,
        _request: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        let ready = self.engine.stats().await.is_some();
        Ok(Response::new(HealthResponse {
            ready,
            status: if ready { "serving" } else { "engine stopped" }.into(),
        }))
    }
}
