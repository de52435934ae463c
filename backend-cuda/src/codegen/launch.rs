//! The launch shape of a generated kernel, from its layout and the device's
//! properties: plain data, so it is computed and tested without a GPU.
//!
//! - **Rows**: a kernel with too few rows to fill the GPU has its rows
//!   split where its body allows (an optimizer step over one flat group).
//! - **Block**: one block per row; enough warps that each thread takes one
//!   vector step of the row (rounded up to a whole warp), at most
//!   [`MAX_THREADS`] (longer rows loop).
//! - **Grid**: one block per row up to the device's grid limit; a block
//!   takes `rows_per_block` consecutive rows.
//! - **Cross-row outputs** need one `double` partial per output element per
//!   block (the scratch buffer), so their grid is capped at
//!   [`CROSS_ROW_BLOCKS_PER_SM`] blocks per multiprocessor and at what fits
//!   [`SCRATCH_BYTES`]. The `_finish` kernel gives each block
//!   [`FINISH_COLUMNS`] output elements and each of its warps a share of
//!   the partials. The grid is a function of the shape and the device only,
//!   so the partial sums are added in the same order on every run.

use zeroplan_ir::kernel::layout::Layout;
use zeroplan_ir::kernel::{Kernel, MAX_SPLIT_ROW, split_row_length};

use super::vector::VectorSteps;

/// What the generator needs to know about the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    /// `(major, minor)`; `(9, 0)` is Hopper (the code is compiled for `compute_{major}{minor}`).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors: what caps the grid of a kernel with
    /// cross-row outputs.
    pub multiprocessors: u32,
    /// The most threads a block may have.
    pub max_threads_per_block: u32,
    /// Static shared memory one block may use, in bytes.
    pub shared_memory_per_block: u32,
    /// The most blocks a grid may have along x.
    pub max_grid_x: u32,
    /// Threads per warp; the generated reductions need 32.
    pub warp_size: u32,
}

impl DeviceProperties {
    /// An H100 SXM (Hopper): 132 SMs, 1024 threads and 48 KiB of static
    /// shared memory per block, 2³¹ − 1 blocks along x.
    pub const H100_SXM: DeviceProperties = DeviceProperties {
        compute_capability: (9, 0),
        multiprocessors: 132,
        max_threads_per_block: 1024,
        shared_memory_per_block: 48 << 10,
        max_grid_x: i32::MAX as u32,
        warp_size: 32,
    };

