//! The CUDA weight decoders of `kernels/common.cuh` (`dequant_chunk_any`, `row_bytes_of`) checked
//! without a GPU: the prelude is compiled as host C++ behind a shim that maps the CUDA intrinsics it
//! uses to plain IEEE f32 operations (`__fmul_rn(a, b)` is `a * b`, no contraction) and its f16
//! conversion to an exact software one, then every format's rows are decoded chunk by chunk, as the
//! matrix and embedding kernels do, and compared bit for bit with gguf's scalar decoders (random
//! blocks of all 11 formats) and with the stored values of llama.cpp's blocks in
//! `fixtures/quant-blocks.json`. On the GPU only the f16 conversion differs (the PTX `cvt`, also
//! exact), so this checks the decoders' layout and operation order; `scripts/gpu-check` repeats the
//! comparison on the device.
//!
//! Needs a C++17 compiler (`c++`, or `CXX`); without one the test fails with that message.

use std::io::Write;
use std::process::Command;

use gguf::GgmlType;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

/// CUDA names the prelude uses, for a host build.
const SHIM: &str = r#"
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#define __device__
#define __host__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __shfl_xor_sync(unsigned, float v, int) { return v; }
static inline void __syncthreads() {}
struct HostDim { unsigned x; };
static HostDim threadIdx{0}, blockDim{1};
// IEEE binary16 to binary32, exact (every f16 is an f32).
static inline float host_f16_to_f32(unsigned short h) {
    const unsigned s = (h >> 15) & 1u, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0) v = std::ldexp((float)m, -24);
    else if (e == 31) v = __uint_as_float(0x7f800000u | (m << 13));
    else v = __uint_as_float(((e + 112u) << 23) | (m << 13));
    return s ? -v : v;
}
#undef INFINITY
"#;

/// Reads records `fmt, rows, cols, n (u32 each), n bytes` from argv[1]; writes every row's
/// decoded chunks as f32 to argv[2]. Exit 2 when `row_bytes_of` disagrees with the record.
const MAIN: &str = r#"
int main(int argc, char** argv) {
    if (argc != 3) return 1;
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) return 1;
    uint32_t hdr[4];
    while (std::fread(hdr, 4, 4, in) == 4) {
        const int fmt = (int)hdr[0], rows = (int)hdr[1], cols = (int)hdr[2];
        std::vector<unsigned char> b(hdr[3]);
        if (std::fread(b.data(), 1, b.size(), in) != b.size()) return 1;
        const i64 rb = row_bytes_of(fmt, cols);
        if (rb * rows != (i64)b.size()) {
            std::fprintf(stderr, "row_bytes_of(%d, %d) = %lld: %d rows are not %u bytes\n", fmt, cols,
                         (long long)rb, rows, hdr[3]);
            return 2;
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols / CHUNK; c++) {
                float w[CHUNK];
                dequant_chunk_any(fmt, b.data() + r * rb, c, w);
                std::fwrite(w, 4, CHUNK, out);
            }
    }
    return std::fclose(out) == 0 ? 0 : 1;
}
"#;

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
    let src = dir.path().join("decoders.cpp");
    let prelude = worker::cuda::kernels::PRELUDE;
    std::fs::write(&src, format!("{SHIM}\n{prelude}\n{MAIN}")).unwrap();
    let exe = dir.path().join("decoders");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let built = Command::new(&cxx)
        .args(["-std=c++17", "-O2", "-ffp-contract=off", "-w", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("this test needs a C++17 compiler (`{cxx}`, or set CXX): {e}"));
    assert!(
        built.status.success(),
        "compiling kernels/common.cuh as host C++ failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );

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
