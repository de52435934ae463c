//! One rank's memory: a zeroed, page-aligned block per place, at the size
//! the plan gives it, and the typed slices instructions read and write.
//! With an NVMe tier, the host buffers the tier holds live in its slots
//! instead ([`Memory::ptr`] redirects them).

use memmap2::MmapMut;
use zeroplan_ir::{DType, Place};

use zeroplan_exec::Buf;
use zeroplan_exec::nvme::Tier;

/// A block of zeroed memory that never moves: an anonymous mapping, so
/// pages no buffer ever touches (the planned place of states the NVMe tier
/// holds) take no RAM, and page alignment covers every SIMD width.
///
/// A guard of [`GUARD`] bytes of [`CANARY`] lies on each side of the
/// arena, inside the same mapping. No buffer a validated plan places can
/// reach them (`zeroplan_exec::validate`), so a guard that changed is a
/// write outside the arena: what the plan-mutation tests and fuzz targets
/// check after every run ([`Arena::guards_intact`]).
pub struct Arena {
    ptr: *mut u8,
    len: usize,
    /// The mapping `ptr` points into, guards included; `None` for an empty arena.
    map: Option<MmapMut>,
}

/// The bytes of each guard: one page, so the arena itself stays page-aligned.
pub const GUARD: usize = 4096;

/// What a guard holds: a byte no zeroed arena and no small float starts with.
pub const CANARY: u8 = 0xA5;

// The arena is plain memory; the executor orders every access.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

/// Why an arena of `len` bytes could not be mapped, in the units and flags
/// a user plans with: its size against this host's memory, and what shrinks
/// it (the activations grow with the batch and the sequence; the model
/// states shrink with ZeRO-3 and offload).
fn too_large(len: usize, cause: &std::io::Error) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    let size = len as f64 / GIB;
    let host = match host_memory_bytes() {
        Some(total) => format!(
            "; this host has {:.1} GiB in all, so the arena must shrink about {:.0}×",
            total as f64 / GIB,
            (len as f64 / total as f64).ceil()
        ),
        None => String::new(),
    };
    format!(
        "the plan needs a {size:.1} GiB arena and the host could not map it ({cause}){host}: \
         lower --batch-size or --seq-len (activations), or plan ZeRO-3 or offload for the model states"
    )
}

/// The host's physical memory (`MemTotal` of /proc/meminfo); `None` where
/// that file is absent (not Linux) or unreadable.
fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Arena {
    /// `len` zeroed bytes; an empty arena owns no allocation.
    pub fn new(len: usize) -> Result<Arena, String> {
        if len == 0 {
            return Ok(Arena { ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), len, map: None });
        }
        let whole =
            len.checked_add(2 * GUARD).ok_or_else(|| format!("an arena of {len} bytes does not fit this host"))?;
        let mut map = MmapMut::map_anon(whole).map_err(|e| too_large(len, &e))?;
        map[..GUARD].fill(CANARY);
        map[GUARD + len..].fill(CANARY);
        // SAFETY: `GUARD + len` bytes lie in the mapping.
        let ptr = unsafe { map.as_mut_ptr().add(GUARD) };
        Ok(Arena { ptr, len, map: Some(map) })
    }

    /// Whether both guards still hold only [`CANARY`]: nothing wrote just
    /// outside the arena.
    pub fn guards_intact(&self) -> bool {
        let Some(map) = &self.map else { return true };
        let (before, after) = (&map[..GUARD], &map[GUARD + self.len..]);
        before.iter().chain(after).all(|&b| b == CANARY)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (and so no allocation).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its first byte, which a buffer's offset counts from; dangling (and
    /// never read) when the arena is empty.
    pub fn base(&self) -> *mut u8 {
        self.ptr
    }
}

/// The device arena and the host arena of one rank.
pub struct Memory {
    /// The plan's device arena: [`Place::Device`] buffers (on the host
    /// device, this CPU's memory too).
    pub device: Arena,
    /// The plan's host arena: [`Place::Host`] buffers, where offloaded
    /// optimizer state and parameters live.
    pub host: Arena,
    /// The NVMe tier holding the host-placed params and states, if any.
    pub nvme: Option<Tier>,
}

impl Memory {
    /// Whether the guards around both arenas are untouched ([`Arena::guards_intact`]).
    pub fn guards_intact(&self) -> bool {
        self.device.guards_intact() && self.host.guards_intact()
    }

    /// The arena of `place`.
    pub fn arena(&self, place: Place) -> &Arena {
        match place {
            Place::Device => &self.device,
            Place::Host => &self.host,
        }
    }

    /// The first byte of `b`: in its NVMe tier slot if the tier holds it,
    /// else in its arena. Loading checked that `b` lies in its arena.
    pub fn ptr(&self, b: Buf) -> *mut u8 {
        if let Some(p) = self.nvme.as_ref().and_then(|t| t.ptr(b)) {
            return p;
        }
        // SAFETY: `offset + bytes <= len` was checked when `b` was made.
        unsafe { self.arena(b.place).base().add(b.offset) }
    }

