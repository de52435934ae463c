//! The handshake that opens every connection of a job — a rank to the
//! rendezvous store, a rank to another rank — so that its ends trust only
//! each other: a mutual challenge–response over the [`JobToken`], which
//! never travels.
//!
//! Three messages, the *responder* (the end that accepted) speaking first:
//!
//! ```text
//! R → I   magic ‖ READY ‖ Nr                   (or magic ‖ BUSY: at its connection limit)
//! I → R   magic ‖ len ‖ claim ‖ Ni ‖ MAC(K, "initiator", transcript)
//! R → I   ACCEPTED ‖ MAC(K, "responder", transcript)      (or REFUSED)
//! transcript = protocol label ‖ claim ‖ responder ‖ Nr ‖ Ni
//! ```
//!
//! `K` is the token, MAC is HMAC-SHA256 (RustCrypto's `hmac` and `sha2`),
//! checked in constant time (`verify_slice`), every field length-prefixed.
//! `Nr` and `Ni` are 32 fresh random bytes from each end, so a recorded
//! message is worth nothing on another connection (a replay fails), and
//! each end proves itself to the other: a stranger who reaches a port
//! cannot join, nor can a stranger who holds a port pose as the store or a
//! rank. `claim` is who the initiator says it is (the mesh: its group and
//! rank) and `responder` who it believes it reached (the store; a group's
//! rank), both under the MACs, so neither can be relabelled; the protocol
//! label keeps a store transcript from passing as a mesh one.
//!
//! Every read and write of a handshake shares one deadline, so a peer that
//! connects and stalls — or trickles a byte at a time — is dropped when it
//! passes, and the sizes read are bounded ([`MAX_CLAIM`]) before anything
//! is allocated. What it does not do: encrypt or authenticate the traffic
//! after the handshake (an attacker on the path can read or alter it), or
//! tell one token holder from another (each is trusted as any rank).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::token::JobToken;

const NONCE: usize = 32;
const TAG: usize = 32;
/// The longest claim a responder reads (a mesh claim is a group name and a rank).
pub const MAX_CLAIM: usize = 256;

const READY: u8 = 0;
const BUSY: u8 = 1;
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

/// One protocol's first bytes and the label its MACs open with.
pub struct Protocol {
    magic: &'static [u8; 4],
    label: &'static str,
}

/// A rank's connection to the rendezvous store.
pub const STORE: Protocol = Protocol { magic: b"ZPS2", label: "zeroplan-store-v1" };
/// A connection between two ranks of a group.
pub const MESH: Protocol = Protocol { magic: b"ZPT2", label: "zeroplan-mesh-v1" };

/// Why a handshake failed, said of the other end ("it …").
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("it is at its connection limit")]
    Busy,
    #[error("it refused this process's job token (the ranks' ZEROPLAN_JOB_TOKEN differ, or it is another job's)")]
    Refused,
    #[error(
        "it did not prove it holds the job token (a wrong or missing ZEROPLAN_JOB_TOKEN, or not one of the job's ranks)"
    )]
    Unproven,
    #[error("it does not speak this protocol: {0}")]
    Foreign(String),
    #[error("it stalled: the handshake did not finish within {0:?}")]
    Stalled(Duration),
    #[error("it closed the connection during the handshake")]
    Closed,
    #[error("{0}")]
    Io(io::Error),
}

impl AuthError {
    /// Whether trying again cannot help: the other end holds another
    /// token, or is no zeroplan at all. A busy, slow or vanished one may
    /// answer the next attempt.
    pub fn is_final(&self) -> bool {
        matches!(self, AuthError::Refused | AuthError::Unproven | AuthError::Foreign(_))
    }
}

/// Opens the handshake on `conn`, which this end connected: proves this end
/// holds `token`, saying it is `claim`, and checks that the other end is
/// `responder` and holds it too — all within `within`.
pub fn initiate(
    conn: &TcpStream,
    token: &JobToken,
    p: &Protocol,
    claim: &[u8],
    responder: &[u8],
    within: Duration,
) -> Result<(), AuthError> {
    assert!(claim.len() <= MAX_CLAIM, "a claim of {} bytes", claim.len());
    let mut io = Timed::new(conn, within);
    let mut hello = [0; 5];
    io.read(&mut hello)?;
    check_magic(p, &hello[..4])?;
    match hello[4] {
        READY => {}
        BUSY => return Err(AuthError::Busy),
        other => return Err(AuthError::Foreign(format!("a status byte {other}"))),
    }
    let mut theirs = [0; NONCE];
    io.read(&mut theirs)?;
    let ours = nonce()?;
    let t = Transcript { p, claim, responder, responder_nonce: &theirs, initiator_nonce: &ours };
    let mut message = p.magic.to_vec();
    message.extend((claim.len() as u16).to_le_bytes());
    message.extend(claim);
    message.extend(ours);
    message.extend(t.tag(token, INITIATOR));
    io.write(&message)?;
    let mut verdict = [0; 1 + TAG];
    io.read(&mut verdict[..1])?;
    match verdict[0] {
        ACCEPTED => {}
        REFUSED => return Err(AuthError::Refused),
        other => return Err(AuthError::Foreign(format!("a verdict byte {other}"))),
    }
    io.read(&mut verdict[1..])?;
    t.verify(token, RESPONDER, &verdict[1..])?;
    io.done()
}

