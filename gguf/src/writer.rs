//! A small GGUF v3 writer, used to build test models.
//!
//! Writes the layout described in [`crate::reader`]: header, metadata,
//! tensor infos, padding to the alignment, then each tensor's data padded to
//! the alignment (`general.alignment` if set as an integer, else 32).

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::metadata::{MetadataArray, MetadataValue};
use crate::quant::{encode_f32, quantize_f16, quantize_q4_1, quantize_q8_0};
use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::GgmlType;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    dtype: GgmlType,
    data: Vec<u8>,
}

/// Accumulates metadata and tensors in memory, then writes a GGUF v3 file.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, replacing an earlier value for the same key.
    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        if let Some(slot) = self.metadata.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
        } else {
            self.metadata.push((key.to_string(), value));
        }
        self
    }

    /// Sets a u32 value.
    pub fn add_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.add_metadata(key, MetadataValue::U32(v))
    }

    /// Sets a u64 value.
    pub fn add_u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.add_metadata(key, MetadataValue::U64(v))
    }

    /// Sets an i32 value.
    pub fn add_i32(&mut self, key: &str, v: i32) -> &mut Self {
        self.add_metadata(key, MetadataValue::I32(v))
    }

    /// Sets an f32 value.
    pub fn add_f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.add_metadata(key, MetadataValue::F32(v))
    }

    /// Sets a bool value.
    pub fn add_bool(&mut self, key: &str, v: bool) -> &mut Self {
        self.add_metadata(key, MetadataValue::Bool(v))
    }

    /// Sets a string value.
    pub fn add_string(&mut self, key: &str, v: &str) -> &mut Self {
        self.add_metadata(key, MetadataValue::String(v.to_string()))
    }

    /// Sets an array-of-strings value.
    pub fn add_str_array<S: AsRef<str>>(&mut self, key: &str, v: &[S]) -> &mut Self {
        let v = v.iter().map(|s| s.as_ref().to_string()).collect();
        self.add_metadata(key, MetadataValue::Array(MetadataArray::String(v)))
    }

    /// Sets an array-of-i32 value.
    pub fn add_i32_array(&mut self, key: &str, v: &[i32]) -> &mut Self {
        self.add_metadata(key, MetadataValue::Array(MetadataArray::I32(v.to_vec())))
    }

    /// Sets an array-of-f32 value.
    pub fn add_f32_array(&mut self, key: &str, v: &[f32]) -> &mut Self {
        self.add_metadata(key, MetadataValue::Array(MetadataArray::F32(v.to_vec())))
    }

    /// Adds a tensor from already-encoded bytes. `dims` is in GGUF order
    /// (`dims[0]` = row length).
    /// Errors: `UnsupportedType`, `SizeMismatch` if `data` is not the encoded
    /// size of `dims`, `Malformed`-style `SizeMismatch` on duplicate names.
    pub fn add_tensor_raw(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let n: u64 = dims.iter().product();
        if dtype.block_size().is_none() {
            return Err(GgufError::UnsupportedType(dtype));
        }
        let size = dtype.byte_size(n).ok_or_else(|| {
            GgufError::SizeMismatch(format!(
                "tensor `{name}`: {n} elements is not a whole number of {dtype} blocks"
            ))
        })?;
        if size != data.len() as u64 {
            return Err(GgufError::SizeMismatch(format!(
                "tensor `{name}`: {n} {dtype} elements need {size} bytes, got {}",
                data.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::SizeMismatch(format!(
                "tensor `{name}` added twice"
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            dtype,
            data,
        });
        Ok(self)
    }

    /// Adds a tensor from f32 values, encoding them as `dtype`
    /// (F32, F16, Q8_0 or Q4_1). `values.len()` must equal the product of `dims`.
    /// Errors: `UnsupportedType` for other types, `SizeMismatch` for bad sizes.
    pub fn add_tensor_f32(
        &mut self,
        name: &str,
        dims: &[u64],
        dtype: GgmlType,
        values: &[f32],
    ) -> Result<&mut Self> {
        let n: u64 = dims.iter().product();
        if n != values.len() as u64 {
            return Err(GgufError::SizeMismatch(format!(
                "tensor `{name}`: dims {dims:?} hold {n} elements, got {} values",
                values.len()
            )));
        }
        let data = match dtype {
            GgmlType::F32 => encode_f32(values),
            GgmlType::F16 => quantize_f16(values),
            GgmlType::Q8_0 => quantize_q8_0(values)?,
            GgmlType::Q4_1 => quantize_q4_1(values)?,
            other => return Err(GgufError::UnsupportedType(other)),
        };
        self.add_tensor_raw(name, dims, dtype, data)
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_integer())
            .and_then(|a| u64::try_from(a).ok())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Serializes the whole file into `w`.
    /// Errors: I/O errors are reported as `Io` with an empty path.
    pub fn write_to<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
        let align = self.alignment();
        let mut buf = Vec::new();
        buf.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        buf.extend_from_slice(&3u32.to_le_bytes());
        buf.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        buf.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut buf, k);
            buf.extend_from_slice(&v.value_type().id().to_le_bytes());
            write_value(&mut buf, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_str(&mut buf, &t.name);
            buf.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                buf.extend_from_slice(&d.to_le_bytes());
            }
            buf.extend_from_slice(&t.dtype.id().to_le_bytes());
            buf.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).div_ceil(align) * align;
        }
        let pad = |p: u64| (p.div_ceil(align) * align - p) as usize;
        let zeros = vec![0u8; align as usize];
        w.write_all(&buf)?;
        w.write_all(&zeros[..pad(buf.len() as u64)])?;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            w.write_all(&zeros[..pad(t.data.len() as u64)])?;
        }
        Ok(())
    }

    /// Writes the file to `path` (created or truncated).
    /// Errors: [`GgufError::Io`] naming `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = BufWriter::new(file);
        self.write_to(&mut w).map_err(io)?;
        w.flush().map_err(io)
    }
}

