//! `bench --router 127.0.0.1:PORT [--requests N] [--concurrency C | --request-rate R] ...`: the
//! project's load tool. Drives the router's public `Generate` stream with synthetic prompts of an
//! exact token count, shows progress on stderr, prints requests/s, prompt and generated tokens/s,
//! TTFT / ITL / TPOT / end-to-end latency percentiles (ms) and errors by gRPC status code, and
//! optionally writes it all as JSON (`--json PATH`). See `tools::bench` for the definitions.
//!
//! `bench --worker 127.0.0.1:PORT ...` drives one worker's `Generate` stream directly with the same
//! load instead (no router), to measure what the router adds; `bench --openai URL ...` drives an
//! OpenAI-compatible HTTP server. `--api-key KEY` authenticates; `--constraint SPEC`
//! (`--constrained-fraction F`) makes it a structured-output load; `--worker-metrics HOST:PORT`
//! adds the worker's mask time per token.
//!
//! `bench fleet ...`: the fleet benchmark of the routing policies on real worker and router
//! processes, and its simulator (`tools::fleet`; `bench fleet --help`).
//!
//! `bench resync ...`: how long a restarted `kv_aware` router takes until its index equals every
//! worker's prefix cache, at 100k cached blocks per worker (`tools::fleet::resync`).
//!
//! `bench quality ...`: perplexity, KL divergence and top-1 agreement of the CPU backend's `fast`
//! numerics against `exact` over a text, in-process (`tools::quality`; `bench quality --help`);
//! `bench quality --api URL --candidate-api URL`: perplexity and top-1 agreement of two servers
//! over a text through their OpenAI-compatible APIs (`tools::quality::api`).
//!
//! `bench soak ...`: the fault-injecting soak of 3 workers and 2 routers (`tools::soak`;
//! `scripts/soak`; `bench soak --help`): exit 0 when every target holds, 1 when one fails, 2 for a
//! bad command line.
//!
//! `bench stuck-clients ...`: the normal requests' ITL beside 32 streams whose client never reads,
//! against their ITL alone (`tools::stuck_clients`; `bench stuck-clients --help`): exit 0 when
//! the ratio meets `--max-ratio`, 1 when not, 2 when the run could not be carried out.
//!
//! Exit status: 0 when every measured request succeeded, 1 when any failed (the summary is still
//! printed and written), 2 when the run could not start or the JSON could not be written.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tools::bench::{run::run, BenchArgs};
use tools::fleet::{self, cli::FleetArgs, resync::ResyncArgs};
use tools::quality::{self, cli::QualityArgs};
use tools::soak::{self, cli::SoakArgs};
use tools::stuck_clients::{self, StuckArgs};

/// 0 when a subcommand's run succeeded; else its error on stderr and 2.
fn exit_code(subcommand: &str, result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench {subcommand}: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("fleet") {
        let args = FleetArgs::parse_from(std::env::args().skip(1));
        return exit_code("fleet", fleet::cli::run(&args).await);
    }
    if std::env::args().nth(1).as_deref() == Some("resync") {
        let args = ResyncArgs::parse_from(std::env::args().skip(1));
        return exit_code("resync", fleet::resync::run(&args).await);
    }
    if std::env::args().nth(1).as_deref() == Some("quality") {
        let args = QualityArgs::parse_from(std::env::args().skip(1));
        return exit_code("quality", quality::cli::run(&args).await);
    }
    if std::env::args().nth(1).as_deref() == Some("stuck-clients") {
        let args = StuckArgs::parse_from(std::env::args().skip(1));
        return match stuck_clients::run(&args).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("bench stuck-clients: {e:#}");
                ExitCode::from(2)
            }
        };
    }
    if std::env::args().nth(1).as_deref() == Some("soak") {
        let args = SoakArgs::parse_from(std::env::args().skip(1));
        if let Err(e) = args.validate() {
            eprintln!("bench soak: {e:#}");
            return ExitCode::from(2);
        }
        return match soak::run::run(&args).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                println!("soak: FAIL: the run could not be carried out: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let args = BenchArgs::parse();
    if let Err(e) = args.validate() {
        eprintln!("bench: {e:#}");
        return ExitCode::from(2);
    }
    let outcome = match run(&args).await {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    println!("{}", outcome.report.summary.render(&args.label));
    if let Some(constrained) = &outcome.report.constrained {
        println!("{}", constrained.render());
    }
    if let Some(mask_time) = &outcome.report.mask_time {
        println!("{}", mask_time.render());
    }
    if let Some(tenants) = &outcome.report.tenants {
        println!("{}", tools::bench::tenant_mix::render(tenants));
    }
    if let Some(path) = &args.json {
        let written = serde_json::to_vec_pretty(&outcome.report)
            .context("encoding the report")
            .and_then(|bytes| {
                std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
            });
        match written {
            Ok(()) => eprintln!("bench: wrote {}", path.display()),
            Err(e) => {
                eprintln!("bench: {e:#}");
                return ExitCode::from(2);
            }
        }
    }
    if outcome.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
