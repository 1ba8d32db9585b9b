//! The load report sent with every step: the work ahead that KV-aware routing weighs.

use super::*;

#[tokio::test]
async fn the_load_report_counts_the_work_ahead() {
    // Prompt 20 in chunks of 16, 30 new tokens (context 64: the length limit binds).
    let mut c = Client::new(config(64, 16, false));
    c.add(add("a", prompt(20, 3), 30, vec![]));
    let mut loads = Vec::new();
    let mut generated = 0u64;
    loop {
        let step = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
            .await
            .expect("engine output within 10 s")
            .expect("engine alive");
        let done = step.tokens.iter().any(|t| t.stop.is_some());
        generated += step.tokens.len() as u64;
        let load = step.load.expect("every step reports its load");
        loads.push((
            load.prefill_backlog_tokens,
            load.decode_horizon_tokens,
            generated,
        ));
        if done {
            break;
        }
    }
    // After the first chunk: 4 prompt tokens to prefill, 30 tokens to generate.
    assert_eq!((loads[0].0, loads[0].1), (4, 30));
    // Then one decode token pending and the generation left, until nothing is left.
    for &(backlog, horizon, generated) in &loads[1..loads.len() - 1] {
        assert_eq!((backlog, horizon + generated), (1, 30), "{loads:?}");
    }
    assert_eq!(loads.last().map(|l| (l.0, l.1)), Some((0, 0)), "{loads:?}");
    assert_eq!(generated, 30);
}

#[tokio::test]
async fn an_engine_left_idle_by_a_cancel_reports_its_load_at_once() {
    // A long generation, cancelled after its first output: the engine has no step left to run,
    // yet its connections must hear that nothing is ahead (a router would otherwise keep the last
    // step's report, which still counts the sequence).
    let mut c = Client::new(config(2048, 16, false));
    c.add(add("a", prompt(20, 3), 1_000, vec![]));
    let first = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
        .await
        .expect("engine output within 10 s")
        .expect("engine alive");
    assert_eq!(first.load.expect("a step's load").running_sequences, 1);
    assert!(c.engine.send(Command::Cancel {
        conn: c.conn,
        request_id: "a".into(),
    }));
    loop {
        let out = tokio::time::timeout(Duration::from_secs(10), c.rx.recv())
            .await
            .expect("the idle report within 10 s")
            .expect("engine alive");
        let Some(load) = out.load else { continue };
        if load.running_sequences + load.waiting_sequences == 0 {
            // Between steps (step 0), with nothing ahead.
            assert_eq!(out.step, 0);
            assert_eq!(
                (load.prefill_backlog_tokens, load.decode_horizon_tokens),
                (0, 0)
            );
            assert!(out.tokens.is_empty());
            break;
        }
    }
}
