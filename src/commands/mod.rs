//! One module per subcommand.

pub mod capacity;
pub mod compare;
pub mod compile;
pub mod devices;
pub mod embed;
pub mod eval;
pub mod export;
pub mod export_deepspeed;
pub mod finetune;
pub mod glue;
pub mod graph;
pub mod inspect;
pub mod launch;
pub mod predict;
pub mod train;
