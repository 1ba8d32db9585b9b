//! [`CudaModel`]: the forward pass of every [`model_desc::Arch`] on one GPU, implementing
//! [`BatchModel`] like the CPU model, so the engine (scheduler, KV block manager, sampler) is shared.
//!
//! One step: the batch is checked and packed on the host ([`pack_step`]), its inputs are copied into
//! persistent device buffers, then the model's [`ModelPlan`] is launched op by op (`record`): the
//! embedding lookup, each layer's operations (norms, the fused QKV matrix with one launch per file
//! part, biases, q/k norms, RoPE, the KV write into the step's paged blocks, attention, the output
//! projection with the residual add fused in its epilogue or, with Gemma's post-norms, normed and
//! then added, gate/up, the gated activation and the down projection), and finally the rows that
//! want logits are gathered, normalised, multiplied by the LM head into f32 logits, soft-capped if
//! the plan says so, and copied back. The per-architecture options come from the plan and are
//! decided per launch, so a plain Llama runs the same kernels with neutral arguments (bias-free,
//! ones as RoPE factors, scale 1). Pure decode steps replay a CUDA graph per batch bucket (see
//! [`super::graphs`]) unless `cuda_graphs` is off.
//!
//! Exact mode mirrors the CPU model operation by operation; the sums run in a different (but fixed)
//! order, so logits agree to rounding and greedy ids match, and every value is independent of the
//! batch (the matrix kernels share one reduction order for every row count, attention is one full pass
//! per query). Fast mode stores activations and K/V as bf16 and runs prefill chunks through the tiled
//! online-softmax kernel.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{sys as driver_sys, CudaFunction, CudaSlice, CudaStream, DeviceRepr};
use cudarc::nvrtc::Ptx;

use super::block_table::{pack_step, StepInputs};
use super::buffers::{Capacity, StepBuffers};
use super::cache::ModuleCache;
use super::device::GpuInfo;
use super::error::{driver, CudaError};
use super::graphs::{bucket_for, decode_buckets, Captured, DecodeGraphs};
use super::kernels::FILES;
use super::kv_store::{GpuKv, KvBlocks};
use super::launch::{self, DEFAULT_SMEM_LIMIT};
use super::numerics::Numerics;
use super::weights::{GpuWeights, HostWeights};
use engine::backend::{BatchEntry, BatchModel, EntryLimits, Logits, ModelError, StepError};
use model_desc::{ModelDesc, ModelPlan, ModelSource};

mod record;

/// Options of the CUDA backend (from the worker settings).
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// Numeric mode the kernels are compiled for.
    pub numerics: Numerics,
    /// Replay pure decode steps from CUDA graphs.
    pub graphs: bool,
    /// Folder of the compiled-module cache.
    pub cache_dir: PathBuf,
    /// Largest decode batch a graph is captured for (normally `max_num_seqs`).
    pub max_decode_batch: usize,
}

/// A model of any supported architecture on a GPU.
pub struct CudaModel {
    config: ModelDesc,
    /// The order of operations, from `config`.
    plan: ModelPlan,
    gpu: GpuInfo,
    stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    weights: GpuWeights,
    options: CudaOptions,
    buckets: Vec<usize>,
    smem_limit: usize,
}

impl CudaModel {
    /// Loads the model at `path` (a GGUF file or a Hugging Face folder) onto `gpu`: reads and checks the config and weights like the
    /// CPU model, compiles (or takes from the cache) every kernel file for the GPU's architecture,
    /// and uploads the weights.
    ///
    /// Errors: the CPU model's load errors ([`CudaError::Model`]), a kernel that cannot be compiled
    /// (NVRTC missing on a cache miss, or a compile error: [`CudaError::NvrtcUnavailable`],
    /// [`CudaError::Compile`]), a head size or context the attention kernel does not support
    /// ([`CudaError::ModelUnsupported`]), or a driver error, e.g. out of memory
    /// ([`CudaError::Driver`]).
    pub fn load(path: &Path, gpu: GpuInfo, options: CudaOptions) -> Result<CudaModel, CudaError> {
        let file = model_files::open(path).map_err(ModelError::from)?;
        CudaModel::from_source(&file, gpu, options)
    }

