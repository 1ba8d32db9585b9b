//! `bench fleet`: the fleet benchmark of issue 25, on real processes and in simulation.
//!
//! - [`workload`]: the seeded workloads (`shared-prefix`, `multi-turn`, `no-sharing`);
//! - [`real`]: starts W workers and R routers on 127.0.0.1, replays a workload per policy and reads
//!   the workers' prefix-cache counters;
//! - [`sim`]: the discrete-event simulator that drives the `routing` crate's policies against
//!   modelled workers, to 1,000 workers and more;
//! - [`calibrate`]: fits the simulator's step cost from a real worker and compares both;
//! - [`outcome`]: a run's timings and its summary (TTFT, ITL, throughput, hit rate, balance);
//! - [`cli`]: the `bench fleet` command line;
//! - [`resync`]: `bench resync`, a restarted router's resync time at 100k cached blocks per worker.

pub mod calibrate;
pub mod cli;
pub mod outcome;
pub mod real;
pub mod resync;
pub mod sim;
pub mod workload;
