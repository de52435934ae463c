//! Where this process stands among the ranks of a launched run: the
//! torchrun environment (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), as `zeroplan launch`,
//! `torchrun` or a scheduler's wrapper (Slurm's `srun` with a few exports)
//! sets it, with the job token ([`JobToken::from_vars`]), and the
//! rendezvous it leads to ([`World::rendezvous`]).
//!
//! Who may run without a token: a job whose store is reachable from this
//! host alone (`MASTER_ADDR` a loopback address or `localhost`, and no
//! wider [`STORE_BIND_VAR`]) — ranks started by hand, or by torchrun, on
//! one machine — with a warning, since any local user's process could still
//! join it. Anything reachable from elsewhere is refused without one
//! ([`WorldError::NoToken`]).

use std::net::IpAddr;
use std::time::Duration;

use super::store::{Store, StoreConfig, StoreError};
use super::token::{JobToken, TOKEN_FILE_VAR, TOKEN_VAR, TokenError};

pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";
pub const RANK: &str = "RANK";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const LOCAL_RANK: &str = "LOCAL_RANK";
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";

/// Seconds every rendezvous wait may take (default [`DEFAULT_TIMEOUT_S`]):
/// reaching the store, and each key another rank publishes.
pub const TIMEOUT_VAR: &str = "ZEROPLAN_RENDEZVOUS_TIMEOUT";
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// The address rank 0 serves the store on, where it is not `MASTER_ADDR`
/// (a node reached through another address; `0.0.0.0` or `[::]` for every
/// interface).
pub const STORE_BIND_VAR: &str = "ZEROPLAN_STORE_BIND";

/// Connections the store holds beyond one per rank (see [`World::rendezvous`]).
const SPARE_CONNECTIONS: usize = 64;

/// This process's place in a launched run.
#[derive(Clone, Debug)]
pub struct World {
    /// The global rank, in `0..world_size`.
    pub rank: usize,
    pub world_size: usize,
    /// The rank on this node (which GPU it opens), in `0..local_world_size`.
    pub local_rank: usize,
    /// Ranks on this node, where the launcher said.
    pub local_world_size: Option<usize>,
    /// Where rank 0 serves the rendezvous store.
    pub master_addr: String,
    pub master_port: u16,
    /// Where rank 0 serves the store instead of `MASTER_ADDR` ([`STORE_BIND_VAR`]).
    pub store_bind: Option<String>,
    /// How long a rendezvous wait may take.
    pub timeout: Duration,
    /// The job's secret; `None` only where the store is reachable from this
    /// host alone.
    pub token: Option<JobToken>,
}

/// A variable of the launch environment missing or malformed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorldError {
    #[error(
        "{var} is not set, but WORLD_SIZE is: a launched rank needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and \
         LOCAL_RANK. Start the ranks with `zeroplan launch --nproc N -- …` (or torchrun), or set {var} ({what}) \
         for each process; unset WORLD_SIZE to run in one process"
    )]
    Missing { var: &'static str, what: &'static str },
    #[error("{var}={value} is not {what}: set it to {what}")]
    Malformed { var: &'static str, value: String, what: &'static str },
    #[error("{var}={value} but {bound_var}={bound}: {var} must be below {bound_var} (ranks count from 0)")]
    OutOfRange { var: &'static str, value: usize, bound_var: &'static str, bound: usize },
    #[error(
        "{var}={value} can be reached from other hosts, and no job token is set: anyone who reaches the port could \
         join the job. Start the ranks with `zeroplan launch` (it draws a token for them), or give every rank the \
         same secret in {TOKEN_VAR} or {TOKEN_FILE_VAR} (`openssl rand -hex 32 > job.token && chmod 600 \
         job.token`)"
    )]
    NoToken { var: &'static str, value: String },
    #[error("{0}")]
    Token(TokenError),
}

