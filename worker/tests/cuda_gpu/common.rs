//! What the GPU checks share (part of `cuda_gpu`): the GPU and the model options, every kernel
//! compiled for one numeric mode ([`Kernels`]), random inputs and the relative error, launch
//! shapes, the matmul launch, the reference prompts of a fixture and a greedy batched run.

use std::sync::Arc;

use backend_cuda::cache::{cache_dir, ModuleCache};
use backend_cuda::kernels::FILES;
use backend_cuda::{probe, CudaModel, CudaOptions, GpuInfo, Numerics};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use engine::backend::{BatchEntry, BatchModel, Logits};
use engine::sampler::argmax;
use gguf::GgmlType;
use half::bf16;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

pub const BLOCK: usize = 16;

pub fn gpu() -> GpuInfo {
    probe(0).unwrap_or_else(|e| panic!("these tests need a GPU: {e}"))
}

pub fn options(numerics: Numerics, graphs: bool) -> CudaOptions {
    CudaOptions {
        numerics,
        graphs,
        cache_dir: cache_dir(&std::env::var("WORKER_CUDA_CACHE_DIR").unwrap_or_default()),
        max_decode_batch: 64,
    }
}

/// The kernels of every file, compiled (or cached) for this GPU in `numerics`.
pub struct Kernels {
    pub stream: Arc<CudaStream>,
    pub funcs: std::collections::HashMap<&'static str, CudaFunction>,
    pub numerics: Numerics,
}

impl Kernels {
    pub fn load(gpu: &GpuInfo, numerics: Numerics) -> Kernels {
        let cache = ModuleCache::new(options(numerics, false).cache_dir);
        let stream = gpu.ctx.new_stream().unwrap();
        let mut funcs = std::collections::HashMap::new();
        for f in FILES {
            let (cubin, _) = cache.load_or_compile(f, &gpu.arch, numerics).unwrap();
            let module = gpu.ctx.load_module(Ptx::from_binary(cubin)).unwrap();
            for &k in f.kernels {
                funcs.insert(k, module.load_function(k).unwrap());
            }
        }
        Kernels {
            stream,
            funcs,
            numerics,
        }
    }

    pub fn act(&self, v: &[f32]) -> CudaSlice<u8> {
        let bytes: Vec<u8> = match self.numerics {
            Numerics::Exact => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Numerics::Fast => v
                .iter()
                .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
                .collect(),
        };
        self.stream.clone_htod(&bytes).unwrap()
    }

    pub fn read_act(&self, d: &CudaSlice<u8>, n: usize) -> Vec<f32> {
        let bytes = self.stream.clone_dtoh(d).unwrap();
        match self.numerics {
            Numerics::Exact => bytes
                .chunks_exact(4)
                .take(n)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Numerics::Fast => bytes
                .chunks_exact(2)
                .take(n)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        }
    }

    /// Rounds host values the way an activation buffer stores them.
    pub fn round(&self, v: &[f32]) -> Vec<f32> {
        match self.numerics {
            Numerics::Exact => v.to_vec(),
            Numerics::Fast => v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
        }
    }
}

pub fn random(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(1e-30f32, f32::max);
    num / den
}

pub fn rows_cfg(n: usize, threads: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    }
}

/// Runs `gemv_*` or `gemm_*` for `m` rows; returns `[m, n_out]`.
#[allow(clippy::too_many_arguments)]
pub fn run_matmul(
    k: &Kernels,
    prefix: &str,
    format: GgmlType,
    w: &CudaSlice<u8>,
    n_out: usize,
    cols: usize,
    x: &CudaSlice<u8>,
    m: usize,
) -> Vec<f32> {
    let suffix = backend_cuda::weights::format_suffix(format).unwrap();
    let kind = if prefix == "gemv" {
        backend_cuda::launch::MatmulKernel::Gemv
    } else {
        backend_cuda::launch::MatmulKernel::Gemm
    };
    let out: CudaSlice<f32> = k.stream.alloc_zeros(m * n_out).unwrap();
    let (n_i, k_i, xs, m_i, os, oo, acc, f32o) = (
        n_out as i32,
        cols as i32,
        cols as i32,
        m as i32,
        n_out as i32,
        0i32,
        0i32,
        1i32,
    );
    let f = &k.funcs[format!("{prefix}_{suffix}").as_str()];
    let mut b = k.stream.launch_builder(f);
    b.arg(w).arg(&n_i).arg(&k_i).arg(x).arg(&xs).arg(&m_i);
    b.arg(&out).arg(&os).arg(&oo).arg(&acc).arg(&f32o);
    unsafe { b.launch(kind.shape(m, n_out)) }.unwrap();
    k.stream.clone_dtoh(&out).unwrap()
}

