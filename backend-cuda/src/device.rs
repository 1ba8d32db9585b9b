//! Choosing the compute device: `--device cpu|cuda|auto`, and discovering a CUDA GPU through the
//! driver library (`libcuda.so`, loaded at run time; its absence is an ordinary "no GPU" answer).

use std::sync::Arc;

use cudarc::driver::{sys as driver_sys, CudaContext};
use serde::{Deserialize, Serialize};

use super::compile::arch_name;
use super::error::{driver, CudaError};

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
/// Errors (one line): [`CudaError::NoDriver`] (the driver library cannot be loaded),
/// [`CudaError::Driver`] (`cuInit` fails, e.g. no device or a driver too old for CUDA 12),
/// [`CudaError::NoGpu`], [`CudaError::OrdinalOutOfRange`], [`CudaError::ComputeCapabilityTooOld`],
/// or [`CudaError::DriverPanicked`].
pub fn probe(ordinal: usize) -> Result<GpuInfo, CudaError> {
    // cudarc panics when a symbol is missing from an old driver; report that as an error too.
    let outcome = std::panic::catch_unwind(|| -> Result<GpuInfo, CudaError> {
        // SAFETY: dlopen of the driver library by name; the handle is dropped again.
        if !unsafe { driver_sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        driver("cuInit failed", cudarc::driver::result::init())?;
        let count = driver("cuDeviceGetCount", CudaContext::device_count())?;
        if count <= 0 {
            return Err(CudaError::NoGpu);
        }
        let count = count as usize;
        if ordinal >= count {
            return Err(CudaError::OrdinalOutOfRange { ordinal, count });
        }
        let ctx = driver("creating a CUDA context", CudaContext::new(ordinal))?;
        let (major, minor) = driver("reading the compute capability", ctx.compute_capability())?;
        if major < 8 {
            return Err(CudaError::ComputeCapabilityTooOld {
                ordinal,
                major,
                minor,
            });
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
        Err(panic) => Err(CudaError::DriverPanicked {
            message: panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("panic while probing")
                .to_string(),
        }),
    }
}

/// Resolves the `device` setting with `probe_gpu` (normally [`probe`] of the configured ordinal).
///
/// Errors: [`CudaError::NoUsableGpu`] when `device = cuda` and the probe failed; the message is one
/// line, names the setting and says what was found, e.g. `device = "cuda" but no usable GPU: no CUDA driver: libcuda.so could not be
/// loaded (use --device cpu or auto)`.
pub fn choose_backend(
    kind: DeviceKind,
    probe_gpu: impl FnOnce() -> Result<GpuInfo, CudaError>,
) -> Result<Backend, CudaError> {
    match kind {
        DeviceKind::Cpu => Ok(Backend::Cpu {
            reason: "device = cpu".into(),
        }),
        DeviceKind::Cuda => probe_gpu()
            .map(Backend::Cuda)
            .map_err(|e| CudaError::NoUsableGpu {
                reason: Box::new(e),
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
        let none = || Err::<GpuInfo, _>(CudaError::NoDriver);
        let err = choose_backend(DeviceKind::Cuda, none).unwrap_err();
        assert!(
            matches!(&err, CudaError::NoUsableGpu { reason } if matches!(**reason, CudaError::NoDriver))
        );
        assert_eq!(
            err.to_string(),
            "device = \"cuda\" but no usable GPU: no CUDA driver: libcuda.so could not be loaded \
             (use --device cpu or auto)"
        );
        match choose_backend(DeviceKind::Auto, none).unwrap() {
            Backend::Cpu { reason } => assert_eq!(
                reason,
                "device = auto and no usable GPU: no CUDA driver: libcuda.so could not be loaded"
            ),
            Backend::Cuda(_) => panic!("auto picked CUDA without a GPU"),
        }
        let cpu = choose_backend(DeviceKind::Cpu, || panic!("cpu must not probe")).unwrap();
        assert!(matches!(cpu, Backend::Cpu { .. }));
    }
}
