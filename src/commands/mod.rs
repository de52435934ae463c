//! One module per subcommand.

pub mod devices;
pub mod graph;
pub mod train;
