//! GGUF metadata values (`gguf_type` in llama.cpp's `gguf.h`).
//!
//! Value type ids: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool,
//! 8 string, 9 array, 10 u64, 11 i64, 12 f64 (GGUF specification,
//! `docs/gguf.md` in the ggml repository).

/// The type tag of a metadata value as stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// Id 0.
    U8,
    /// Id 1.
    I8,
    /// Id 2.
    U16,
    /// Id 3.
    I16,
    /// Id 4.
    U32,
    /// Id 5.
    I32,
    /// Id 6.
    F32,
    /// Id 7 (one byte, 0 or 1).
    Bool,
    /// Id 8 (u64 byte length + UTF-8 bytes, no terminator).
    String,
    /// Id 9 (u32 element type + u64 count + elements).
    Array,
    /// Id 10.
    U64,
    /// Id 11.
    I64,
    /// Id 12.
    F64,
}

impl ValueType {
    /// Maps a raw id to a type; `None` for unknown ids.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The raw id written in the file.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// Minimum encoded size in bytes of one value of this type (used to
    /// reject absurd array lengths before allocating).
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

/// A typed metadata array. Arrays are homogeneous in GGUF, so each variant
/// holds a vector of one element type (arrays of arrays are allowed).
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataArray {
    /// Array of u8.
    U8(Vec<u8>),
    /// Array of i8.
    I8(Vec<i8>),
    /// Array of u16.
    U16(Vec<u16>),
    /// Array of i16.
    I16(Vec<i16>),
    /// Array of u32.
    U32(Vec<u32>),
    /// Array of i32.
    I32(Vec<i32>),
    /// Array of f32.
    F32(Vec<f32>),
    /// Array of bool.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of arrays.
    Array(Vec<MetadataArray>),
    /// Array of u64.
    U64(Vec<u64>),
    /// Array of i64.
    I64(Vec<i64>),
    /// Array of f64.
    F64(Vec<f64>),
}

impl MetadataArray {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            MetadataArray::U8(_) => ValueType::U8,
            MetadataArray::I8(_) => ValueType::I8,
            MetadataArray::U16(_) => ValueType::U16,
            MetadataArray::I16(_) => ValueType::I16,
            MetadataArray::U32(_) => ValueType::U32,
            MetadataArray::I32(_) => ValueType::I32,
            MetadataArray::F32(_) => ValueType::F32,
            MetadataArray::Bool(_) => ValueType::Bool,
            MetadataArray::String(_) => ValueType::String,
            MetadataArray::Array(_) => ValueType::Array,
            MetadataArray::U64(_) => ValueType::U64,
            MetadataArray::I64(_) => ValueType::I64,
            MetadataArray::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Converts an integer array of any integer element type to `i64`s;
    /// `None` for non-integer arrays or u64 values above `i64::MAX`.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy + Into<i64>>(v: &[T]) -> Vec<i64> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            MetadataArray::U8(v) => conv(v),
            MetadataArray::I8(v) => conv(v),
            MetadataArray::U16(v) => conv(v),
            MetadataArray::I16(v) => conv(v),
            MetadataArray::U32(v) => conv(v),
            MetadataArray::I32(v) => conv(v),
            MetadataArray::I64(v) => v.clone(),
            MetadataArray::U64(v) => v
                .iter()
                .map(|&x| i64::try_from(x).ok())
                .collect::<Option<Vec<_>>>()?,
            _ => return None,
        })
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    /// u8.
    U8(u8),
    /// i8.
    I8(i8),
    /// u16.
    U16(u16),
    /// i16.
    I16(i16),
    /// u32.
    U32(u32),
    /// i32.
    I32(i32),
    /// f32.
    F32(f32),
    /// bool.
    Bool(bool),
    /// UTF-8 string (invalid UTF-8 in a file is replaced with U+FFFD).
    String(String),
    /// Homogeneous array.
    Array(MetadataArray),
    /// u64.
    U64(u64),
    /// i64.
    I64(i64),
    /// f64.
    F64(f64),
}

impl MetadataValue {
    /// The stored type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// The value as an `i128` if it is of any integer type (wide enough for
    /// every GGUF integer without loss).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as an `f64` if it is a float (f32/f64) or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => self.as_integer().map(|i| i as f64),
        }
    }

    /// A short description for error messages, e.g. `u32 7` or `array of 3 string`.
    pub fn describe(&self) -> String {
        match self {
            MetadataValue::String(s) if s.len() > 40 => format!("string of {} bytes", s.len()),
            MetadataValue::String(s) => format!("string {s:?}"),
            MetadataValue::Array(a) => format!("array of {} {:?}", a.len(), a.elem_type()),
            MetadataValue::Bool(b) => format!("bool {b}"),
            MetadataValue::F32(v) => format!("f32 {v}"),
            MetadataValue::F64(v) => format!("f64 {v}"),
            other => format!(
                "{:?} {}",
                other.value_type(),
                other.as_integer().unwrap_or_default()
            ),
        }
    }
}
