//! One rank's memory on a GPU: a device arena (`cuMemAlloc`) and a pinned
//! host arena (`cuMemHostAlloc`, for ZeRO-Offload's states), each one
//! allocation at the plan's size, zeroed like the host runtime's arenas,
//! and the byte moves between them and ordinary host memory. With an NVMe
//! tier ([`super::tier`]), host buffers in its slots are reached there.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, result, sys};
use zeroplan_ir::Place;

use super::tier::{self, OnNvme, Route};
use zeroplan_exec::Buf;

/// `len` bytes of device memory, freed on drop.
pub struct DeviceArena {
    ptr: sys::CUdeviceptr,
    len: usize,
    context: Arc<CudaContext>,
}

impl DeviceArena {
    /// `len` zeroed bytes (no allocation for 0). `cuMemAlloc` aligns to 256 bytes.
    pub fn new(context: &Arc<CudaContext>, len: usize) -> Result<DeviceArena, DriverError> {
        context.bind_to_thread()?;
        let ptr = if len == 0 {
            0
        } else {
            // SAFETY: the context is bound; the allocation is zeroed before use.
            unsafe {
                let ptr = result::malloc_sync(len)?;
                result::memset_d8_sync(ptr, 0, len)?;
                ptr
            }
        };
        Ok(DeviceArena { ptr, len, context: Arc::clone(context) })
    }

    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Copies `bytes` to `offset`, waiting for it (tables made at load).
    pub fn upload(&self, offset: usize, bytes: &[u8]) -> Result<(), DriverError> {
        assert!(offset + bytes.len() <= self.len, "an upload past the end of a device buffer");
        if bytes.is_empty() {
            return Ok(());
        }
        self.context.bind_to_thread()?;
        // SAFETY: inside the allocation, checked above.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, bytes) }
    }
}

