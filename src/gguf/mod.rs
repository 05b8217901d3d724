//! GGUF files: the header (metadata and tensor infos) parsed and checked, and
//! the tensor data viewed in place from a memory map or read into memory.
//!
//! Format reference: ggml's `docs/gguf.md`. Versions 2 and 3 (little-endian)
//! are read; both use 64-bit counts and lengths.

mod parse;
mod storage;
mod value;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

pub use parse::{DEFAULT_ALIGNMENT, MAX_ARRAY_NESTING, MAX_DIMS, MAX_TENSOR_NAME_BYTES};
pub use storage::{AlignedBytes, TensorData};
pub use value::{Array, Entry, Value, ValueType};

use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// One tensor's description from the file's tensor info section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the length of a row (the contiguous dimension).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset inside the data section; a multiple of the file's alignment.
    pub offset: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// How to read a file: map it or copy it, and whether tensor data is wanted.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    pub use_mmap: bool,
    /// False reads the header alone (metadata and tensor infos).
    pub load_data: bool,
}

/// A parsed GGUF file.
pub struct GgufFile {
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    file_size: u64,
    data: Option<TensorData>,
}

impl GgufFile {
    /// Opens and checks the GGUF file at `path`.
    /// A path that is not a regular file (a directory, a FIFO, a device) is
    /// an I/O error, found before the file is opened: opening a FIFO would
    /// wait for a writer, and opening a device can have effects.
    pub fn open(path: &Path, options: ReadOptions) -> Result<GgufFile> {
        let stat = std::fs::metadata(path).map_err(|e| Error::io("cannot open", e))?;
        check_regular(&stat)?;
        let file = open_nonblocking(path).map_err(|e| Error::io("cannot open", e))?;
        // The path may have been replaced between the check and the open.
        let stat = file.metadata().map_err(|e| Error::io("cannot stat", e))?;
        check_regular(&stat)?;
        let file_size = stat.len();
        if file_size == 0 {
            return Err(Error::format("the file is empty"));
        }
        if options.use_mmap {
            // SAFETY: the map is read-only and private to this process. Like
            // every mmap-based model loader (llama.cpp included), this relies on
            // the file not being truncated or rewritten while it is loaded;
            // the host owns that file.
            let map =
                unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io("cannot mmap", e))?;
            let header = parse::parse_header(&map[..], file_size)?;
            // A file without tensors may end before its (aligned) data offset.
            let data = options.load_data.then(|| TensorData::Mapped {
                map,
                data_offset: header.data_offset.min(file_size) as usize,
            });
            Ok(Self::assemble(header, file_size, data))
        } else {
            let mut reader = BufReader::with_capacity(1 << 20, file);
            let header = parse::parse_header(&mut reader, file_size)?;
            let data = if options.load_data {
                let mut file = reader.into_inner();
                let start = header.data_offset.min(file_size);
                file.seek(SeekFrom::Start(start))
                    .map_err(|e| Error::io("cannot seek to the data section", e))?;
                let len = file_size - start;
                let mut bytes = allocate(len)?;
                file.read_exact(bytes.as_mut_slice())
                    .map_err(|e| Error::io("cannot read the tensor data", e))?;
                Some(TensorData::Owned(bytes))
            } else {
                None
            };
            Ok(Self::assemble(header, file_size, data))
        }
    }

    /// Parses a GGUF file held in memory (tests, fuzzing, embedded models),
    /// copying its data section.
    pub fn from_bytes(bytes: &[u8]) -> Result<GgufFile> {
        let file_size = bytes.len() as u64;
        let header = parse::parse_header(bytes, file_size)?;
        let data_bytes = bytes.get(header.data_offset as usize..).unwrap_or(&[]);
        let mut data = allocate(data_bytes.len() as u64)?;
        data.as_mut_slice().copy_from_slice(data_bytes);
        Ok(Self::assemble(
            header,
            file_size,
            Some(TensorData::Owned(data)),
        ))
    }

    fn assemble(header: parse::Header, file_size: u64, data: Option<TensorData>) -> GgufFile {
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        GgufFile {
            version: header.version,
            metadata: header.metadata,
            key_index,
            tensors: header.tensors,
            tensor_index,
            alignment: header.alignment,
            data_offset: header.data_offset,
            file_size,
            data,
        }
    }

    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> impl Iterator<Item = Entry<'_>> {
        self.metadata
            .iter()
            .map(|(key, value)| Entry { key, value })
    }

    pub fn get(&self, key: &str) -> Option<Entry<'_>> {
        self.key_index.get(key).map(|&i| {
            let (key, value) = &self.metadata[i];
            Entry { key, value }
        })
    }

    /// The entry for `key`, or a format error naming the missing key.
    pub fn require(&self, key: &str) -> Result<Entry<'_>> {
        self.get(key)
            .ok_or_else(|| Error::format(format!("missing metadata key '{key}'")))
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor data section, when it was loaded.
    pub fn data(&self) -> Option<&TensorData> {
        self.data.as_ref()
    }

    /// The bytes of `tensor`, when the data section was loaded and holds its
    /// range (the parser checked this for the file's own tensor infos).
    pub fn tensor_bytes(&self, tensor: &TensorInfo) -> Option<&[u8]> {
        let data = self.data.as_ref()?.bytes();
        let start = usize::try_from(tensor.offset).ok()?;
        let end = start.checked_add(usize::try_from(tensor.n_bytes).ok()?)?;
        data.get(start..end)
    }
}

fn check_regular(stat: &std::fs::Metadata) -> Result<()> {
    if stat.is_file() {
        return Ok(());
    }
    let ty = stat.file_type();
    let what = if ty.is_dir() {
        "a directory"
    } else {
        file_type_name(&ty)
    };
    Err(Error::new(
        crate::error::ErrorKind::Io,
        format!("not a regular file ({what})"),
    ))
}

#[cfg(unix)]
fn file_type_name(ty: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ty.is_fifo() {
        "a FIFO"
    } else if ty.is_socket() {
        "a socket"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else {
        "an unknown kind of file"
    }
}

#[cfg(not(unix))]
fn file_type_name(_: &std::fs::FileType) -> &'static str {
    "an unknown kind of file"
}

/// Opens `path` for reading without waiting: should it have become a FIFO
/// since it was checked, the open returns at once (and the check after it
/// fails) instead of blocking until a writer comes. For a regular file
/// O_NONBLOCK changes nothing.
#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

fn allocate(len: u64) -> Result<AlignedBytes> {
    usize::try_from(len)
        .ok()
        .and_then(AlignedBytes::zeroed)
        .ok_or_else(|| {
            Error::out_of_memory(format!("cannot allocate {len} bytes for the tensor data"))
        })
}
