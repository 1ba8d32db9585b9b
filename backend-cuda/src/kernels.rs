//! The CUDA kernel sources (`kernels/` at the repository root), embedded in the binary.
//!
//! Every `.cu` file is compiled as its own module, with [`PRELUDE`] (`kernels/common.cuh`: element
//! types of the numeric modes, weight-format decoders, fixed-order reductions) prepended; see
//! [`KernelFile::full_source`].

/// One kernel source file and the `extern "C"` kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    /// File name in `kernels/`, e.g. `rmsnorm.cu` (also the NVRTC program name).
    pub name: &'static str,
    /// The file's text.
    pub source: &'static str,
    /// Names of the kernels it defines (each must appear in the compiled module).
    pub kernels: &'static [&'static str],
}

/// `kernels/common.cuh`, prepended to every file.
pub const PRELUDE: &str = include_str!("../../kernels/common.cuh");

/// Every kernel file, in a fixed order.
pub const FILES: &[KernelFile] = &[
    KernelFile {
        name: "embedding.cu",
        source: include_str!("../../kernels/embedding.cu"),
        kernels: &["embedding"],
    },
    KernelFile {
        name: "rmsnorm.cu",
        source: include_str!("../../kernels/rmsnorm.cu"),
        kernels: &["rmsnorm"],
    },
    KernelFile {
        name: "rope.cu",
        source: include_str!("../../kernels/rope.cu"),
        kernels: &["rope"],
    },
    KernelFile {
        name: "kv_write.cu",
        source: include_str!("../../kernels/kv_write.cu"),
        kernels: &["kv_write"],
    },
    KernelFile {
        name: "gated.cu",
        source: include_str!("../../kernels/gated.cu"),
        kernels: &["swiglu", "geglu"],
    },
    KernelFile {
        name: "head_rmsnorm.cu",
        source: include_str!("../../kernels/head_rmsnorm.cu"),
        kernels: &["head_rmsnorm"],
    },
    KernelFile {
        name: "bias_add.cu",
        source: include_str!("../../kernels/bias_add.cu"),
        kernels: &["bias_add"],
    },
    KernelFile {
        name: "softcap.cu",
        source: include_str!("../../kernels/softcap.cu"),
        kernels: &["softcap"],
    },
    KernelFile {
        name: "gather_rows.cu",
        source: include_str!("../../kernels/gather_rows.cu"),
        kernels: &["gather_rows"],
    },
    KernelFile {
        name: "matmul_gemv.cu",
        source: include_str!("../../kernels/matmul_gemv.cu"),
        kernels: &[
            "gemv_f32",
            "gemv_f16",
            "gemv_bf16",
            "gemv_q4_0",
            "gemv_q4_1",
            "gemv_q8_0",
            "gemv_q5_0",
            "gemv_q5_1",
            "gemv_q4_k",
            "gemv_q5_k",
            "gemv_q6_k",
        ],
    },
    KernelFile {
        name: "matmul_gemm.cu",
        source: include_str!("../../kernels/matmul_gemm.cu"),
        kernels: &[
            "gemm_f32",
            "gemm_f16",
            "gemm_bf16",
            "gemm_q4_0",
            "gemm_q4_1",
            "gemm_q8_0",
            "gemm_q5_0",
            "gemm_q5_1",
            "gemm_q4_k",
            "gemm_q5_k",
            "gemm_q6_k",
        ],
    },
    KernelFile {
        name: "attention_decode.cu",
        source: include_str!("../../kernels/attention_decode.cu"),
        kernels: &["attention_decode"],
    },
    KernelFile {
        name: "attention_prefill.cu",
        source: include_str!("../../kernels/attention_prefill.cu"),
        kernels: &["attention_prefill"],
    },
    KernelFile {
        name: "select.cu",
        source: include_str!("../../kernels/select.cu"),
        kernels: &["argmax", "topk"],
    },
];

impl KernelFile {
    /// The text NVRTC compiles: the prelude, a `#line` directive (so errors name this file and its
    /// own line numbers), then the file.
    pub fn full_source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.name, self.source)
    }

    /// The kernel file named `name` (e.g. `rope.cu`), if any.
    pub fn containing_file(name: &str) -> Option<&'static KernelFile> {
        FILES.iter().find(|f| f.name == name)
    }

    /// The file defining kernel `kernel`, if any.
    pub fn containing(kernel: &str) -> Option<&'static KernelFile> {
        FILES.iter().find(|f| f.kernels.contains(&kernel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_once() {
        let mut seen = std::collections::HashSet::new();
        for f in FILES {
            for k in f.kernels {
                assert!(seen.insert(*k), "kernel {k} listed twice");
                let defined = f.source.contains(&format!(" {k}("))
                    || f.source.contains(&format!("\n    {k}("))
                    || k.split_once('_').is_some_and(|(family, fmt)| {
                        f.source
                            .contains(&format!("{}_KERNEL({fmt},", family.to_uppercase()))
                    });
                assert!(defined, "{k} is not defined in {}", f.name);
            }
        }
        assert!(KernelFile::containing("gemv_q4_1").is_some_and(|f| f.name == "matmul_gemv.cu"));
        assert!(FILES[0].full_source().contains("#line 1 \"embedding.cu\""));
    }
}