impl Drop for DeviceArena {
    fn drop(&mut self) {
        if self.len != 0 && self.context.bind_to_thread().is_ok() {
            // SAFETY: allocated in `new`, freed once; a failure leaves nothing to undo.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// `len` bytes of page-locked host memory (DMA without a staging copy),
/// freed on drop.
pub struct PinnedArena {
    ptr: *mut u8,
    len: usize,
    context: Arc<CudaContext>,
    backing: Backing,
}

/// Where a [`PinnedArena`]'s bytes come from.
enum Backing {
    /// `cuMemHostAlloc`: every byte page-locked.
    Allocated,
    /// An anonymous mapping page-locked only in `ranges`
    /// (`cuMemHostRegister`): the host arena beside an NVMe tier, whose
    /// slots' planned bytes are never touched and so take no RAM.
    Registered { _map: memmap2::MmapMut, ranges: Vec<Range<usize>> },
}

// Plain memory; the runner orders every access.
unsafe impl Send for PinnedArena {}
unsafe impl Sync for PinnedArena {}

impl PinnedArena {
    pub fn new(context: &Arc<CudaContext>, len: usize) -> Result<PinnedArena, DriverError> {
        context.bind_to_thread()?;
        let ptr = if len == 0 {
            std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
        } else {
            // SAFETY: the context is bound; `len` bytes are zeroed before use.
            unsafe {
                let ptr = result::malloc_host(len, 0)?.cast::<u8>();
                ptr.write_bytes(0, len);
                ptr
            }
        };
        Ok(PinnedArena { ptr, len, context: Arc::clone(context), backing: Backing::Allocated })
    }

    /// `len` zero bytes of an anonymous mapping, page-locked in `ranges`
    /// (page-aligned, sorted, disjoint, within the mapping's pages).
    pub fn registered(context: &Arc<CudaContext>, len: usize, ranges: &[Range<usize>]) -> Result<PinnedArena, String> {
        context.bind_to_thread().map_err(|e| format!("binding the CUDA context: {e:?}"))?;
        let mut map = memmap2::MmapMut::map_anon(len.max(1))
            .map_err(|e| format!("could not map {len} bytes for the host arena: {e}"))?;
        let ptr = map.as_mut_ptr();
        let mut arena = PinnedArena {
            ptr,
            len,
            context: Arc::clone(context),
            backing: Backing::Registered { _map: map, ranges: Vec::with_capacity(ranges.len()) },
        };
        for r in ranges {
            // SAFETY: the range lies in the mapping's pages, which live as
            // long as the arena; its drop unregisters what was registered.
            unsafe { sys::cuMemHostRegister_v2(ptr.add(r.start).cast(), r.len(), 0) }.result().map_err(|e| {
                format!(
                    "page-locking {} bytes of the host arena at offset {} (cuMemHostRegister): {e:?}",
                    r.len(),
                    r.start
                )
            })?;
            if let Backing::Registered { ranges, .. } = &mut arena.backing {
                ranges.push(r.clone());
            }
        }
        Ok(arena)
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for PinnedArena {
    fn drop(&mut self) {
        if self.len == 0 || self.context.bind_to_thread().is_err() {
            return;
        }
        match &self.backing {
            // SAFETY: allocated in `new`, freed once.
            Backing::Allocated => {
                let _ = unsafe { result::free_host(self.ptr.cast()) };
            }
            Backing::Registered { ranges, .. } => {
                for r in ranges {
                    // SAFETY: registered in `registered`, unregistered once; the
                    // mapping is unmapped after (the field drops after this).
                    let _ = unsafe { sys::cuMemHostUnregister(self.ptr.add(r.start).cast()) };
                }
            }
        }
    }
}

/// The device and pinned host arenas of one rank.
pub struct GpuMemory {
    pub device: DeviceArena,
    pub host: PinnedArena,
    /// The NVMe tier holding the host-placed params and states, if any.
    pub nvme: Option<OnNvme>,
}

impl GpuMemory {
    /// `b`'s first byte on the device. Loading checked `b` lies in its arena.
    pub fn device_ptr(&self, b: Buf) -> sys::CUdeviceptr {
        debug_assert_eq!(b.place, Place::Device);
        self.device.ptr() + b.offset as u64
    }

    /// `b`'s first byte: in its NVMe tier slot if the tier holds it, else
    /// in the pinned host arena.
    pub fn host_ptr(&self, b: Buf) -> *mut u8 {
        debug_assert_eq!(b.place, Place::Host);
        if let Some(p) = self.nvme.as_ref().and_then(|n| n.tier.ptr(b)) {
            return p;
        }
        // SAFETY: `offset + bytes <= len` was checked when `b` was made.
        unsafe { self.host.ptr().add(b.offset) }
    }

    /// Copies `b`'s bytes into `dst` (`b.bytes()` long), waiting for them.
    /// The caller has synchronised the streams that write `b`.
    pub fn download(&self, b: Buf, dst: &mut [u8]) -> Result<(), DriverError> {
        debug_assert_eq!(dst.len(), b.bytes());
        match b.place {
            // SAFETY: `b` lies in the device arena; `dst` holds its bytes.
            Place::Device => unsafe { result::memcpy_dtoh_sync(dst, self.device_ptr(b)) },
            Place::Host => {
                // SAFETY: `b` lies in the pinned arena; `dst` is ordinary memory elsewhere.
                unsafe { std::ptr::copy_nonoverlapping(self.host_ptr(b), dst.as_mut_ptr(), dst.len()) };
                Ok(())
            }
        }
    }

    /// Copies `src` (`b.bytes()` long) into `b`, waiting for it. The caller
    /// has synchronised the streams that read or write `b`.
    pub fn upload(&self, b: Buf, src: &[u8]) -> Result<(), DriverError> {
        debug_assert_eq!(src.len(), b.bytes());
        match b.place {
            // SAFETY: `b` lies in the device arena.
            Place::Device => unsafe { result::memcpy_htod_sync(self.device_ptr(b), src) },
            Place::Host => {
                // SAFETY: `b` lies in the pinned arena; `src` is ordinary memory elsewhere.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.host_ptr(b), src.len()) };
                Ok(())
            }
        }
    }

    /// Queues a copy of `from`'s bytes into `to` on `stream` where the DMA
    /// engines can do it (device↔device without overlap, device↔pinned
    /// host, device↔NVMe tier slot through the pinned staging buffers,
    /// waiting for a copy into a slot: [`super::tier`]); `false` when the
    /// caller must copy on the host instead.
    pub fn copy_async(&self, from: Buf, to: Buf, stream: &CudaStream) -> Result<bool, DriverError> {
        let route = tier::route_beside(self.nvme.as_ref().map(|n| &n.tier), from, to);
        let n = from.bytes().min(to.bytes());
        match (route, &self.nvme) {
            (Route::Dma, _) => {}
            (Route::Cpu, _) | (Route::Up | Route::Down, None) => return Ok(false),
            // SAFETY: the slot is resident (the runner's window or a hold)
            // and `n` bytes long; the device buffer lies in its arena.
            (Route::Up, Some(nvme)) => {
                unsafe { nvme.staging.up(self.host_ptr(from), self.device_ptr(to), n, stream)? };
                return Ok(true);
            }
            (Route::Down, Some(nvme)) => {
                unsafe { nvme.staging.down(self.device_ptr(from), self.host_ptr(to), n, stream)? };
                return Ok(true);
            }
        }
        let s = stream.cu_stream();
        // SAFETY: both lie in their arenas; the pinned slices live as long as `self`.
        unsafe {
            match (from.place, to.place) {
                (Place::Device, Place::Device) => {
                    result::memcpy_dtod_async(self.device_ptr(to), self.device_ptr(from), n, s)?
                }
                (Place::Device, Place::Host) => {
                    let dst = std::slice::from_raw_parts_mut(self.host_ptr(to), n);
                    result::memcpy_dtoh_async(dst, self.device_ptr(from), s)?
                }
                (Place::Host, Place::Device) => {
                    let src = std::slice::from_raw_parts(self.host_ptr(from), n);
                    result::memcpy_htod_async(self.device_ptr(to), src, s)?
                }
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// Whether the DMA engines copy `from` into `to` ([`GpuMemory::copy_async`]):
/// device↔device without overlap, device↔pinned host.
pub fn by_dma(from: Buf, to: Buf) -> bool {
    match (from.place, to.place) {
        (Place::Device, Place::Device) => !from.overlaps(&to),
        (Place::Device, Place::Host) | (Place::Host, Place::Device) => true,
        _ => false,
    }
}