impl World {
    /// The launch environment of this process; `None` when `WORLD_SIZE` is
    /// unset (a run in one process).
    pub fn from_env() -> Result<Option<World>, WorldError> {
        World::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`World::from_env`], reading the variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<World>, WorldError> {
        let Some(size) = var(WORLD_SIZE) else { return Ok(None) };
        let get = |name: &'static str, what: &'static str| {
            var(name).map(|v| v.trim().to_string()).ok_or(WorldError::Missing { var: name, what })
        };
        let number = |name: &'static str, value: String, what: &'static str| {
            value.parse::<usize>().map_err(|_| WorldError::Malformed { var: name, value, what })
        };
        let world_size = number(WORLD_SIZE, size.trim().to_string(), "a number of ranks, 1 or more")?;
        if world_size == 0 {
            return Err(WorldError::Malformed { var: WORLD_SIZE, value: size, what: "a number of ranks, 1 or more" });
        }
        let rank = number(RANK, get(RANK, "the global rank, 0 to WORLD_SIZE-1")?, "a rank, 0 to WORLD_SIZE-1")?;
        if rank >= world_size {
            return Err(WorldError::OutOfRange { var: RANK, value: rank, bound_var: WORLD_SIZE, bound: world_size });
        }
        let local_rank = number(
            LOCAL_RANK,
            get(LOCAL_RANK, "the rank on this node, which picks its GPU")?,
            "a rank on this node, 0 or more",
        )?;
        let local_world_size = match var(LOCAL_WORLD_SIZE) {
            Some(v) => {
                let n = number(LOCAL_WORLD_SIZE, v.trim().to_string(), "a number of ranks on this node, 1 or more")?;
                if local_rank >= n {
                    return Err(WorldError::OutOfRange {
                        var: LOCAL_RANK,
                        value: local_rank,
                        bound_var: LOCAL_WORLD_SIZE,
                        bound: n,
                    });
                }
                Some(n)
            }
            None => None,
        };
        let master_addr = get(MASTER_ADDR, "the host name or address of rank 0's node")?;
        if master_addr.is_empty() {
            return Err(WorldError::Malformed { var: MASTER_ADDR, value: master_addr, what: "a host name or address" });
        }
        let port = get(MASTER_PORT, "a free TCP port on rank 0's node")?;
        let master_port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => return Err(WorldError::Malformed { var: MASTER_PORT, value: port, what: "a TCP port, 1 to 65535" }),
        };
        let timeout = match var(TIMEOUT_VAR) {
            Some(v) => match v.trim().parse::<u64>() {
                Ok(s) if s > 0 => Duration::from_secs(s),
                _ => {
                    return Err(WorldError::Malformed {
                        var: TIMEOUT_VAR,
                        value: v,
                        what: "a number of seconds, 1 or more",
                    });
                }
            },
            None => Duration::from_secs(DEFAULT_TIMEOUT_S),
        };
        let store_bind = var(STORE_BIND_VAR).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let token = JobToken::from_vars(&var).map_err(WorldError::Token)?;
        if token.is_none() {
            let wide = [(MASTER_ADDR, Some(&master_addr)), (STORE_BIND_VAR, store_bind.as_ref())]
                .into_iter()
                .find_map(|(var, host)| host.filter(|h| !is_loopback(h)).map(|h| (var, h.clone())));
            if let Some((var, value)) = wide {
                return Err(WorldError::NoToken { var, value });
            }
        }
        Ok(Some(World {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            store_bind,
            timeout,
            token,
        }))
    }

    /// `MASTER_ADDR:MASTER_PORT` (an IPv6 address in brackets).
    pub fn master(&self) -> String {
        host_port(&self.master_addr, self.master_port)
    }

    /// Joins the rendezvous: rank 0 serves the store at `MASTER_PORT` on
    /// `MASTER_ADDR` (or [`STORE_BIND_VAR`]), to at most one connection per
    /// rank and [`SPARE_CONNECTIONS`] more (or the default limit, if
    /// higher); every rank connects to `MASTER_ADDR:MASTER_PORT` with the
    /// job token. Without one (a store on loopback), it warns and runs the
    /// handshakes with an empty key.
    pub fn rendezvous(&self) -> Result<Store, StoreError> {
        let token = self.token.clone().unwrap_or_else(|| {
            eprintln!(
                "warning: rank {}: no job token ({TOKEN_VAR}): any process on this host can join the rendezvous at \
                 {}; start the ranks with `zeroplan launch`, or set {TOKEN_VAR}",
                self.rank,
                self.master()
            );
            JobToken::none()
        });
        let mut config = StoreConfig::new(token, self.timeout);
        config.max_connections = config.max_connections.max(self.world_size + SPARE_CONNECTIONS);
        if self.rank == 0 {
            Store::serve(&self.serve_on(), &self.master(), &config)
        } else {
            Store::connect(&self.master(), &config)
        }
    }

    /// Where rank 0 serves the store: [`STORE_BIND_VAR`], else
    /// `MASTER_ADDR` — except a host name that this host resolves to its
    /// loopback alone (`/etc/hosts` often maps its own name to 127.0.1.1),
    /// which other nodes reach at another address: then every interface,
    /// with a note.
    fn serve_on(&self) -> String {
        if let Some(bind) = &self.store_bind {
            return host_port(bind, self.master_port);
        }
        let resolved: Vec<IpAddr> = std::net::ToSocketAddrs::to_socket_addrs(&self.master())
            .map(|addrs| addrs.map(|a| a.ip()).collect())
            .unwrap_or_default();
        match every_interface(&self.master_addr, &resolved) {
            Some(any) => {
                eprintln!(
                    "note: MASTER_ADDR={} resolves to {} on this host, a loopback address other nodes cannot \
                     reach: serving the rendezvous on every interface (set {STORE_BIND_VAR} to choose one)",
                    self.master_addr, resolved[0]
                );
                host_port(any, self.master_port)
            }
            None => self.master(),
        }
    }
}