/// A reference prompt: name, prompt ids, greedy ids, top-5 `(id, logit)` at the first position.
pub type Case = (String, Vec<u32>, Vec<u32>, Vec<(usize, f32)>);

pub fn cases() -> Vec<Case> {
    cases_from("reference.json")
}

/// The prompts of a reference fixture (`fixtures/{name}`: `prompts[]` with `name`, `prompt_ids`,
/// `greedy_ids`, `top5_first`).
pub fn cases_from(name: &str) -> Vec<Case> {
    let fixture = format!("{}/../fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let json: Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    json["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let top5 = p["top5_first"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        e[0].as_u64().unwrap() as usize,
                        e[1].as_f64().unwrap() as f32,
                    )
                })
                .collect();
            (
                p["name"].as_str().unwrap_or("?").to_string(),
                ids(&p["prompt_ids"]),
                ids(&p["greedy_ids"]),
                top5,
            )
        })
        .collect()
}

pub fn load(numerics: Numerics, graphs: bool) -> CudaModel {
    let path = gguf::testing::default_model_path();
    assert!(path.is_file(), "run scripts/fetch-model first");
    CudaModel::load(&path, gpu(), options(numerics, graphs)).expect("loading the model on the GPU")
}

/// Runs every case greedily for `steps` tokens, all cases in one batch when `batched`, else alone.
/// Returns per case the ids and the logits of the first generated position.
pub fn run_greedy<M: BatchModel>(
    model: &M,
    prompts: &[Vec<u32>],
    steps: usize,
    batched: bool,
) -> Vec<(Vec<u32>, Vec<f32>)> {
    let tables: Vec<Vec<u32>> = prompts
        .iter()
        .scan(0u32, |first, p| {
            let n = (p.len() + steps).div_ceil(BLOCK) as u32;
            let t = (*first..*first + n).collect();
            *first += n;
            Some(t)
        })
        .collect();
    let num_blocks = tables.iter().map(Vec::len).sum();
    let groups: Vec<Vec<usize>> = if batched {
        vec![(0..prompts.len()).collect()]
    } else {
        (0..prompts.len()).map(|i| vec![i]).collect()
    };
    let mut out = vec![(Vec::new(), Vec::new()); prompts.len()];
    for group in groups {
        let mut kv = model.new_kv(num_blocks, BLOCK);
        let entries: Vec<BatchEntry<'_>> = group
            .iter()
            .map(|&i| BatchEntry {
                tokens: &prompts[i],
                start_pos: 0,
                block_table: &tables[i],
                logit_tokens: 1,
            })
            .collect();
        let mut logits = Logits::new();
        model
            .forward_batch(&entries, &mut kv, &mut logits)
            .expect("prefill");
        for (&i, l) in group.iter().zip(logits.iter()) {
            out[i].1 = l.to_vec();
        }
        for step in 0..steps {
            let next: Vec<u32> = logits.iter().map(|l| argmax(l) as u32).collect();
            for (&i, &n) in group.iter().zip(&next) {
                out[i].0.push(n);
            }
            if step + 1 == steps {
                break;
            }
            let entries: Vec<BatchEntry<'_>> = group
                .iter()
                .zip(&next)
                .map(|(&i, n)| BatchEntry {
                    tokens: std::slice::from_ref(n),
                    start_pos: prompts[i].len() + step,
                    block_table: &tables[i],
                    logit_tokens: 1,
                })
                .collect();
            model
                .forward_batch(&entries, &mut kv, &mut logits)
                .expect("decode");
        }
    }
    out
}
