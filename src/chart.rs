//! `inspect --memory-svg`: a plan's memory as a picture (SVG, by plotters).
//!
//! Left, the device memory of one rank over one step — the program is the
//! same on every rank — stacked by category as the memory plan places it:
//! the reserve outside the arena (CUDA context, GEMM workspace, NCCL
//! buffers) at the bottom, then parameters, optimizer state, gradients and
//! activations, with the budget and the plan's peak as lines. Right, every
//! strategy the search tried: its peak memory against its predicted
//! throughput, the chosen one marked, those that do not fit on the axis.

use std::collections::BTreeMap;

use plotters::prelude::*;

use zeroplan_ir::Phase;
use zeroplan_ir::plan::{Candidate, Offload, Plan};
use zeroplan_passes::memory::Category;
use zeroplan_passes::planner::evaluate::bindings;

const GIB: f64 = (1u64 << 30) as f64;
/// Points per series: longer schedules keep each bin's busiest position.
const MAX_POINTS: usize = 1200;

/// The stacked categories, bottom first: their legend names, the memory
/// plan's categories they sum, and colours.
const LAYERS: [(&str, &[Category], RGBColor); 4] = [
    ("parameters", &[Category::Parameters], RGBColor(76, 114, 176)),
    ("optimizer", &[Category::OptimizerState], RGBColor(221, 132, 82)),
    ("gradients", &[Category::Gradients], RGBColor(85, 168, 104)),
    ("activations", &[Category::Activations, Category::Inputs], RGBColor(196, 78, 82)),
];
const WORKSPACE: RGBColor = RGBColor(160, 160, 160);
const BUDGET: RGBColor = RGBColor(200, 0, 0);

/// The two charts of `plan`, side by side, as one SVG document.
pub fn memory_svg(plan: &Plan) -> Result<String, String> {
    let steps = stacked(plan)?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1500, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(fail)?;
        let (left, right) = root.split_horizontally(860);
        over_the_step(&left, plan, &steps).map_err(fail)?;
        strategies(&right, plan).map_err(fail)?;
        root.present().map_err(fail)?;
    }
    Ok(svg)
}

fn fail(e: impl std::fmt::Display) -> String {
    format!("error: drawing the memory chart: {e}")
}

/// One point of the step: its schedule position and the cumulative GiB
/// at the top of each layer (workspace first).
struct Point {
    position: usize,
    tops: [f64; 5],
}

/// Where the step is: its points, and the positions where the backward
/// and the optimizer begin.
struct Steps {
    points: Vec<Point>,
    phases: Vec<(&'static str, usize)>,
}

/// The memory plan of `plan`'s program, replayed: live bytes by layer at
/// each schedule position, on top of the reserve.
fn stacked(plan: &Plan) -> Result<Steps, String> {
    let graph = &plan.program.graph;
    let memory = zeroplan_passes::memory::plan(graph, &bindings(plan.program.batch, plan.program.seq))
        .map_err(|e| format!("error: planning the plan's memory again: {e}"))?;
    let live: BTreeMap<Category, Vec<u64>> = memory.live_by_category();
    let positions = live.values().map(Vec::len).max().unwrap_or(0);
    let reserve = plan.memory.reserve_bytes as f64 / GIB;
    let tops_at = |i: usize| {
        let mut tops = [reserve; 5];
        for (layer, (_, categories, _)) in LAYERS.iter().enumerate() {
            let bytes: u64 = categories.iter().filter_map(|c| live.get(c)).map(|s| s[i]).sum();
            tops[layer + 1] = tops[layer] + bytes as f64 / GIB;
        }
        tops
    };
    let bin = positions.div_ceil(MAX_POINTS).max(1);
    let points = (0..positions)
        .step_by(bin)
        .map(|start| {
            let busiest =
                (start..(start + bin).min(positions)).max_by(|&a, &b| tops_at(a)[4].total_cmp(&tops_at(b)[4]));
            let position = busiest.unwrap_or(start);
            Point { position, tops: tops_at(position) }
        })
        .collect();
    let phase_at = |p: Phase| memory.order.iter().position(|&n| graph.node(n).phase == p);
    let phases = [("backward", Phase::Backward), ("optimizer", Phase::Optimizer)]
        .into_iter()
        .filter_map(|(name, p)| Some((name, phase_at(p)?)))
        .collect();
    Ok(Steps { points, phases })
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Both charts' legend: upper left, over a white box.
fn draw_legend<'a, CT: plotters::coord::CoordTranslate>(chart: &mut ChartContext<'a, SVGBackend<'a>, CT>) -> Drawn {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
}

fn over_the_step(area: &Area, plan: &Plan, steps: &Steps) -> Drawn {
    let (s, m) = (&plan.strategy, &plan.memory);
    let budget = m.budget_bytes as f64 / GIB;
    let peak = m.peak_bytes as f64 / GIB;
    let end = steps.points.last().map_or(1, |p| p.position + 1) as f64;
    // Headroom above the budget for the legend, over the forward's start.
    let top = budget.max(peak) * 1.3;
    let title = format!("memory per GPU over one step ({} ranks alike; micro-batch 1 of {})", s.ranks, s.micro_batches);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..end, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("instruction (schedule order: forward, backward, optimizer)")
        .y_desc("GiB")
        .disable_x_mesh()
        .draw()?;
    // Each layer is drawn down to zero, the highest first, so the lower
    // ones cover what is theirs.
    for layer in (0..5).rev() {
        let (name, colour) =
            if layer == 0 { ("workspace", WORKSPACE) } else { (LAYERS[layer - 1].0, LAYERS[layer - 1].2) };
        let points = steps.points.iter().map(|p| (p.position as f64, p.tops[layer]));
        chart
            .draw_series(AreaSeries::new(points, 0.0, colour.filled()).border_style(colour))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    for &(name, at) in &steps.phases {
        let x = at as f64;
        chart.draw_series(LineSeries::new([(x, 0.0), (x, top)], BLACK.mix(0.4)))?;
        chart.draw_series(std::iter::once(Text::new(name, (x, top * 0.97), ("sans-serif", 12))))?;
    }
    // The budget last, over the peak where they meet.
    let lines = [(peak, BLACK, format!("peak {peak:.2} GiB")), (budget, BUDGET, format!("budget {budget:.2} GiB"))];
    for (y, colour, label) in lines {
        chart
            .draw_series(LineSeries::new([(0.0, y), (end, y)], colour.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 12, y)], colour.stroke_width(2)));
    }
    draw_legend(&mut chart)
}

