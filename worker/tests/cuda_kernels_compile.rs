//! Every kernel in `kernels/` compiles with NVRTC for sm_80 and sm_90 in both numeric modes, on a
//! machine without a GPU or driver; prints ptxas' registers and spills per kernel.
//!
//! NVRTC comes from the PyPI wheel `nvidia-cuda-nvrtc-cu12` that `scripts/fetch-nvrtc` unpacks into
//! `.cache/nvrtc/lib` (`scripts/test` runs it), or from `NVRTC_LIB_DIR`. Without it this test fails:
//! it never skips.
//!
//! With `CUDA_MODULE_CACHE_FILL=DIR` it also stores every CUBIN in the module cache at `DIR`, so a GPU
//! host without NVRTC can run from it (`scripts/gpu-check --prepare`).

use backend_cuda::cache::ModuleCache;
use backend_cuda::compile::{compile, load_nvrtc, nvrtc_version, parse_ptxas_log};
use backend_cuda::kernels::FILES;
use backend_cuda::Numerics;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_in_both_modes() {
    if let Err(e) = load_nvrtc() {
        panic!(
            "NVRTC is needed to compile the CUDA kernels: {e}\n\
             run scripts/fetch-nvrtc (it puts libnvrtc.so.12 in .cache/nvrtc/lib), or point \
             NVRTC_LIB_DIR at a folder holding libnvrtc.so.12"
        );
    }
    let (major, minor) = nvrtc_version().expect("NVRTC version");
    println!("NVRTC {major}.{minor}");
    let fill = std::env::var_os("CUDA_MODULE_CACHE_FILL").map(ModuleCache::new);
    let mut failures = Vec::new();
    let mut table = Vec::new();
    for file in FILES {
        for arch in ARCHS {
            for numerics in [Numerics::Exact, Numerics::Fast] {
                match compile(file, arch, numerics, true) {
                    Err(e) => failures.push(e.to_string()),
                    Ok(module) => {
                        assert!(
                            module.cubin.starts_with(b"\x7fELF"),
                            "{}: not a CUBIN",
                            file.name
                        );
                        if let Some(cache) = &fill {
                            cache
                                .put(file, arch, numerics, &module.cubin)
                                .expect("writing the module cache");
                        }
                        let report = parse_ptxas_log(&module.log);
                        for k in file.kernels {
                            match report.iter().find(|r| r.kernel == *k) {
                                None => failures.push(format!(
                                    "{} ({arch}, {}): kernel {k} missing from the ptxas report",
                                    file.name,
                                    numerics.as_str()
                                )),
                                Some(r) => table.push((arch, numerics, file.name, r.clone())),
                            }
                        }
                    }
                }
            }
        }
    }
    println!(
        "{:<6} {:<6} {:<22} {:<18} {:>5} {:>6} {:>6} {:>6}",
        "arch", "mode", "file", "kernel", "regs", "spillS", "spillL", "smem"
    );
    for (arch, numerics, file, r) in &table {
        println!(
            "{:<6} {:<6} {:<22} {:<18} {:>5} {:>6} {:>6} {:>6}",
            arch,
            numerics.as_str(),
            file,
            r.kernel,
            r.registers,
            r.spill_stores,
            r.spill_loads,
            r.smem
        );
    }
    assert!(
        failures.is_empty(),
        "{} kernel compile failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    let expected: usize = FILES.iter().map(|f| f.kernels.len()).sum::<usize>() * 4;
    assert_eq!(table.len(), expected);
    let spilling: Vec<String> = table
        .iter()
        .filter(|(_, _, _, r)| r.spill_stores > 0 || r.spill_loads > 0)
        .map(|(a, n, _, r)| format!("{} ({a}, {})", r.kernel, n.as_str()))
        .collect();
    assert!(spilling.is_empty(), "kernels spill registers: {spilling:?}");
}
