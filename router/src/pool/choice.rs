//! The choice of a worker for one request under the `routing` setting ([`routing::Routing`]): what
//! the policy needs of the request, computed once when it is admitted ([`RouteKey`]), and the pick
//! among the ready workers ([`choose`]). The policies themselves are the `routing` crate's.

use std::sync::Arc;

use inference_proto::worker::AddRequest;
use routing::kv_aware::{KvCandidate, PromptChain};
use routing::Routing;

use super::link::{WorkerLink, WorkerSnapshot};
use super::settings::PoolSettings;
use crate::affinity::Candidate;

/// What the policy needs of a request, computed once when it is admitted (or resumed).
#[derive(Debug, Clone)]
pub(super) struct RouteKey {
    /// The affinity key (`routing = affinity`).
    affinity: Option<u64>,
    /// The block chain of the prompt plus already generated tokens (`routing = kv_aware`): what
    /// the worker looks up in its prefix cache.
    chain: Option<PromptChain>,
    /// Work in tokens the request brings to its worker, as the worker's load report will count it
    /// ([`routing::kv_aware::request_work_tokens`]): the load this router adds to the worker's
    /// last report until the next one.
    pub(super) work_tokens: u64,
    /// Tokens the request may still generate (`max_new_tokens` minus those already generated):
    /// `kv_aware`'s decode term.
    new_tokens: usize,
    /// The request is sheddable (negative priority): every in-flight request counts against
    /// the worker's cap; otherwise only non-sheddable ones do
    /// ([`has_room`](super::occupancy::Occupancy::has_room)).
    sheddable: bool,
    /// The request's tenant, when known (not for a failover): a tenant below its share of a
    /// worker's cap may go past it
    /// ([`has_room`](super::occupancy::Occupancy::has_room)).
    tenant: Option<Arc<str>>,
}

impl RouteKey {
    /// The key of a request of `tenant`.
    pub(super) fn of_tenant(self, tenant: Arc<str>) -> Self {
        Self {
            tenant: Some(tenant),
            ..self
        }
    }

    /// The request's tenant, when known.
    pub(super) fn tenant(&self) -> Option<&Arc<str>> {
        self.tenant.as_ref()
    }

    /// The key of `request` under `settings`, with chains in blocks of `block_size` tokens (the
    /// workers' block size; 0 before any worker described it).
    pub(super) fn new(settings: &PoolSettings, block_size: usize, request: &AddRequest) -> Self {
        let new_tokens =
            (request.max_new_tokens as usize).saturating_sub(request.generated_ids.len());
        let work_tokens = routing::kv_aware::request_work_tokens(
            request.prompt_ids.len() + request.generated_ids.len(),
            new_tokens,
        );
        let sheddable = request.priority < 0;
        match settings.routing {
            Routing::Affinity => Self {
                affinity: settings.affinity.key(&request.prompt_ids),
                chain: None,
                work_tokens,
                new_tokens,
                sheddable,
                tenant: None,
            },
            Routing::RoundRobin => Self {
                affinity: None,
                chain: None,
                work_tokens,
                new_tokens,
                sheddable,
                tenant: None,
            },
            Routing::KvAware => {
                // The worker roots a salted request's chain at its salt's seed.
                let root = routing::salted_seed(&request.cache_salt);
                let chain = if request.generated_ids.is_empty() {
                    PromptChain::rooted(root, &request.prompt_ids, block_size)
                } else {
                    let mut all = request.prompt_ids.clone();
                    all.extend_from_slice(&request.generated_ids);
                    PromptChain::rooted(root, &all, block_size)
                };
                Self {
                    affinity: None,
                    chain: Some(chain),
                    work_tokens,
                    new_tokens,
                    sheddable,
                    tenant: None,
                }
            }
        }
    }
}

/// Index into `ready` (the ready workers and their snapshots) of the worker that takes the request,
/// `None` when none has room (fewer than `cap` of this router's requests in flight).
pub(super) fn choose(
    settings: &PoolSettings,
    round_robin: &routing::round_robin::RoundRobin,
    key: &RouteKey,
    ready: &[(Arc<WorkerLink>, WorkerSnapshot)],
    cap: usize,
) -> Option<usize> {
    match (&key.chain, settings.routing) {
        (Some(chain), Routing::KvAware) => {
            let candidates: Vec<KvCandidate<'_>> = ready
                .iter()
                .map(|(link, s)| {
                    let (load_tokens, sequences) = link.kv.load();
                    KvCandidate {
                        address: &s.address,
                        has_room: s
                            .occupancy
                            .has_room(cap, key.sheddable, key.tenant.as_deref()),
                        cached_blocks: link.kv.prefix_blocks(&chain.hashes, chain.block_size),
                        load_tokens,
                        sequences: (sequences as usize).max(s.load),
                    }
                })
                .collect();
            settings.kv_aware.pick(chain, key.new_tokens, &candidates)
        }
        (_, Routing::RoundRobin) => {
            let addresses: Vec<&str> = ready.iter().map(|(_, s)| s.address.as_str()).collect();
            let has_room: Vec<bool> = ready
                .iter()
                .map(|(_, s)| {
                    s.occupancy
                        .has_room(cap, key.sheddable, key.tenant.as_deref())
                })
                .collect();
            round_robin.pick(&addresses, &has_room)
        }
        _ => {
            let candidates: Vec<Candidate<'_>> = ready
                .iter()
                .map(|(_, s)| Candidate {
                    address: &s.address,
                    load: s.load,
                    has_room: s
                        .occupancy
                        .has_room(cap, key.sheddable, key.tenant.as_deref()),
                })
                .collect();
            settings.affinity.pick(key.affinity, &candidates)
        }
    }
}
