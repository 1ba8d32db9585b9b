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
