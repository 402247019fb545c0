//! Weakly connected components by label propagation.

use crate::csr::{Direction, Graph};
use crate::engine::{
    Edge, EngineConfig, RunStats, Start, StepContext, VertexProgram, VertexValues, run_program,
};
use crate::error::Result;

/// Weakly connected components: edges are followed in both directions (out-edges and the
/// reverse graph's in-edges), every vertex starts labelled with its own id, labels spread with
/// `min`, and a vertex is active again when its label dropped. At the end every vertex holds the
/// smallest id of its component. Needs the reverse graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectedComponents;

impl VertexProgram for ConnectedComponents {
    type Value = u64;
    type Update = u64;

    fn initial_value(&self, vertex: u64) -> u64 {
        vertex
    }

    fn start(&self) -> Start {
        Start::All
    }

    fn directions(&self) -> &[Direction] {
        &[Direction::Out, Direction::In]
    }

    fn edge_program(&self, label: &u64, _: &Edge) -> Option<u64> {
        Some(*label)
    }

    fn vertex_update(&self, a: u64, b: u64) -> u64 {
        a.min(b)
    }

    fn finalize(&self, _: &StepContext, _: u64, old: u64, update: Option<u64>) -> u64 {
        update.map_or(old, |u| old.min(u))
    }

    fn is_active(&self, old: &u64, new: &u64) -> bool {
        new < old
    }
}

/// The result of [`connected_components`].
#[derive(Debug)]
pub struct ComponentsResult {
    /// Component label of every vertex: the smallest vertex id in its component.
    pub labels: VertexValues<u64>,
    /// Number of components (isolated vertices count as one each).
    pub components: u64,
    /// Engine counters.
    pub stats: RunStats,
}

/// Weakly connected components; see [`ConnectedComponents`].
pub fn connected_components(graph: &Graph, config: &EngineConfig) -> Result<ComponentsResult> {
    graph.require(Direction::In)?;
    let out = run_program(graph, &ConnectedComponents, config, u64::MAX)?;
    // A component's label is its smallest vertex, which keeps its own id: count those.
    let mut components = 0;
    for (v, label) in out.values.iter()?.enumerate() {
        if label? == v as u64 {
            components += 1;
        }
    }
    Ok(ComponentsResult {
        labels: out.values,
        components,
        stats: out.stats,
    })
}
