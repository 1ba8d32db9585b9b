//! `kernels_against_cpu` (part of `cuda_gpu`): every kernel on random inputs against the CPU
//! implementation (or a float64 reference for attention), both numeric modes.

use backend_cpu::matmul::matmul;
use backend_cpu::ops::{rms_norm, swiglu, RopeTable};
use backend_cpu::QMatrix;
use backend_cuda::Numerics;
use cudarc::driver::{CudaSlice, PushKernelArg};
use engine::sampler::argmax;
use gguf::GgmlType;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::attention_ref::attention_ref;
use super::common::{gpu, random, rel_err, rows_cfg, run_matmul, Kernels};
use super::formats::{
    embed_tokens, encode, fixture_blocks, run_embedding, weight_bytes, ALL_FORMATS,
};

#[test]
#[ignore = "needs an NVIDIA GPU (scripts/gpu-check)"]
fn kernels_against_cpu() {
    let gpu = gpu();
    println!("GPU: {} ({})", gpu.name, gpu.arch);
    println!("{:<6} {:<22} {:>12}", "mode", "kernel", "rel. error");
    for numerics in [Numerics::Exact, Numerics::Fast] {
        let k = Kernels::load(&gpu, numerics);
        let mode = numerics.as_str();
        let tol = if numerics == Numerics::Exact {
            1e-5
        } else {
            2e-2
        };
        let report = |name: &str, err: f32, limit: f32| {
            println!("{mode:<6} {name:<22} {err:>12.3e}");
            assert!(
                err <= limit,
                "{mode} {name}: relative error {err} > {limit}"
            );
        };
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (hidden, ffn, vocab) = (576usize, 1536usize, 300usize);

        // Embedding lookup (Q8_0 table), exact values.
        let table = random(&mut rng, vocab * hidden, 1.0);
        let bytes = encode(GgmlType::Q8_0, &table);
        let qm = QMatrix::from_bytes(GgmlType::Q8_0, vocab, hidden, &bytes).unwrap();
        let tokens = [3u32, 299, 0, 41];
        let got = embed_tokens(&k, GgmlType::Q8_0, &bytes, &tokens, hidden);
        let mut want = vec![0.0; tokens.len() * hidden];
        for (t, row) in tokens.iter().zip(want.chunks_exact_mut(hidden)) {
            qm.dequantize_rows(*t as usize, row);
        }
        report("embedding(q8_0)", rel_err(&got, &k.round(&want)), 0.0);

        // RMSNorm.
        let rows = 5;
        let x = random(&mut rng, rows * hidden, 3.0);
        let wt = random(&mut rng, hidden, 1.0);
        let dx = k.act(&x);
        let dw = k.stream.clone_htod(&wt).unwrap();
        let out = k.act(&vec![0.0; rows * hidden]);
        let (n, dim, eps, acc) = (rows as i32, hidden as i32, 1e-5f32, 0i32);
        let mut b = k.stream.launch_builder(&k.funcs["rmsnorm"]);
        b.arg(&dx)
            .arg(&dw)
            .arg(&n)
            .arg(&dim)
            .arg(&eps)
            .arg(&out)
            .arg(&acc);
        unsafe { b.launch(rows_cfg(rows, 256, 256 * 8)) }.unwrap();
        let want = rms_norm(&k.round(&x), &wt, 1e-5);
        report(
            "rmsnorm",
            rel_err(&k.read_act(&out, want.len()), &want),
            tol,
        );

        // RoPE on Q and K heads (9 + 3 heads of 64), V untouched.
        let (nh, nkv, hd) = (9usize, 3usize, 64usize);
        let width = (nh + 2 * nkv) * hd;
        let positions = [0i32, 7, 1000];
        let qkv = k.round(&random(&mut rng, positions.len() * width, 2.0));
        let dq = k.act(&qkv);
        let dp = k.stream.clone_htod(&positions).unwrap();
        let (n, w, a, b_, c, base) = (
            3i32,
            width as i32,
            nh as i32,
            nkv as i32,
            hd as i32,
            10000f32,
        );
        let (pos_scale, neox) = (1.0f32, 0i32);
        let ones = k.stream.clone_htod(&vec![1.0f32; hd / 2]).unwrap();
        let mut b = k.stream.launch_builder(&k.funcs["rope"]);
        b.arg(&dq)
            .arg(&dp)
            .arg(&n)
            .arg(&w)
            .arg(&a)
            .arg(&b_)
            .arg(&c)
            .arg(&base)
            .arg(&pos_scale)
            .arg(&ones)
            .arg(&neox);
        unsafe { b.launch(rows_cfg(3, 128, 0)) }.unwrap();
        let rope = RopeTable::at_positions(positions.iter().map(|&p| p as usize), hd, 10000.0);
        let mut want = qkv.clone();
        for (t, row) in want.chunks_exact_mut(width).enumerate() {
            rope.apply(&mut row[..(nh + nkv) * hd], t);
        }
        report("rope", rel_err(&k.read_act(&dq, want.len()), &want), tol);

        // SwiGLU.
        let gu = k.round(&random(&mut rng, 4 * 2 * ffn, 4.0));
        let dg = k.act(&gu);
        let out = k.act(&vec![0.0; 4 * ffn]);
        let (n, f) = (4i32, ffn as i32);
        let mut b = k.stream.launch_builder(&k.funcs["swiglu"]);
        b.arg(&dg).arg(&n).arg(&f).arg(&out);
        unsafe { b.launch(backend_cuda::launch::elementwise(4 * ffn)) }.unwrap();
        let want = swiglu(&gu, ffn);
        report("swiglu", rel_err(&k.read_act(&out, want.len()), &want), tol);

        // Weight decoders, bitwise: the fixture's llama.cpp blocks against their stored values, and
        // random rows of every format against gguf's scalar decoder (through `embedding`, which
        // only decodes).
        for (format, elems, bytes, values) in fixture_blocks() {
            let got = run_embedding(&k, format, &bytes, values.len() / elems, elems);
            let want = k.round(&values);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{mode}: {format} fixture blocks decode differently on the GPU"
            );
        }
        for format in ALL_FORMATS {
            let (rows, cols) = (7usize, 768usize);
            let bytes = weight_bytes(format, &mut rng, rows, cols);
            let got = run_embedding(&k, format, &bytes, rows, cols);
            let want = k.round(&gguf::dequantize_to_vec(format, &bytes, rows * cols).unwrap());
            let same = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() == b.to_bits());
            assert_eq!(
                same.count(),
                want.len(),
                "{mode}: {format} decodes differently"
            );
        }
        println!(
            "{mode:<6} {:<22} {:>12}",
            "decoders (all formats)", "bitwise"
        );

        // Matrix kernels, every format, several row counts; GEMV == GEMM bitwise in exact mode.
        for format in ALL_FORMATS {
            // 768: whole k-quant super-blocks, and 3 GEMM slabs.
            let (n_out, cols) = (96usize, 768usize);
            let bytes = weight_bytes(format, &mut rng, n_out, cols);
            let qm = QMatrix::from_bytes(format, n_out, cols, &bytes).unwrap();
            let dw = k.stream.clone_htod(&bytes).unwrap();
            let x = k.round(&random(&mut rng, 33 * cols, 1.0));
            let dx = k.act(&x);
            let suffix = backend_cuda::weights::format_suffix(format).unwrap();
            let mut first_rows: Vec<Vec<f32>> = Vec::new();
            for m in [1usize, 3, 8, 9, 33] {
                let want = matmul(&x[..m * cols], m, cols, std::slice::from_ref(&qm));
                let prefix = if m <= 8 { "gemv" } else { "gemm" };
                let got = run_matmul(&k, prefix, format, &dw, n_out, cols, &dx, m);
                report(
                    &format!("{prefix}_{suffix} m={m}"),
                    rel_err(&got, &want),
                    tol,
                );
                first_rows.push(got[..n_out].to_vec());
                if numerics == Numerics::Exact && m == 8 {
                    let other = run_matmul(&k, "gemm", format, &dw, n_out, cols, &dx, m);
                    assert_eq!(got, other, "{suffix}: gemv and gemm differ at m = 8");
                }
            }
            if numerics == Numerics::Exact {
                assert!(
                    first_rows.windows(2).all(|w| w[0] == w[1]),
                    "{suffix}: row 0 depends on the number of rows"
                );
            }
        }

        // Paged attention (decode kernel for every query; prefill kernel on one tile) against f64:
        // plain, then with a score soft-cap and a 37-key sliding window (Gemma 2).
        for (softcap, window) in [(0.0f32, 0i32), (5.0, 37)] {
            let label = if window > 0 { " cap+window" } else { "" };
            let (bs, n_blocks) = (16usize, 8usize);
            let kv_dim = nkv * hd;
            let slots = bs * n_blocks;
            let kc = k.round(&random(&mut rng, slots * kv_dim, 1.0));
            let vc = k.round(&random(&mut rng, slots * kv_dim, 1.0));
            let table: Vec<u32> = vec![5, 2, 7, 0, 1, 3, 6, 4];
            let dk = k.act(&kc);
            let dv = k.act(&vc);
            let dt = k.stream.clone_htod(&table).unwrap();
            let nq = 12usize;
            let pos0 = 90usize;
            let q = k.round(&random(&mut rng, nq * width, 1.0));
            let dq = k.act(&q);
            let positions: Vec<i32> = (0..nq).map(|i| (pos0 + i) as i32).collect();
            let dp = k.stream.clone_htod(&positions).unwrap();
            let dti = k.stream.clone_htod(&vec![0i32; nq]).unwrap();
            let head_kv = |j: usize, h: usize, c: &[f32]| -> Vec<f32> {
                let slot = table[j / bs] as usize * bs + j % bs;
                let off = slot * kv_dim + (h / (nh / nkv)) * hd;
                c[off..off + hd].to_vec()
            };
            let mut want = vec![0.0f32; nq * nh * hd];
            for t in 0..nq {
                for h in 0..nh {
                    let keys: Vec<Vec<f32>> = (0..=pos0 + t).map(|j| head_kv(j, h, &kc)).collect();
                    let vals: Vec<Vec<f32>> = (0..=pos0 + t).map(|j| head_kv(j, h, &vc)).collect();
                    let qh = &q[t * width + h * hd..t * width + (h + 1) * hd];
                    let pos = pos0 + t;
                    let first = if window > 0 {
                        (pos + 1).saturating_sub(window as usize)
                    } else {
                        0
                    };
                    let o = attention_ref(qh, &keys, &vals, first, pos, softcap);
                    want[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(&o);
                }
            }
            let scale = 1.0 / (hd as f32).sqrt();
            let (w_i, stride, bs_i, a, b_, c, n) = (
                width as i32,
                n_blocks as i32,
                bs as i32,
                nh as i32,
                nkv as i32,
                hd as i32,
                nq as i32,
            );
            let out = k.act(&vec![0.0; nq * nh * hd]);
            let cfg =
                backend_cuda::launch::attention_decode(nq, nh, hd, pos0 + nq, 48 * 1024).unwrap();
            let mut b = k.stream.launch_builder(&k.funcs["attention_decode"]);
            b.arg(&dq)
                .arg(&w_i)
                .arg(&dp)
                .arg(&dti)
                .arg(&dt)
                .arg(&stride)
                .arg(&dk)
                .arg(&dv);
            b.arg(&bs_i)
                .arg(&a)
                .arg(&b_)
                .arg(&c)
                .arg(&scale)
                .arg(&out)
                .arg(&n)
                .arg(&softcap)
                .arg(&window);
            unsafe { b.launch(cfg) }.unwrap();
            report(
                &format!("attention_decode{label}"),
                rel_err(&k.read_act(&out, want.len()), &want),
                tol.max(1e-4),
            );
            let tiles = [0i32, nq as i32, pos0 as i32, 0];
            let dtiles = k.stream.clone_htod(&tiles).unwrap();
            let out = k.act(&vec![0.0; nq * nh * hd]);
            let mut b = k.stream.launch_builder(&k.funcs["attention_prefill"]);
            b.arg(&dq)
                .arg(&w_i)
                .arg(&dtiles)
                .arg(&dt)
                .arg(&stride)
                .arg(&dk)
                .arg(&dv);
            b.arg(&bs_i).arg(&a).arg(&b_).arg(&c).arg(&scale).arg(&out);
            b.arg(&softcap).arg(&window);
            unsafe { b.launch(backend_cuda::launch::attention_prefill(1, nh)) }.unwrap();
            report(
                &format!("attention_prefill{label}"),
                rel_err(&k.read_act(&out, want.len()), &want),
                tol.max(1e-4),
            );
        }

        // Selection: argmax and top-8 of f32 logits, ties to the lower id.
        let mut logits = random(&mut rng, 3 * 5000, 10.0);
        logits[5000 + 17] = 50.0;
        logits[5000 + 4000] = 50.0;
        let dl = k.stream.clone_htod(&logits).unwrap();
        let ids: CudaSlice<i32> = k.stream.alloc_zeros(3).unwrap();
        let (n, v) = (3i32, 5000i32);
        let mut b = k.stream.launch_builder(&k.funcs["argmax"]);
        b.arg(&dl).arg(&n).arg(&v).arg(&ids);
        unsafe { b.launch(rows_cfg(3, 1024, 0)) }.unwrap();
        let got = k.stream.clone_dtoh(&ids).unwrap();
        let want: Vec<i32> = logits.chunks(5000).map(|r| argmax(r) as i32).collect();
        assert_eq!(got, want, "argmax");
        assert_eq!(got[1], 17);
        let kk = 8i32;
        let tids: CudaSlice<i32> = k.stream.alloc_zeros(24).unwrap();
        let tvals: CudaSlice<f32> = k.stream.alloc_zeros(24).unwrap();
        let mut b = k.stream.launch_builder(&k.funcs["topk"]);
        b.arg(&dl).arg(&n).arg(&v).arg(&kk).arg(&tids).arg(&tvals);
        unsafe { b.launch(rows_cfg(3, 1024, 0)) }.unwrap();
        let got = k.stream.clone_dtoh(&tids).unwrap();
        for (r, row) in logits.chunks(5000).enumerate() {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let want: Vec<i32> = order[..8].iter().map(|&i| i as i32).collect();
            assert_eq!(&got[r * 8..r * 8 + 8], &want[..], "topk row {r}");
        }
        println!("{mode:<6} {:<22} {:>12}", "argmax/topk", "exact");
    }
}
