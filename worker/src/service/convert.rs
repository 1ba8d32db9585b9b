//! The service's edge between the wire and the engine: the wire's `AddRequest` into an
//! [`EngineRequest`], and the engine's outputs, errors and counters into the wire's messages. The
//! mapping of [`EngineErrorKind`]s to gRPC status codes lives here and nowhere else.

use std::sync::Arc;

use inference_proto::worker::{
    AddRequest, EngineStats as WireStats, KvCacheEvents, LoadReport,
    PromptLogprobs as WirePromptLogprobs, PromptTokenLogprob, RequestError, SamplingParams,
    StepOutput, StopReason as WireStopReason, TokenLogprob, TokenOutput,
};
use prost::Message as _;
use tokio::sync::mpsc;
use tonic::Code;

use super::backlog::Backlog;
use engine::sampler::SamplingConfig;
use engine::{
    CacheReport, EngineErrorKind, EngineLoad, EngineOutput, EngineRequest, EngineStats,
    GeneratedToken, OutputSink, PromptLogprobs, RequestFailure, StopReason,
};

/// The engine's request for the wire's `add`. Its `constraint` and `trace_context` are the
/// service's (compiled and followed beside the request); a missing `sampling` is the wire's default
/// (which the engine refuses: `top_p` 0 is out of range).
pub fn engine_request(add: AddRequest) -> EngineRequest {
    let sampling = add.sampling.unwrap_or_default();
    EngineRequest {
        request_id: add.request_id,
        prompt_ids: add.prompt_ids,
        generated_ids: add.generated_ids,
        max_new_tokens: add.max_new_tokens,
        stop_token_ids: add.stop_token_ids,
        sampling: sampling_config(&sampling),
        seed: sampling.seed,
        priority: add.priority,
        tenant: if add.tenant.is_empty() {
            engine::DEFAULT_TENANT.into()
        } else {
            add.tenant.into()
        },
        tenant_weight: add.tenant_weight.max(1),
        prefix_root: engine::kv::salted_seed(&add.cache_salt),
        prompt_logprobs: add.prompt_logprobs,
        speculation_opt_out: add.speculation == Some(false),
    }
}

/// The sampler's config for the wire's `SamplingParams` (not validated: the engine checks it). The
/// seed is not part of it. `repetition_penalty` 0 (the wire's unset value) means 1 (off);
/// `logit_bias` is sorted by id.
pub fn sampling_config(params: &SamplingParams) -> SamplingConfig {
    let mut logit_bias: Vec<(u32, f32)> = params
        .logit_bias
        .iter()
        .map(|(&id, &bias)| (id, bias))
        .collect();
    logit_bias.sort_unstable_by_key(|&(id, _)| id);
    SamplingConfig {
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
        repetition_penalty: if params.repetition_penalty == 0.0 {
            1.0
        } else {
            params.repetition_penalty
        },
        frequency_penalty: params.frequency_penalty,
        presence_penalty: params.presence_penalty,
        logit_bias,
        top_logprobs: params.top_logprobs,
    }
}

/// The gRPC status code the wire's `RequestError.code` carries for an engine error of `kind`:
/// `INVALID_ARGUMENT` for a bad request and one that can never fit the KV cache (a client must not
/// retry it), `RESOURCE_EXHAUSTED` for one that does not fit now, `INTERNAL` for the model's or
/// the constraint's failure.
pub fn status_code(kind: EngineErrorKind) -> Code {
    match kind {
        EngineErrorKind::InvalidRequest | EngineErrorKind::ExceedsKvCache => Code::InvalidArgument,
        EngineErrorKind::NoKvRoom => Code::ResourceExhausted,
        EngineErrorKind::ModelFailed | EngineErrorKind::ConstraintFailed => Code::Internal,
    }
}

/// The wire's step message for the engine's `output`.
pub fn step_output(output: EngineOutput) -> StepOutput {
    StepOutput {
        tokens: output.tokens.into_iter().map(token_output).collect(),
        errors: output.errors.into_iter().map(request_error).collect(),
        load: output.load.map(load_report),
        step: output.step,
        kv_events: output.cache.map(kv_events),
        prompt_logprobs: output
            .prompt_logprobs
            .into_iter()
            .map(prompt_logprobs)
            .collect(),
    }
}

/// The wire's scored prompt tokens for the engine's.
fn prompt_logprobs(scored: PromptLogprobs) -> WirePromptLogprobs {
    WirePromptLogprobs {
        request_id: scored.request_id,
        first_index: scored.first_index,
        tokens: scored
            .tokens
            .into_iter()
            .map(|t| PromptTokenLogprob {
                token_id: t.token_id,
                logprob: t.logprob,
                top_logprobs: token_logprobs(t.top_logprobs),
            })
            .collect(),
    }
}

