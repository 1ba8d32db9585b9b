//! The description read from real converter output (the tiny-arch fixtures, written by llama.cpp's
//! `convert_hf_to_gguf.py`) and from files the tests write.

use std::path::PathBuf;

use gguf::{GgufFile, GgufWriter};

use super::*;

fn fixture(arch: &str) -> GgufFile {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "fixtures",
        "tiny-arch",
        arch,
        &format!("{arch}-f32.gguf"),
    ]
    .iter()
    .collect();
    GgufFile::open(&path).expect("tiny-arch fixture")
}

fn desc(arch: &str) -> ModelDesc {
    ModelDesc::from_source(&fixture(arch)).expect("description")
}

#[test]
fn tiny_llama_is_plain_llama() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let info = gguf::testing::write_tiny_llama(&path, 1).unwrap();
    let d = ModelDesc::from_source(&GgufFile::open(&path).unwrap()).unwrap();
    assert_eq!(d.arch, Arch::Llama);
    assert_eq!(d.n_layers, info.n_layers);
    assert_eq!(
        (d.hidden, d.n_heads, d.n_kv_heads, d.head_dim),
        (64, 4, 2, 16)
    );
    assert_eq!(d.ffn_dim, 128);
    assert_eq!(d.vocab_size, info.vocab_size());
    assert_eq!(d.context_length, 256);
    assert_eq!(d.rope_base, 10000.0);
    assert_eq!(d.attn_scale, 0.25);
    assert!(d.is_plain_llama());
    // backend-cuda's `model::tests` checks that device = auto accepts this model.
}

#[test]
fn llama3_reads_rope_freq_factors() {
    let d = desc("llama3rope");
    assert_eq!(d.arch, Arch::Llama);
    assert_eq!(d.rope_style, RopeStyle::Interleaved);
    let f = d.rope_freq_factors.as_ref().expect("rope_freqs.weight");
    assert_eq!(f.len(), 8);
    // llama3 scaling (factor 8, low 1, high 4, original context 16): the highest frequency's
    // wavelength 2π lies between 16/4 and 16/1, so it is smoothed; the others are divided by 8.
    assert!(f[0] > 1.0 && f[0] < 8.0, "{}", f[0]);
    assert!(f[1..].iter().all(|&x| x == 8.0), "{f:?}");
    assert!(!d.is_plain_llama());
    // backend-cuda's `model::tests` checks that device = auto refuses it.
}

#[test]
fn qwen_options() {
    let q2 = desc("qwen2");
    assert_eq!(q2.arch, Arch::Qwen2);
    assert!(q2.qkv_bias && !q2.qk_norm);
    assert_eq!(q2.rope_style, RopeStyle::Neox);
    assert_eq!(q2.rope_base, 1e6);
    let q3 = desc("qwen3");
    assert!(q3.qk_norm && !q3.qkv_bias);
    assert_eq!((q3.head_dim, q3.q_dim(), q3.hidden), (32, 128, 64));
    assert_eq!(q3.attn_scale, 1.0 / 32f32.sqrt());
}

#[test]
fn gemma2_options_and_alternating_window() {
    let d = desc("gemma2");
    assert_eq!(d.activation, Activation::GeluTanh);
    assert!(d.post_norms && !d.qk_norm);
    assert_eq!(d.attn_softcap, Some(50.0));
    assert_eq!(d.final_softcap, Some(30.0));
    assert_eq!(d.embed_scale, Some(8.0));
    assert_eq!(d.attn_scale, 0.25);
    let windows: Vec<_> = d.layers.iter().map(|l| l.sliding_window).collect();
    assert_eq!(windows, [Some(8), None, Some(8), None]);
    assert!(d.layers.iter().all(|l| l.rope_base == 10000.0));
}

#[test]
fn phi3_is_fused_and_ignores_its_window() {
    let d = desc("phi3");
    assert_eq!(d.projections, Projections::Fused);
    assert!(d.layers.iter().all(|l| l.sliding_window.is_none()));
}

/// A Gemma 3 header as the 270M file has it (18 layers, window 512, base 1e6), no tensors.
fn gemma3_header(extra: impl FnOnce(&mut GgufWriter)) -> Result<ModelDesc, ArchError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g3.gguf");
    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "gemma3");
    for (k, v) in [
        ("block_count", 18),
        ("embedding_length", 640),
        ("feed_forward_length", 2048),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 1),
        ("attention.key_length", 256),
        ("attention.value_length", 256),
        ("attention.sliding_window", 512),
        ("context_length", 32768),
        ("vocab_size", 262144),
    ] {
        w.add_u32(&format!("gemma3.{k}"), v);
    }
    w.add_f32("gemma3.rope.freq_base", 1e6);
    w.add_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6);
    extra(&mut w);
    w.write(&path).unwrap();
    ModelDesc::from_source(&GgufFile::open(&path).unwrap())
}

