//! [`CudaError`]: everything that can fail in the CUDA backend (finding a GPU, NVRTC, compiling and
//! caching kernels, launch shapes, uploads, the KV cache size, a step), with the two narrower
//! errors it wraps: [`NvrtcUnavailable`] (kept for the whole process by
//! [`super::compile::load_nvrtc`], so cheap to clone) and [`LaunchShapeError`].
//!
//! Every message is one line (a failed compile adds NVRTC's log on the following lines) and names
//! what failed. A wrapped error's text is part of its variant's message, so wrapped errors are not
//! also reported as [`std::error::Error::source`]: a message that lists the sources (the engine's
//! for a failed step, `anyhow`'s `{:#}`) would print them twice.
//! [`CudaError::Model`] is transparent (message and source are the [`ModelError`]'s).

use std::ffi::NulError;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;
use cudarc::nvrtc::sys::nvrtcResult;

use super::numerics::Numerics;
use engine::backend::{ModelError, StepError};

/// An error of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA driver call failed, e.g.
    /// `allocating step buffers: DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")`.
    #[error("{what}: {error}")]
    Driver {
        /// What was being done, e.g. `creating a CUDA stream` or `kernel rmsnorm`.
        what: String,
        /// The driver's status.
        error: DriverError,
    },
    /// The driver library cannot be loaded (no NVIDIA driver installed).
    #[error("no CUDA driver: libcuda.so could not be loaded")]
    NoDriver,
    /// The driver loaded but reports no device.
    #[error("the CUDA driver reports no GPU")]
    NoGpu,
    /// The configured `cuda_device` is not below the number of GPUs.
    #[error("cuda_device {ordinal} does not exist (the driver reports {count} GPU(s))")]
    OrdinalOutOfRange {
        /// The configured ordinal.
        ordinal: usize,
        /// GPUs the driver reports.
        count: usize,
    },
    /// The GPU is older than the kernels support (compute capability 8.0, Ampere).
    #[error("GPU {ordinal} has compute capability {major}.{minor}; the kernels need 8.0 or newer")]
    ComputeCapabilityTooOld {
        /// Device ordinal.
        ordinal: usize,
        /// Compute capability, major part.
        major: i32,
        /// Compute capability, minor part.
        minor: i32,
    },
    /// cudarc panicked while probing (e.g. a symbol missing from a driver too old for CUDA 12).
    #[error("the CUDA driver is unusable: {message}")]
    DriverPanicked {
        /// The panic's message.
        message: String,
    },
    /// `device = cuda` was set and the probe failed (the worker exits with code 2).
    #[error("device = \"cuda\" but no usable GPU: {reason} (use --device cpu or auto)")]
    NoUsableGpu {
        /// Why the probe failed.
        reason: Box<CudaError>,
    },
    /// NVRTC cannot be loaded (only needed when a kernel is not in the module cache).
    #[error(transparent)]
    NvrtcUnavailable(#[from] NvrtcUnavailable),
    /// An NVRTC call other than the compile itself failed.
    #[error("{}{call}: {status:?}", file_prefix(.file))]
    NvrtcCall {
        /// The kernel file the call was for, if any.
        file: Option<&'static str>,
        /// The NVRTC function, e.g. `nvrtcGetCUBIN`.
        call: &'static str,
        /// NVRTC's status.
        status: nvrtcResult,
    },
    /// NVRTC could not create the program of a kernel file.
    #[error("{file}: creating the NVRTC program: {error:?}")]
    NvrtcCreateProgram {
        /// The kernel file.
        file: &'static str,
        /// NVRTC's status.
        error: NvrtcError,
    },
    /// A kernel source holds a NUL byte (NVRTC takes C strings).
    #[error("{0}")]
    NulInSource(NulError),
    /// A kernel file did not compile; the message ends with NVRTC's log (file and line of each
    /// diagnostic) on the following lines.
    #[error("{file} ({arch}, {}): {status:?}\n{log}", numerics.as_str())]
    Compile {
        /// The kernel file.
        file: &'static str,
        /// The target architecture, e.g. `sm_90`.
        arch: String,
        /// The numeric mode compiled for.
        numerics: Numerics,
        /// NVRTC's status.
        status: NvrtcError,
        /// NVRTC's log.
        log: String,
    },
    /// A launch shape is out of the kernels' range during a step.
    #[error(transparent)]
    LaunchShape(#[from] LaunchShapeError),
    /// The model's shape is out of the kernels' range (checked at load).
    #[error("this model cannot run on the CUDA backend: {0}")]
    ModelUnsupported(LaunchShapeError),
    /// The KV cache does not fit in the GPU's free memory (keeping 512 MiB for step buffers and
    /// graphs).
    #[error(
        "the KV cache needs {} MiB but the GPU has {} MiB free (512 MiB are kept for step \
         buffers); lower kv_cache_mib or kv_cache_blocks",
        .need >> 20,
        .free >> 20
    )]
    KvCacheTooLarge {
        /// Bytes the KV cache needs.
        need: usize,
        /// Bytes free on the GPU.
        free: usize,
    },
    /// Capturing a decode graph ended without a graph.
    #[error("graph capture produced no graph")]
    NoGraphCaptured,
    /// Loading the model or checking a step's batch failed as in every backend.
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl From<CudaError> for StepError {
    /// A batch the shared checks refused stays [`StepError::Batch`]; anything else is the device's.
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::Model(e) => StepError::Batch(e),
            e => StepError::Device(Box::new(e)),
        }
    }
}

