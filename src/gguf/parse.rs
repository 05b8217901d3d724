//! The GGUF header parser: magic, version, metadata, tensor infos.
//!
//! GGUF is the first thing untrusted input reaches, so this reader checks every
//! count, length, dimension, type id and offset before using it. Allocations are
//! sized only by counts already checked against the bytes left in the file, all
//! size arithmetic is checked, and recursion (arrays of arrays) is bounded.

use std::collections::HashMap;
use std::io::Read;

use super::value::{Array, Value, ValueType};
use super::TensorInfo;
use crate::error::{echo, Error, Result};
use crate::quant::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of every tensor when the file does not
/// set `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// ggml keeps tensor names in a 64-byte buffer with a terminating NUL.
pub const MAX_TENSOR_NAME_BYTES: usize = 63;
/// Arrays of arrays deeper than this are rejected: no real file comes near it,
/// and it bounds the parser's recursion.
pub const MAX_ARRAY_NESTING: u32 = 8;
/// Bytes a tensor info takes at least: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// Bytes a metadata entry takes at least: key length, value type, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// Everything before the data section.
pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// File offset of the data section; tensor offsets are relative to it.
    pub data_offset: u64,
}

/// A reader that knows how many bytes the file has left, so that every length
/// is checked against the file before anything is allocated for it.
struct Cursor<R> {
    src: R,
    pos: u64,
    len: u64,
}

impl<R: Read> Cursor<R> {
    fn remaining(&self) -> u64 {
        self.len - self.pos
    }

    fn truncated(&self, needed: u64, what: &dyn Fn() -> String) -> Error {
        Error::format(format!(
            "file truncated at offset {}: {} needs {needed} bytes, {} left",
            self.pos,
            what(),
            self.remaining()
        ))
    }

    fn fill(&mut self, buf: &mut [u8], what: &dyn Fn() -> String) -> Result<()> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return Err(self.truncated(n, what));
        }
        self.src.read_exact(buf).map_err(|err| {
            if err.kind() == std::io::ErrorKind::UnexpectedEof {
                self.truncated(n, what)
            } else {
                Error::new(
                    crate::error::ErrorKind::Io,
                    format!("read error at offset {} ({}): {err}", self.pos, what()),
                )
            }
        })?;
        self.pos += n;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// `n` bytes into a fresh vector; `n` is checked against the file first.
    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        if n > self.remaining() {
            return Err(self.truncated(n, what));
        }
        let mut buf = Vec::new();
        buf.try_reserve_exact(n as usize).map_err(|_| {
            Error::out_of_memory(format!("cannot allocate {n} bytes for {}", what()))
        })?;
        buf.resize(n as usize, 0);
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let at = self.pos;
        let len = self.u64(&|| format!("the length of {}", what()))?;
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes)
            .map_err(|_| Error::format(format!("{} at offset {at} is not valid UTF-8", what())))
    }

    /// How many elements of `elem` an array may claim: no more than the bytes
    /// left could hold, so a hostile count cannot size an allocation.
    fn checked_count(
        &self,
        count: u64,
        min_bytes: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize> {
        match count.checked_mul(min_bytes) {
            Some(bytes) if bytes <= self.remaining() => Ok(count as usize),
            _ => Err(Error::format(format!(
                "{} claims {count} elements at offset {}, more than the {} bytes left can hold",
                what(),
                self.pos,
                self.remaining()
            ))),
        }
    }
}

fn vec_with_capacity<T>(n: usize, what: &dyn Fn() -> String) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        Error::out_of_memory(format!("cannot allocate {n} elements for {}", what()))
    })?;
    Ok(v)
}

fn read_value_type<R: Read>(cur: &mut Cursor<R>, what: &dyn Fn() -> String) -> Result<ValueType> {
    let at = cur.pos;
    let id = cur.u32(&|| format!("the value type of {}", what()))?;
    ValueType::from_id(id).ok_or_else(|| {
        Error::format(format!(
            "{} has unknown value type {id} at offset {at}",
            what()
        ))
    })
}

