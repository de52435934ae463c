//! Selected steps of real plans without a GPU, for the device passes' unit
//! tests: the host's instruction selection with a stand-in kernel compiler
//! that keeps each kernel's IR and whether its buffers all lie on the device
//! (what the CUDA device's compiler would make a GPU kernel of).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use zeroplan_ir::kernel::Kernel;
use zeroplan_ir::plan::{DataParallel, Program};
use zeroplan_ir::spec::{self, ModelSpec, TrainingSpec};
use zeroplan_ir::{Bindings, Place, Value};
use zeroplan_passes::manager::PassOptions;
use zeroplan_passes::pipeline::{Target, compile};

use zeroplan_exec::validate::buffers;
use zeroplan_exec::{Buf, Rank, Step};
use zeroplan_exec::{Instr, KernelCompile, Named, select};

/// A kernel as the stand-in compiler keeps it.
#[derive(Clone, Debug)]
pub struct Ir {
    pub kernel: Arc<Kernel>,
    pub on_device: bool,
}

impl Named for Ir {
    fn name(&self) -> &str {
        &self.kernel.name
    }
}

struct StandIn;

impl KernelCompile for StandIn {
    type Kernel = Ir;

    fn compile(&mut self, kernel: &Kernel, _: &[usize], buffers: &[Buf]) -> Result<Ir, String> {
        let on_device = buffers.iter().all(|b| b.place == Place::Device);
        Ok(Ir { kernel: Arc::new(kernel.clone()), on_device })
    }
}

/// A plan's program, its buffers and its selected steps.
pub struct Selected {
    pub program: Program,
    pub bindings: Bindings,
    pub bufs: HashMap<Value, Buf>,
    pub steps: Vec<Step<Instr<Ir>>>,
}

/// `models/tiny/NAME.ron`.
pub fn model(name: &str) -> ModelSpec {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../models/tiny/{name}.ron"));
    spec::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// `model` compiled for `train` on one rank at batch 2 × seq 6, selected.
pub fn selected(model: &ModelSpec, train: &TrainingSpec) -> Selected {
    selected_with(model, train, None)
}

/// As [`selected`], as rank 0 of the data-parallel strategy `dp`.
pub fn selected_with(model: &ModelSpec, train: &TrainingSpec, dp: Option<DataParallel>) -> Selected {
    let bindings: Bindings = [("batch".to_string(), 2), ("seq".to_string(), 6)].into();
    let ranks = dp.as_ref().map_or(1, |d| d.ranks as usize);
    let options = PassOptions { shape_hint: bindings.clone(), data_parallel: dp, ..PassOptions::default() };
    let graph = compile(model, &Target::Training(train), options).unwrap_or_else(|e| panic!("{e}")).graph;
    let memory = zeroplan_passes::memory::plan(&graph, &bindings).unwrap();
    let program = zeroplan_passes::planner::program::program(graph, &memory, 2, 6);
    let order = program.graph.topo_order();
    let rank = Rank { index: 0, ranks, tensor: 0, tensor_ranks: 1 };
    let bufs = buffers(&program, &order, &bindings, rank).unwrap();
    let steps = select::select(&program.graph, &order, &bufs, &bindings, rank, &mut StandIn).unwrap();
    Selected { program, bindings, bufs, steps }
}
