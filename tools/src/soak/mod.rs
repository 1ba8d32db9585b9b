//! `bench soak` (`scripts/soak`): the fault-injecting soak of issue 31. Real processes on
//! 127.0.0.1, 3 workers and 2 routers (every router over every worker), a bounded mixed load on
//! both fronts for `--duration` seconds while a fault schedule runs, samples every
//! `--sample-secs`, and a verdict on each target at the end.
//!
//! - [`cli`]: the command line;
//! - [`procs`]: starting, signalling, restarting and reading the processes;
//! - [`load`]: the request mix, its clients and each request's record;
//! - [`faults`]: the fault schedule, its log and the readiness watch;
//! - [`report`]: samples, tables, the summary and the targets;
//! - [`run`]: the whole run.

pub mod cli;
pub mod faults;
pub mod load;
pub mod procs;
pub mod report;
pub mod run;
