//! CUDA C → PTX with NVRTC, through cudarc's `nvrtc` module.
//!
//! NVRTC is a host library: compiling needs no GPU and no driver, only
//! `libnvrtc.so` (and the `libnvrtc-builtins.so` it opens) and, for bf16/f16
//! kernels, the `cuda_bf16.h`/`cuda_fp16.h` headers. cudarc opens the
//! library by name (`libnvrtc.so`, `libnvrtc.so.13`, …: the loader's search
//! path) and panics when it is missing, so [`Nvrtc::system`] probes with
//! `is_culib_present()` first. [`Nvrtc::from_dir`] opens the libraries of a
//! directory (the PyPI wheels `scripts/fetch-nvrtc.sh` unpacks) by full
//! path first: the dynamic loader then answers cudarc's `libnvrtc.so.13` with
//! the library already loaded under that soname.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{CompileOptions, result, sys};

/// Why NVRTC is unavailable or refused a source.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// No NVRTC library could be loaded.
    #[error("NVRTC is not available: {0}")]
    Missing(String),
    /// NVRTC rejected the source; `log` is its compilation log.
    #[error("NVRTC could not compile `{name}` with {options:?}:\n{log}")]
    Compile {
        /// The program's name (the kernel's symbol).
        name: String,
        /// The options it was compiled with.
        options: Vec<String>,
        /// NVRTC's compilation log.
        log: String,
    },
    /// An NVRTC call failed outside compilation.
    #[error("NVRTC failed on `{name}`: {message}")]
    Call {
        /// The program's name, or the function called when no program is
        /// involved (`nvrtcVersion`).
        name: String,
        /// NVRTC's error.
        message: String,
    },
    /// The source cannot be handed to NVRTC (it holds a NUL byte).
    #[error("the CUDA C of `{0}` holds a NUL byte")]
    Nul(String),
}

/// A usable NVRTC: its version and where the CUDA headers are.
#[derive(Clone, Debug)]
pub struct Nvrtc {
    version: (i32, i32),
    include_dir: Option<PathBuf>,
}

/// Libraries opened by [`Nvrtc::from_dir`], kept open for the process's life
/// (cudarc's handle refers to them by soname).
static PRELOADED: OnceLock<Result<Vec<libloading::Library>, String>> = OnceLock::new();

impl Nvrtc {
    /// NVRTC from the loader's search path, with headers from `include_dir`,
    /// else `$CUDA_HOME/include`, `$CUDA_PATH/include` or
    /// `/usr/local/cuda/include` (the first holding `cuda_bf16.h`).
    pub fn system(include_dir: Option<PathBuf>) -> Result<Nvrtc, NvrtcError> {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(NvrtcError::Missing(
                "no libnvrtc on the library search path (LD_LIBRARY_PATH, ldconfig)".into(),
            ));
        }
        let include_dir = include_dir.or_else(|| {
            let candidates = ["CUDA_HOME", "CUDA_PATH"]
                .iter()
                .filter_map(std::env::var_os)
                .map(|root| PathBuf::from(root).join("include"))
                .chain([PathBuf::from("/usr/local/cuda/include")]);
            candidates.into_iter().find(|d| d.join("cuda_bf16.h").is_file())
        });
        Ok(Nvrtc { version: version()?, include_dir })
    }

    /// NVRTC from `lib_dir` (holding `libnvrtc.so.*` and
    /// `libnvrtc-builtins.so.*`), with headers from `include_dir`. Only the
    /// first call's directory is loaded into the process.
    pub fn from_dir(lib_dir: &Path, include_dir: Option<PathBuf>) -> Result<Nvrtc, NvrtcError> {
        PRELOADED.get_or_init(|| preload(lib_dir)).as_ref().map_err(|e| NvrtcError::Missing(e.clone()))?;
        Nvrtc::system(include_dir)
    }

    /// `(major, minor)`, e.g. `(13, 0)`.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// Where the CUDA headers (`cuda_bf16.h`, `cuda_fp16.h`) are, if
    /// found: passed to every compilation as `--include-path`.
    pub fn include_dir(&self) -> Option<&Path> {
        self.include_dir.as_deref()
    }

    /// The options a source is compiled with for `arch` (`compute_90`): part
    /// of the PTX cache's key.
    pub fn options(&self, arch: &str) -> Vec<String> {
        let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()];
        if let Some(dir) = &self.include_dir {
            options.push(format!("--include-path={}", dir.display()));
        }
        options
    }

    /// The PTX of `source` for `arch`; `name` names the program in errors.
    pub fn compile_ptx(&self, name: &str, source: &str, arch: &str) -> Result<String, NvrtcError> {
        if source.contains('\0') {
            return Err(NvrtcError::Nul(name.into()));
        }
        let program = format!("{}.cu", name.replace('\0', "?"));
        let mut options = self.options(arch);
        if self.version >= AUTOMATIC_PCH {
            options.push("--pch".into());
        }
        let opts = CompileOptions { options, name: Some(program), ..Default::default() };
        match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
            Ok(ptx) => Ok(ptx.to_src()),
            Err(cudarc::nvrtc::CompileError::CompileError { options, log, .. }) => {
                Err(NvrtcError::Compile { name: name.into(), options, log: log.to_string_lossy().into_owned() })
            }
            Err(other) => Err(NvrtcError::Call { name: name.into(), message: format!("{other:?}") }),
        }
    }
}

/// The first NVRTC with automatic precompiled headers (`--pch`, CUDA
/// 12.8): the first compilation in a process that includes `cuda_bf16.h`
/// or `cuda_fp16.h` saves the parsed headers, and later ones with the same
/// includes load them instead of parsing them again — most of a small
/// kernel's compile time. The PTX is the same, so the flag is not part of
/// [`Nvrtc::options`], the PTX cache's key.
const AUTOMATIC_PCH: (i32, i32) = (12, 8);

fn version() -> Result<(i32, i32), NvrtcError> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked by the caller); the pointers are valid.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e: result::NvrtcError| NvrtcError::Call { name: "nvrtcVersion".into(), message: format!("{e:?}") })?;
    Ok((major, minor))
}

/// Opens `libnvrtc-builtins.so.*`, then `libnvrtc.so.*`, from `dir`.
fn preload(dir: &Path) -> Result<Vec<libloading::Library>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    let find = |prefix: &str| {
        files
            .iter()
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && !n.contains(".alt."))
            })
            .cloned()
            .ok_or_else(|| format!("no {prefix}* in {}", dir.display()))
    };
    let mut libraries = Vec::new();
    for prefix in ["libnvrtc-builtins.so", "libnvrtc.so"] {
        let path = find(prefix)?;
        // SAFETY: NVRTC's initialisers only set up the library itself.
        let library =
            unsafe { libloading::Library::new(&path) }.map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        libraries.push(library);
    }
    Ok(libraries)
}
