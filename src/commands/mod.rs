//! One module per subcommand.

pub mod checkpoints;
pub mod compare;
pub mod compile;
pub mod devices;
pub mod embed;
pub mod export;
pub mod export_deepspeed;
pub mod graph;
pub mod inspect;
pub mod train;
pub mod train_host;