/// A candidate's strategy in a few characters: `Z3 opt+par sel`.
fn short(c: &Candidate) -> String {
    let offload = match c.strategy.offload {
        Offload::None => "",
        Offload::Optimizer => " opt",
        Offload::OptimizerAndParams => " opt+par",
    };
    format!("Z{}{offload} {}", c.strategy.zero_stage, c.strategy.recompute)
}

fn strategies(area: &Area, plan: &Plan) -> Drawn {
    let budget = plan.memory.budget_bytes as f64 / GIB;
    let gib = |c: &Candidate| c.peak_bytes as f64 / GIB;
    let right = plan.candidates.iter().map(gib).fold(budget, f64::max) * 1.1;
    let speed = |c: &Candidate| c.tokens_per_second.unwrap_or(0.0) / 1e3;
    // Headroom for the legend: little memory and high speed is where no strategy is.
    let top = plan.candidates.iter().map(speed).fold(plan.predicted.tokens_per_second / 1e3, f64::max) * 1.35;
    let mut chart = ChartBuilder::on(area)
        .caption("strategies the search tried", ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..right, 0f64..top)?;
    chart.configure_mesh().x_desc("peak memory per GPU, GiB").y_desc("predicted k tokens/s").draw()?;
    chart
        .draw_series(LineSeries::new([(budget, 0.0), (budget, top)], BUDGET.stroke_width(2)))?
        .label(format!("budget {budget:.2} GiB"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 12, y)], BUDGET.stroke_width(2)));
    let s = &plan.strategy;
    let chosen = |c: &Candidate| {
        (c.strategy.zero_stage, c.strategy.offload, &c.strategy.recompute) == (s.zero_stage, s.offload, &s.recompute)
    };
    let font = ("sans-serif", 11).into_font();
    for c in &plan.candidates {
        let at = (gib(c), speed(c));
        let label = Text::new(short(c), (6, -6), font.clone());
        if chosen(c) {
            let marker = EmptyElement::at(at) + Circle::new((0, 0), 8, BUDGET.filled()) + label;
            chart.draw_series(std::iter::once(marker))?;
        } else if c.fits {
            chart.draw_series(std::iter::once(EmptyElement::at(at) + Circle::new((0, 0), 5, BLUE.filled()) + label))?;
        } else {
            chart.draw_series(std::iter::once(EmptyElement::at(at) + Cross::new((0, 0), 5, BLACK) + label))?;
        }
    }
    let legend = [("chosen", BUDGET, 8), ("fits", BLUE, 5)];
    for (name, colour, size) in legend {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(name)
            .legend(move |(x, y)| Circle::new((x + 6, y), size, colour.filled()));
    }
    chart
        .draw_series(std::iter::empty::<Cross<(f64, f64), i32>>())?
        .label("does not fit (least memory)")
        .legend(|(x, y)| Cross::new((x + 6, y), 5, BLACK));
    draw_legend(&mut chart)
}
