//! Command-line tools over the service's public APIs: the `bench` load tool ([`bench`],
//! `src/bin/bench.rs`; `bench fleet`: [`fleet`]; `bench quality`: [`quality`]; `bench soak`: [`soak`];
//! `bench stuck-clients`: [`stuck_clients`]) and the `client`
//! caller (`src/bin/client.rs`).

pub mod bench;
pub mod fleet;
pub mod quality;
pub mod soak;
pub mod stuck_clients;
