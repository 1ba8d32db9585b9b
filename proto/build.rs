//! Compiles the .proto files with `protox` (pure Rust; no system `protoc` needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/inference/v1/generation.proto",
        "proto/inference/worker/v1/worker.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        // INVALID_ARGUMENT instead of INTERNAL for a message that does not decode (src/codec.rs).
        .codec_path("crate::codec::WireCodec")
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
