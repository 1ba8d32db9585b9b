//! CUDA device code run on the host, without a GPU: `kernels/common.cuh` and the per-row and
//! elementwise kernels are compiled as host C++ behind a shim that maps the CUDA intrinsics they use
//! to plain IEEE operations (`__fmul_rn(a, b)` is `a * b`, no contraction), the f16 conversion to an
//! exact software one, and a launch to one OS thread per CUDA thread of a block (barriers and warp
//! shuffles emulated with `std::barrier`; `cuda_host/threaded.h`). On the GPU only the intrinsics' implementations differ
//! (the PTX f16 `cvt` is exact too; `expf`, `tanhf`, `pow`, `cos`, `sin` may differ in the last bit),
//! so these tests check the kernels' layouts, index arithmetic and operation order; `scripts/gpu-check`
//! repeats the comparisons on the device.
//!
//! - `cuda_decoders_match_gguf_bit_for_bit_on_the_host`: every format's rows decoded chunk by chunk
//!   (`dequant_chunk_any`, as the matrix and embedding kernels do, with `row_bytes_of`) against
//!   gguf's scalar decoders (random blocks of all 11 formats) and llama.cpp's blocks in
//!   `fixtures/quant-blocks.json`, bit for bit.
//! - `arch_kernels_match_the_cpu_on_the_host`: `rope` (adjacent and half-split pairs, frequency
//!   factors, position scale), `bias_add`, `head_rmsnorm`, `swiglu`, `geglu`, `softcap` and
//!   `embedding` (with a scale) in exact mode against the CPU backend's functions, bit for bit (the
//!   host's libm serves both).
//! - `attention_decode_matches_a_float64_reference_on_the_host`: the exact-mode attention kernel
//!   (paged, grouped-query, heads of 64 and 256, score soft-cap, sliding window) within 1e-5 of a
//!   float64 reference.
//!
//! Needs a C++20 compiler (`c++`, or `CXX`); without one the tests fail with that message.

use std::io::Write;
use std::process::Command;

use gguf::GgmlType;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

#[path = "common/attention_ref.rs"]
mod attention_ref;
use attention_ref::attention_ref;

/// CUDA names the kernels use, for a host build with an emulated launch.
const SHIM: &str = concat!(
    include_str!("cuda_host/math.h"),
    include_str!("cuda_host/threaded.h")
);

/// Reads records `fmt, rows, cols, n (u32 each), n bytes` from argv[1]; writes every row's
/// decoded chunks as f32 to argv[2]. Exit 2 when `row_bytes_of` disagrees with the record.
const DECODE_MAIN: &str = include_str!("cuda_host/decode_main.cpp");

/// Compiles `source` (host C++) into an executable in `dir`; panics with the compiler's message.
fn compile(dir: &std::path::Path, source: &str) -> std::path::PathBuf {
    let src = dir.join("harness.cpp");
    std::fs::write(&src, source).unwrap();
    let exe = dir.join("harness");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O2",
            "-pthread",
            "-ffp-contract=off",
            "-w",
            "-o",
        ])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("this test needs a C++20 compiler (`{cxx}`, or set CXX): {e}"));
    assert!(
        built.status.success(),
        "compiling the kernels as host C++ failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    exe
}

/// One matrix to decode: its format, shape and bytes, and the f32 values it must decode to.
struct Case {
    what: String,
    format: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    want: Vec<f32>,
}

