//! Choosing the compute device: `--device cpu|cuda|auto`, and discovering a CUDA GPU through the
//! driver library (`libcuda.so`, loaded at run time; its absence is an ordinary "no GPU" answer).

use std::sync::Arc;

use cudarc::driver::{sys as driver_sys, CudaContext};
use serde::{Deserialize, Serialize};

use super::compile::arch_name;

/// The `device` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend; the worker exits with code 2 when no usable GPU is present.
    Cuda,
    /// CUDA when a driver and a GPU are present, else the CPU.
    Auto,
}

/// A usable GPU: its context (primary context of the device) and what the logs report.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    /// The device's primary context.
    pub ctx: Arc<CudaContext>,
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// NVRTC architecture of the device, e.g. `sm_90`.
    pub arch: String,
    /// Total device memory, bytes.
    pub total_mem: usize,
}

/// The backend chosen at start.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The CPU backend; `reason` says why (requested, or what the CUDA probe found).
    Cpu { reason: String },
    /// The CUDA backend on this GPU.
    Cuda(GpuInfo),
}

/// Opens CUDA device `ordinal`.
///
/// Errors (one line): the driver library cannot be loaded, `cuInit` fails (e.g. no device or a driver
/// too old for CUDA 12), or the ordinal is out of range.
pub fn probe(ordinal: usize) -> Result<GpuInfo, String> {
    // cudarc panics when a symbol is missing from an old driver; report that as an error too.
    let outcome = std::panic::catch_unwind(|| -> Result<GpuInfo, String> {
        // SAFETY: dlopen of the driver library by name; the handle is dropped again.
        if !unsafe { driver_sys::is_culib_present() } {
            return Err("no CUDA driver: libcuda.so could not be loaded".into());
        }
        cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e}"))?;
        let count = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
        if count <= 0 {
            return Err("the CUDA driver reports no GPU".into());
        }
        if ordinal >= count as usize {
            return Err(format!(
                "cuda_device {ordinal} does not exist (the driver reports {count} GPU(s))"
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("creating a CUDA context: {e}"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the compute capability: {e}"))?;
        if major < 8 {
            return Err(format!(
                "GPU {ordinal} has compute capability {major}.{minor}; the kernels need 8.0 or newer"
            ));
        }
        Ok(GpuInfo {
            name: ctx.name().unwrap_or_else(|_| "unknown GPU".into()),
            total_mem: ctx.total_mem().unwrap_or(0),
            arch: arch_name(major, minor),
            ordinal,
            ctx,
        })
    });
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(format!(
            "the CUDA driver is unusable: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("panic while probing")
        )),
    }
}

/// Resolves the `device` setting with `probe_gpu` (normally [`probe`] of the configured ordinal).
///
/// Errors: `device = cuda` and the probe failed; the message is one line, names the setting and says
/// what was found, e.g. `device = "cuda" but no usable GPU: no CUDA driver: libcuda.so could not be
/// loaded (use --device cpu or auto)`.
pub fn choose_backend(
    kind: DeviceKind,
    probe_gpu: impl FnOnce() -> Result<GpuInfo, String>,
) -> Result<Backend, String> {
    match kind {
        DeviceKind::Cpu => Ok(Backend::Cpu {
            reason: "device = cpu".into(),
        }),
        DeviceKind::Cuda => probe_gpu().map(Backend::Cuda).map_err(|e| {
            format!("device = \"cuda\" but no usable GPU: {e} (use --device cpu or auto)")
        }),
        DeviceKind::Auto => Ok(match probe_gpu() {
            Ok(gpu) => Backend::Cuda(gpu),
            Err(e) => Backend::Cpu {
                reason: format!("device = auto and no usable GPU: {e}"),
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_without_gpu_is_an_error_auto_falls_back() {
        let none = || Err::<GpuInfo, _>("no CUDA driver".to_string());
        let err = choose_backend(DeviceKind::Cuda, none).unwrap_err();
        assert!(err.starts_with("device = \"cuda\" but no usable GPU: no CUDA driver"));
        assert!(!err.contains('\n'));
        match choose_backend(DeviceKind::Auto, none).unwrap() {
            Backend::Cpu { reason } => assert!(reason.contains("no CUDA driver")),
            Backend::Cuda(_) => panic!("auto picked CUDA without a GPU"),
        }
        let cpu = choose_backend(DeviceKind::Cpu, || panic!("cpu must not probe")).unwrap();
        assert!(matches!(cpu, Backend::Cpu { .. }));
    }
}
