//! Engine loop tests with a fake model whose next token is a fixed function of the last one.

use std::time::Duration;

use inference_proto::worker::{AddRequest, SamplingParams, StepOutput, StopReason};
use tokio::sync::mpsc;

use super::*;

/// Fake model: vocabulary 50, context 32; the next token after `t` is `(t + 1) % 50`; 2 ms a forward.
struct CountingModel;

impl SequenceModel for CountingModel {
    type Cache = Vec<u32>;
    fn new_cache(&self) -> Vec<u32> {
        Vec::new()
    }
    fn cache_len(cache: &Vec<u32>) -> usize {
        cache.len()
    }
    fn forward(&self, tokens: &[u32], cache: &mut Vec<u32>) -> anyhow::Result<Vec<f32>> {
        anyhow::ensure!(!tokens.is_empty(), "no tokens");
        anyhow::ensure!(cache.len() + tokens.len() <= 32, "context full");
        cache.extend_from_slice(tokens);
        // Slow enough that a test can act between steps.
        std::thread::sleep(Duration::from_millis(2));
        let mut logits = vec![0.0; 50];
        logits[((tokens[tokens.len() - 1] + 1) % 50) as usize] = 10.0;
        Ok(logits)
    }
    fn context_length(&self) -> usize {
        32
    }
    fn vocab_size(&self) -> usize {
        50
    }
}

fn add(id: &str, prompt: Vec<u32>, max_new: u32, stops: Vec<u32>) -> AddRequest {
    AddRequest {
        request_id: id.into(),
        prompt_ids: prompt,
        sampling: Some(SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 1,
        }),
        max_new_tokens: max_new,
        stop_token_ids: stops,
    }
}

/// Collects outputs until `id` finishes or fails; returns its token ids and stop reason (or error).
async fn collect(
    rx: &mut mpsc::UnboundedReceiver<StepOutput>,
    id: &str,
) -> Result<(Vec<u32>, StopReason), String> {
    let mut ids = Vec::new();
    loop {
        let step = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("engine output within 5 s")
            .expect("engine alive");
        if let Some(e) = step.errors.iter().find(|e| e.request_id == id) {
            return Err(e.message.clone());
        }
        for t in step.tokens.iter().filter(|t| t.request_id == id) {
            ids.push(t.token_id);
            if t.finished {
                return Ok((ids, t.stop_reason()));
            }
        }
    }
}

#[tokio::test]
async fn generates_until_each_stop_condition() {
    let engine = spawn_engine(CountingModel);
    let conn = engine.new_connection();
    let (tx, mut rx) = mpsc::unbounded_channel();
    engine.send(Command::Add {
        conn,
        request: add("len", vec![3], 4, vec![]),
        out: tx.clone(),
    });
    assert_eq!(
        collect(&mut rx, "len").await,
        Ok((vec![4, 5, 6, 7], StopReason::Length))
    );
    engine.send(Command::Add {
        conn,
        request: add("eos", vec![3], 10, vec![6]),
        out: tx.clone(),
    });
    assert_eq!(
        collect(&mut rx, "eos").await,
        Ok((vec![4, 5, 6], StopReason::StopToken))
    );
    // Prompt of 30 in a context of 32: tokens at positions 30 and 31, then the context is full.
    engine.send(Command::Add {
        conn,
        request: add("ctx", vec![1; 30], 10, vec![]),
        out: tx,
    });
    assert_eq!(
        collect(&mut rx, "ctx").await,
        Ok((vec![2, 3], StopReason::ContextFull))
    );
    let stats = engine.stats().await.unwrap();
    assert_eq!((stats.running_sequences, stats.finished_requests), (0, 3));
}

#[tokio::test]
async fn rejects_bad_requests_and_keeps_serving() {
    let engine = spawn_engine(CountingModel);
    let conn = engine.new_connection();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cases = [
        (add("empty", vec![], 4, vec![]), "no tokens"),
        (add("long", vec![1; 32], 4, vec![]), "context is 32"),
        (add("oov", vec![99], 4, vec![]), "outside the vocabulary"),
        (add("zero", vec![1], 0, vec![]), "max_new_tokens"),
    ];
    for (request, needle) in cases {
        let id = request.request_id.clone();
        engine.send(Command::Add {
            conn,
            request,
            out: tx.clone(),
        });
        let err = collect(&mut rx, &id).await.unwrap_err();
        assert!(err.contains(needle), "{id}: {err}");
    }
    engine.send(Command::Add {
        conn,
        request: add("ok", vec![1], 2, vec![]),
        out: tx,
    });
    assert_eq!(
        collect(&mut rx, "ok").await,
        Ok((vec![2, 3], StopReason::Length))
    );
}

#[tokio::test]
async fn cancel_and_closed_connections_free_sequences() {
    let engine = spawn_engine(CountingModel);
    let conn = engine.new_connection();
    let (tx, mut rx) = mpsc::unbounded_channel();
    engine.send(Command::Add {
        conn,
        request: add("a", vec![1], 30, vec![]),
        out: tx.clone(),
    });
    engine.send(Command::Add {
        conn,
        request: add("b", vec![1], 30, vec![]),
        out: tx.clone(),
    });
    rx.recv().await.unwrap();
    engine.send(Command::Cancel {
        conn,
        request_id: "a".into(),
    });
    engine.send(Command::CloseConnection { conn });
    let stats = engine.stats().await.unwrap();
    assert_eq!(stats.running_sequences, 0);
    assert_eq!(stats.cancelled_requests, 2);

    // A connection whose receiver is dropped is cleaned up by the engine on its next send.
    let conn2 = engine.new_connection();
    let (tx2, rx2) = mpsc::unbounded_channel();
    engine.send(Command::Add {
        conn: conn2,
        request: add("c", vec![1], 30, vec![]),
        out: tx2,
    });
    drop(rx2);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(engine.stats().await.unwrap().running_sequences, 0);
}

#[tokio::test]
async fn interleaves_concurrent_requests() {
    let engine = spawn_engine(CountingModel);
    let conn = engine.new_connection();
    let (tx, mut rx) = mpsc::unbounded_channel();
    engine.send(Command::Add {
        conn,
        request: add("x", vec![10], 5, vec![]),
        out: tx.clone(),
    });
    engine.send(Command::Add {
        conn,
        request: add("y", vec![20], 5, vec![]),
        out: tx,
    });
    let mut x = Vec::new();
    let mut y = Vec::new();
    while x.len() < 5 || y.len() < 5 {
        let step = rx.recv().await.unwrap();
        for t in step.tokens {
            if t.request_id == "x" {
                x.push(t.token_id)
            } else {
                y.push(t.token_id)
            }
        }
    }
    assert_eq!(x, vec![11, 12, 13, 14, 15]);
    assert_eq!(y, vec![21, 22, 23, 24, 25]);
}
