//! Reading and writing safetensors files: bytes ↔ host tensors, writes
//! that leave the file whole or absent, and each written file's SHA-256,
//! hashed from the bytes as they go out (a checkpoint's manifest keeps it).

use super::CheckpointError;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use zeroplan_ir::{DType, Tensor, TensorData};

/// The whole file's bytes.
pub(super) fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    std::fs::read(path).map_err(|source| CheckpointError::Io { path: path.to_path_buf(), doing: "read", source })
}

/// The file's tensors, checked against its header: a truncated or corrupt
/// file is an error here, before any tensor is looked at.
pub(super) fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, CheckpointError> {
    SafeTensors::deserialize(bytes).map_err(|e| corrupt(path, e.to_string()))
}

/// The header metadata's value of `key`, if the file has one.
pub(super) fn tag(bytes: &[u8], key: &str) -> Option<String> {
    let (_, metadata) = SafeTensors::read_metadata(bytes).ok()?;
    metadata.metadata().as_ref()?.get(key).cloned()
}

pub(super) fn corrupt(path: &Path, reason: String) -> CheckpointError {
    CheckpointError::Corrupt { path: path.to_path_buf(), reason }
}

/// The elements of a float tensor (F32, F16, BF16, F64) as f64; `None` for
/// any other dtype.
pub(super) fn floats(dtype: Dtype, data: &[u8]) -> Option<Vec<f64>> {
    Some(match dtype {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect(),
        Dtype::F64 => data.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes"))).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64()).collect(),
        _ => return None,
    })
}

/// The elements of an integer (or boolean) tensor as i64; `None` for floats
/// and for U64 values beyond i64.
pub(super) fn ints(dtype: Dtype, data: &[u8]) -> Option<Vec<i64>> {
    Some(match dtype {
        Dtype::I64 => data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect(),
        Dtype::I32 => data.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect(),
        Dtype::U32 => data.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect(),
        Dtype::I16 => data.chunks_exact(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as i64).collect(),
        Dtype::U16 => data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as i64).collect(),
        Dtype::I8 => data.iter().map(|&b| b as i8 as i64).collect(),
        Dtype::U8 | Dtype::BOOL => data.iter().map(|&b| b as i64).collect(),
        Dtype::U64 => data
            .chunks_exact(8)
            .map(|b| i64::try_from(u64::from_le_bytes(b.try_into().expect("8 bytes"))).ok())
            .collect::<Option<Vec<i64>>>()?,
        _ => return None,
    })
}

/// The safetensors dtype a zeroplan dtype is stored as.
pub(super) fn file_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
    }
}

/// The zeroplan dtype a safetensors dtype holds, where there is one.
pub(super) fn our_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        _ => return None,
    })
}

/// One tensor to write: its name in the file, its value, and the dtype it is
/// stored as (values are rounded to it as they are encoded).
pub(super) struct Entry<'a> {
    pub name: String,
    pub tensor: &'a Tensor,
    pub dtype: DType,
}

/// Little-endian bytes of `tensor` as `dtype`.
fn encode(tensor: &Tensor, dtype: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(tensor.numel() * dtype.size_bytes() as usize);
    match tensor.data() {
        TensorData::Float(values) => match dtype {
            DType::F32 => values.iter().for_each(|&x| out.extend((x as f32).to_le_bytes())),
            DType::BF16 => values.iter().for_each(|&x| out.extend(zeroplan_ir::to_bf16(x).to_le_bytes())),
            DType::F16 => values.iter().for_each(|&x| out.extend(zeroplan_ir::to_f16(x).to_le_bytes())),
            DType::I32 => values.iter().for_each(|&x| out.extend((x as i32).to_le_bytes())),
            DType::I64 => values.iter().for_each(|&x| out.extend((x as i64).to_le_bytes())),
        },
        TensorData::Int(values) => match dtype {
            DType::F32 => values.iter().for_each(|&x| out.extend((x as f32).to_le_bytes())),
            DType::BF16 => values.iter().for_each(|&x| out.extend(zeroplan_ir::to_bf16(x as f64).to_le_bytes())),
            DType::F16 => values.iter().for_each(|&x| out.extend(zeroplan_ir::to_f16(x as f64).to_le_bytes())),
            DType::I32 => values.iter().for_each(|&x| out.extend((x as i32).to_le_bytes())),
            DType::I64 => values.iter().for_each(|&x| out.extend(x.to_le_bytes())),
        },
    }
    out
}

