//! Model files: a GGUF file ([`gguf()`]) and the files of a Hugging Face folder ([`model_files()`]),
//! opened from disk as the worker opens them ([`model_files::open`]) and read on as far as the
//! worker's load path goes without a backend: the tokenizer metadata, the model description and
//! its checks, every weight the description needs, and every tensor dequantized.
//!
//! Properties: no panic; a file is either refused with a typed error ([`gguf::GgufError`],
//! [`model_files::ModelFileError`], [`model_desc::ArchError`]) or every tensor it lists can be read.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use gguf::{GgufFile, TokenizerMetadata};
use model_desc::{ArchError, ModelDesc, ModelWeights};

/// `gguf`: `data` as a GGUF file: header, metadata, tensor table, then the worker's reading of it.
pub fn gguf(data: &[u8]) {
    let path = scratch().join("model.gguf");
    std::fs::write(&path, data).expect("the scratch file is written");
    if let Ok(file) = model_files::open(&path) {
        read_model(&file);
    }
}

/// The files of the Hugging Face folder [`model_files()`] replaces one of, by the input's first byte
/// (modulo their number); the others are the tiny Qwen2 fixture's (`fixtures/tiny-arch/qwen2/hf-bf16`).
const FOLDER_FILES: [&str; 6] = [
    "config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "tokenizer.json",
];

/// `model-files`: a Hugging Face folder in which one file (chosen by the first byte, see
/// [`FOLDER_FILES`]) holds the rest of `data`; the others are the tiny Qwen2 fixture's. For
/// `tokenizer.json` the fixture's `tokenizer.model` is left out (it would take precedence); for the
/// index, the fixture's `model.safetensors` stays as the shard it may name.
pub fn model_files(data: &[u8]) {
    let Some((&which, content)) = data.split_first() else {
        return;
    };
    let name = FOLDER_FILES[which as usize % FOLDER_FILES.len()];
    let dir = scratch().join("hf-folder");
    lay_out_fixture(&dir);
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, content).expect("the scratch file is written");
    if name == "tokenizer.json" {
        std::fs::remove_file(dir.join("tokenizer.model")).expect("the link is removed");
    }
    if let Ok(file) = model_files::open(&dir) {
        read_model(&file);
    }
}

/// Reads what the worker reads of an opened model: tokenizer metadata, the description (and its
/// checks), every weight the description needs, and every tensor's values.
fn read_model(file: &GgufFile) {
    let _ = TokenizerMetadata::from_gguf(file);
    let _ = model_files::sampling::recommended_sampling(file.path(), file);
    for info in file.tensors() {
        let Ok(data) = file.tensor_data(info) else {
            continue;
        };
        let n = usize::try_from(info.n_elements()).expect("a tensor in the file fits memory");
        let _ = gguf::dequantize_to_vec(info.dtype, data.bytes(), n);
    }
    let Ok(desc) = ModelDesc::from_source(file) else {
        return;
    };
    if desc.validate().is_err() {
        return;
    }
    let _ = ModelWeights::load(file, &desc, |m| Ok::<_, ArchError>(m.rows * m.cols));
}

/// A scratch folder of this process (and thread), made once.
fn scratch() -> PathBuf {
    thread_local! {
        static SCRATCH: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
    }
    SCRATCH.with(|cell| {
        cell.borrow_mut()
            .get_or_insert_with(|| {
                let thread = format!("{:?}", std::thread::current().id())
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "");
                let dir = std::env::temp_dir()
                    .join(format!("fuzz-model-files-{}-{thread}", std::process::id()));
                std::fs::create_dir_all(&dir).expect("the scratch folder is made");
                dir
            })
            .clone()
    })
}

/// The fixture folder [`model_files()`] starts from.
fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-arch/qwen2/hf-bf16")
}

/// Makes `dir` the fixture folder again: a link to each fixture file, nothing else.
fn lay_out_fixture(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("the folder is made");
    for entry in std::fs::read_dir(fixture()).expect("the fixture folder is readable") {
        let entry = entry.expect("a fixture file");
        std::os::unix::fs::symlink(entry.path(), dir.join(entry.file_name()))
            .expect("the fixture file is linked");
    }
}
