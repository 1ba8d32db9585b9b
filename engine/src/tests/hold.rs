//! Flow control: a held sequence (its client stopped reading) sits out of the batch and resumes with
//! exactly the tokens it would have had.

use std::collections::HashMap;

use super::*;

/// Reads one output within 10 s and adds its tokens to `tokens` (by request id); returns the
/// output.
async fn next_output(c: &mut Client, tokens: &mut HashMap<String, Vec<u32>>) -> EngineOutput {
    let out = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
        .await
        .expect("engine output within 10 s")
        .expect("engine alive");
    for t in &out.tokens {
        tokens
            .entry(t.request_id.clone())
            .or_default()
            .push(t.token_id);
    }
    out
}

fn hold(c: &Client, id: &str) {
    assert!(c.engine.send(Command::Hold {
        conn: c.conn,
        request_id: id.into(),
    }));
}

fn resume(c: &Client, id: &str) {
    assert!(c.engine.send(Command::Resume {
        conn: c.conn,
        request_id: id.into(),
    }));
}

#[tokio::test]
async fn a_held_sequence_sits_out_and_resumes_with_the_tokens_it_would_have_had() {
    let (prompt_a, prompt_b) = (prompt(9, 1), prompt(7, 2));
    let mut c = Client::new(config(64, 64, true));
    c.add(add("a", prompt_a.clone(), 40, vec![]));
    c.add(add("b", prompt_b.clone(), 40, vec![]));
    let mut tokens: HashMap<String, Vec<u32>> = HashMap::new();
    while tokens.get("a").map_or(0, Vec::len) < 5 {
        next_output(&mut c, &mut tokens).await;
    }
    hold(&c, "a");
    // Ignored: an unknown id, a second hold, a resume of a sequence that is not held.
    hold(&c, "nobody");
    hold(&c, "a");
    resume(&c, "b");
    // b runs to its end alone.
    while tokens.get("b").map_or(0, Vec::len) < 40 {
        next_output(&mut c, &mut tokens).await;
    }
    assert_eq!(tokens["b"], expected(&prompt_b, 40));
    let stats = c.stats().await;
    assert_eq!(
        (
            stats.held_sequences,
            stats.running_sequences,
            stats.waiting_sequences
        ),
        (1, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.kv_blocks_used, 0, "a held sequence holds no blocks");
    // Nothing runs while only a held sequence is left: no step, no token.
    let held_at = tokens["a"].len();
    assert!(held_at < 40, "a finished before its hold");
    let steps = stats.steps;
    tokio::time::sleep(Duration::from_millis(100)).await;
    while let Ok(out) = c.rx.try_recv() {
        assert!(out.tokens.is_empty(), "a held sequence generated {out:?}");
        if let Some(load) = out.load {
            assert_eq!(load.kv_demand_tokens, 0, "a held sequence counts as load");
        }
    }
    assert_eq!(
        c.stats().await.steps,
        steps,
        "the engine stepped with only a held sequence"
    );
    // Resumed, it continues exactly where it stopped and frees everything at its end.
    resume(&c, "a");
    while tokens["a"].len() < 40 {
        next_output(&mut c, &mut tokens).await;
    }
    assert_eq!(tokens["a"], expected(&prompt_a, 40));
    let stats = c.stats().await;
    assert_eq!(
        (stats.held_sequences, stats.kv_blocks_used),
        (0, 0),
        "{stats:?}"
    );
    // The resume recomputed only what the prefix cache no longer had: a's full blocks were kept.
    assert!(stats.prefix_cache_hit_tokens >= 12, "{stats:?}");
}

#[tokio::test]
async fn holding_the_last_runnable_sequence_reports_an_idle_load_and_a_cancel_frees_it() {
    let mut c = Client::new(config(64, 64, false));
    c.add(add("a", prompt(9, 3), 1_000, vec![]));
    let mut tokens = HashMap::new();
    next_output(&mut c, &mut tokens).await;
    hold(&c, "a");
    loop {
        let out = next_output(&mut c, &mut tokens).await;
        let Some(load) = out.load else { continue };
        if load.running_sequences + load.waiting_sequences == 0 {
            assert_eq!((load.kv_demand_tokens, load.decode_horizon_tokens), (0, 0));
            break;
        }
    }
    assert!(c.engine.send(Command::Cancel {
        conn: c.conn,
        request_id: "a".into(),
    }));
    let stats = c.stats().await;
    assert_eq!(
        (
            stats.held_sequences,
            stats.cancelled_requests,
            stats.kv_blocks_used
        ),
        (0, 1, 0),
        "{stats:?}"
    );
    // A resume after the cancel is ignored, and the engine still serves.
    resume(&c, "a");
    c.add(add("b", prompt(5, 4), 3, vec![]));
    let got = c.collect(&["b"]).await;
    assert_eq!(got[0], Ok((expected(&prompt(5, 4), 3), StopReason::Length)));
}
