//! Writing results: to standard output, or to a file that is either whole or absent.

use std::io::{BufWriter, Write};
use std::path::Path;

/// Writes `text` to `path` (see [`write_atomic`]), or prints it.
pub fn emit(text: &str, path: Option<&Path>) -> Result<(), String> {
    match path {
        Some(path) => write_atomic(path, |file| file.write_all(text.as_bytes())),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(text.as_bytes()).map_err(|e| format!("error: writing standard output: {e}"))
        }
    }
}

/// Writes what `write` puts out to `path` through a buffered temporary file
/// in the same directory, synced, then renamed, so a failure never leaves a
/// half-written file.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("error: writing {}: {e}", path.display());
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = path.file_name().ok_or_else(|| format!("error: {} is not a file path", path.display()))?;
    let temporary = dir.join(format!(".{}.{}.tmp", file_name.to_string_lossy(), std::process::id()));
    let written = std::fs::File::create(&temporary).and_then(|file| {
        let mut buffered = BufWriter::with_capacity(1 << 20, file);
        write(&mut buffered)?;
        buffered.into_inner().map_err(|e| e.into_error())?.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&temporary, path)) {
        let _ = std::fs::remove_file(&temporary);
        return Err(fail(e));
    }
    Ok(())
}
