//! Writing results: to standard output, or to a file that is either whole or absent.

use std::io::Write;
use std::path::Path;

/// Writes `text` to `path` through a temporary file in the same directory and
/// a rename, so a failure never leaves a half-written file; or prints it.
pub fn emit(text: &str, path: Option<&Path>) -> Result<(), String> {
    let Some(path) = path else {
        let mut stdout = std::io::stdout().lock();
        return stdout.write_all(text.as_bytes()).map_err(|e| format!("error: writing standard output: {e}"));
    };
    let fail = |e: std::io::Error| format!("error: writing {}: {e}", path.display());
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = path.file_name().ok_or_else(|| format!("error: {} is not a file path", path.display()))?;
    let temporary = dir.join(format!(".{}.{}.tmp", file_name.to_string_lossy(), std::process::id()));
    let written = std::fs::File::create(&temporary).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&temporary, path)) {
        let _ = std::fs::remove_file(&temporary);
        return Err(fail(e));
    }
    Ok(())
}
