//! The operators a storage node runs: the one list.
//!
//! A fragment may hold only these (`validate_fragment` refuses anything else), the host's
//! placement pushes only these and prices each of them, the node binds them, and EXPLAIN names
//! them. Each of those uses matches [`NodeOp`] exhaustively, so adding an operator here is a
//! compile error at every place that must decide what to do with it.

use datafusion::common::JoinType;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::ExecutionPlan;

use crate::fragment::ScanLeafExec;
use crate::star::{StarDimensionExec, StarProbeExec};

/// An operator a storage node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeOp {
    /// A `ScanLeafExec`: the segments of a table the node holds.
    Scan,
    /// A `FilterExec`.
    Filter,
    /// A `ProjectionExec`.
    Projection,
    /// An `AggregateExec` in partial mode; the host runs the final step.
    PartialAggregate,
    /// A `SortExec` with a limit; the host merges the partitions' top rows.
    TopK,
    /// A `HashJoinExec` of one of [`NODE_JOIN_TYPES`] whose inputs are both on the node; it runs
    /// as a Grace hash join within the device memory.
    Join,
    /// A `StarProbeExec`: the fact side of a star join.
    StarProbe,
    /// A `StarDimensionExec`: a star join's dimension, built into keys and group codes.
    StarDimension,
}

/// Every node operator, for tests and documentation that walk the list.
pub const NODE_OPS: [NodeOp; 8] = [NodeOp::Scan, NodeOp::Filter, NodeOp::Projection, NodeOp::PartialAggregate, NodeOp::TopK, NodeOp::Join, NodeOp::StarProbe, NodeOp::StarDimension];

/// The join types a node runs: those placement has a cost for and the tests cover. A
/// null-aware anti join (`NOT IN`) is not per-partition, so it cannot be a Grace join.
pub const NODE_JOIN_TYPES: [JoinType; 3] = [JoinType::Inner, JoinType::LeftSemi, JoinType::RightSemi];

impl NodeOp {
    /// The node operator `plan` is, if it is one (its mode, limit or join type included).
    pub fn of(plan: &dyn ExecutionPlan) -> Option<NodeOp> {
        if plan.is::<ScanLeafExec>() {
            Some(NodeOp::Scan)
        } else if plan.is::<FilterExec>() {
            Some(NodeOp::Filter)
        } else if plan.is::<ProjectionExec>() {
            Some(NodeOp::Projection)
        } else if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
            (*aggregate.mode() == AggregateMode::Partial).then_some(NodeOp::PartialAggregate)
        } else if let Some(sort) = plan.downcast_ref::<SortExec>() {
            sort.fetch().is_some().then_some(NodeOp::TopK)
        } else if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
            (NODE_JOIN_TYPES.contains(join.join_type()) && !join.null_aware).then_some(NodeOp::Join)
        } else if plan.is::<StarProbeExec>() {
            Some(NodeOp::StarProbe)
        } else if plan.is::<StarDimensionExec>() {
            Some(NodeOp::StarDimension)
        } else {
            None
        }
    }

    /// Its name in EXPLAIN and in errors.
    pub fn name(self) -> &'static str {
        match self {
            NodeOp::Scan => "scan",
            NodeOp::Filter => "filter",
            NodeOp::Projection => "projection",
            NodeOp::PartialAggregate => "partial aggregate",
            NodeOp::TopK => "top-k",
            NodeOp::Join => "join",
            NodeOp::StarProbe => "star probe",
            NodeOp::StarDimension => "star dimension",
        }
    }

    /// How many inputs it has in a fragment.
    pub fn inputs(self) -> usize {
        match self {
            NodeOp::Scan => 0,
            NodeOp::Join => 2,
            NodeOp::Filter | NodeOp::Projection | NodeOp::PartialAggregate | NodeOp::TopK | NodeOp::StarProbe | NodeOp::StarDimension => 1,
        }
    }
}

/// Why `plan` is not a node operator, in words for an error.
pub fn refusal(plan: &dyn ExecutionPlan) -> String {
    if let Some(aggregate) = plan.downcast_ref::<AggregateExec>() {
        format!("only partial aggregation runs in storage, not {:?}", aggregate.mode())
    } else if plan.is::<SortExec>() {
        "only top-k sorts (with a limit) run in storage".to_string()
    } else if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        let types: Vec<String> = NODE_JOIN_TYPES.iter().map(|t| t.to_string()).collect();
        if join.null_aware {
            "a null-aware anti join (NOT IN) is not run in storage".to_string()
        } else {
            format!("join type {} is not run in storage (only {})", join.join_type(), types.join(", "))
        }
    } else {
        format!("operator {} is not run in storage", plan.name())
    }
}