/// Answers the handshake on `conn`, which this end accepted, as
/// `responder`: the initiator's claim once it has proved it holds `token`
/// (and been given this end's proof), all within `within`.
pub fn respond(
    conn: &TcpStream,
    token: &JobToken,
    p: &Protocol,
    responder: &[u8],
    within: Duration,
) -> Result<Vec<u8>, AuthError> {
    let mut io = Timed::new(conn, within);
    let ours = nonce()?;
    let mut hello = p.magic.to_vec();
    hello.push(READY);
    hello.extend(ours);
    io.write(&hello)?;
    let mut magic = [0; 4];
    io.read(&mut magic)?;
    check_magic(p, &magic)?;
    let mut len = [0; 2];
    io.read(&mut len)?;
    let len = usize::from(u16::from_le_bytes(len));
    if len > MAX_CLAIM {
        return Err(AuthError::Foreign(format!("a claim of {len} bytes (at most {MAX_CLAIM})")));
    }
    let mut claim = vec![0; len];
    io.read(&mut claim)?;
    let mut theirs = [0; NONCE];
    io.read(&mut theirs)?;
    let mut proof = [0; TAG];
    io.read(&mut proof)?;
    let t = Transcript { p, claim: &claim, responder, responder_nonce: &ours, initiator_nonce: &theirs };
    if let Err(e) = t.verify(token, INITIATOR, &proof) {
        let _ = io.write(&[REFUSED]);
        return Err(e);
    }
    let mut verdict = vec![ACCEPTED];
    verdict.extend(t.tag(token, RESPONDER));
    io.write(&verdict)?;
    io.done()?;
    Ok(claim)
}

/// Tells a new connection this end is at its connection limit (the
/// initiator tries again), without waiting on it.
pub fn busy(conn: &TcpStream, p: &Protocol) {
    let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
    let mut w = conn;
    let _ = w.write_all(p.magic).and_then(|()| w.write_all(&[BUSY]));
}

/// How many refused connections have been reported; past [`SHOWN`] they
/// are counted, not printed (a flood of strangers must not flood the log).
static REPORTED: AtomicUsize = AtomicUsize::new(0);
const SHOWN: usize = 20;

/// Says on standard error that `place` refused `peer`'s connection and why,
/// and that the job goes on without it.
pub fn report(place: &str, peer: SocketAddr, e: &AuthError) {
    match REPORTED.fetch_add(1, Ordering::Relaxed) {
        n if n < SHOWN => eprintln!("warning: {place} refused a connection from {peer}: {e}; the job goes on"),
        SHOWN => eprintln!("warning: {place}: further refused connections are not shown"),
        _ => {}
    }
}

const INITIATOR: &str = "initiator";
const RESPONDER: &str = "responder";

/// What both ends' MACs cover.
struct Transcript<'a> {
    p: &'a Protocol,
    claim: &'a [u8],
    responder: &'a [u8],
    responder_nonce: &'a [u8; NONCE],
    initiator_nonce: &'a [u8; NONCE],
}

impl Transcript<'_> {
    fn mac(&self, token: &JobToken, role: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(token.key()).expect("HMAC takes a key of any length");
        let fields: [&[u8]; 6] = [
            self.p.label.as_bytes(),
            role.as_bytes(),
            self.claim,
            self.responder,
            self.responder_nonce,
            self.initiator_nonce,
        ];
        for field in fields {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field);
        }
        mac
    }

    fn tag(&self, token: &JobToken, role: &str) -> [u8; TAG] {
        self.mac(token, role).finalize().into_bytes().into()
    }

    /// Checks `role`'s tag in constant time.
    fn verify(&self, token: &JobToken, role: &str, tag: &[u8]) -> Result<(), AuthError> {
        self.mac(token, role).verify_slice(tag).map_err(|_| AuthError::Unproven)
    }
}

fn check_magic(p: &Protocol, got: &[u8]) -> Result<(), AuthError> {
    if got == p.magic {
        return Ok(());
    }
    Err(AuthError::Foreign(format!(
        "it opened with {:?}, not {:?}",
        String::from_utf8_lossy(got),
        String::from_utf8_lossy(p.magic)
    )))
}

fn nonce() -> Result<[u8; NONCE], AuthError> {
    let mut n = [0; NONCE];
    getrandom::fill(&mut n).map_err(|e| AuthError::Io(io::Error::other(format!("no random nonce: {e}"))))?;
    Ok(n)
}

/// A connection's reads and writes against one deadline for the whole
/// handshake (each call's socket timeout is the time left), so no pace of
/// trickling outlasts it.
struct Timed<'a> {
    conn: &'a TcpStream,
    deadline: Instant,
    within: Duration,
}

impl<'a> Timed<'a> {
    fn new(conn: &'a TcpStream, within: Duration) -> Timed<'a> {
        Timed { conn, deadline: Instant::now() + within, within }
    }

    /// The time left, or `Stalled` when none is.
    fn left(&self) -> Result<Duration, AuthError> {
        match self.deadline.saturating_duration_since(Instant::now()) {
            left if left.is_zero() => Err(AuthError::Stalled(self.within)),
            left => Ok(left),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), AuthError> {
        let mut at = 0;
        while at < buf.len() {
            self.conn.set_read_timeout(Some(self.left()?)).map_err(AuthError::Io)?;
            let mut r = self.conn;
            match r.read(&mut buf[at..]) {
                Ok(0) => return Err(AuthError::Closed),
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.failed(e)),
            }
        }
        Ok(())
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), AuthError> {
        self.conn.set_write_timeout(Some(self.left()?)).map_err(AuthError::Io)?;
        let mut w = self.conn;
        w.write_all(buf).map_err(|e| self.failed(e))
    }

    fn failed(&self, e: io::Error) -> AuthError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => AuthError::Stalled(self.within),
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
                AuthError::Closed
            }
            _ => AuthError::Io(e),
        }
    }

    /// Lifts the handshake's timeouts: the connection's user sets its own.
    fn done(self) -> Result<(), AuthError> {
        self.conn.set_read_timeout(None).and_then(|()| self.conn.set_write_timeout(None)).map_err(AuthError::Io)
    }
}

#[cfg(test)]
mod tests;