fn read_value<R: Read>(
    cur: &mut Cursor<R>,
    ty: ValueType,
    what: &dyn Fn() -> String,
) -> Result<Value> {
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(cur.array(what)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(cur.array(what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(cur.array(what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(cur.array(what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(cur.array(what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(cur.array(what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(cur.array(what)?)),
        ValueType::Bool => Value::Bool(read_bool(cur, what)?),
        ValueType::String => Value::String(cur.string(what)?),
        ValueType::Array => Value::Array(read_array(cur, 1, what)?),
        ValueType::U64 => Value::U64(u64::from_le_bytes(cur.array(what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(cur.array(what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(cur.array(what)?)),
    })
}

fn read_bool<R: Read>(cur: &mut Cursor<R>, what: &dyn Fn() -> String) -> Result<bool> {
    let at = cur.pos;
    match cur.array::<1>(what)?[0] {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(Error::format(format!(
            "{} at offset {at} is a bool with byte value {other} (must be 0 or 1)",
            what()
        ))),
    }
}

/// Reads `count` fixed-size elements with `decode`, the count already checked.
fn read_fixed<R: Read, T, const N: usize>(
    cur: &mut Cursor<R>,
    count: usize,
    decode: fn([u8; N]) -> T,
    what: &dyn Fn() -> String,
) -> Result<Vec<T>> {
    let mut v = vec_with_capacity(count, what)?;
    for _ in 0..count {
        v.push(decode(cur.array(what)?));
    }
    Ok(v)
}

fn read_array<R: Read>(
    cur: &mut Cursor<R>,
    depth: u32,
    what: &dyn Fn() -> String,
) -> Result<Array> {
    if depth > MAX_ARRAY_NESTING {
        return Err(Error::format(format!(
            "{} nests arrays deeper than {MAX_ARRAY_NESTING} levels at offset {}",
            what(),
            cur.pos
        )));
    }
    let elem = read_value_type(cur, &|| format!("the elements of {}", what()))?;
    let count = cur.u64(&|| format!("the element count of {}", what()))?;
    let n = cur.checked_count(count, elem.min_encoded_bytes(), what)?;
    Ok(match elem {
        ValueType::U8 => Array::U8(read_fixed(cur, n, u8::from_le_bytes, what)?),
        ValueType::I8 => Array::I8(read_fixed(cur, n, i8::from_le_bytes, what)?),
        ValueType::U16 => Array::U16(read_fixed(cur, n, u16::from_le_bytes, what)?),
        ValueType::I16 => Array::I16(read_fixed(cur, n, i16::from_le_bytes, what)?),
        ValueType::U32 => Array::U32(read_fixed(cur, n, u32::from_le_bytes, what)?),
        ValueType::I32 => Array::I32(read_fixed(cur, n, i32::from_le_bytes, what)?),
        ValueType::F32 => Array::F32(read_fixed(cur, n, f32::from_le_bytes, what)?),
        ValueType::U64 => Array::U64(read_fixed(cur, n, u64::from_le_bytes, what)?),
        ValueType::I64 => Array::I64(read_fixed(cur, n, i64::from_le_bytes, what)?),
        ValueType::F64 => Array::F64(read_fixed(cur, n, f64::from_le_bytes, what)?),
        ValueType::Bool => {
            let mut v = vec_with_capacity(n, what)?;
            for i in 0..n {
                v.push(read_bool(cur, &|| format!("element {i} of {}", what()))?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = vec_with_capacity(n, what)?;
            for i in 0..n {
                v.push(cur.string(&|| format!("element {i} of {}", what()))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = vec_with_capacity(n, what)?;
            for i in 0..n {
                v.push(read_array(cur, depth + 1, &|| {
                    format!("element {i} of {}", what())
                })?);
            }
            Array::Array(v)
        }
    })
}

fn align_up(offset: u64, alignment: u64) -> Option<u64> {
    offset
        .checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

/// Parses the header of a GGUF file of `file_len` bytes read from `src`,
/// which must be positioned at the file's start.
pub fn parse_header<R: Read>(src: R, file_len: u64) -> Result<Header> {
    let mut cur = Cursor {
        src,
        pos: 0,
        len: file_len,
    };

    let magic: [u8; 4] = cur.array(&|| "the GGUF magic".into())?;
    if &magic != MAGIC {
        return Err(Error::format(format!(
            "not a GGUF file: magic bytes are {magic:02x?}, expected \"GGUF\""
        )));
    }
    let version = cur.u32(&|| "the GGUF version".into())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(Error::unsupported(
                "GGUF version 1 is not supported (only v2 and v3); re-convert the model with a current llama.cpp",
            ))
        }
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(Error::unsupported(
                "big-endian GGUF files are not supported; use the little-endian file",
            ))
        }
        v => return Err(Error::format(format!("unknown GGUF version {v} (expected 2 or 3)"))),
    }
    let tensor_count = cur.u64(&|| "the tensor count".into())?;
    let kv_count = cur.u64(&|| "the metadata entry count".into())?;
    let n_kv = cur.checked_count(kv_count, MIN_KV_BYTES, &|| "the metadata section".into())?;
    // Tensor infos follow the metadata, so this bound is loose but still caps
    // the allocation by the file's size.
    let n_tensors = cur.checked_count(tensor_count, MIN_TENSOR_INFO_BYTES, &|| {
        "the tensor info section".into()
    })?;

    let mut metadata = vec_with_capacity(n_kv, &|| "the metadata".into())?;
    let mut seen_keys: HashMap<String, usize> = HashMap::new();
    for i in 0..n_kv {
        let key = cur.string(&|| format!("the key of metadata entry {i}"))?;
        if key.is_empty() {
            return Err(Error::format(format!(
                "metadata entry {i} has an empty key"
            )));
        }
        if seen_keys.contains_key(&key) {
            return Err(Error::format(format!(
                "duplicate metadata key '{}' (entry {i})",
                echo(&key)
            )));
        }
        let what = || format!("metadata key '{}'", echo(&key));
        let ty = read_value_type(&mut cur, &what)?;
        let value = read_value(&mut cur, ty, &what)?;
        seen_keys.insert(key.clone(), i);
        metadata.push((key, value));
    }

    let alignment = match seen_keys.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(Value::U32(a)) => {
            return Err(Error::format(format!(
                "metadata key 'general.alignment' = {a} is not a power of two"
            )))
        }
        Some(other) => {
            return Err(Error::format(format!(
                "metadata key 'general.alignment' has type {}, expected u32",
                other.type_description()
            )))
        }
    };

    let mut tensors: Vec<TensorInfo> = vec_with_capacity(n_tensors, &|| "the tensor infos".into())?;
    let mut seen_names: HashMap<String, usize> = HashMap::new();
    for i in 0..n_tensors {
        let info = read_tensor_info(&mut cur, i, alignment)?;
        if let Some(&first) = seen_names.get(&info.name) {
            return Err(Error::format(format!(
                "duplicate tensor name '{}' (tensor infos {first} and {i})",
                info.name
            )));
        }
        seen_names.insert(info.name.clone(), i);
        tensors.push(info);
    }

    let data_offset = align_up(cur.pos, alignment)
        .ok_or_else(|| Error::format("data section offset overflows"))?;
    check_tensor_ranges(&tensors, data_offset, file_len)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_tensor_info<R: Read>(
    cur: &mut Cursor<R>,
    index: usize,
    alignment: u64,
) -> Result<TensorInfo> {
    let name = cur.string(&|| format!("the name of tensor {index}"))?;
    if name.is_empty() || name.len() > MAX_TENSOR_NAME_BYTES {
        return Err(Error::format(format!(
            "tensor {index} has a name of {} bytes (must be 1..={MAX_TENSOR_NAME_BYTES})",
            name.len()
        )));
    }
    let what = || format!("tensor '{name}'");
    let n_dims = cur.u32(&|| format!("the dimension count of {}", what()))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(Error::format(format!(
            "{} has {n_dims} dimensions (must be 1..={MAX_DIMS})",
            what()
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(cur.u64(&|| format!("dimension {d} of {}", what()))?);
    }
    let type_at = cur.pos;
    let type_id = cur.u32(&|| format!("the type of {}", what()))?;
    let offset = cur.u64(&|| format!("the data offset of {}", what()))?;

    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
        Error::format(format!(
            "{} has unknown tensor type id {type_id} at offset {type_at}",
            what()
        ))
    })?;
    // ggml counts elements in int64_t: each dimension and their product must fit.
    let mut elements: u64 = 1;
    for (d, &n) in dims.iter().enumerate() {
        if n == 0 || n > i64::MAX as u64 {
            return Err(Error::format(format!("{} has dimension {d} = {n}", what())));
        }
        elements = elements
            .checked_mul(n)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| {
                Error::format(format!("{} has {dims:?} elements, which overflows", what()))
            })?;
    }
    let row_bytes = ggml_type.row_bytes(dims[0]).ok_or_else(|| {
        Error::format(format!(
            "{} has rows of {} values, not a multiple of the {}-value blocks of {ggml_type}",
            what(),
            dims[0],
            ggml_type.block_elements()
        ))
    })?;
    let n_bytes = row_bytes
        .checked_mul(elements / dims[0])
        .ok_or_else(|| Error::format(format!("the byte size of {} overflows", what())))?;
    if offset % alignment != 0 {
        return Err(Error::format(format!(
            "{} has data offset {offset}, not a multiple of the alignment {alignment}",
            what()
        )));
    }
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    })
}

/// Every tensor's bytes lie inside the file and no two tensors overlap.
fn check_tensor_ranges(tensors: &[TensorInfo], data_offset: u64, file_len: u64) -> Result<()> {
    if tensors.is_empty() {
        return Ok(());
    }
    let data_len = file_len.checked_sub(data_offset).ok_or_else(|| {
        Error::format(format!(
            "file truncated: the data section starts at offset {data_offset}, past the end of the {file_len}-byte file"
        ))
    })?;
    for t in tensors {
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|end| end > data_len) {
            return Err(Error::format(format!(
                "tensor '{}' ({} bytes at data offset {}) extends past the end of the file (data section holds {data_len} bytes)",
                t.name, t.n_bytes, t.offset
            )));
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].n_bytes > pair[1].offset {
            return Err(Error::format(format!(
                "tensors '{}' and '{}' overlap (data offsets {} and {})",
                pair[0].name, pair[1].name, pair[0].offset, pair[1].offset
            )));
        }
    }
    Ok(())
}