/// Random blocks of a block format: every quant, scale and high bit random, the f16 scale fields
/// (byte offsets `scales` in blocks of `block` bytes) set to finite values in [2^-10, 2^-4).
fn random_blocks(rng: &mut ChaCha8Rng, format: GgmlType, n: usize) -> Vec<u8> {
    let (scales, block): (&[usize], usize) = match format {
        GgmlType::Q4_0 => (&[0], 18),
        GgmlType::Q4_1 => (&[0, 2], 20),
        GgmlType::Q8_0 => (&[0], 34),
        GgmlType::Q5_0 => (&[0], 22),
        GgmlType::Q5_1 => (&[0, 2], 24),
        GgmlType::Q4_K | GgmlType::Q5_K => (&[0, 2], format.bytes_per_block().unwrap()),
        GgmlType::Q6_K => (&[208], 210),
        other => panic!("{other} is not a block format"),
    };
    let len = format.byte_size(n as u64).unwrap() as usize;
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    for b in bytes.chunks_exact_mut(block) {
        for &at in scales {
            let d = f16::from_f32(rng.random_range(1.0f32 / 1024.0..1.0 / 16.0));
            b[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    bytes
}

fn random_cases(rng: &mut ChaCha8Rng) -> Vec<Case> {
    let (rows, cols) = (5usize, 768usize);
    let n = rows * cols;
    let formats = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    formats
        .into_iter()
        .map(|format| {
            let values: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            let bytes = match format {
                GgmlType::F32 => gguf::quant::encode_f32(&values),
                GgmlType::F16 => gguf::quant::quantize_f16(&values),
                GgmlType::BF16 => values
                    .iter()
                    .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                    .collect(),
                _ => random_blocks(rng, format, n),
            };
            let want = gguf::dequantize_to_vec(format, &bytes, n).unwrap();
            Case {
                what: format!("random {format}"),
                format,
                rows,
                cols,
                bytes,
                want,
            }
        })
        .collect()
}

/// llama.cpp's blocks of `fixtures/quant-blocks.json`, each as a one-block row.
fn fixture_cases() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/quant-blocks.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut cases = Vec::new();
    for (name, t) in json["types"].as_object().unwrap() {
        let format = [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ]
        .into_iter()
        .find(|f| f.to_string() == *name)
        .unwrap_or_else(|| panic!("fixture type {name}"));
        let cols = t["block_elems"].as_u64().unwrap() as usize;
        for (i, b) in t["blocks"].as_array().unwrap().iter().enumerate() {
            let hex = b["hex"].as_str().unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let want = b["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            cases.push(Case {
                what: format!("fixture {name} block {i}"),
                format,
                rows: 1,
                cols,
                bytes,
                want,
            });
        }
    }
    cases
}

#[test]
fn cuda_decoders_match_gguf_bit_for_bit_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let prelude = backend_cuda::kernels::PRELUDE;
    let exe = compile(dir.path(), &format!("{SHIM}\n{prelude}\n{DECODE_MAIN}"));

    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut cases = random_cases(&mut rng);
    cases.extend(fixture_cases());
    let input = dir.path().join("in.bin");
    let mut f = std::fs::File::create(&input).unwrap();
    for c in &cases {
        for v in [
            c.format.id(),
            c.rows as u32,
            c.cols as u32,
            c.bytes.len() as u32,
        ] {
            f.write_all(&v.to_le_bytes()).unwrap();
        }
        f.write_all(&c.bytes).unwrap();
    }
    drop(f);
    let output = dir.path().join("out.bin");
    let run = Command::new(&exe)
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the decoder harness failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let raw = std::fs::read(&output).unwrap();
    let mut got = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut formats = std::collections::BTreeSet::new();
    for c in &cases {
        let decoded: Vec<f32> = got.by_ref().take(c.want.len()).collect();
        assert_eq!(decoded.len(), c.want.len(), "{}: output too short", c.what);
        for (i, (g, w)) in decoded.iter().zip(&c.want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{} value {i}: {g} vs {w}", c.what);
        }
        formats.insert(c.format.to_string());
    }
    assert!(
        got.next().is_none(),
        "the harness wrote more values than expected"
    );
    assert_eq!(formats.len(), 11, "{formats:?}");
}

/// Runs one kernel through the emulated launch: `harness KERNEL in out`, `in` holding the arguments
/// as arrays of 32-bit words (each `u32 len` then the words), `out` the result as f32.
const KERNEL_MAIN: &str = include_str!("cuda_host/kernel_main.cpp");

/// The kernel harness: the shim, the prelude, every kernel file that runs under the emulated
/// launch, and [`KERNEL_MAIN`], compiled in `dir`.
fn kernel_harness(dir: &std::path::Path) -> std::path::PathBuf {
    let mut source = format!("{SHIM}\n{}\n", backend_cuda::kernels::PRELUDE);
    for name in [
        "rope.cu",
        "bias_add.cu",
        "gated.cu",
        "head_rmsnorm.cu",
        "softcap.cu",
        "embedding.cu",
        "attention_decode.cu",
    ] {
        source += backend_cuda::kernels::KernelFile::containing_file(name)
            .unwrap_or_else(|| panic!("{name} is not a kernel file"))
            .source;
    }
    compile(dir, &(source + KERNEL_MAIN))
}