/// The wire's alternatives for the engine's `(id, logprob)` pairs.
fn token_logprobs(top: Vec<(u32, f32)>) -> Vec<TokenLogprob> {
    top.into_iter()
        .map(|(token_id, logprob)| TokenLogprob { token_id, logprob })
        .collect()
}

/// The wire's prefix cache events for the engine's cache report.
fn kv_events(report: CacheReport) -> KvCacheEvents {
    KvCacheEvents {
        snapshot: report.snapshot,
        stored: report.events.stored,
        evicted: report.events.evicted,
    }
}

/// The step message that refuses `request_id` with `code` and `message` before it reached the
/// engine (the worker drains, or its constraint cannot be followed).
pub fn refusal(request_id: String, code: Code, message: String) -> StepOutput {
    StepOutput {
        errors: vec![RequestError {
            request_id,
            code: code as i32,
            message,
        }],
        ..Default::default()
    }
}

fn token_output(token: GeneratedToken) -> TokenOutput {
    TokenOutput {
        request_id: token.request_id,
        token_id: token.token_id,
        logprob: token.logprob,
        finished: token.stop.is_some(),
        stop_reason: wire_stop_reason(token.stop) as i32,
        index: token.index,
        top_logprobs: token_logprobs(token.top_logprobs),
        draft_tokens: token.draft_tokens,
        accepted_draft_tokens: token.accepted_draft_tokens,
    }
}

fn wire_stop_reason(reason: Option<StopReason>) -> WireStopReason {
    match reason {
        None => WireStopReason::Unspecified,
        Some(StopReason::StopToken) => WireStopReason::StopToken,
        Some(StopReason::Length) => WireStopReason::Length,
        Some(StopReason::ContextFull) => WireStopReason::ContextFull,
        Some(StopReason::ConstraintComplete) => WireStopReason::ConstraintComplete,
    }
}

fn request_error(failure: RequestFailure) -> RequestError {
    RequestError {
        request_id: failure.request_id,
        code: status_code(failure.error.kind) as i32,
        message: failure.error.message,
    }
}

fn load_report(load: EngineLoad) -> LoadReport {
    LoadReport {
        running_sequences: load.running_sequences,
        waiting_sequences: load.waiting_sequences,
        free_kv_tokens: load.free_kv_tokens,
        kv_demand_tokens: load.kv_demand_tokens,
        prefill_backlog_tokens: Some(load.prefill_backlog_tokens),
        decode_horizon_tokens: Some(load.decode_horizon_tokens),
    }
}

/// The wire's `EngineStats` (in `Info`) for the engine's counters.
pub fn wire_stats(stats: EngineStats) -> WireStats {
    // Destructured, so a counter added to the engine is not forgotten here.
    let EngineStats {
        running_sequences,
        waiting_sequences,
        steps,
        generated_tokens,
        prompt_tokens,
        kv_tokens_used,
        kv_tokens_capacity,
        finished_requests,
        cancelled_requests,
        kv_block_size,
        kv_blocks_total,
        kv_blocks_used,
        kv_blocks_free,
        preemptions,
        prefix_cache_query_tokens,
        prefix_cache_hit_tokens,
        prefix_cache_hit_rate,
        prefix_cache_blocks,
        failed_requests,
        last_batch_tokens,
        last_batch_sequences,
        speculative_draft_tokens,
        speculative_accepted_tokens,
        speculative_verifications,
        held_sequences,
        // Not on the wire: the metrics' `proposer="grammar"` counters carry them.
        speculative_forced_tokens: _,
        speculative_forced_accepted_tokens: _,
    } = stats;
    WireStats {
        running_sequences,
        waiting_sequences,
        steps,
        generated_tokens,
        prompt_tokens,
        kv_tokens_used,
        kv_tokens_capacity,
        finished_requests,
        cancelled_requests,
        kv_block_size,
        kv_blocks_total,
        kv_blocks_used,
        kv_blocks_free,
        preemptions,
        prefix_cache_query_tokens,
        prefix_cache_hit_tokens,
        prefix_cache_hit_rate,
        prefix_cache_blocks,
        failed_requests,
        last_batch_tokens,
        last_batch_sequences,
        speculative_draft_tokens,
        speculative_accepted_tokens,
        speculative_verifications,
        held_sequences,
    }
}

/// The engine's sink for one router stream: converts each output to the wire's step message and
/// queues it on the stream.
pub struct WireSink {
    /// The stream's channel.
    pub out: mpsc::UnboundedSender<StepOutput>,
    /// What the stream has left unread, against its limit.
    pub backlog: Arc<Backlog>,
}

