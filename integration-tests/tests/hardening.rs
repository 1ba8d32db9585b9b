//! Found by an adversarial run (issue 31), against real router and worker processes on the tiny
//! model:
//!
//! - a key file rewritten in place (truncate, then write: what `open("w")` and `>` do) while
//!   clients call with a key present in every version never refuses one of them, nor does a key
//!   file that is emptied and then deleted; a file replaced atomically still rotates the keys;
//! - a 100 KB `authorization` value gets `UNAUTHENTICATED` naming the limit, for that request
//!   alone: another stream on the same HTTP/2 connection goes on to its end.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inference_proto::public::text_generation_client::TextGenerationClient;
use inference_proto::public::ModelInfoRequest;
use integration_tests::{authorized, greedy, start_router_with_env, start_worker, tiny_model};
use tonic::transport::Channel;
use tonic::Code;

const KEY: &str = "sk-steady-4b1e";
const NEW_KEY: &str = "sk-rotated-77c2";

/// Calls `ModelInfo` with `key` every 10 ms for `period`; returns (calls, refusals).
async fn probe(
    client: &TextGenerationClient<Channel>,
    key: &str,
    period: Duration,
) -> (u32, Vec<String>) {
    let mut client = client.clone();
    let (mut calls, mut refused) = (0, Vec::new());
    let end = Instant::now() + period;
    while Instant::now() < end {
        calls += 1;
        if let Err(status) = client
            .model_info(authorized(ModelInfoRequest::default(), key))
            .await
        {
            refused.push(format!("{:?}: {}", status.code(), status.message()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (calls, refused)
}

/// Waits until the router behind `client` has a ready worker, asking with `key`.
async fn wait_ready(client: &TextGenerationClient<Channel>, key: &str) {
    let mut client = client.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .model_info(authorized(ModelInfoRequest::default(), key))
        .await
        .map_or(true, |info| info.into_inner().ready_workers == 0)
    {
        assert!(Instant::now() < deadline, "the router never got ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_file_rewritten_in_place_or_emptied_never_locks_a_steady_key_out() {
    let (_model_dir, model) = tiny_model(41);
    let keys_dir = tempfile::tempdir().unwrap();
    let key_file = keys_dir.path().join("api-keys");
    std::fs::write(&key_file, format!("# version 0\n{KEY}\n")).unwrap();
    let (_worker, worker_addr) = start_worker(&model).await;
    let (router, router_addr) = start_router_with_env(
        &[&worker_addr],
        &["--api-keys-file", key_file.to_str().unwrap()],
        &[],
    )
    .await;
    let channel = Channel::from_shared(format!("http://{router_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = TextGenerationClient::new(channel);
    wait_ready(&client, KEY).await;

    // In-place rewrites for 4 s, each leaving the file empty for 100 ms of every 120 ms, the way a
    // slow `open("w")` then `write` does: most of the router's once-a-second reads see it empty.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (path, stop) = (key_file.clone(), stop.clone());
        move || {
            let mut version = 0;
            while !stop.load(Ordering::SeqCst) {
                version += 1;
                let mut file = std::fs::File::create(&path).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                write!(file, "# version {version}\n{KEY}\n").unwrap();
                drop(file);
                std::thread::sleep(Duration::from_millis(20));
            }
            version
        }
    });
    let (calls, refused) = probe(&client, KEY, Duration::from_secs(4)).await;
    stop.store(true, Ordering::SeqCst);
    let versions = writer.join().unwrap();
    assert!(calls >= 50, "{calls} calls");
    assert!(
        refused.is_empty(),
        "{} of {calls} calls refused during {versions} in-place rewrites: {:?}",
        refused.len(),
        &refused[..refused.len().min(3)]
    );

    // Emptied (the last read before a deletion catches it truncated), then deleted: the last good
    // keys stay through both.
    std::fs::File::create(&key_file).unwrap();
    let (calls, refused) = probe(&client, KEY, Duration::from_millis(1_500)).await;
    assert!(refused.is_empty(), "emptied file: {refused:?} of {calls}");
    std::fs::remove_file(&key_file).unwrap();
    let (calls, refused) = probe(&client, KEY, Duration::from_millis(1_500)).await;
    assert!(refused.is_empty(), "deleted file: {refused:?} of {calls}");
    let log = router.log_text();
    assert!(log.contains("keeping the last good API keys"), "{log}");
    assert!(log.contains("the file is empty"), "{log}");

    // The atomic replace the README shows (a temporary file, then a rename) rotates the keys.
    let temporary = keys_dir.path().join("api-keys.tmp");
    std::fs::write(&temporary, format!("# rotated\n{NEW_KEY}\n")).unwrap();
    std::fs::rename(&temporary, &key_file).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut c = client.clone();
    while c
        .model_info(authorized(ModelInfoRequest::default(), NEW_KEY))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "the new key was not taken");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let old = c
        .model_info(authorized(ModelInfoRequest::default(), KEY))
        .await
        .unwrap_err();
    assert_eq!(old.code(), Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_authorization_header_fails_its_request_alone() {
    let (_model_dir, model) = tiny_model(42);
    let (_worker, worker_addr) = start_worker(&model).await;
    let (_router, router_addr) =
        start_router_with_env(&[&worker_addr], &[], &[("ROUTER_API_KEYS", KEY)]).await;
    // One HTTP/2 connection for every call below.
    let channel = Channel::from_shared(format!("http://{router_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = TextGenerationClient::new(channel);
    wait_ready(&client, KEY).await;

    // A stream under way on the connection.
    let mut stream = client
        .generate(authorized(greedy("Hello there", 64), KEY))
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().expect("a first message");
    let mut tokens = first.tokens.len();

    // A 100 KB key on the same connection: UNAUTHENTICATED, naming the limit.
    let huge = "k".repeat(100 << 10);
    let status = client
        .clone()
        .model_info(authorized(ModelInfoRequest::default(), &huge))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("longer than 8192 bytes"),
        "{status:?}"
    );
    let status = client
        .clone()
        .generate(authorized(greedy("Hi", 4), &huge))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    // The stream goes on to its end, and the connection takes new calls.
    while let Some(m) = stream.message().await.expect("the stream survives") {
        tokens += m.tokens.len();
    }
    assert_eq!(tokens, 64);
    client
        .model_info(authorized(ModelInfoRequest::default(), KEY))
        .await
        .expect("the connection takes new calls");
}
