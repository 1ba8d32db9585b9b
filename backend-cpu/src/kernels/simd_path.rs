//! The instruction-set path the CPU kernels run ([`SimdPath`]): AVX-512F (+F16C),
//! AVX2+FMA (+F16C), or portable scalar code, detected once at run time.

use std::sync::OnceLock;

/// An instruction-set path for the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdPath {
    /// Plain Rust: separate multiply and add, 8 lane accumulators.
    Portable,
    /// AVX2 + FMA + F16C: 8-lane fused multiply-add.
    Avx2,
    /// AVX-512F + F16C (+ AVX2/FMA): 16-lane fused multiply-add.
    Avx512,
}

impl SimdPath {
    /// The fastest path this CPU supports, unless `WORKER_SIMD` is `portable`
    /// or `avx2` (and that path is available); detected once, then cached.
    pub fn detect() -> SimdPath {
        static PATH: OnceLock<SimdPath> = OnceLock::new();
        *PATH.get_or_init(|| {
            if std::env::var_os("WORKER_SIMD").is_some_and(|v| v == "portable") {
                return SimdPath::Portable;
            }
            let all = SimdPath::available();
            if std::env::var_os("WORKER_SIMD").is_some_and(|v| v == "avx2")
                && all.contains(&SimdPath::Avx2)
            {
                return SimdPath::Avx2;
            }
            *all.last().expect("portable is always available")
        })
    }

    /// `"portable"`, `"avx2"` or `"avx512"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SimdPath::Portable => "portable",
            SimdPath::Avx2 => "avx2",
            SimdPath::Avx512 => "avx512",
        }
    }

    /// Every path this CPU can run, slowest first (always starts with `Portable`).
    pub fn available() -> Vec<SimdPath> {
        let mut out = vec![SimdPath::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            if avx2 {
                out.push(SimdPath::Avx2);
                if std::arch::is_x86_feature_detected!("avx512f") {
                    out.push(SimdPath::Avx512);
                }
            }
        }
        out
    }
}
