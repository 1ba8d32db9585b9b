//! NVRTC: loading the library, compiling a kernel file to a CUBIN for one GPU architecture, and
//! reading ptxas' resource report (registers, spills) from the compile log.
//!
//! NVRTC is loaded at run time through cudarc (`libnvrtc.so.12`, found through the dynamic loader's
//! search path). [`load_nvrtc`] first preloads it from an explicit folder when one is given (the
//! `NVRTC_LIB_DIR` variable, or the folder `scripts/fetch-nvrtc` fills): once a library with that
//! soname is loaded, cudarc's own lookup by name finds it, so no `LD_LIBRARY_PATH` is needed.

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use super::error::{CudaError, NvrtcUnavailable};
use super::kernels::KernelFile;
use super::numerics::Numerics;

/// NVRTC options for `arch` (e.g. `sm_90`) in numeric mode `numerics`; `verbose` adds ptxas' resource
/// report to the log.
pub fn compile_options(arch: &str, numerics: Numerics, verbose: bool) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
    ];
    match numerics {
        Numerics::Exact => o.push("--fmad=false".into()),
        Numerics::Fast => o.push("-DSMOLLM_FAST=1".into()),
    }
    if verbose {
        o.push("--ptxas-options=-v".into());
    }
    o
}

/// `sm_XY` for compute capability `(X, Y)`.
pub fn arch_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// A compiled kernel file.
#[derive(Debug, Clone)]
pub struct CompiledModule {
    /// The CUBIN image (ELF) for the requested architecture.
    pub cubin: Vec<u8>,
    /// NVRTC's log (warnings, and with `verbose` ptxas' resource report).
    pub log: String,
}

/// Where a folder holding `libnvrtc.so.12` may be: `NVRTC_LIB_DIR`, else `<repo>/.cache/nvrtc/lib`
/// (what `scripts/fetch-nvrtc` fills) when it exists.
pub fn nvrtc_lib_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("NVRTC_LIB_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/nvrtc/lib");
    repo.join("libnvrtc.so.12").is_file().then_some(repo)
}

/// Makes NVRTC callable: preloads `libnvrtc.so.12` (and its builtins) from [`nvrtc_lib_dir`] when
/// that folder has it, then checks that cudarc can load the library. Idempotent.
///
/// Errors: [`CudaError::NvrtcUnavailable`], naming what was searched (the library is optional
/// until a kernel must be compiled: cached CUBINs need no NVRTC).
pub fn load_nvrtc() -> Result<(), CudaError> {
    static LOADED: OnceLock<Result<(), NvrtcUnavailable>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            if let Some(dir) = nvrtc_lib_dir() {
                preload_from(&dir)?;
            }
            // SAFETY: dlopen of a library by name; the handle is dropped again.
            if unsafe { nvrtc_sys::is_culib_present() } {
                Ok(())
            } else {
                Err(NvrtcUnavailable::NotFound)
            }
        })
        .clone()
        .map_err(CudaError::from)
}

fn preload_from(dir: &Path) -> Result<(), NvrtcUnavailable> {
    let main = dir.join("libnvrtc.so.12");
    if !main.is_file() {
        return Err(NvrtcUnavailable::MissingLibrary(main));
    }
    // Builtins first (libnvrtc loads them by name at compile time), then the library itself.
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| NvrtcUnavailable::ReadDir {
            dir: dir.to_path_buf(),
            error: Arc::new(e),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
        })
        .collect();
    names.sort();
    names.push(main);
    for path in names {
        // SAFETY: loading NVIDIA's NVRTC libraries, whose initialisers have no preconditions. The
        // handles are leaked on purpose: the libraries stay loaded for the life of the process.
        let lib =
            unsafe { libloading::Library::new(&path) }.map_err(|e| NvrtcUnavailable::Load {
                path: path.clone(),
                error: Arc::new(e),
            })?;
        std::mem::forget(lib);
    }
    Ok(())
}

/// NVRTC's version, `(major, minor)`. Errors when NVRTC cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    load_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    nvrtc_result(rc, None, "nvrtcVersion")?;
    Ok((major, minor))
}

/// `rc` as a result: [`CudaError::NvrtcCall`] of `call` (about kernel file `file`) unless it is
/// `NVRTC_SUCCESS`.
fn nvrtc_result(
    rc: nvrtc_sys::nvrtcResult,
    file: Option<&'static str>,
    call: &'static str,
) -> Result<(), CudaError> {
    if rc == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::NvrtcCall {
            file,
            call,
            status: rc,
        })
    }
}

