//! What `serve` does: starts the worker on a free loopback port, then the router over it with the
//! gRPC API on `--grpc-port` and the OpenAI HTTP API on `--port`, waits until the HTTP API reports a
//! ready worker, prints one ready line, and stops both in order (router first: it drains its running
//! calls, then the worker) on SIGTERM or Ctrl-C. When either part exits on its own, the other one is
//! stopped and `serve` fails with that part's message.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::args::ServeArgs;
use crate::error::ServeError;
use crate::part::{sibling_binary, Part};

/// How often the router's `/health` is asked while `serve` waits for it.
const HEALTH_POLL: Duration = Duration::from_millis(100);

/// Runs `serve` until a signal stops it (`Ok` after a clean stop) or a part fails.
pub async fn run(args: ServeArgs) -> Result<(), ServeError> {
    let worker_bin = sibling_binary("worker")?;
    let router_bin = sibling_binary("router")?;
    let mut signals = Signals::install()?;
    // The worker picks a free port itself and names it in its ready line.
    let mut worker_args = vec![
        "--model".to_string(),
        args.model_path().to_string_lossy().into_owned(),
        "--listen".to_string(),
        "127.0.0.1:0".to_string(),
    ];
    if let Some(name) = &args.served_model_name {
        worker_args.extend(["--served-model-name".to_string(), name.clone()]);
    }
    if let Some(threads) = args.threads {
        worker_args.extend(["--threads".to_string(), threads.to_string()]);
    }
    let mut worker = Part::spawn("worker", &worker_bin, &worker_args, &[])?;
    let worker_line = tokio::select! {
        line = worker.ready_line("worker ready:") => Some(line?),
        () = signals.recv() => None,
    };
    let Some(worker_line) = worker_line else {
        return stop(vec![worker], &mut signals).await;
    };
    let worker_addr = ready_address(&worker_line);
    let grpc = SocketAddr::new(args.host, args.grpc_port);
    let http = SocketAddr::new(args.host, args.port);
    let router_args = vec![
        "--workers".to_string(),
        worker_addr.clone(),
        "--listen".to_string(),
        grpc.to_string(),
        "--http-listen".to_string(),
        http.to_string(),
    ];
    // Keys go in the environment, where other local users cannot read them (the command line they
    // can), after any `ROUTER_API_KEYS` of serve's own; the keys of `api_keys_file` count too.
    let keys = std::env::var("ROUTER_API_KEYS")
        .ok()
        .filter(|k| !k.trim().is_empty())
        .into_iter()
        .chain(args.api_keys.iter().cloned())
        .collect::<Vec<_>>()
        .join(",");
    let router_env: Vec<(&str, &str)> = match keys.is_empty() {
        true => vec![],
        false => vec![("ROUTER_API_KEYS", keys.as_str())],
    };
    let mut router = match Part::spawn("router", &router_bin, &router_args, &router_env) {
        Ok(router) => router,
        Err(e) => {
            worker.kill();
            return Err(e);
        }
    };
    let ready_timeout = Duration::from_secs(args.ready_timeout_secs);
    let ready = async {
        router.ready_line("router ready:").await?;
        wait_healthy(local(http), ready_timeout).await
    };
    let started = tokio::select! {
        ready = ready => Some(ready),
        status = worker.exited() => Some(Err(worker.failure(status).await)),
        () = signals.recv() => None,
    };
    let Some(started) = started else {
        return stop(vec![router, worker], &mut signals).await;
    };
    if let Err(e) = started {
        // The failing part has exited; stop the other.
        let _ = stop(vec![router, worker], &mut signals).await;
        return Err(e);
    }
    println!(
        "serve ready: OpenAI HTTP API on http://{http}/v1, gRPC inference.v1.TextGeneration on \
         {grpc} (model {}; worker on {worker_addr})",
        args.model_path().display()
    );
    let failed = tokio::select! {
        status = worker.exited() => Some(worker.failure(status).await),
        status = router.exited() => Some(router.failure(status).await),
        () = signals.recv() => None,
    };
    let stopped = stop(vec![router, worker], &mut signals).await;
    match failed {
        Some(e) => Err(e),
        None => stopped,
    }
}