    /// NVRTC's `--gpu-architecture` for this device, e.g. `compute_90`.
    pub fn arch(&self) -> String {
        format!("compute_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// The most threads a block gets (rows longer than this many vector steps loop).
pub const MAX_THREADS: u32 = 256;
/// Blocks per multiprocessor for a kernel with cross-row outputs. Each block
/// writes one `double` partial per output element (LayerNorm's backward at
/// width 768: 1,536 a block), so more blocks cost bytes; on an H100 that
/// kernel took 100 µs (bert-base, profiled) at 2 and at 4 blocks an SM
/// alike.
pub const CROSS_ROW_BLOCKS_PER_SM: u32 = 2;
/// The most scratch memory the cross-row partial sums of one launch may take.
pub const SCRATCH_BYTES: usize = 256 << 20;
/// Threads per block of the kernel that adds the partial sums up.
pub const FINISH_THREADS: u32 = 256;
/// Output elements per block of that kernel: a warp's lanes read one
/// block's partials of 32 neighbouring elements (256 contiguous bytes), and
/// its `FINISH_THREADS / FINISH_COLUMNS` warps take every 8th block each, so
/// an output's sum is spread over 8 threads rather than one walking every
/// block's partial.
pub const FINISH_COLUMNS: u32 = 32;

/// Rows under this many multiprocessors' worth leave the GPU idle: a kernel
/// with fewer rows gets its rows split when its body allows.
pub const SPLIT_BELOW_ROWS_PER_SM: usize = 4;

/// `kernel` over `dims` with each row split into rows of at most
/// [`MAX_SPLIT_ROW`] elements, and the split dims, when it has fewer than
/// [`SPLIT_BELOW_ROWS_PER_SM`] rows per multiprocessor and its body allows
/// ([`Kernel::split_row`]): an optimizer step over one flat parameter group
/// is one row, which one block would sweep alone. `None` otherwise.
pub(crate) fn split_long_rows(
    kernel: &Kernel,
    dims: &[usize],
    device: &DeviceProperties,
) -> Option<(Kernel, Vec<usize>)> {
    let (&width, outer) = dims.split_last()?;
    let rows: usize = outer.iter().product();
    if rows >= SPLIT_BELOW_ROWS_PER_SM * device.multiprocessors as usize {
        return None;
    }
    kernel.split_row(dims, split_row_length(width, MAX_SPLIT_ROW)?)
}

/// How to launch one generated kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks of the row kernel (0: no rows, nothing to launch).
    pub grid: u32,
    /// Threads per block of the row kernel.
    pub block: u32,
    /// Consecutive rows each block takes.
    pub rows_per_block: usize,
    /// Static shared memory per block, in bytes (the reductions' warp totals).
    pub shared_bytes: u32,
    /// Bytes of the `double` scratch buffer for cross-row partial sums
    /// (`grid` partials of every cross-row output); 0 without such outputs.
    pub scratch_bytes: usize,
    /// The second kernel, adding the partials in block order: `(grid, block)`.
    pub finish: Option<(u32, u32)>,
}

/// Why a kernel cannot be launched on a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LaunchError {
    /// The device's limits are below what a row kernel needs.
    Device(String),
}

/// Warp totals kept in shared memory by one block reduction: at most 32
/// warps, a `float` (reductions) and a `double` (row sums of cross-row
/// outputs) each.
pub(crate) fn shared_bytes(layout: &Layout, has_reduction: bool) -> u32 {
    let row_sums = layout.outputs.iter().any(|o| o.cross_row && !o.along_row);
    32 * (4 * u32::from(has_reduction) + 8 * u32::from(row_sums))
}

pub(crate) fn launch_config(
    layout: &Layout,
    vectors: VectorSteps,
    device: &DeviceProperties,
    has_reduction: bool,
) -> Result<LaunchConfig, LaunchError> {
    let warp = device.warp_size.max(1);
    if device.max_threads_per_block < warp || warp != 32 {
        return Err(LaunchError::Device(format!(
            "blocks of {} threads with warps of {warp}: the reductions need warps of 32 and at least one per block",
            device.max_threads_per_block
        )));
    }
    let steps = vectors.main / vectors.columns + (layout.width - vectors.main);
    let cap = MAX_THREADS.min(device.max_threads_per_block / warp * warp);
    let block = (steps.div_ceil(warp as usize) * warp as usize).clamp(warp as usize, cap as usize) as u32;
    let shared = shared_bytes(layout, has_reduction);
    if shared > device.shared_memory_per_block {
        return Err(LaunchError::Device(format!(
            "{shared} bytes of shared memory per block, the device has {}",
            device.shared_memory_per_block
        )));
    }
    let slot: usize = layout.outputs.iter().filter(|o| o.cross_row).map(|o| o.len * 8).sum();
    let mut grid = layout.rows.min(device.max_grid_x.max(1) as usize);
    if let Some(by_memory) = SCRATCH_BYTES.checked_div(slot) {
        let by_memory = by_memory.max(1);
        grid = grid.min((device.multiprocessors.max(1) * CROSS_ROW_BLOCKS_PER_SM) as usize).min(by_memory);
    }
    let rows_per_block = layout.rows.checked_div(grid).map_or(0, |_| layout.rows.div_ceil(grid));
    // With fewer rows than blocks would take, drop the blocks left without a row.
    let grid = layout.rows.checked_div(rows_per_block).map_or(0, |_| layout.rows.div_ceil(rows_per_block));
    let finish = (slot > 0).then(|| {
        let elements: usize = layout.outputs.iter().filter(|o| o.cross_row).map(|o| o.len).sum();
        (elements.div_ceil(FINISH_COLUMNS as usize).max(1) as u32, FINISH_THREADS)
    });
    Ok(LaunchConfig {
        grid: grid as u32,
        block,
        rows_per_block,
        shared_bytes: shared,
        scratch_bytes: slot * grid,
        finish,
    })
}