#[test]
fn gemma3_pattern_local_base_and_scale() {
    let d = gemma3_header(|_| {}).unwrap();
    let global: Vec<usize> = (0..18)
        .filter(|&l| d.layers[l].sliding_window.is_none())
        .collect();
    assert_eq!(global, [5, 11, 17]);
    for (l, layer) in d.layers.iter().enumerate() {
        let local = !global.contains(&l);
        assert_eq!(layer.sliding_window, local.then_some(512));
        assert_eq!(layer.rope_base, if local { 10000.0 } else { 1e6 });
    }
    assert_eq!(d.attn_scale, 1.0 / 16.0);
    assert_eq!(d.embed_scale, Some((640f64).sqrt() as f32));
    assert!(d.qk_norm && d.post_norms);
    assert_eq!((d.attn_softcap, d.final_softcap), (None, None));

    // Linear RoPE scaling applies to the global layers only.
    let d = gemma3_header(|w| {
        w.add_string("gemma3.rope.scaling.type", "linear");
        w.add_f32("gemma3.rope.scaling.factor", 8.0);
    })
    .unwrap();
    assert_eq!(d.layers[5].rope_scale, 0.125);
    assert_eq!(d.layers[0].rope_scale, 1.0);

    // A file that states the local layers' base (today's converter writes it).
    let d = gemma3_header(|w| {
        w.add_f32("gemma3.rope.freq_base_swa", 20000.0);
    })
    .unwrap();
    assert_eq!(
        (d.layers[0].rope_base, d.layers[5].rope_base),
        (20000.0, 1e6)
    );
}

#[test]
fn bad_headers_say_which_key() {
    let err = gemma3_header(|w| {
        w.add_string("gemma3.rope.scaling.type", "yarn");
    })
    .unwrap_err();
    assert!(err.to_string().contains("`yarn`"), "{err}");
    let err = gemma3_header(|w| {
        w.add_u32("gemma3.attention.value_length", 128);
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("gemma3.attention.value_length"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "gpt2");
    w.write(&path).unwrap();
    let err = ModelDesc::from_source(&GgufFile::open(&path).unwrap()).unwrap_err();
    assert!(matches!(err, ArchError::UnsupportedArchitecture(ref a) if a == "gpt2"));

    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "qwen2");
    w.add_u32("qwen2.block_count", 2);
    w.write(&path).unwrap();
    let err = ModelDesc::from_source(&GgufFile::open(&path).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing metadata key `qwen2.embedding_length`"
    );

    // A corrupt layer count is refused before anything is allocated per layer (found by the
    // `gguf` fuzz target: 4,294,967,288 layers asked for 96 GiB).
    let mut w = GgufWriter::new();
    w.add_string("general.architecture", "llama");
    w.add_u32("llama.block_count", 0xFFFF_FFF8);
    w.write(&path).unwrap();
    let err = ModelDesc::from_source(&GgufFile::open(&path).unwrap()).unwrap_err();
    assert!(matches!(err, ArchError::InvalidConfig(_)), "{err}");
    assert!(
        err.to_string().contains("llama.block_count is 4294967288"),
        "{err}"
    );
}

/// A plain Llama's plan is the Llama block and nothing else: no bias, q/k norm, post-norm,
/// soft-cap or embedding scale op, one RoPE variant.
#[test]
fn plain_llama_plan_is_the_llama_block() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gguf::testing::write_tiny_llama(&path, 1).unwrap();
    let d = ModelDesc::from_source(&GgufFile::open(&path).unwrap()).unwrap();
    let plan = ModelPlan::new(&d);
    let variant = RopeVariant {
        base: 10000.0,
        pos_scale: 1.0,
    };
    let layer = [
        LayerOp::Norm(Branch::Attention),
        LayerOp::QkvProject,
        LayerOp::Rope(RopeOp {
            style: RopeStyle::Interleaved,
            variant,
            index: 0,
        }),
        LayerOp::KvWrite,
        LayerOp::Attention(AttentionOp {
            scale: 0.25,
            softcap: None,
            window: None,
        }),
        LayerOp::Residual {
            branch: Branch::Attention,
            post_norm: false,
        },
        LayerOp::Norm(Branch::FeedForward),
        LayerOp::GateUpProject,
        LayerOp::Gate(Activation::Silu),
        LayerOp::Residual {
            branch: Branch::FeedForward,
            post_norm: false,
        },
    ];
    assert_eq!(plan.layers.len(), d.n_layers);
    assert!(plan.layers.iter().all(|l| l.ops == layer));
    assert_eq!(plan.head, [HeadOp::Norm, HeadOp::LmHead]);
    assert_eq!(plan.embed.scale, None);
    assert_eq!(plan.rope_variants, [variant]);
}