impl OutputSink for WireSink {
    /// False (the engine then drops the connection) when the router went away or left more than
    /// its backlog's limit unread ([`Backlog`]).
    fn send(&self, output: EngineOutput) -> bool {
        let step = step_output(output);
        self.backlog.reserve(step.encoded_len()) && self.out.send(step).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use engine::EngineError;

    #[test]
    fn sampling_params_become_a_normalised_config_and_the_seed_goes_beside() {
        let ok = SamplingParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            seed: 5,
            min_p: 0.05,
            repetition_penalty: 0.0,
            frequency_penalty: -2.0,
            presence_penalty: 2.0,
            logit_bias: HashMap::from([(9, 1.5), (2, -100.0)]),
            top_logprobs: 20,
        };
        let c = sampling_config(&ok);
        assert_eq!(
            c,
            SamplingConfig {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                repetition_penalty: 1.0,
                frequency_penalty: -2.0,
                presence_penalty: 2.0,
                logit_bias: vec![(2, -100.0), (9, 1.5)],
                top_logprobs: 20,
            }
        );
        assert_eq!(c.validate(), Ok(()));
        // Values out of range pass through for the engine to refuse.
        let mut p = ok.clone();
        p.repetition_penalty = 10.5;
        p.temperature = -1.0;
        let c = sampling_config(&p);
        assert_eq!((c.repetition_penalty, c.temperature), (10.5, -1.0));
        assert!(c.validate().is_err());
        let add = AddRequest {
            request_id: "r".into(),
            prompt_ids: vec![1, 2],
            sampling: Some(ok.clone()),
            max_new_tokens: 7,
            stop_token_ids: vec![0],
            generated_ids: vec![3],
            priority: -2,
            cache_salt: "tenant:a".into(),
            tenant: "a".into(),
            tenant_weight: 3,
            ..Default::default()
        };
        assert_eq!(
            engine_request(add),
            EngineRequest {
                request_id: "r".into(),
                prompt_ids: vec![1, 2],
                generated_ids: vec![3],
                max_new_tokens: 7,
                stop_token_ids: vec![0],
                sampling: sampling_config(&ok),
                seed: 5,
                priority: -2,
                tenant: "a".into(),
                tenant_weight: 3,
                prefix_root: engine::kv::salted_seed("tenant:a"),
                prompt_logprobs: None,
                speculation_opt_out: false,
            }
        );
        // No sampling at all: the wire's default, which the engine refuses for its top_p.
        let bare = engine_request(AddRequest::default());
        assert_eq!(bare.sampling, sampling_config(&SamplingParams::default()));
        // No salt: the unsalted chain's root.
        assert_eq!((bare.priority, bare.prefix_root), (0, 0));
        // No tenant: the default one, weight 1.
        assert_eq!(
            (&*bare.tenant, bare.tenant_weight),
            (engine::DEFAULT_TENANT, 1)
        );
        assert_eq!(
            bare.sampling.validate().unwrap_err().to_string(),
            "top_p must be in (0, 1], got 0"
        );
    }

    #[test]
    fn engine_errors_carry_the_status_codes_the_wire_documents() {
        let code = |kind| {
            request_error(RequestFailure {
                request_id: "r".into(),
                error: EngineError::new(kind, "m"),
            })
            .code
        };
        assert_eq!(code(EngineErrorKind::InvalidRequest), 3);
        assert_eq!(code(EngineErrorKind::ExceedsKvCache), 3);
        assert_eq!(code(EngineErrorKind::NoKvRoom), 8);
        assert_eq!(code(EngineErrorKind::ModelFailed), 13);
        assert_eq!(code(EngineErrorKind::ConstraintFailed), 13);
        assert_eq!(
            refusal("r".into(), Code::Unavailable, "m".into()).errors[0].code,
            14
        );
    }

