//! A small GGUF writer for tests: valid files of any shape, and the byte layout
//! of each section so that tests can corrupt exactly one field.
//!
//! Written from the GGUF specification (ggml `docs/gguf.md`), independently of
//! the library's reader.

/// Value type ids from the GGUF specification.
pub mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type ids used by the tests.
pub mod tt {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const IQ2_XXS: u32 = 16;
    pub const BF16: u32 = 30;
}

/// A metadata value as it will be encoded.
#[derive(Clone, Debug)]
pub enum Meta {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// Element type id and elements (all of that type; arrays may nest).
    Array(u32, Vec<Meta>),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Any type id followed by any payload bytes, for malformed values.
    Raw(u32, Vec<u8>),
}

impl Meta {
    pub fn str(s: &str) -> Meta {
        Meta::Str(s.to_string())
    }
    pub fn strings(items: &[&str]) -> Meta {
        Meta::Array(vt::STRING, items.iter().map(|s| Meta::str(s)).collect())
    }

    pub fn type_id(&self) -> u32 {
        match self {
            Meta::U8(_) => vt::U8,
            Meta::I8(_) => vt::I8,
            Meta::U16(_) => vt::U16,
            Meta::I16(_) => vt::I16,
            Meta::U32(_) => vt::U32,
            Meta::I32(_) => vt::I32,
            Meta::F32(_) => vt::F32,
            Meta::Bool(_) => vt::BOOL,
            Meta::Str(_) => vt::STRING,
            Meta::Array(..) => vt::ARRAY,
            Meta::U64(_) => vt::U64,
            Meta::I64(_) => vt::I64,
            Meta::F64(_) => vt::F64,
            Meta::Raw(id, _) => *id,
        }
    }

    /// The value's bytes, without its type id.
    fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Meta::U8(v) => out.extend(v.to_le_bytes()),
            Meta::I8(v) => out.extend(v.to_le_bytes()),
            Meta::U16(v) => out.extend(v.to_le_bytes()),
            Meta::I16(v) => out.extend(v.to_le_bytes()),
            Meta::U32(v) => out.extend(v.to_le_bytes()),
            Meta::I32(v) => out.extend(v.to_le_bytes()),
            Meta::F32(v) => out.extend(v.to_le_bytes()),
            Meta::Bool(v) => out.push(*v as u8),
            Meta::Str(s) => put_str(out, s),
            Meta::Array(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                // Elements carry no type id; nested arrays carry their own
                // element type and count.
                for item in items {
                    item.encode_payload(out);
                }
            }
            Meta::U64(v) => out.extend(v.to_le_bytes()),
            Meta::I64(v) => out.extend(v.to_le_bytes()),
            Meta::F64(v) => out.extend(v.to_le_bytes()),
            Meta::Raw(_, payload) => out.extend(payload),
        }
    }
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A tensor to write: its info fields and its data bytes.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
    /// Written instead of the computed data offset when set.
    pub offset_override: Option<u64>,
}

/// Where each part of a written file starts.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Offset of each metadata entry (its key length field).
    pub kv_at: Vec<usize>,
    /// Offset of each metadata entry's value type field.
    pub kv_type_at: Vec<usize>,
    /// Offset of each tensor info (its name length field).
    pub tensor_info_at: Vec<usize>,
    /// Offset of each tensor info's type id field (the offset field follows it).
    pub tensor_type_at: Vec<usize>,
    /// Offset of each tensor info's n_dims field (the dims follow it).
    pub tensor_ndims_at: Vec<usize>,
    /// Start of the data section.
    pub data_at: usize,
}

/// Offsets of the fixed header fields.
pub const VERSION_AT: usize = 4;
pub const TENSOR_COUNT_AT: usize = 8;
pub const KV_COUNT_AT: usize = 16;

#[derive(Clone, Debug)]
pub struct GgufWriter {
    pub version: u32,
    /// Alignment used to place tensors; write `general.alignment` yourself to
    /// change the file's declared alignment.
    pub alignment: u64,
    pub kvs: Vec<(String, Meta)>,
    pub tensors: Vec<Tensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a metadata entry (replacing keeps its position).
    pub fn kv(mut self, key: &str, value: Meta) -> Self {
        self.set_kv(key, value);
        self
    }

    pub fn set_kv(&mut self, key: &str, value: Meta) {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.kvs.push((key.to_string(), value)),
        }
    }

    pub fn remove_kv(&mut self, key: &str) {
        let before = self.kvs.len();
        self.kvs.retain(|(k, _)| k != key);
        assert_ne!(before, self.kvs.len(), "no metadata key {key}");
    }

    /// Adds a tensor whose data is `data` (its length is not checked, so tests
    /// can write wrong sizes).
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            type_id,
            data,
            offset_override: None,
        });
        self
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut Tensor {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    pub fn remove_tensor(&mut self, name: &str) {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        assert_ne!(before, self.tensors.len(), "no tensor {name}");
    }

    /// The file's bytes and where each part lies.
    pub fn build_with_layout(&self) -> (Vec<u8>, Layout) {
        let mut out = Vec::new();
        let mut layout = Layout::default();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            layout.kv_at.push(out.len());
            put_str(&mut out, key);
            layout.kv_type_at.push(out.len());
            out.extend(value.type_id().to_le_bytes());
            value.encode_payload(&mut out);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        for (t, &computed) in self.tensors.iter().zip(&offsets) {
            layout.tensor_info_at.push(out.len());
            put_str(&mut out, &t.name);
            layout.tensor_ndims_at.push(out.len());
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            layout.tensor_type_at.push(out.len());
            out.extend(t.type_id.to_le_bytes());
            out.extend(t.offset_override.unwrap_or(computed).to_le_bytes());
        }
        let data_at = (out.len() as u64).div_ceil(self.alignment) * self.alignment;
        layout.data_at = data_at as usize;
        if !self.tensors.is_empty() {
            out.resize(layout.data_at, 0);
            for (t, &at) in self.tensors.iter().zip(&offsets) {
                out.resize(layout.data_at + at as usize, 0);
                out.extend(&t.data);
            }
        }
        (out, layout)
    }

    pub fn build(&self) -> Vec<u8> {
        self.build_with_layout().0
    }
}

/// `n` f32 values, deterministic and distinct, as little-endian bytes.
pub fn f32_bytes(n: u64, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            (((i as u32).wrapping_mul(2654435761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
                .to_le_bytes()
        })
        .collect()
}
