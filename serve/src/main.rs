//! `serve MODEL [--port 8000] [--grpc-port 50051]`: starts a worker and a router on 127.0.0.1, the
//! OpenAI HTTP API on `--port` and the gRPC API on `--grpc-port`, prints one `serve ready:` line with
//! both addresses, and on SIGTERM or Ctrl-C stops the router (it drains running calls) and then the
//! worker. Exit codes: 0 after a clean stop; a part's own non-zero code (2: a model file that cannot
//! be served or invalid settings) or 1 when a part fails, with its message on standard error.

use std::process::ExitCode;

use clap::Parser;
use serve::args::ServeArgs;

fn main() -> ExitCode {
    let args = ServeArgs::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("serve: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve::supervise::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