    /// `b`'s elements as f32.
    ///
    /// # Safety
    /// `b` is f32 and nothing writes it while the slice lives.
    pub unsafe fn f32s(&self, b: Buf) -> &[f32] {
        debug_assert_eq!(b.dtype, DType::F32);
        unsafe { std::slice::from_raw_parts(self.ptr(b).cast::<f32>(), b.len) }
    }

    /// `b`'s elements as f32, to write.
    ///
    /// # Safety
    /// `b` is f32 and nothing else reads or writes it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn f32s_mut(&self, b: Buf) -> &mut [f32] {
        debug_assert_eq!(b.dtype, DType::F32);
        unsafe { std::slice::from_raw_parts_mut(self.ptr(b).cast::<f32>(), b.len) }
    }

    /// `b`'s elements converted to f32 (a copy).
    pub fn read_f32(&self, b: Buf) -> Vec<f32> {
        let p = self.ptr(b);
        // SAFETY: `b` lies in its arena and holds `len` elements of `dtype`;
        // the reads are unaligned where the type is wider than its offset's alignment.
        unsafe {
            match b.dtype {
                DType::F32 => self.f32s(b).to_vec(),
                DType::BF16 => {
                    (0..b.len).map(|i| half::bf16::from_bits(p.cast::<u16>().add(i).read()).to_f32()).collect()
                }
                DType::F16 => {
                    (0..b.len).map(|i| half::f16::from_bits(p.cast::<u16>().add(i).read()).to_f32()).collect()
                }
                DType::I32 => (0..b.len).map(|i| p.cast::<i32>().add(i).read() as f32).collect(),
                DType::I64 => (0..b.len).map(|i| p.cast::<i64>().add(i).read() as f32).collect(),
            }
        }
    }

    /// Writes `values` into `b`, rounding to its dtype (nearest even).
    pub fn write_f32(&self, b: Buf, values: &[f32]) {
        assert_eq!(values.len(), b.len, "a buffer write of the wrong length");
        let p = self.ptr(b);
        // SAFETY: as in `read_f32`.
        unsafe {
            match b.dtype {
                DType::F32 => self.f32s_mut(b).copy_from_slice(values),
                DType::BF16 => {
                    for (i, v) in values.iter().enumerate() {
                        p.cast::<u16>().add(i).write(half::bf16::from_f32(*v).to_bits());
                    }
                }
                DType::F16 => {
                    for (i, v) in values.iter().enumerate() {
                        p.cast::<u16>().add(i).write(half::f16::from_f32(*v).to_bits());
                    }
                }
                DType::I32 => values.iter().enumerate().for_each(|(i, v)| p.cast::<i32>().add(i).write(*v as i32)),
                DType::I64 => values.iter().enumerate().for_each(|(i, v)| p.cast::<i64>().add(i).write(*v as i64)),
            }
        }
    }

    /// An integer buffer's elements (ids, labels, the attention mask).
    pub fn read_i64(&self, b: Buf) -> Vec<i64> {
        let p = self.ptr(b);
        // SAFETY: `b` lies in its arena; its dtype says how to read it.
        unsafe {
            match b.dtype {
                DType::I64 => (0..b.len).map(|i| p.cast::<i64>().add(i).read()).collect(),
                DType::I32 => (0..b.len).map(|i| i64::from(p.cast::<i32>().add(i).read())).collect(),
                _ => self.read_f32(b).into_iter().map(|v| v as i64).collect(),
            }
        }
    }

    /// Writes integers into an integer buffer.
    pub fn write_i64(&self, b: Buf, values: &[i64]) {
        assert_eq!(values.len(), b.len, "a buffer write of the wrong length");
        let p = self.ptr(b);
        // SAFETY: `b` lies in its arena.
        unsafe {
            match b.dtype {
                DType::I64 => values.iter().enumerate().for_each(|(i, v)| p.cast::<i64>().add(i).write(*v)),
                DType::I32 => values.iter().enumerate().for_each(|(i, v)| p.cast::<i32>().add(i).write(*v as i32)),
                _ => self.write_f32(b, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
            }
        }
    }

    /// Copies `from` into `to` (same bytes; they may overlap).
    pub fn copy(&self, from: Buf, to: Buf) {
        let n = from.bytes().min(to.bytes());
        // SAFETY: both lie in their arenas; `copy` allows overlap.
        unsafe { std::ptr::copy(self.ptr(from), self.ptr(to), n) }
    }
}

#[cfg(test)]
mod tests {
    use super::Arena;

    /// The guards see a write one byte past either end, and none inside.
    #[test]
    fn the_guards_catch_a_write_just_outside_the_arena() {
        for outside in [-1isize, 100] {
            let arena = Arena::new(100).unwrap();
            // SAFETY: the guards belong to the same mapping, so both bytes are mapped.
            unsafe {
                std::ptr::write_bytes(arena.base(), 0xFF, 100);
                assert!(arena.guards_intact());
                arena.base().offset(outside).write(0);
            }
            assert!(!arena.guards_intact(), "a write at {outside} went unseen");
        }
    }
}