/// An f32 slice as words.
fn words(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs `kernel` of the harness `exe` on `args`; returns its f32 output.
fn run_kernel(exe: &std::path::Path, kernel: &str, args: &[Vec<u32>]) -> Vec<f32> {
    let dir = exe.parent().unwrap();
    let (input, output) = (dir.join("args.bin"), dir.join("out.bin"));
    let mut f = std::fs::File::create(&input).unwrap();
    for a in args {
        f.write_all(&(a.len() as u32).to_le_bytes()).unwrap();
        for w in a {
            f.write_all(&w.to_le_bytes()).unwrap();
        }
    }
    drop(f);
    let run = Command::new(exe)
        .arg(kernel)
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap();
    assert!(run.status.success(), "{kernel}: the harness failed");
    std::fs::read(&output)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn assert_bitwise(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what} element {i}: {g} vs {w}");
    }
}

#[test]
fn arch_kernels_match_the_cpu_on_the_host() {
    use backend_cpu::ops::{gated_into, rms_norm_chunks_in_place, softcap_in_place, RopeTable};
    use backend_cpu::AlignedVec;
    use model_desc::{Activation, RopeStyle};

    let dir = tempfile::tempdir().unwrap();
    let exe = kernel_harness(dir.path());
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut random = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    };
    let (nh, nkv, hd, rows) = (6usize, 2usize, 64usize, 3usize);
    let width = (nh + 2 * nkv) * hd;

    // RoPE, both pairings, with frequency factors and a position scale.
    let positions = [0u32, 9, 5000];
    let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + (i % 5) as f32 * 2.5).collect();
    let (base, pos_scale) = (500_000f32, 0.5f32);
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        let qkv = random(rows * width, 2.0);
        let ints = [
            rows,
            width,
            nh,
            nkv,
            hd,
            usize::from(style == RopeStyle::Neox),
        ];
        let got = run_kernel(
            &exe,
            "rope",
            &[
                ints.iter().map(|&v| v as u32).collect(),
                words(&[base, pos_scale]),
                positions.to_vec(),
                words(&factors),
                words(&qkv),
            ],
        );
        let table = RopeTable::with_options(
            positions.iter().map(|&p| p as usize),
            hd,
            base,
            pos_scale,
            Some(&factors),
        );
        let mut want = qkv.clone();
        for (t, row) in want.chunks_exact_mut(width).enumerate() {
            table.apply_style(style, &mut row[..(nh + nkv) * hd], t);
        }
        assert_bitwise(&format!("rope {style:?}"), &got, &want);
    }

    // Q/K/V bias.
    let (x, bias) = (random(rows * width, 2.0), random(width, 0.5));
    let got = run_kernel(
        &exe,
        "bias_add",
        &[vec![rows as u32, width as u32], words(&bias), words(&x)],
    );
    let want: Vec<f32> = x
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias[i % width])
        .collect();
    assert_bitwise("bias_add", &got, &want);

    // Gated activations.
    let ffn = 300usize;
    let gu = random(rows * 2 * ffn, 8.0);
    for (kernel, act) in [
        ("swiglu", Activation::Silu),
        ("geglu", Activation::GeluTanh),
    ] {
        let got = run_kernel(&exe, kernel, &[vec![rows as u32, ffn as u32], words(&gu)]);
        let mut want = AlignedVec::new();
        gated_into(&gu, ffn, act, &mut want);
        assert_bitwise(kernel, &got, &want);
    }

    // Per-head q/k RMSNorm (V untouched).
    let (qkv, qn, kn) = (random(rows * width, 3.0), random(hd, 1.5), random(hd, 1.5));
    let eps = 1e-6f32;
    let ints = [rows, width, nh, nkv, hd].map(|v| v as u32).to_vec();
    let got = run_kernel(
        &exe,
        "head_rmsnorm",
        &[ints, words(&[eps]), words(&qn), words(&kn), words(&qkv)],
    );
    let mut want = qkv.clone();
    for row in want.chunks_exact_mut(width) {
        rms_norm_chunks_in_place(&mut row[..nh * hd], &qn, eps);
        rms_norm_chunks_in_place(&mut row[nh * hd..(nh + nkv) * hd], &kn, eps);
    }
    assert_bitwise("head_rmsnorm", &got, &want);

    // Logit soft-cap.
    let logits = random(1000, 100.0);
    let got = run_kernel(&exe, "softcap", &[words(&[30.0]), words(&logits)]);
    let mut want = logits.clone();
    softcap_in_place(&mut want, 30.0);
    assert_bitwise("softcap", &got, &want);

    // Embedding lookup with Gemma's scale, from a Q6_K table (4 rows of 512).
    let table = random_blocks(&mut rng, GgmlType::Q6_K, 4 * 512);
    let scale = (640f32).sqrt();
    let tokens = [2u32, 0, 3];
    let mut table_words: Vec<u32> = table
        .chunks(4)
        .map(|b| {
            let mut w = [0u8; 4];
            w[..b.len()].copy_from_slice(b);
            u32::from_le_bytes(w)
        })
        .collect();
    table_words.push(0);
    let got = run_kernel(
        &exe,
        "embedding",
        &[
            vec![3, GgmlType::Q6_K.id(), 512],
            words(&[scale]),
            tokens.to_vec(),
            table_words,
        ],
    );
    let all = gguf::dequantize_to_vec(GgmlType::Q6_K, &table, 4 * 512).unwrap();
    let want: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            all[t as usize * 512..(t as usize + 1) * 512]
                .iter()
                .map(|v| v * scale)
        })
        .collect();
    assert_bitwise("embedding scale", &got, &want);
}