    #[test]
    fn a_step_output_keeps_every_token_error_and_load_field() {
        let output = EngineOutput {
            tokens: vec![
                GeneratedToken {
                    request_id: "a".into(),
                    token_id: 7,
                    logprob: -0.5,
                    stop: None,
                    index: 0,
                    top_logprobs: vec![(7, -0.5), (3, -1.5)],
                    draft_tokens: 3,
                    accepted_draft_tokens: 2,
                },
                GeneratedToken {
                    request_id: "b".into(),
                    token_id: 2,
                    logprob: -0.25,
                    stop: Some(StopReason::ConstraintComplete),
                    index: 4,
                    top_logprobs: vec![],
                    draft_tokens: 0,
                    accepted_draft_tokens: 0,
                },
            ],
            errors: vec![RequestFailure {
                request_id: "c".into(),
                error: EngineError::new(EngineErrorKind::NoKvRoom, "does not fit"),
            }],
            load: Some(EngineLoad {
                running_sequences: 2,
                waiting_sequences: 1,
                free_kv_tokens: 640,
                kv_demand_tokens: 300,
                prefill_backlog_tokens: 40,
                decode_horizon_tokens: 70,
            }),
            step: 9,
            cache: Some(CacheReport {
                snapshot: false,
                events: engine::kv::CacheEvents {
                    stored: vec![5, 6],
                    evicted: vec![1],
                },
            }),
            prompt_logprobs: vec![],
        };
        let wire = step_output(output);
        assert_eq!(
            wire,
            StepOutput {
                tokens: vec![
                    TokenOutput {
                        request_id: "a".into(),
                        token_id: 7,
                        logprob: -0.5,
                        finished: false,
                        stop_reason: WireStopReason::Unspecified as i32,
                        index: 0,
                        top_logprobs: vec![
                            TokenLogprob {
                                token_id: 7,
                                logprob: -0.5
                            },
                            TokenLogprob {
                                token_id: 3,
                                logprob: -1.5
                            },
                        ],
                        draft_tokens: 3,
                        accepted_draft_tokens: 2,
                    },
                    TokenOutput {
                        request_id: "b".into(),
                        token_id: 2,
                        logprob: -0.25,
                        finished: true,
                        stop_reason: WireStopReason::ConstraintComplete as i32,
                        index: 4,
                        top_logprobs: vec![],
                        draft_tokens: 0,
                        accepted_draft_tokens: 0,
                    },
                ],
                errors: vec![RequestError {
                    request_id: "c".into(),
                    code: 8,
                    message: "does not fit".into(),
                }],
                load: Some(LoadReport {
                    running_sequences: 2,
                    waiting_sequences: 1,
                    free_kv_tokens: 640,
                    kv_demand_tokens: 300,
                    prefill_backlog_tokens: Some(40),
                    decode_horizon_tokens: Some(70),
                }),
                step: 9,
                kv_events: Some(KvCacheEvents {
                    snapshot: false,
                    stored: vec![5, 6],
                    evicted: vec![1],
                }),
                prompt_logprobs: vec![],
            }
        );
        for (reason, wire) in [
            (StopReason::StopToken, WireStopReason::StopToken),
            (StopReason::Length, WireStopReason::Length),
            (StopReason::ContextFull, WireStopReason::ContextFull),
        ] {
            assert_eq!(wire_stop_reason(Some(reason)), wire);
        }
    }

    #[test]
    fn stats_keep_every_counter() {
        let stats = EngineStats {
            running_sequences: 1,
            waiting_sequences: 2,
            steps: 3,
            generated_tokens: 4,
            prompt_tokens: 5,
            kv_tokens_used: 6,
            kv_tokens_capacity: 7,
            finished_requests: 8,
            cancelled_requests: 9,
            kv_block_size: 10,
            kv_blocks_total: 11,
            kv_blocks_used: 12,
            kv_blocks_free: 13,
            preemptions: 14,
            prefix_cache_query_tokens: 15,
            prefix_cache_hit_tokens: 16,
            prefix_cache_hit_rate: 0.17,
            prefix_cache_blocks: 18,
            failed_requests: 19,
            last_batch_tokens: 20,
            last_batch_sequences: 21,
            speculative_draft_tokens: 22,
            speculative_accepted_tokens: 23,
            speculative_verifications: 24,
            held_sequences: 27,
            // Not on the wire (see `wire_stats`).
            speculative_forced_tokens: 25,
            speculative_forced_accepted_tokens: 26,
        };
        assert_eq!(
            wire_stats(stats),
            WireStats {
                running_sequences: 1,
                waiting_sequences: 2,
                steps: 3,
                generated_tokens: 4,
                prompt_tokens: 5,
                kv_tokens_used: 6,
                kv_tokens_capacity: 7,
                finished_requests: 8,
                cancelled_requests: 9,
                kv_block_size: 10,
                kv_blocks_total: 11,
                kv_blocks_used: 12,
                kv_blocks_free: 13,
                preemptions: 14,
                prefix_cache_query_tokens: 15,
                prefix_cache_hit_tokens: 16,
                prefix_cache_hit_rate: 0.17,
                prefix_cache_blocks: 18,
                failed_requests: 19,
                last_batch_tokens: 20,
                last_batch_sequences: 21,
                speculative_draft_tokens: 22,
                speculative_accepted_tokens: 23,
                speculative_verifications: 24,
                held_sequences: 27,
            }
        );
    }
}