/// `"{file}: "`, or nothing for a call that is not about one kernel file.
fn file_prefix(file: &Option<&str>) -> String {
    file.map(|f| format!("{f}: ")).unwrap_or_default()
}

/// `r` with a driver error turned into [`CudaError::Driver`] saying `what` was being done.
pub(crate) fn driver<T>(what: &str, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|error| CudaError::Driver {
        what: what.to_string(),
        error,
    })
}

/// Why NVRTC cannot be used. Cheap to clone: [`super::compile::load_nvrtc`] answers with the first
/// outcome for the life of the process.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NvrtcUnavailable {
    /// Neither a preload folder nor the dynamic loader's search path has the library.
    #[error(
        "NVRTC (libnvrtc.so.12) not found: install the CUDA 12 toolkit's NVRTC, or run \
         scripts/fetch-nvrtc and set NVRTC_LIB_DIR to the folder it prints"
    )]
    NotFound,
    /// The preload folder has no `libnvrtc.so.12` (the path is the missing file).
    #[error("{} does not exist", .0.display())]
    MissingLibrary(PathBuf),
    /// The preload folder cannot be listed.
    #[error("reading {}: {error}", .dir.display())]
    ReadDir {
        /// The folder.
        dir: PathBuf,
        /// The I/O error.
        error: Arc<std::io::Error>,
    },
    /// A library of the preload folder cannot be loaded.
    #[error("loading {}: {error}", .path.display())]
    Load {
        /// The library file.
        path: PathBuf,
        /// The loader's error.
        error: Arc<libloading::Error>,
    },
}