/// Writes `entries` as a safetensors file at `path` (header metadata
/// `format: pt`, which Hugging Face's loader asks for, and `tags`). The
/// bytes go to a temporary file beside `path`, which is synced and then
/// renamed over it: `path` ends up whole or untouched, and no temporary
/// file is left behind. Returns the SHA-256 of the bytes written
/// ([`sha256`]'s form).
pub(super) fn write(
    path: &Path,
    mut entries: Vec<Entry<'_>>,
    tags: &[(&str, String)],
) -> Result<String, CheckpointError> {
    let io_error = |source: std::io::Error| CheckpointError::Io { path: path.to_path_buf(), doing: "write", source };
    // As the safetensors crate orders them: widest dtype first, then by name,
    // so every tensor starts aligned to its element size.
    entries.sort_by(|a, b| file_dtype(b.dtype).cmp(&file_dtype(a.dtype)).then_with(|| a.name.cmp(&b.name)));
    let mut infos = Vec::with_capacity(entries.len());
    let mut offset = 0usize;
    for e in &entries {
        let len = e.tensor.numel() * e.dtype.size_bytes() as usize;
        let info = TensorInfo {
            dtype: file_dtype(e.dtype),
            shape: e.tensor.shape().to_vec(),
            data_offsets: (offset, offset + len),
        };
        infos.push((e.name.clone(), info));
        offset += len;
    }
    // The `__metadata__` entry is written here, in key order: safetensors
    // keeps it in a `HashMap`, whose order changes from run to run, and a
    // save must be the same bytes every run.
    let metadata = Metadata::new(None, infos).map_err(|e| io_error(std::io::Error::other(e.to_string())))?;
    let tensors = serde_json::to_vec(&metadata).map_err(|e| io_error(std::io::Error::other(e)))?;
    let mut keys: BTreeMap<&str, &str> = BTreeMap::from([("format", "pt")]);
    keys.extend(tags.iter().map(|(k, v)| (*k, v.as_str())));
    let keys = serde_json::to_string(&keys).map_err(|e| io_error(std::io::Error::other(e)))?;
    let mut header = format!("{{\"__metadata__\":{keys}").into_bytes();
    if tensors.len() > 2 {
        header.push(b',');
    }
    header.extend_from_slice(&tensors[1..]);
    header.resize(header.len().next_multiple_of(8), b' ');

    let mut digest = String::new();
    atomic_write(path, |out| {
        let mut out = Hashing { out, hash: Sha256::new() };
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for e in &entries {
            out.write_all(&encode(e.tensor, e.dtype))?;
        }
        digest = hex(&out.hash.finalize());
        Ok(())
    })?;
    Ok(digest)
}

/// The SHA-256 of `bytes`, as lowercase hex (what `sha256sum` prints).
pub(super) fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Passes bytes on to `out` and hashes those it took: a file's checksum
/// is then of exactly the bytes written, without reading the file again.
struct Hashing<'w> {
    out: &'w mut dyn Write,
    hash: Sha256,
}

impl Write for Hashing<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let taken = self.out.write(bytes)?;
        self.hash.update(&bytes[..taken]);
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Writes `path` whole or not at all: `fill` writes into a temporary file
/// beside it, which is synced and renamed over `path`, and the directory is
/// synced so the rename survives a crash. On error no temporary is left.
pub(super) fn atomic_write(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), CheckpointError> {
    let io_error = |source: std::io::Error| CheckpointError::Io { path: path.to_path_buf(), doing: "write", source };
    let temp = temp_path(path).ok_or_else(|| {
        io_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path does not name a file"))
    })?;
    let result = (|| -> std::io::Result<()> {
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temp)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        fill(&mut out)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, path)
    })();
    if let Err(source) = result {
        let _ = std::fs::remove_file(&temp);
        return Err(io_error(source));
    }
    sync_dir(path.parent());
    Ok(())
}

/// Makes renames and creations in `dir` durable; not every platform can
/// open a directory, and there it is skipped.
pub(super) fn sync_dir(dir: Option<&Path>) {
    if let Some(dir) = dir.map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d })
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
}

/// A fresh name beside `path` for the file being written: hidden, and unique
/// to this process and call.
fn temp_path(path: &Path) -> Option<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name()?.to_string_lossy();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Some(path.with_file_name(format!(".{name}.{}.{n}.partial", std::process::id())))
}