    /// [`Self::load`] from an opened model (a GGUF file, a Hugging Face folder converted by
    /// [`model_files::open`], or any container that answers GGUF's metadata keys and tensor
    /// names); errors as [`Self::load`].
    pub fn from_source(
        src: &dyn ModelSource,
        gpu: GpuInfo,
        options: CudaOptions,
    ) -> Result<CudaModel, CudaError> {
        let config = ModelDesc::from_source(src).map_err(ModelError::from)?;
        let host = HostWeights::load(src, &config)?;
        let ctx = gpu.ctx.clone();
        driver("binding the CUDA context", ctx.bind_to_thread())?;
        // One stream, so cudarc's cross-stream event tracking is not needed (and it would put event
        // records into captured graphs).
        // SAFETY: no allocation has been made on this context by this model yet; all work of the
        // model is ordered on its single stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = driver("creating a CUDA stream", ctx.new_stream())?;
        let cache = ModuleCache::new(&options.cache_dir);
        let mut funcs = HashMap::new();
        let (mut hits, started) = (0, std::time::Instant::now());
        for file in FILES {
            let (cubin, hit) = cache.load_or_compile(file, &gpu.arch, options.numerics)?;
            hits += usize::from(hit);
            let module = driver(
                &format!("loading {}", file.name),
                ctx.load_module(Ptx::from_binary(cubin)),
            )?;
            for &k in file.kernels {
                let f = driver(&format!("kernel {k}"), module.load_function(k))?;
                funcs.insert(k, f);
            }
        }
        tracing::info!(
            arch = %gpu.arch,
            numerics = options.numerics.as_str(),
            cached = hits,
            compiled = FILES.len() - hits,
            ms = started.elapsed().as_millis() as u64,
            cache = %cache.dir().display(),
            "CUDA kernels ready"
        );
        // Attention keeps all scores of a query in shared memory: opt in beyond 48 KiB when the
        // context needs it.
        let needed = launch::attention_decode_smem(config.head_dim, config.context_length);
        let mut smem_limit = DEFAULT_SMEM_LIMIT;
        if needed > smem_limit {
            let optin = driver(
                "reading the shared memory limit",
                ctx.attribute(
                    driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                ),
            )? as usize;
            smem_limit = needed.min(optin);
            driver(
                "raising attention's shared memory",
                funcs["attention_decode"].set_attribute(
                    driver_sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem_limit as i32,
                ),
            )?;
        }
        launch::attention_decode(
            1,
            config.n_heads,
            config.head_dim,
            config.context_length,
            smem_limit,
        )
        .map_err(CudaError::ModelUnsupported)?;
        let weights = GpuWeights::upload(&host, &stream)?;
        tracing::info!(
            gpu = %gpu.name,
            weight_mib = host.device_bytes() >> 20,
            "weights uploaded to the GPU"
        );
        let buckets = if options.graphs {
            decode_buckets(options.max_decode_batch)
        } else {
            Vec::new()
        };
        Ok(CudaModel {
            plan: ModelPlan::new(&config),
            config,
            gpu,
            stream,
            funcs,
            weights,
            options,
            buckets,
            smem_limit,
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelDesc {
        &self.config
    }

    /// The GPU it runs on.
    pub fn gpu(&self) -> &GpuInfo {
        &self.gpu
    }

    /// KV bytes per token: `2 * n_layers * kv_dim * (4 exact | 2 fast)`.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.config.n_layers * self.config.kv_dim() * self.options.numerics.act_bytes()
    }

    /// Checks that a KV pool of `num_blocks` blocks of `block_size` tokens fits in the GPU's free
    /// memory (keeping 512 MiB for step buffers and graphs).
    ///
    /// Errors: [`CudaError::KvCacheTooLarge`] with both sizes, or [`CudaError::Driver`] when the
    /// free memory cannot be read.
    pub fn check_kv_fits(&self, num_blocks: usize, block_size: usize) -> Result<(), CudaError> {
        self.check_kv_bytes_fit(num_blocks * block_size * self.kv_bytes_per_token())
    }

    /// Checks that `need` bytes of KV storage (e.g. this model's pool and a draft model's on the
    /// same GPU) fit in the GPU's free memory, keeping 512 MiB for step buffers and graphs.
    ///
    /// Errors: as [`Self::check_kv_fits`].
    pub fn check_kv_bytes_fit(&self, need: usize) -> Result<(), CudaError> {
        let _ = self.gpu.ctx.bind_to_thread();
        let (free, _) = driver("reading free memory", self.gpu.ctx.mem_get_info())?;
        let reserve = 512usize << 20;
        if need + reserve > free {
            return Err(CudaError::KvCacheTooLarge { need, free });
        }
        Ok(())
    }

    pub(super) fn f(&self, name: &str) -> &CudaFunction {
        &self.funcs[name]
    }

    fn limits(&self, kv: &GpuKv) -> EntryLimits {
        EntryLimits {
            vocab_size: self.config.vocab_size,
            context_length: self.config.context_length,
            num_blocks: kv.blocks.num_blocks,
            block_size: kv.blocks.block_size,
        }
    }

    fn upload(&self, buf: &mut StepBuffers, s: &StepInputs) -> Result<(), CudaError> {
        fn put<T: DeviceRepr>(
            stream: &Arc<CudaStream>,
            host: &[T],
            dev: &mut CudaSlice<T>,
        ) -> Result<(), CudaError> {
            if host.is_empty() {
                return Ok(());
            }
            driver(
                "uploading step inputs",
                stream.memcpy_htod(host, &mut dev.slice_mut(0..host.len())),
            )
        }
        put(&self.stream, &s.tokens, &mut buf.tokens)?;
        put(&self.stream, &s.positions, &mut buf.positions)?;
        put(&self.stream, &s.att_positions, &mut buf.att_positions)?;
        put(&self.stream, &s.slots, &mut buf.slots)?;
        put(&self.stream, &s.table_index, &mut buf.table_index)?;
        put(&self.stream, &s.block_tables, &mut buf.block_tables)?;
        put(&self.stream, &s.logit_rows, &mut buf.logit_rows)?;
        put(&self.stream, &s.prefill_tiles, &mut buf.tiles)
    }

    fn download(
        &self,
        buf: &StepBuffers,
        n_logits: usize,
        logits: &mut Logits,
    ) -> Result<(), CudaError> {
        let vocab = self.config.vocab_size;
        let host = logits.buffer(vocab);
        host.resize(n_logits * vocab, 0.0);
        if n_logits > 0 {
            driver(
                "copying logits",
                self.stream
                    .memcpy_dtoh(&buf.logits.slice(0..n_logits * vocab), host.as_mut_slice()),
            )?;
        }
        driver("finishing the step", self.stream.synchronize())
    }

    /// Makes sure `kv` has step buffers for `need`, reallocating (and dropping the graphs) if not.
    fn ensure_buffers(&self, kv: &mut GpuKv, need: Capacity) -> Result<(), CudaError> {
        if kv.buffers.as_ref().is_some_and(|b| b.cap.covers(&need)) {
            return Ok(());
        }
        let old = kv.buffers.as_ref().map(|b| b.cap).unwrap_or_default();
        let cap = old.grown_to(&need);
        kv.graphs.clear();
        kv.buffers = None;
        kv.buffers = Some(StepBuffers::alloc(
            &self.stream,
            &self.config,
            self.options.numerics,
            cap,
        )?);
        Ok(())
    }

    /// One step (see the module docs). Errors: the batch checks' [`CudaError::Model`], or a driver
    /// or launch error.
    fn forward(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut GpuKv,
        logits: &mut Logits,
    ) -> Result<(), CudaError> {
        driver("binding the CUDA context", self.gpu.ctx.bind_to_thread())?;
        let fast = self.options.numerics == Numerics::Fast;
        // Heads wider than the tiled prefill kernel's run every query through the decode kernel.
        let tiled = fast && self.config.head_dim <= launch::PREFILL_MAX_HEAD_DIM;
        let s = pack_step(batch, self.limits(kv), None, tiled)?;
        if s.n_rows() == 0 {
            logits.clear(self.config.vocab_size);
            return Ok(());
        }
        if s.is_pure_decode() {
            if let Some(bucket) = bucket_for(s.real_rows, &self.buckets) {
                return self.decode_with_graph(batch, kv, bucket, logits);
            }
        }
        let need = Capacity {
            rows: s.n_rows(),
            logits: s.logit_rows.len(),
            tables: s.block_tables.len(),
            tiles: s.prefill_tiles.len(),
        };
        self.ensure_buffers(kv, need)?;
        let (blocks, buf) = kv.split();
        self.upload(buf, &s)?;
        self.record(
            blocks,
            buf,
            s.n_rows(),
            s.logit_rows.len(),
            s.prefill_tiles.len() / 4,
            s.table_stride,
            s.max_keys,
        )?;
        self.download(buf, s.logit_rows.len(), logits)
    }

    /// A pure decode step through the graph of `bucket` (captured on first use).
    fn decode_with_graph(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut GpuKv,
        bucket: usize,
        logits: &mut Logits,
    ) -> Result<(), CudaError> {
        let stride = self.config.context_length.div_ceil(kv.blocks.block_size);
        let mut s = pack_step(batch, self.limits(kv), Some(stride), false)?;
        let real = s.real_rows;
        s.pad_to(bucket);
        let need = Capacity {
            rows: bucket,
            logits: bucket,
            tables: bucket * stride,
            tiles: 0,
        };
        self.ensure_buffers(kv, need)?;
        let GpuKv {
            blocks,
            buffers,
            graphs,
        } = kv;
        let buf = buffers.as_mut().expect("allocated above");
        self.upload(buf, &s)?;
        if graphs.get(bucket).is_none() {
            let mode = driver_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            driver("starting graph capture", self.stream.begin_capture(mode))?;
            let recorded = self.record(
                blocks,
                buf,
                bucket,
                bucket,
                0,
                stride,
                self.config.context_length,
            );
            let flags = driver_sys::CUgraphInstantiate_flags(0);
            let ended = self.stream.end_capture(flags);
            recorded?;
            let graph =
                driver("capturing a decode graph", ended)?.ok_or(CudaError::NoGraphCaptured)?;
            tracing::debug!(bucket, "captured a decode graph");
            graphs.insert(bucket, Captured(graph));
        }
        let graph = graphs.get(bucket).expect("captured above");
        driver("replaying a decode graph", graph.0.launch())?;
        // Padding rows' logits stay on the GPU.
        self.download(buf, real, logits)
    }
}

impl BatchModel for CudaModel {
    type Kv = GpuKv;

    fn kv_bytes_per_token(&self) -> usize {
        CudaModel::kv_bytes_per_token(self)
    }

    /// Allocates the zeroed pool on the GPU. Panics when the allocation fails (the worker checks the
    /// size against free memory first, see [`CudaModel::check_kv_fits`]).
    fn new_kv(&self, num_blocks: usize, block_size: usize) -> GpuKv {
        self.gpu
            .ctx
            .bind_to_thread()
            .expect("binding the CUDA context");
        let bytes =
            num_blocks * block_size * self.config.kv_dim() * self.options.numerics.act_bytes();
        let alloc = || -> CudaSlice<u8> {
            self.stream
                .alloc_zeros::<u8>(bytes.max(1))
                .unwrap_or_else(|e| panic!("allocating {bytes} bytes of KV cache on the GPU: {e}"))
        };
        let n = self.config.n_layers;
        GpuKv {
            blocks: KvBlocks {
                k: (0..n).map(|_| alloc()).collect(),
                v: (0..n).map(|_| alloc()).collect(),
                num_blocks,
                block_size,
            },
            buffers: None,
            graphs: DecodeGraphs::default(),
        }
    }

    fn forward_batch(
        &self,
        batch: &[BatchEntry<'_>],
        kv: &mut GpuKv,
        logits: &mut Logits,
    ) -> Result<(), StepError> {
        Ok(self.forward(batch, kv, logits)?)
    }

    fn context_length(&self) -> usize {
        self.config.context_length
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }
}