/// Stops `parts` one after the other: SIGTERM, then waits for it to exit (each drains first). A
/// second signal meanwhile kills every part still running. `Ok` when each exited with code 0 (or had
/// exited already), else the first failure, or [`ServeError::Killed`] after a second signal (the
/// parts killed on request are not failures: their output is not replayed as one).
async fn stop(parts: Vec<Part>, signals: &mut Signals) -> Result<(), ServeError> {
    let mut first_failure = None;
    let mut parts = parts.into_iter();
    while let Some(mut part) = parts.next() {
        eprintln!("serve: stopping the {}", part.name());
        part.terminate();
        let status = tokio::select! {
            status = part.exited() => status,
            () = signals.recv() => {
                eprintln!("serve: second signal: killing the parts");
                part.kill();
                for rest in parts.by_ref() {
                    rest.kill();
                }
                part.exited().await;
                return Err(first_failure.unwrap_or(ServeError::Killed));
            }
        };
        if !status.is_some_and(|s| s.success()) && first_failure.is_none() {
            first_failure = Some(part.failure(status).await);
        }
    }
    match first_failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The address in a ready line (`worker ready: serving PATH on ADDR[ over TLS][ (MODE)]`), where
/// MODE names the backend and its numerics, e.g. `(cpu, numerics exact)`.
fn ready_address(line: &str) -> String {
    let mut line = line.trim_end();
    if line.ends_with(')') {
        if let Some(open) = line.rfind(" (") {
            line = &line[..open];
        }
    }
    let line = line.trim_end_matches(" over TLS");
    line.rsplit(" on ").next().unwrap_or(line).to_string()
}

/// Waits until `GET /health` on `addr` answers 200 (the router has a ready worker).
async fn wait_healthy(addr: SocketAddr, timeout: Duration) -> Result<(), ServeError> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if health_ok(addr).await {
            return Ok(());
        }
        tokio::time::sleep(HEALTH_POLL).await;
    }
    Err(ServeError::NotReady {
        url: format!("http://{addr}/health"),
        seconds: timeout.as_secs(),
    })
}

/// Where `serve` reaches a part listening on `addr`: the loopback address of its family when it
/// listens on every interface.
fn local(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], addr.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// One plain HTTP/1.1 `GET /health`; true on status 200.
async fn health_ok(addr: SocketAddr) -> bool {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(head.starts_with(b"HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ask).await,
        Ok(Some(true))
    )
}

/// The signals `serve` stops on: SIGTERM and SIGINT (Ctrl-C).
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    fn install() -> Result<Signals, ServeError> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(ServeError::Signals)?,
            int: signal(SignalKind::interrupt()).map_err(ServeError::Signals)?,
        })
    }

    /// Resolves on the next SIGTERM or SIGINT.
    async fn recv(&mut self) {
        let name = tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        };
        eprintln!("serve: {name} received");
    }
}

#[cfg(test)]
mod tests {
    use super::ready_address;

    #[test]
    fn the_address_is_the_end_of_the_ready_line() {
        assert_eq!(
            ready_address("worker ready: serving /m/a on b.gguf on 127.0.0.1:4321"),
            "127.0.0.1:4321"
        );
        assert_eq!(
            ready_address("worker ready: serving m.gguf on 127.0.0.1:9 over TLS\n"),
            "127.0.0.1:9"
        );
        assert_eq!(
            ready_address("worker ready: serving m.gguf on 127.0.0.1:9 (cpu, numerics exact)\n"),
            "127.0.0.1:9"
        );
        assert_eq!(
            ready_address(
                "worker ready: serving m (1).gguf on 127.0.0.1:7 over TLS (cuda, cuda_numerics exact)"
            ),
            "127.0.0.1:7"
        );
    }
}