/// A kernel launch shape the kernels do not support.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchShapeError {
    /// `attention_decode`'s thread groups need `head_dim` to divide the block or be a multiple of it.
    #[error("head_dim {head_dim} must divide {threads} or be a multiple of it")]
    HeadDim {
        /// The model's head size.
        head_dim: usize,
        /// Threads per block.
        threads: usize,
    },
    /// Attention's scores do not fit in the shared memory limit.
    #[error(
        "attention over {max_keys} keys needs {smem} bytes of shared memory, the limit is {limit}"
    )]
    SharedMemory {
        /// Keys attended to.
        max_keys: usize,
        /// Bytes needed.
        smem: usize,
        /// Bytes allowed (the opt-in limit set at load).
        limit: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_and_device_messages() {
        assert_eq!(
            CudaError::OrdinalOutOfRange {
                ordinal: 3,
                count: 2
            }
            .to_string(),
            "cuda_device 3 does not exist (the driver reports 2 GPU(s))"
        );
        assert_eq!(
            CudaError::ComputeCapabilityTooOld {
                ordinal: 0,
                major: 7,
                minor: 5
            }
            .to_string(),
            "GPU 0 has compute capability 7.5; the kernels need 8.0 or newer"
        );
        assert_eq!(
            CudaError::DriverPanicked {
                message: "panic while probing".into()
            }
            .to_string(),
            "the CUDA driver is unusable: panic while probing"
        );
        assert_eq!(
            CudaError::NoGpu.to_string(),
            "the CUDA driver reports no GPU"
        );
    }

    #[test]
    fn nvrtc_messages() {
        assert_eq!(
            CudaError::from(NvrtcUnavailable::NotFound).to_string(),
            "NVRTC (libnvrtc.so.12) not found: install the CUDA 12 toolkit's NVRTC, or run \
             scripts/fetch-nvrtc and set NVRTC_LIB_DIR to the folder it prints"
        );
        let status = nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        let version = CudaError::NvrtcCall {
            file: None,
            call: "nvrtcVersion",
            status,
        };
        assert_eq!(
            version.to_string(),
            "nvrtcVersion: NVRTC_ERROR_INVALID_INPUT"
        );
        let cubin = CudaError::NvrtcCall {
            file: Some("rope.cu"),
            call: "nvrtcGetCUBIN",
            status,
        };
        assert_eq!(
            cubin.to_string(),
            "rope.cu: nvrtcGetCUBIN: NVRTC_ERROR_INVALID_INPUT"
        );
        let create = CudaError::NvrtcCreateProgram {
            file: "rope.cu",
            error: NvrtcError(nvrtcResult::NVRTC_ERROR_OUT_OF_MEMORY),
        };
        assert_eq!(
            create.to_string(),
            "rope.cu: creating the NVRTC program: NvrtcError(NVRTC_ERROR_OUT_OF_MEMORY)"
        );
        let compile = CudaError::Compile {
            file: "rope.cu",
            arch: "sm_90".into(),
            numerics: Numerics::Fast,
            status: NvrtcError(nvrtcResult::NVRTC_ERROR_COMPILATION),
            log: "rope.cu(3): error: expected a \";\"".into(),
        };
        assert_eq!(
            compile.to_string(),
            "rope.cu (sm_90, fast): NvrtcError(NVRTC_ERROR_COMPILATION)\n\
             rope.cu(3): error: expected a \";\""
        );
    }

    #[test]
    fn load_and_step_messages() {
        let shape = LaunchShapeError::HeadDim {
            head_dim: 48,
            threads: 128,
        };
        assert_eq!(
            CudaError::ModelUnsupported(shape.clone()).to_string(),
            "this model cannot run on the CUDA backend: head_dim 48 must divide 128 or be a \
             multiple of it"
        );
        assert_eq!(
            CudaError::from(shape.clone()).to_string(),
            shape.to_string()
        );
        assert_eq!(
            CudaError::KvCacheTooLarge {
                need: 3 << 30,
                free: (1 << 30) + 5
            }
            .to_string(),
            "the KV cache needs 3072 MiB but the GPU has 1024 MiB free (512 MiB are kept for step \
             buffers); lower kv_cache_mib or kv_cache_blocks"
        );
        let model = CudaError::from(ModelError::EmptyInput { entry: 2 });
        assert_eq!(model.to_string(), "batch entry 2 has no tokens");
        assert!(std::error::Error::source(&model).is_none());
    }

    #[test]
    fn driver_names_what_failed() {
        assert_eq!(driver("x", Ok::<_, DriverError>(5)).unwrap(), 5);
        // Only matched, not printed: a DriverError's text comes from the driver library.
        let status = cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        match driver::<()>("allocating step buffers", Err(DriverError(status))) {
            Err(CudaError::Driver { what, error }) => {
                assert_eq!(
                    (what.as_str(), error.0),
                    ("allocating step buffers", status)
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