/// `attention_decode` (one full pass per query, the exact-mode kernel) under the threaded launch
/// against a float64 reference: a paged cache with a scattered block table, grouped-query heads
/// of 64 and of Gemma's 256, plain, with a score soft-cap and with a sliding window.
#[test]
fn attention_decode_matches_a_float64_reference_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let exe = kernel_harness(dir.path());
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let (bs, table) = (16usize, [5u32, 2, 7, 0, 1, 3, 6, 4]);
    let slots = bs * table.len();
    for (hd, softcap, window) in [
        (64usize, 0.0f32, 0usize),
        (64, 5.0, 0),
        (256, 0.0, 37),
        (64, 5.0, 9),
    ] {
        let (nh, nkv) = (4usize, 2usize);
        let (kv_dim, width) = (nkv * hd, (nh + 2 * nkv) * hd);
        let mut random =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect() };
        let (kc, vc) = (random(slots * kv_dim), random(slots * kv_dim));
        let positions = [0i32, 36, 90, 127];
        let qkv = random(positions.len() * width);
        let scale = 1.0 / (hd as f32).sqrt();
        let ints = [width, positions.len(), table.len(), bs, nh, nkv, hd, window];
        let got = run_kernel(
            &exe,
            "attention_decode",
            &[
                ints.iter().map(|&v| v as u32).collect(),
                words(&[scale, softcap]),
                positions.iter().map(|&p| p as u32).collect(),
                vec![0; positions.len()],
                table.to_vec(),
                words(&kc),
                words(&vc),
                words(&qkv),
            ],
        );
        let head_kv = |c: &[f32], j: usize, h: usize| -> Vec<f32> {
            let slot = table[j / bs] as usize * bs + j % bs;
            let off = slot * kv_dim + (h / (nh / nkv)) * hd;
            c[off..off + hd].to_vec()
        };
        let mut want = Vec::new();
        for (t, &pos) in positions.iter().enumerate() {
            let pos = pos as usize;
            let first = if window > 0 {
                (pos + 1).saturating_sub(window)
            } else {
                0
            };
            for h in 0..nh {
                let keys: Vec<Vec<f32>> = (0..=pos).map(|j| head_kv(&kc, j, h)).collect();
                let vals: Vec<Vec<f32>> = (0..=pos).map(|j| head_kv(&vc, j, h)).collect();
                let q = &qkv[t * width + h * hd..t * width + (h + 1) * hd];
                want.extend(attention_ref(q, &keys, &vals, first, pos, softcap));
            }
        }
        assert_eq!(got.len(), want.len());
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            err <= 1e-5,
            "head {hd}, soft-cap {softcap}, window {window}: max error {err}"
        );
    }
}
