//! Runs the unit tests of `scripts/check-imports`, the import-circle check of `.ci/run`
//! (`scripts/check_imports/test_check_imports.py`), so that `cargo test` covers the script too.
//! They need `python3` (3.11 or later) and nothing else.

use std::path::Path;
use std::process::Command;

#[test]
fn check_imports_script_passes_its_self_test() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check-imports");
    let out = Command::new("python3")
        .arg(&script)
        .arg("--self-test")
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{} --self-test failed:\n{}{}",
        script.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
