//! Which architectures `device = auto` sends to the CUDA path (moved from the model description's
//! tests, which can no longer see this backend).

use std::path::PathBuf;

use gguf::GgufFile;
use model_desc::ModelDesc;

use super::unverified_architecture;

#[test]
fn tiny_llama_is_verified() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    gguf::testing::write_tiny_llama(&path, 1).unwrap();
    let d = ModelDesc::from_source(&GgufFile::open(&path).unwrap()).unwrap();
    assert!(d.is_plain_llama());
    assert!(unverified_architecture(&d).is_none());
}

#[test]
fn llama3_rope_is_refused_naming_the_way_out() {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "..",
        "fixtures",
        "tiny-arch",
        "llama3rope",
        "llama3rope-f32.gguf",
    ]
    .iter()
    .collect();
    let d = ModelDesc::from_source(&GgufFile::open(&path).expect("tiny-arch fixture"))
        .expect("description");
    assert!(!d.is_plain_llama());
    // device = auto refuses the not yet GPU-verified CUDA path, naming the way out.
    let why = unverified_architecture(&d).expect("refused").to_string();
    assert!(
        why.contains("--device cpu") && why.contains("--device cuda"),
        "{why}"
    );
}