fn write_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn write_value(buf: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        MetadataValue::U8(x) => buf.push(*x),
        MetadataValue::I8(x) => buf.push(*x as u8),
        MetadataValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => buf.push(*x as u8),
        MetadataValue::String(s) => write_str(buf, s),
        MetadataValue::Array(a) => write_array(buf, a),
        MetadataValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

fn write_array(buf: &mut Vec<u8>, a: &MetadataArray) {
    buf.extend_from_slice(&a.elem_type().id().to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        MetadataArray::U8(v) => buf.extend_from_slice(v),
        MetadataArray::I8(v) => buf.extend(v.iter().map(|&x| x as u8)),
        MetadataArray::U16(v) => le!(v),
        MetadataArray::I16(v) => le!(v),
        MetadataArray::U32(v) => le!(v),
        MetadataArray::I32(v) => le!(v),
        MetadataArray::F32(v) => le!(v),
        MetadataArray::Bool(v) => buf.extend(v.iter().map(|&x| x as u8)),
        MetadataArray::String(v) => v.iter().for_each(|s| write_str(buf, s)),
        MetadataArray::Array(v) => v.iter().for_each(|x| write_array(buf, x)),
        MetadataArray::U64(v) => le!(v),
        MetadataArray::I64(v) => le!(v),
        MetadataArray::F64(v) => le!(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_to_vec;
    use crate::GgufFile;

    #[test]
    fn roundtrip_with_reader() {
        let dir = tempdir();
        let path = dir.join("rt.gguf");
        let mut w = GgufWriter::new();
        w.add_string("general.architecture", "llama")
            .add_u32("a.u32", 7)
            .add_metadata("a.u8", MetadataValue::U8(200))
            .add_metadata("a.i64", MetadataValue::I64(-5))
            .add_metadata("a.f64", MetadataValue::F64(0.25))
            .add_f32("a.f32", 1.5)
            .add_bool("a.bool", true)
            .add_str_array("a.strs", &["x", "Ġthe", ""])
            .add_i32_array("a.ints", &[1, -2, 3])
            .add_f32_array("a.floats", &[0.5])
            .add_metadata(
                "a.nested",
                MetadataValue::Array(MetadataArray::Array(vec![MetadataArray::U16(vec![1, 2])])),
            );
        let vals: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 10.0).collect();
        w.add_tensor_f32("t.f32", &[3], GgmlType::F32, &[1.0, 2.0, 3.0])
            .unwrap();
        w.add_tensor_f32("t.q8", &[32, 2], GgmlType::Q8_0, &vals)
            .unwrap();
        w.add_tensor_f32("t.q41", &[64], GgmlType::Q4_1, &vals)
            .unwrap();
        w.add_tensor_f32("t.f16", &[2, 2], GgmlType::F16, &[1.0, 0.5, -2.0, 4.0])
            .unwrap();
        w.write(&path).unwrap();

        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get_u32("a.u32").unwrap(), 7);
        assert_eq!(f.get_u32("a.u8").unwrap(), 200);
        assert!(f.get_u32("a.i64").is_err());
        assert_eq!(f.get_f32("a.f64").unwrap(), 0.25);
        assert_eq!(f.get_f32("a.f32").unwrap(), 1.5);
        assert!(f.get_bool("a.bool").unwrap());
        assert_eq!(f.get_str_array("a.strs").unwrap(), ["x", "Ġthe", ""]);
        assert_eq!(f.get_i32_array("a.ints").unwrap(), [1, -2, 3]);
        assert_eq!(f.get_f32_array("a.floats").unwrap(), [0.5]);
        assert!(matches!(
            f.get_u32("missing"),
            Err(GgufError::MissingKey { .. })
        ));
        assert_eq!(f.get_opt_u32("missing").unwrap(), None);
        assert!(f.get_opt_u32("a.bool").is_err());
        assert!(matches!(
            f.metadata("a.nested"),
            Some(MetadataValue::Array(MetadataArray::Array(_)))
        ));

        assert_eq!(f.tensors().len(), 4);
        for t in f.tensors() {
            assert_eq!((f.data_offset() + t.offset) % 32, 0);
        }
        let t = f.tensor("t.q8").unwrap();
        assert_eq!(t.dims, [32, 2]);
        assert_eq!(t.dtype, GgmlType::Q8_0);
        let got = dequantize_to_vec(t.dtype, f.tensor_bytes(t).unwrap(), 64).unwrap();
        for (a, b) in got.iter().zip(&vals) {
            assert!((a - b).abs() < 0.02);
        }
        let t = f.tensor("t.f16").unwrap();
        let got = dequantize_to_vec(t.dtype, f.tensor_bytes(t).unwrap(), 4).unwrap();
        assert_eq!(got, [1.0, 0.5, -2.0, 4.0]);
        let t = f.tensor("t.f32").unwrap();
        let got = dequantize_to_vec(t.dtype, f.tensor_bytes(t).unwrap(), 3).unwrap();
        assert_eq!(got, [1.0, 2.0, 3.0]);
        assert!(f.tensor("nope").is_none());
        // A tensor's shared range is its bytes in the file's mapping, and outlives the file.
        let t = f.tensor("t.q8").unwrap().clone();
        let bytes = f.tensor_bytes(&t).unwrap();
        let shared = f.tensor_mapped(&t).unwrap().unwrap();
        assert_eq!(
            (shared.as_ptr(), shared.len()),
            (bytes.as_ptr(), bytes.len())
        );
        let start = (f.data_offset() + t.offset) as usize;
        assert_eq!(shared.range(), start..start + 68);
        let data = f.tensor_data(&t).unwrap();
        assert_eq!(data.mapped().map(|m| m.range()), Some(start..start + 68));
        let copy = bytes.to_vec();
        drop(f);
        assert_eq!(&*shared, copy);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn rejects_bad_files() {
        let dir = tempdir();
        let path = dir.join("bad.gguf");
        std::fs::write(&path, b"GGML\x03\0\0\0").unwrap();
        let err = GgufFile::open(&path).unwrap_err();
        assert!(matches!(err, GgufError::BadMagic { .. }));
        assert!(err.to_string().contains("bad.gguf"));
        std::fs::write(&path, b"GGUF\x01\0\0\0").unwrap();
        assert!(matches!(
            GgufFile::open(&path),
            Err(GgufError::UnsupportedVersion { version: 1, .. })
        ));
        let mut bytes = Vec::new();
        let mut w = GgufWriter::new();
        w.add_tensor_f32("t", &[64], GgmlType::F32, &[0.0; 64])
            .unwrap();
        w.write_to(&mut bytes).unwrap();
        bytes.truncate(bytes.len() - 8);
        std::fs::write(&path, &bytes).unwrap();
        let err = GgufFile::open(&path).unwrap_err();
        assert!(matches!(err, GgufError::Malformed { .. }), "{err}");
        let err = GgufFile::open(&dir.join("absent.gguf")).unwrap_err();
        assert!(err.to_string().contains("absent.gguf"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A file shorter than the 4-byte magic says what it is (empty, or cut
    /// inside the magic), not that it holds a magic of zero.
    #[test]
    fn names_empty_and_short_files() {
        let dir = tempdir();
        let path = dir.join("short.gguf");
        std::fs::write(&path, b"").unwrap();
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}: malformed GGUF file: the file is empty (0 bytes)",
                path.display()
            )
        );
        std::fs::write(&path, b"GG").unwrap();
        let err = GgufFile::open(&path).unwrap_err().to_string();
        assert!(
            err.ends_with("truncated while reading magic at offset 0 (need 4 bytes, 2 left)"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Found by the `gguf` fuzz target (fuzz/artifacts/gguf/): dimensions whose product passes
    /// 2^64 panicked (an overflow in `TensorInfo::n_elements`) instead of refusing the file.
    #[test]
    fn refuses_dimensions_past_two_to_the_64_elements() {
        let dir = tempdir();
        let path = dir.join("huge.gguf");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"GGUF");
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes()); // one tensor
        bytes.extend_from_slice(&0u64.to_le_bytes()); // no metadata
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(b"t");
        bytes.extend_from_slice(&2u32.to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 32).to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 32).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes()); // F32
        bytes.extend_from_slice(&0u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = GgufFile::open(&path).unwrap_err();
        assert!(matches!(err, GgufError::Malformed { .. }), "{err}");
        assert!(
            err.to_string().ends_with(
                "tensor `t` has dimensions [4294967296, 4294967296], more than 2^64 elements"
            ),
            "{err}"
        );
        let info = crate::TensorInfo {
            name: "t".into(),
            dims: vec![1 << 32, 1 << 32],
            dtype: GgmlType::F32,
            offset: 0,
        };
        assert_eq!(info.n_elements(), u64::MAX);
        assert_eq!(info.byte_size(), None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempdir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gguf-writer-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
