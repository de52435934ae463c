//! The job token: the secret a job's ranks share, and the only thing that
//! lets a process into the job's rendezvous store and rank mesh
//! ([`super::auth`]).
//!
//! `zeroplan launch` draws one ([`JobToken::generate`]) and hands it to its
//! children in [`TOKEN_VAR`]; a multi-node job, whose launches cannot share
//! a draw, takes it from [`TOKEN_VAR`] or a file ([`TOKEN_FILE_VAR`],
//! `launch --token-file`). The token is a MAC key and never travels: the
//! handshakes prove knowledge of it over fresh nonces.

use std::path::Path;
use std::sync::Arc;

/// The variable holding the job token itself.
pub const TOKEN_VAR: &str = "ZEROPLAN_JOB_TOKEN";
/// The variable naming a file that holds the job token (read when
/// [`TOKEN_VAR`] is unset).
pub const TOKEN_FILE_VAR: &str = "ZEROPLAN_JOB_TOKEN_FILE";

/// The shortest token accepted: 32 characters. A token is a key, not a
/// password; the generated ones are 64 hex digits (256 random bits).
pub const MIN_TOKEN_CHARS: usize = 32;

/// How to make a token, for the errors that ask for one.
const MAKE_ONE: &str = "make one with `openssl rand -hex 32 > job.token && chmod 600 job.token` and give every node \
                        the same (`zeroplan launch --token-file job.token`, or ZEROPLAN_JOB_TOKEN_FILE / \
                        ZEROPLAN_JOB_TOKEN)";

/// A job's shared secret. Cheap to clone (the handshake threads each hold
/// one); its `Debug` does not show it.
#[derive(Clone)]
pub struct JobToken(Arc<str>);

/// Why no usable token was found, naming where it was looked for and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenError {
    #[error("the job token from {from} has {chars} characters; it needs {MIN_TOKEN_CHARS} or more: {MAKE_ONE}")]
    TooShort { from: String, chars: usize },
    #[error("could not read the job token file {path} ({cause}): {MAKE_ONE}")]
    Unreadable { path: String, cause: String },
    #[error(
        "the job token file {path} is open to other users (mode {mode:o}): anyone who reads it can join the job; \
         run `chmod 600 {path}`"
    )]
    Exposed { path: String, mode: u32 },
    #[error("could not draw a job token from the operating system's random source: {0}")]
    Random(String),
}

impl JobToken {
    /// A fresh token: 32 bytes of the OS's randomness as 64 hex digits
    /// (text, so that it travels in an environment variable).
    pub fn generate() -> Result<JobToken, TokenError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(JobToken(hex.into()))
    }

    /// `text` (surrounding white space removed), from `from` (named in the
    /// error): at least [`MIN_TOKEN_CHARS`] characters.
    pub fn parse(text: &str, from: &str) -> Result<JobToken, TokenError> {
        let text = text.trim();
        let chars = text.chars().count();
        if chars < MIN_TOKEN_CHARS {
            return Err(TokenError::TooShort { from: from.to_string(), chars });
        }
        Ok(JobToken(text.into()))
    }

    /// The token in the file at `path`, which only its owner may read or
    /// write (as ssh insists of a private key: a token others can read
    /// admits them, one they can write is theirs).
    pub fn from_file(path: &Path) -> Result<JobToken, TokenError> {
        let shown = path.display().to_string();
        let unreadable = |e: std::io::Error| TokenError::Unreadable { path: shown.clone(), cause: e.to_string() };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).map_err(unreadable)?.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(TokenError::Exposed { path: shown, mode });
            }
        }
        let text = std::fs::read_to_string(path).map_err(unreadable)?;
        JobToken::parse(&text, &format!("the file {shown}"))
    }

    /// The token the environment gives, read through `var`: [`TOKEN_VAR`],
    /// else the file [`TOKEN_FILE_VAR`] names; `None` when neither is set.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<JobToken>, TokenError> {
        if let Some(text) = var(TOKEN_VAR) {
            return JobToken::parse(&text, TOKEN_VAR).map(Some);
        }
        match var(TOKEN_FILE_VAR) {
            Some(path) => JobToken::from_file(Path::new(path.trim())).map(Some),
            None => Ok(None),
        }
    }

    /// The empty key of a single-host job started by hand without a token
    /// (see `World::rendezvous`): the handshakes still run, but prove
    /// nothing — only that the store is bound to loopback keeps others out.
    pub(crate) fn none() -> JobToken {
        JobToken("".into())
    }

    /// The token as text, to hand to a child process in [`TOKEN_VAR`].
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The MAC key.
    pub(crate) fn key(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for JobToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobToken(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_fresh_hex_and_hidden_from_debug() {
        let (a, b) = (JobToken::generate().unwrap(), JobToken::generate().unwrap());
        assert_eq!(a.secret().len(), 64);
        assert!(a.secret().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.secret(), b.secret());
        assert_eq!(format!("{a:?}"), "JobToken(…)");
        assert!(JobToken::parse(a.secret(), "x").is_ok());
    }

    #[test]
    fn short_tokens_and_files_others_can_read_are_refused_naming_the_fix() {
        let e = JobToken::parse("  secret \n", TOKEN_VAR).unwrap_err();
        assert_eq!(e, TokenError::TooShort { from: TOKEN_VAR.into(), chars: 6 });
        assert!(e.to_string().contains("openssl rand -hex 32"), "{e}");
        let vars = |token: Option<&str>, file: Option<&str>| {
            let (token, file) = (token.map(str::to_string), file.map(str::to_string));
            JobToken::from_vars(move |name| if name == TOKEN_VAR { token.clone() } else { file.clone() })
        };
        assert!(vars(None, None).unwrap().is_none());
        let dir = std::env::temp_dir().join(format!("zeroplan-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("job.token");
        let text = "0123456789abcdef0123456789abcdef\n";
        std::fs::write(&path, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = vars(None, path.to_str()).unwrap_err();
            assert!(matches!(e, TokenError::Exposed { mode: 0o644, .. }) && e.to_string().contains("chmod 600"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert_eq!(vars(None, path.to_str()).unwrap().unwrap().secret(), text.trim());
        // The variable wins over the file.
        let inline = "fedcba9876543210fedcba9876543210";
        assert_eq!(vars(Some(inline), path.to_str()).unwrap().unwrap().secret(), inline);
        let e = vars(None, dir.join("missing").to_str()).unwrap_err();
        assert!(matches!(e, TokenError::Unreadable { .. }), "{e:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
