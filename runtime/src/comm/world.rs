//! Where this process stands among the ranks of a launched run: the
//! torchrun environment (`MASTER_ADDR`, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), as `zeroplan launch`,
//! `torchrun` or a scheduler's wrapper (Slurm's `srun` with a few exports)
//! sets it, and the rendezvous it leads to ([`World::rendezvous`]).

use std::time::Duration;

use super::store::{Store, StoreError};

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

/// This process's place in a launched run.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// How long a rendezvous wait may take.
    pub timeout: Duration,
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
        Ok(Some(World { rank, world_size, local_rank, local_world_size, master_addr, master_port, timeout }))
    }

    /// `MASTER_ADDR:MASTER_PORT` (an IPv6 address in brackets).
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    /// Joins the rendezvous: rank 0 serves the store on every interface at
    /// `MASTER_PORT`; every rank connects to `MASTER_ADDR:MASTER_PORT`.
    pub fn rendezvous(&self) -> Result<Store, StoreError> {
        if self.rank == 0 {
            let any = if self.master_addr.contains(':') { "[::]" } else { "0.0.0.0" };
            Store::serve(&format!("{any}:{}", self.master_port), &self.master(), self.timeout)
        } else {
            Store::connect(&self.master(), self.timeout)
        }
    }
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
        assert_eq!(world(&[]), Ok(None));
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
}