/// The unspecified address to serve on instead of `host`, when `host` is a
/// name (not a loopback one) that resolves to loopback addresses only.
fn every_interface(host: &str, resolved: &[IpAddr]) -> Option<&'static str> {
    if is_loopback(host) || host.parse::<IpAddr>().is_ok() || resolved.is_empty() {
        return None;
    }
    if !resolved.iter().all(IpAddr::is_loopback) {
        return None;
    }
    Some(if resolved.iter().all(IpAddr::is_ipv6) { "::" } else { "0.0.0.0" })
}

/// `host:port`, an IPv6 address in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Whether `host` names this host's loopback interface only.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(vars: &[(&str, &str)]) -> Result<Option<World>, WorldError> {
        World::from_vars(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    }

    const GOOD: [(&str, &str); 5] =
        [(MASTER_ADDR, "127.0.0.1"), (MASTER_PORT, "29500"), (RANK, "1"), (WORLD_SIZE, "4"), (LOCAL_RANK, "1")];

    #[test]
    fn the_torchrun_environment_is_read() {
        assert!(world(&[]).unwrap().is_none());
        let w = world(&GOOD).unwrap().unwrap();
        assert_eq!((w.rank, w.world_size, w.local_rank, w.local_world_size), (1, 4, 1, None));
        assert_eq!(w.master(), "127.0.0.1:29500");
        assert_eq!(w.timeout, Duration::from_secs(DEFAULT_TIMEOUT_S));
        let w = world(&[&GOOD[..], &[(LOCAL_WORLD_SIZE, "2"), (TIMEOUT_VAR, "7")]].concat()).unwrap().unwrap();
        assert_eq!((w.local_world_size, w.timeout), (Some(2), Duration::from_secs(7)));
        let v6 = world(&[&GOOD[1..], &[(MASTER_ADDR, "::1")]].concat()).unwrap().unwrap();
        assert_eq!(v6.master(), "[::1]:29500");
    }

    #[test]
    fn missing_and_malformed_variables_are_named_with_the_fix() {
        for missing in [MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK] {
            let vars: Vec<_> = GOOD.iter().copied().filter(|(k, _)| *k != missing).collect();
            let e = world(&vars).unwrap_err();
            assert!(matches!(e, WorldError::Missing { var, .. } if var == missing), "{e:?}");
            let text = e.to_string();
            assert!(text.starts_with(&format!("{missing} is not set")) && text.contains("zeroplan launch"), "{text}");
        }
        let with = |k: &'static str, v: &'static str| {
            let mut vars: Vec<_> = GOOD.iter().copied().filter(|(key, _)| *key != k).collect();
            vars.push((k, v));
            world(&vars).unwrap_err()
        };
        assert!(matches!(with(WORLD_SIZE, "two"), WorldError::Malformed { var: WORLD_SIZE, .. }));
        assert!(matches!(with(WORLD_SIZE, "0"), WorldError::Malformed { var: WORLD_SIZE, .. }));
        assert!(matches!(with(MASTER_PORT, "99999"), WorldError::Malformed { var: MASTER_PORT, .. }));
        assert!(matches!(with(RANK, "-1"), WorldError::Malformed { var: RANK, .. }));
        let e = with(RANK, "4");
        assert_eq!(e, WorldError::OutOfRange { var: RANK, value: 4, bound_var: WORLD_SIZE, bound: 4 });
        assert_eq!(e.to_string(), "RANK=4 but WORLD_SIZE=4: RANK must be below WORLD_SIZE (ranks count from 0)");
        assert!(matches!(with(LOCAL_WORLD_SIZE, "1"), WorldError::OutOfRange { var: LOCAL_RANK, .. }));
        assert!(matches!(with(TIMEOUT_VAR, "soon"), WorldError::Malformed { var: TIMEOUT_VAR, .. }));
    }

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_store_reachable_from_other_hosts_needs_a_token() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars: Vec<_> = GOOD.iter().copied().filter(|(k, _)| extra.iter().all(|(e, _)| e != k)).collect();
            vars.extend_from_slice(extra);
            world(&vars)
        };
        // Loopback only: no token needed (rendezvous warns).
        for host in ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"] {
            let w = with(&[(MASTER_ADDR, host)]).unwrap().unwrap();
            assert!(w.token.is_none() && w.store_bind.is_none(), "{host}");
        }
        for (var, host) in [(MASTER_ADDR, "10.0.0.1"), (MASTER_ADDR, "node0"), (STORE_BIND_VAR, "0.0.0.0")] {
            let e = with(&[(var, host)]).unwrap_err();
            assert_eq!(e, WorldError::NoToken { var, value: host.into() });
            let text = e.to_string();
            assert!(text.contains("zeroplan launch") && text.contains(TOKEN_VAR) && text.contains("openssl"), "{text}");
        }
        let w = with(&[(MASTER_ADDR, "10.0.0.1"), (STORE_BIND_VAR, "0.0.0.0"), (TOKEN_VAR, TOKEN)]).unwrap().unwrap();
        assert_eq!((w.token.unwrap().secret(), w.store_bind.as_deref()), (TOKEN, Some("0.0.0.0")));
        let e = with(&[(TOKEN_VAR, "short")]).unwrap_err();
        assert!(matches!(e, WorldError::Token(TokenError::TooShort { chars: 5, .. })), "{e:?}");
    }

    #[test]
    fn a_host_name_that_resolves_to_loopback_here_is_served_on_every_interface() {
        let (v4, v6): (IpAddr, IpAddr) = ("127.0.1.1".parse().unwrap(), "::1".parse().unwrap());
        assert_eq!(every_interface("node0", &[v4]), Some("0.0.0.0"));
        assert_eq!(every_interface("node0", &[v6]), Some("::"));
        assert_eq!(every_interface("node0", &["10.0.0.1".parse().unwrap(), v4]), None);
        assert_eq!(every_interface("localhost", &[v4]), None);
        assert_eq!(every_interface("127.0.0.1", &[v4]), None);
        assert_eq!(every_interface("node0", &[]), None);
    }

    #[test]
    fn the_store_serves_on_master_addr_alone() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        let vars = [
            (MASTER_ADDR, "127.0.0.1"),
            (MASTER_PORT, port.as_str()),
            (RANK, "0"),
            (WORLD_SIZE, "1"),
            (LOCAL_RANK, "0"),
            (TOKEN_VAR, TOKEN),
        ];
        let store = world(&vars).unwrap().unwrap().rendezvous().unwrap();
        store.set("k", b"v").unwrap();
        // Every 127.x address is this host's loopback: a store on every
        // interface would answer at 127.0.0.2 too.
        let elsewhere = std::net::TcpStream::connect(format!("127.0.0.2:{port}"));
        assert!(elsewhere.is_err(), "the store answered at 127.0.0.2");
        assert!(std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_ok());
    }
}