/// Compiles `file` (with the prelude) for `arch` in mode `numerics` to a CUBIN.
///
/// Errors: [`CudaError::NvrtcUnavailable`], [`CudaError::Compile`] (the message holds NVRTC's log
/// with file and line), or another NVRTC call failing ([`CudaError::NvrtcCreateProgram`],
/// [`CudaError::NvrtcCall`], [`CudaError::NulInSource`]).
pub fn compile(
    file: &KernelFile,
    arch: &str,
    numerics: Numerics,
    verbose: bool,
) -> Result<CompiledModule, CudaError> {
    load_nvrtc()?;
    let src = CString::new(file.full_source()).map_err(CudaError::NulInSource)?;
    let name = CString::new(file.name).map_err(CudaError::NulInSource)?;
    let options = compile_options(arch, numerics, verbose);
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|error| {
        CudaError::NvrtcCreateProgram {
            file: file.name,
            error,
        }
    })?;
    let _guard = ProgramGuard(prog);
    // SAFETY: `prog` is a live program; the options are NUL-free strings.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::get_program_log(prog) }
        .map(|raw| c_chars_to_string(&raw))
        .unwrap_or_default();
    if let Err(status) = compiled {
        return Err(CudaError::Compile {
            file: file.name,
            arch: arch.to_string(),
            numerics,
            status,
            log,
        });
    }
    let mut size = 0usize;
    // SAFETY: valid out-pointer; the program compiled.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
    nvrtc_result(rc, Some(file.name), "nvrtcGetCUBINSize")?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the size NVRTC reported.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) };
    nvrtc_result(rc, Some(file.name), "nvrtcGetCUBIN")?;
    Ok(CompiledModule { cubin, log })
}

struct ProgramGuard(nvrtc_sys::nvrtcProgram);

impl Drop for ProgramGuard {
    fn drop(&mut self) {
        // SAFETY: the program was created by create_program and is destroyed once.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    if raw.is_empty() {
        return String::new();
    }
    // SAFETY: NVRTC's log is NUL-terminated within `raw`.
    unsafe { CStr::from_ptr(raw.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// ptxas' report for one kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// Kernel (entry function) name.
    pub kernel: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores / loads per thread.
    pub spill_stores: u32,
    /// See `spill_stores`.
    pub spill_loads: u32,
    /// Bytes of stack frame per thread.
    pub stack: u32,
    /// Bytes of static shared memory per block.
    pub smem: u32,
}

/// Reads ptxas' verbose report (`--ptxas-options=-v`) from a compile log: one entry per compiled
/// entry function, in log order. Lines look like
/// `ptxas info    : Compiling entry function 'rmsnorm' for 'sm_90'`,
/// `ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads` and
/// `ptxas info    : Used 27 registers, used 1 barriers, 8192 bytes smem`.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources {
                kernel: name,
                ..Default::default()
            });
            current = Some(out.len() - 1);
        } else if line.contains("Function properties for ") {
            // Non-entry (device) functions: their lines are not a kernel's.
            let name = line.rsplit("Function properties for ").next().unwrap_or("");
            current = out.iter().position(|k| k.kernel == name.trim());
        } else if let Some(k) = current.map(|i| &mut out[i]) {
            if line.contains("bytes stack frame") {
                k.stack = number_before(line, "bytes stack frame");
                k.spill_stores = number_before(line, "bytes spill stores");
                k.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("Used ") && line.contains(" registers") {
                k.registers = number_before(line, "registers");
                k.smem = number_before(line, "bytes smem");
                current = None;
            }
        }
    }
    out
}

/// The integer just before `unit` in `line` (0 when absent).
fn number_before(line: &str, unit: &str) -> u32 {
    line.find(unit)
        .and_then(|i| line[..i].split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_per_mode() {
        let exact = compile_options("sm_90", Numerics::Exact, true);
        assert_eq!(
            exact,
            [
                "--gpu-architecture=sm_90",
                "-std=c++17",
                "--fmad=false",
                "--ptxas-options=-v"
            ]
        );
        let fast = compile_options("sm_80", Numerics::Fast, false);
        assert!(fast.contains(&"-DSMOLLM_FAST=1".to_string()));
        assert!(!fast.iter().any(|o| o.contains("fmad")));
        assert_eq!(arch_name(9, 0), "sm_90");
        assert_eq!(
            (Numerics::Exact.act_bytes(), Numerics::Fast.act_bytes()),
            (4, 2)
        );
    }

    #[test]
    fn preload_names_the_missing_library() {
        let dir = tempfile::tempdir().unwrap();
        let err = preload_from(dir.path()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{}/libnvrtc.so.12 does not exist", dir.path().display())
        );
        let lib = dir.path().join("libnvrtc.so.12");
        std::fs::write(&lib, b"not an ELF").unwrap();
        let err = preload_from(dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("loading {}: ", lib.display())),
            "{err}"
        );
        assert!(matches!(err, NvrtcUnavailable::Load { path, .. } if path == lib));
    }

    #[test]
    fn parses_ptxas_report() {
        let log = "ptxas info    : 272 bytes gmem\n\
ptxas info    : Compiling entry function 'gemv_q8_0' for 'sm_90'\n\
ptxas info    : Function properties for gemv_q8_0\n\
ptxas         .     40 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 32 registers, used 0 barriers, 40 bytes cumulative stack size\n\
ptxas info    : Compiling entry function 'rmsnorm' for 'sm_90'\n\
ptxas info    : Function properties for rmsnorm\n\
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 27 registers, used 1 barriers, 8192 bytes smem\n\
ptxas info    : Function properties for __internal_trig_reduction_slowpathd\n\
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        let r = parse_ptxas_log(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelResources {
                kernel: "gemv_q8_0".into(),
                registers: 32,
                spill_stores: 8,
                spill_loads: 12,
                stack: 40,
                smem: 0
            }
        );
        assert_eq!(
            (r[1].registers, r[1].smem, r[1].spill_stores),
            (27, 8192, 0)
        );
    }
}