/// Every tiny architecture's plan has its options' ops, and the shared loader reads every tensor
/// those ops use, with the shapes the ops imply (the accessors panic on a tensor not loaded).
#[test]
fn every_plan_op_has_its_weights() {
    for arch in ["qwen2", "qwen3", "llama3rope", "gemma2", "phi3"] {
        let file = fixture(arch);
        let d = ModelDesc::from_source(&file).unwrap();
        let plan = ModelPlan::new(&d);
        let w = ModelWeights::load(&file, &d, |t| Ok::<_, ArchError>((t.rows, t.cols))).unwrap();
        let width = d.q_dim() + 2 * d.kv_dim();
        let mut seen = Vec::new();
        for (layer, lw) in plan.layers.iter().zip(&w.layers) {
            for op in &layer.ops {
                match *op {
                    LayerOp::Norm(b) => assert_eq!(lw.norm(b).len(), d.hidden),
                    LayerOp::QkvProject => {
                        assert_eq!(lw.wqkv.iter().map(|m| m.0).sum::<usize>(), width)
                    }
                    LayerOp::QkvBias => assert_eq!(lw.bias().len(), width),
                    LayerOp::QkNorm => assert_eq!(lw.qk_norms().1.len(), d.head_dim),
                    LayerOp::Residual { branch, post_norm } => {
                        assert_eq!(lw.out_projection(branch).0, d.hidden);
                        if post_norm {
                            assert_eq!(lw.post_norm(branch).len(), d.hidden);
                        }
                    }
                    LayerOp::GateUpProject => {
                        assert_eq!(
                            lw.w_gate_up.iter().map(|m| m.0).sum::<usize>(),
                            2 * d.ffn_dim
                        )
                    }
                    LayerOp::Rope(_) | LayerOp::KvWrite | LayerOp::Attention(_) => {}
                    LayerOp::Gate(a) => assert_eq!(a, d.activation),
                }
                seen.push(*op);
            }
        }
        assert_eq!(*w.lm_head(), (d.vocab_size, d.hidden), "{arch}");
        let has = |op: LayerOp| seen.contains(&op);
        assert_eq!(has(LayerOp::QkvBias), arch == "qwen2", "{arch}");
        assert_eq!(has(LayerOp::QkNorm), arch == "qwen3", "{arch}");
        let post = LayerOp::Residual {
            branch: Branch::FeedForward,
            post_norm: true,
        };
        assert_eq!(has(post), arch == "gemma2", "{arch}");
        let gemma2 = arch == "gemma2";
        assert_eq!(plan.head.contains(&HeadOp::Softcap(30.0)), gemma2, "{arch}");
        assert_eq!(plan.embed.scale, gemma2.then_some(8.0), "{arch}");
        let windows: Vec<Option<usize>> = seen
            .iter()
            .filter_map(|op| match op {
                LayerOp::Attention(a) => Some(a.window),
                _ => None,
            })
            .collect();
        let want: Vec<_> = d.layers.iter().map(|l| l.sliding_window).collect();
        assert_eq!(windows, want, "{arch}");
    }
}

/// Gemma 3's local and global layers get two RoPE variants, each layer the index of its own.
#[test]
fn gemma3_plan_has_a_rope_variant_per_layer_kind() {
    let d = gemma3_header(|_| {}).unwrap();
    let plan = ModelPlan::new(&d);
    let local = RopeVariant {
        base: 10000.0,
        pos_scale: 1.0,
    };
    let global = RopeVariant {
        base: 1e6,
        pos_scale: 1.0,
    };
    assert_eq!(plan.rope_variants, [local, global]);
    for (l, layer) in plan.layers.iter().enumerate() {
        let rope = layer.ops.iter().find_map(|op| match op {
            LayerOp::Rope(r) => Some(*r),
            _ => None,
        });
        let is_global = (l + 1) % 6 == 0;
        let want = if is_global { (global, 1) } else { (local, 0) };
        assert_eq!(rope.map(|r| (r.variant, r.index)), Some(want), "layer {l}");
    }
    assert!(plan.layers[0].ops.contains(&LayerOp::QkNorm));
}
