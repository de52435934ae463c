//! One module per subcommand.

pub mod devices;
pub mod graph;
