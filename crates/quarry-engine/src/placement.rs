//! Placement: which operators run on the storage node and which on the host.
//!
//! [`PlacementRule`] is the first physical optimizer rule. Walking the plan bottom-up, it looks at
//! each operator directly above a [`FragmentExec`] that a node can run (a filter, a projection, a
//! partial aggregation, a top-k sort, a star join's probe or dimension, a join of two tables on
//! one node) and either pushes it
//! into the fragment or leaves it on the host. Under `--pushdown auto` it compares predicted
//! times from a cost model fed by each node's device profile (internal read bandwidth, link
//! bandwidth, threads, compute slowdown), this machine's calibrated operator costs and
//! DataFusion's selectivity estimates (from the manifest's column statistics). A node's time is
//! that of its slowest stage (read, compute, link), since they overlap; pushdown pays off when
//! it cuts the link's bytes more than it adds device compute (the Smart SSD paper's 100%
//! selectivity selection ran 43% slower on the device: a case this model leaves on the host).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{DataType, Schema};
use datafusion::common::internal_err;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::common::Statistics;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::{ExecutionPlan, StatisticsArgs, StatisticsContext};
use datafusion::execution::{SessionStateBuilder, TaskContext};
use quarry_model::energy::{DeviceWork, Energy, HostPower, Work, joules};
use quarry_model::sharing::Demand;
use quarry_table::PageEncoding;
use quarry_table::segment::DATA_PAGE_ROWS;
use quarry_storage::admission::weighted_demand;
use quarry_storage::grace_join::in_memory_cost;
use quarry_storage::star::{StarDimensionExec, StarProbeExec};
use quarry_storage::{Calibration, LinkCodec, NodeDescription, NodeOp, PageSelectExec, PlainSelectExec, ScanLeafExec, check_shippable};
use datafusion::physical_expr::utils::collect_columns;

use crate::conjunct_order::evaluation_cost;
use crate::scan::{FragmentExec, FragmentPartition, FragmentPrediction, JoinFilterPricing, leaves};

/// Whether operators are pushed to storage nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PushdownMode {
    /// By the cost model.
    #[default]
    Auto,
    /// Whenever the node can run the operator.
    On,
    /// Never: nodes return projected columns unfiltered (passthrough).
    Off,
}

impl std::str::FromStr for PushdownMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(PushdownMode::Auto),
            "on" => Ok(PushdownMode::On),
            "off" => Ok(PushdownMode::Off),
            other => Err(format!("--pushdown takes auto, on or off, not '{other}'")),
        }
    }
}

/// What `--pushdown auto` minimizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Objective {
    /// The query's time (the default).
    #[default]
    Time,
    /// The query's energy, from the nodes' power figures (time where a node has none).
    Energy,
}

impl std::str::FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "time" => Ok(Objective::Time),
            "energy" => Ok(Objective::Energy),
            other => Err(format!("--optimize takes time or energy, not '{other}'")),
        }
    }
}

/// The prediction behind one placement decision, shown by `EXPLAIN`.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The operator decided on.
    pub operator: String,
    /// Whether it was pushed down.
    pub pushed: bool,
    /// Why: "cost" or "forced".
    pub reason: &'static str,
    /// Predicted with the operator on the node.
    pub on_node: Prediction,
    /// Predicted with the operator on the host.
    pub on_host: Prediction,
}

/// Predicted link bytes, time and energy of a fragment plus the host work above it.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// Bytes over the link.
    pub link_bytes: f64,
    /// Seconds.
    pub seconds: f64,
    /// Host CPU seconds (decoding what arrives, the operators kept on the host).
    pub host_cpu_s: f64,
    /// Each node's work, by node name.
    pub devices: Vec<(String, DeviceWork)>,
    /// Joules, when every node has power figures.
    pub joules: Option<f64>,
    /// The component that bounds the time: `flash read`, `device CPU`, `link`, `host receive`,
    /// (passthrough) `host decode`, or the fragment's `fixed cost` when that is over half.
    pub bound: &'static str,
    /// The stated rules the prediction fell back on where an estimate or a rate was unknown.
    pub assumed: Vec<String>,
    /// What the fragment asks of the link and the host's threads, which the fragments running
    /// beside it share (`quarry model check` stretches its time over a run's schedule).
    pub demand: Demand,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let side = if self.pushed { "storage" } else { "host" };
        let energy = |p: &Prediction| p.joules.map_or(String::new(), |j| format!(" / {}", joules(j)));
        write!(
            f,
            "placement: {} on {side} ({}), predicted on storage {:.2} MB over link / {:.1} ms{}, on host {:.2} MB / {:.1} ms{}",
            self.operator,
            self.reason,
            self.on_node.link_bytes / 1e6,
            self.on_node.seconds * 1e3,
            energy(&self.on_node),
            self.on_host.link_bytes / 1e6,
            self.on_host.seconds * 1e3,
            energy(&self.on_host)
        )
    }
}

/// The placement rule (see the module docs).
#[derive(Clone)]
pub struct PlacementRule {
    mode: PushdownMode,
    objective: Objective,
    host_power: HostPower,
    nodes: HashMap<String, NodeDescription>,
    /// Nodes in this process: their batches cost the host nothing to receive.
    in_process: HashSet<String>,
    host: Calibration,
    host_threads: usize,
    /// Functions to decode fragments with, as a node does (see [`check_shippable`]).
    decode_ctx: Arc<TaskContext>,
}

impl std::fmt::Debug for PlacementRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlacementRule").field("mode", &self.mode).field("nodes", &self.nodes.keys()).finish()
    }
}

impl PlacementRule {
    /// A rule deciding by `mode`, knowing the `nodes`, with the host's own rates and threads.
    /// `in_process` names the nodes that run in this process (embedded).
    pub fn new(mode: PushdownMode, nodes: Vec<NodeDescription>, in_process: HashSet<String>, host: Calibration, host_threads: usize) -> Self {
        let nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
        let decode_ctx = SessionStateBuilder::new().with_default_features().build().task_ctx();
        PlacementRule {
            mode,
            objective: Objective::Time,
            host_power: HostPower::do_2013(),
            nodes,
            in_process,
            host,
            host_threads: host_threads.max(1),
            decode_ctx,
        }
    }

    /// The same rule minimizing `objective` under `--pushdown auto`, pricing energy with the
    /// host's `host_power` and each node's profile.
    pub fn with_objective(mut self, objective: Objective, host_power: HostPower) -> Self {
        self.objective = objective;
        self.host_power = host_power;
        self
    }

    /// What a fragment keeps of `prediction` (its [`Self::fragment_cost`]).
    fn as_fragment_prediction(&self, prediction: &Prediction) -> FragmentPrediction {
        FragmentPrediction { seconds: prediction.seconds, bound: prediction.bound, demand: prediction.demand, host_threads: self.host_threads }
    }

    /// `prediction` with its energy: the work it predicts over its predicted time.
    fn priced(&self, mut prediction: Prediction) -> Prediction {
        let mut devices = Vec::with_capacity(prediction.devices.len());
        for (name, work) in &prediction.devices {
            match self.nodes.get(name).and_then(|d| d.profile.power.as_ref()) {
                Some(power) => devices.push((power, work.clone())),
                None => {
                    prediction.joules = None;
                    return prediction;
                }
            }
        }
        let work = Work { wall_s: prediction.seconds, host_cpu_s: prediction.host_cpu_s, devices };
        prediction.joules = Some(Energy::of(&work, &self.host_power).energy_j);
        prediction
    }

    fn visit(&self, plan: Arc<dyn ExecutionPlan>) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        if self.mode == PushdownMode::Off {
            return Ok(Transformed::no(plan));
        }
        if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
            return self.visit_join(&plan, join);
        }
        if !can_run_on_node(plan.as_ref()) {
            return Ok(Transformed::no(plan));
        }
        // The operators between `plan` and the fragment below stayed on the host because each
        // alone did not pay off (a filter that keeps most rows); with `plan` on top (say, the
        // partial aggregate that cuts the link's bytes to a row) they may: decide them together.
        let mut chain = vec![Arc::clone(&plan)];
        let mut below = match plan.children()[..] {
            [child] => Arc::clone(child),
            _ => return Ok(Transformed::no(plan)),
        };
        while !below.is::<FragmentExec>() {
            let [next] = below.children()[..] else { return Ok(Transformed::no(plan)) };
            if !matches!(NodeOp::of(below.as_ref()), Some(NodeOp::Filter | NodeOp::Projection)) || chain.len() >= MAX_CHAIN {
                return Ok(Transformed::no(plan));
            }
            let next = Arc::clone(next);
            chain.push(below);
            below = next;
        }
        let fragment = below.downcast_ref::<FragmentExec>().expect("the loop stops at a fragment");
        // A top-k over several partitions: each partition's top k on its node, merged on the host.
        if let Some(sort) = plan.downcast_ref::<SortExec>()
            && fragment.partitions().len() > 1
            && !sort.preserve_partitioning()
        {
            chain[0] = Arc::new(sort.clone().with_preserve_partitioning(true));
        }
        let depth = chain.len();
        match self.try_push(&chain, fragment)? {
            Push::Pushed(pushed) => match plan.downcast_ref::<SortExec>() {
                Some(sort) if fragment.partitions().len() > 1 && !sort.preserve_partitioning() => {
                    Ok(Transformed::yes(Arc::new(SortPreservingMergeExec::new(sort.expr().clone(), pushed).with_fetch(sort.fetch()))))
                }
                _ => Ok(Transformed::yes(pushed)),
            },
            // The operators stay on the host; the fragment keeps the decision for EXPLAIN.
            Push::Kept(placement) => {
                let noted: Arc<dyn ExecutionPlan> = Arc::new(fragment.with_root(Arc::clone(fragment.root()), Some(placement))?);
                Ok(Transformed::yes(replace_fragment(&plan, depth, noted)?))
            }
            Push::Unshippable => Ok(Transformed::no(plan)),
        }
    }

    /// `chain` (operators, top first, the last directly over `fragment`) moved into the
    /// fragment, if it should be.
    fn try_push(&self, chain: &[Arc<dyn ExecutionPlan>], fragment: &FragmentExec) -> Result<Push> {
        let mut root = Arc::clone(fragment.root());
        for op in chain.iter().rev() {
            root = replace_children_if_necessary(Arc::clone(op), vec![root])?;
        }
        let placement = self.decide(&root, fragment.root(), fragment.partitions(), chain);
        if !placement.pushed {
            return Ok(Push::Kept(placement));
        }
        // Only what the wire format can carry is pushed (e.g. not a subquery expression). Asked
        // only of what would go: the trip there and back is a fifth of this rule's time.
        if check_shippable(&root, &self.decode_ctx).is_err() {
            return Ok(Push::Unshippable);
        }
        Ok(Push::Pushed(Arc::new(fragment.with_root(root, Some(placement))?)))
    }

    /// A join of two fragments on the same single node runs there (a Grace hash join within the
    /// device memory) when the cost model or `--pushdown on` says so.
    fn visit_join(&self, plan: &Arc<dyn ExecutionPlan>, join: &HashJoinExec) -> Result<Transformed<Arc<dyn ExecutionPlan>>> {
        let (Some(left), Some(right)) = (join.left().downcast_ref::<FragmentExec>(), join.right().downcast_ref::<FragmentExec>()) else {
            return Ok(Transformed::no(Arc::clone(plan)));
        };
        if NodeOp::of(plan.as_ref()) != Some(NodeOp::Join) {
            return Ok(Transformed::no(Arc::clone(plan)));
        }
        let Some(partition) = merge_on_one_node(&[left.partitions(), right.partitions()]) else {
            return Ok(Transformed::no(Arc::clone(plan)));
        };
        let root = replace_children_if_necessary(Arc::clone(plan), vec![Arc::clone(left.root()), Arc::clone(right.root())])?;
        let partitions = vec![partition];
        let placement = self.decide_join(&root, left, right, &partitions);
        if !placement.pushed || check_shippable(&root, &self.decode_ctx).is_err() {
            return Ok(Transformed::no(Arc::clone(plan)));
        }
        let fragment = FragmentExec::try_new(root, partitions)?;
        Ok(Transformed::yes(Arc::new(fragment.with_root(Arc::clone(fragment.root()), Some(placement))?)))
    }

    fn decide(&self, pushed: &Arc<dyn ExecutionPlan>, below: &Arc<dyn ExecutionPlan>, partitions: &[FragmentPartition], chain: &[Arc<dyn ExecutionPlan>]) -> Placement {
        let on_node = self.fragment_cost(pushed, partitions, false);
        // Kept on the host, a filter prunes the passthrough scan below it.
        let base = self.fragment_cost(below, partitions, chain.iter().any(|op| op.is::<FilterExec>()));
        let host_ns: f64 = chain
            .iter()
            .filter_map(|op| Some(op.children().first().map_or(0.0, |input| rows(input)) * op_ns_per_row(NodeOp::of(op.as_ref())?, op.as_ref(), &self.host)))
            .sum();
        let on_host = self.priced(Prediction {
            seconds: base.seconds + host_ns / 1e9 / self.host_threads as f64,
            host_cpu_s: base.host_cpu_s + host_ns / 1e9,
            ..base
        });
        let names: Vec<&str> = chain.iter().map(|op| op.name()).collect();
        self.placement(names.join(" + "), on_node, on_host)
    }

    fn decide_join(&self, root: &Arc<dyn ExecutionPlan>, left: &FragmentExec, right: &FragmentExec, partitions: &[FragmentPartition]) -> Placement {
        let on_node = self.fragment_cost(root, partitions, false);
        let (l, r) = (self.fragment_cost(left.root(), left.partitions(), false), self.fragment_cost(right.root(), right.partitions(), false));
        let host_ns = (rows(left.root()) + rows(right.root())) * self.host.join_ns_per_row;
        let on_host = self.priced(Prediction {
            link_bytes: l.link_bytes + r.link_bytes,
            seconds: l.seconds.max(r.seconds) + host_ns / 1e9 / self.host_threads as f64,
            host_cpu_s: l.host_cpu_s + r.host_cpu_s + host_ns / 1e9,
            devices: l.devices.into_iter().chain(r.devices).collect(),
            joules: None,
            bound: if l.seconds >= r.seconds { l.bound } else { r.bound },
            assumed: l.assumed.into_iter().chain(r.assumed).collect(),
            demand: if l.seconds >= r.seconds { l.demand } else { r.demand },
        });
        self.placement("HashJoinExec".into(), on_node, on_host)
    }

    fn placement(&self, operator: String, on_node: Prediction, on_host: Prediction) -> Placement {
        let (pushed, reason) = match self.mode {
            PushdownMode::On => (true, "forced by --pushdown on"),
            PushdownMode::Off => (false, "forced by --pushdown off"),
            PushdownMode::Auto => match (self.objective, on_node.joules, on_host.joules) {
                (Objective::Energy, Some(node), Some(host)) => (node < host, "energy"),
                _ => {
                    let remote = on_node.devices.iter().any(|(name, _)| !self.in_process.contains(name));
                    (auto_pushes(&on_node, &on_host, remote), "cost")
                }
            },
        };
        Placement { operator, pushed, reason, on_node, on_host }
    }

    /// The codec that moves a pushed-down fragment's output fastest: per node, the slowest of
    /// the link (the compressed bytes), the node's compression (its threads, its slowdown) and
    /// the host's decompression, with the calibrated rates and ratios. No compression where a
    /// node is in this process (nothing is encoded) or its link's bandwidth is unknown; a
    /// codec must win by 10% (the ratio is measured on other data than the query's).
    fn link_codec(&self, fragment: &FragmentExec) -> LinkCodec {
        let bytes = output_bytes(fragment.root());
        let mut names: Vec<&str> = fragment.partitions().iter().map(|p| p.node.name()).collect();
        names.sort();
        names.dedup();
        let share = bytes / names.len().max(1) as f64;
        let mut nodes = Vec::with_capacity(names.len());
        for name in names {
            let Some(description) = self.nodes.get(name) else { return LinkCodec::None };
            let Some(link_mbps) = description.profile.link_mbps else { return LinkCodec::None };
            if self.in_process.contains(name) {
                return LinkCodec::None;
            }
            nodes.push((description, link_mbps));
        }
        let seconds = |codec: LinkCodec| {
            nodes
                .iter()
                .map(|(description, link_mbps)| {
                    let (compress, _, ratio) = description.calibration.link_codec_rates(codec);
                    let (_, decompress, _) = self.host.link_codec_rates(codec);
                    let link = share * ratio / (link_mbps * 1e6);
                    let node = share * compress * description.profile.compute_slowdown / description.profile.threads() as f64 / 1e9;
                    let host = share * decompress / self.host_threads as f64 / 1e9;
                    link.max(node).max(host)
                })
                .fold(0.0, f64::max)
        };
        let plain = seconds(LinkCodec::None);
        LinkCodec::ALL
            .into_iter()
            .map(|codec| (codec, seconds(codec)))
            .filter(|(codec, s)| *codec == LinkCodec::None || *s < plain * AUTO_MARGIN)
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(LinkCodec::None, |(codec, _)| codec)
    }

    /// `fragment` with the model's prediction for it as it will run (EXPLAIN shows it;
    /// `--stats` sets it beside the measured time for `quarry model check`); `pruned`: it lies
    /// under a host filter, which prunes its scan (`pruning_filters`).
    fn predicted(&self, fragment: &FragmentExec, pruned: bool) -> FragmentExec {
        let prediction = self.fragment_cost(fragment.root(), fragment.partitions(), pruned);
        fragment.with_prediction(self.as_fragment_prediction(&prediction), prediction.assumed)
    }

    /// A fragment partition's weighted memory demand (Hetero-DB's eq. (2), quarry-storage
    /// `admission.rs`): each node operator's memory weighted by its predicted share of the
    /// time, with the rows [`rows`] estimates spread evenly over the partitions. Memory: a
    /// scan's batches in flight (two), a filter's, projection's or star probe's batch, a partial
    /// aggregate's groups (its output, twice: hash table and states), a top-k's rows, a star
    /// dimension's rows, a join's build side in memory ([`in_memory_cost`]).
    fn demand(&self, fragment: &FragmentExec) -> u64 {
        let share = 1.0 / fragment.partitions().len().max(1) as f64;
        let batch_rows = self.decode_ctx.session_config().batch_size() as f64;
        let mut operators = Vec::new();
        fragment
            .root()
            .apply(|plan| {
                let width = row_width(&plan.schema());
                let input_rows = plan.children().iter().map(|c| rows(c)).sum::<f64>() * share;
                let output_bytes = rows(plan) * share * width;
                let (ns, bytes) = match NodeOp::of(plan.as_ref()) {
                    Some(NodeOp::Scan) => (output_bytes * self.host.decode_ns_per_byte, 2.0 * batch_rows * width),
                    Some(op @ (NodeOp::Filter | NodeOp::Projection)) => (input_rows * op_ns_per_row(op, plan.as_ref(), &self.host), batch_rows * width),
                    Some(NodeOp::StarProbe) => (input_rows * self.host.star_scan_ns_per_row, batch_rows * width),
                    Some(op @ NodeOp::PartialAggregate) => (input_rows * op_ns_per_row(op, plan.as_ref(), &self.host), 2.0 * output_bytes),
                    Some(op @ NodeOp::TopK) => (input_rows * op_ns_per_row(op, plan.as_ref(), &self.host), output_bytes),
                    // It holds the dimension's rows until all have come.
                    Some(op @ NodeOp::StarDimension) => {
                        let input = plan.children()[0];
                        (input_rows * op_ns_per_row(op, plan.as_ref(), &self.host), input_rows * row_width(&input.schema()))
                    }
                    Some(NodeOp::Join) => {
                        let build = plan.children()[0];
                        let build_rows = rows(build) * share;
                        let memory = in_memory_cost((build_rows * row_width(&build.schema())) as usize, build_rows as usize);
                        (input_rows * self.host.join_ns_per_row, memory as f64)
                    }
                    None => return Ok(TreeNodeRecursion::Continue),
                };
                operators.push((ns, bytes as u64));
                Ok(TreeNodeRecursion::Continue)
            })
            .expect("visiting a plan cannot fail");
        weighted_demand(&operators)
    }

    /// Predicted time of running `root` on the partitions' nodes: per node, the slowest of
    /// reading, computing and sending its share, the computing at that node's own rates (the
    /// host's, for passthrough, which the host decodes); nodes run in parallel.
    /// `pruned`: a filter above the fragment prunes its passthrough scan.
    fn fragment_cost(&self, root: &Arc<dyn ExecutionPlan>, partitions: &[FragmentPartition], pruned: bool) -> Prediction {
        let passthrough = root.is::<ScanLeafExec>();
        let leaves = leaves(root);
        let read_bytes: f64 = leaves.iter().map(leaf_stored_bytes).sum();
        let memory = partitions.iter().filter_map(|p| self.nodes.get(p.node.name())).map(|d| d.profile.memory()).min().unwrap_or(0);
        let mut assumed = unknown_rows(root);
        // The host's rates price its decoding, its receiving and the fixed cost.
        let mut unmeasured = if self.host.measured { Vec::new() } else { vec!["the host".to_string()] };
        // Passthrough ships the stored bytes, which the host decodes; pushdown ships Arrow
        // batches, at least one row per partition (aggregates).
        let link_bytes = if passthrough { read_bytes } else { output_bytes(root).max(partitions.len() as f64 * row_width(&root.schema())) };

        let mut node_names: Vec<&str> = partitions.iter().map(|p| p.node.name()).collect();
        node_names.sort();
        node_names.dedup();
        let share = 1.0 / node_names.len().max(1) as f64;
        let mut devices = Vec::with_capacity(node_names.len());
        let mut host_cpu_s = 0.0;
        // Per node: its time, the component bounding it, and its demand on the shared link and
        // host threads (the slowest node's stands for the fragment's).
        let (seconds, bound, demand) = node_names
            .iter()
            .map(|name| -> (f64, &'static str, Demand) {
                let profile = self.nodes.get(*name).map(|d| &d.profile);
                // Passthrough decodes on the host, a partition per thread; pushdown on the
                // device's threads, a segment per thread (a node splits a partition's segments
                // over its threads), so a one-segment table keeps one thread busy however many
                // there are (SSB supplier under kim-isp-2015: 5.2 ms measured, 0.8 predicted at
                // 3 threads).
                let on_node: Vec<&FragmentPartition> = partitions.iter().filter(|p| p.node.name() == *name).collect();
                let streams = on_node.len().min(self.host_threads).max(1) as f64;
                // Every partition sends at once (the link is shared per transfer in flight).
                let link_streams = on_node.len().max(1) as f64;
                let (threads, slowdown) = match profile {
                    Some(p) if !passthrough => {
                        let segments: usize = on_node.iter().map(|p| p.leaves.iter().map(|(_, s)| s.len()).max().unwrap_or(0)).sum();
                        (p.threads().min(segments.max(1)) as f64, p.compute_slowdown)
                    }
                    _ if passthrough => (streams, 1.0),
                    _ => (self.host_threads as f64, 1.0),
                };
                let rates = match self.nodes.get(*name) {
                    Some(description) if !passthrough => &description.calibration,
                    _ => &self.host,
                };
                if !passthrough && !rates.measured {
                    unmeasured.push(format!("node {name}"));
                }
                let FragmentWork { decode_ns, op_ns, join_ns, join_spills } = fragment_work(root, rates, memory);
                // A device pays its partitions' setup at its own speed: the part of the fixed
                // cost (below, at the host's) beyond the host's.
                let setup_ns = if passthrough { 0.0 } else { on_node.len() as f64 * rates.fragment_cpu_ns * (slowdown - 1.0).max(0.0) };
                let compute = (((decode_ns + op_ns) / threads + join_ns) * share * slowdown + setup_ns / threads) / 1e9;
                // The same work in CPU seconds (not spread over threads), for its energy.
                let cpu_s = ((decode_ns + op_ns + join_ns) * share * slowdown + setup_ns) / 1e9;
                let read = profile.and_then(|p| p.read_mbps).map_or(0.0, |mbps| read_bytes * share / (mbps * 1e6));
                let link = profile.and_then(|p| p.link_mbps).map_or(0.0, |mbps| link_bytes * share / (mbps * 1e6));
                // The host receives (decodes the IPC of) pushed-down batches while the node
                // sends them; an embedded node's batches are handed over in memory, and stored
                // bytes are decoded as Parquet (counted in `compute`).
                let receive = if self.in_process.contains(*name) || passthrough { 0.0 } else { link_bytes * share * self.host.transfer_ns_per_byte / self.host_threads as f64 / 1e9 };
                host_cpu_s += receive * self.host_threads as f64 + if passthrough { cpu_s } else { 0.0 };
                let device_cpu_s = if passthrough { 0.0 } else { cpu_s };
                let spilled = if join_spills { read_bytes * share } else { 0.0 };
                devices.push((
                    name.to_string(),
                    DeviceWork { bytes_read: (read_bytes * share) as u64, bytes_written: spilled as u64, bytes_over_link: (link_bytes * share) as u64, cpu_s: device_cpu_s },
                ));
                if passthrough {
                    // DataFusion's Parquet reader fetches a row group's chunks, then decodes
                    // them: transfer and decoding take turns rather than overlap, in one
                    // partition (Synthetic64 PLAIN, 1% of rows, smartssd-2013: passthrough
                    // 180-300 ms where their max predicted 118 ms) and in several, which keep
                    // in step (TPC-H SF 10 under kim-isp-2015, two partitions: `l_orderkey`
                    // alone 773 ms, its transfer 598 ms and its decoding 175 ms a thread).
                    let (transfer, bound) = if read >= link { (read, "flash read") } else { (link, "link") };
                    let demand = Demand { seconds: transfer + compute, link_s: link, host_s: compute, decode_threads: threads, overlapped: false, link_streams, fixed_s: 0.0, warm_saving_s: 0.0 };
                    return (transfer + compute, if compute > transfer { "host decode" } else { bound }, demand);
                }
                let (seconds, bound) = [(compute, "device CPU"), (read, "flash read"), (link, "link"), (receive, "host receive")]
                    .into_iter()
                    .fold((0.0, "device CPU"), |a, b| if b.0 > a.0 { b } else { a });
                (seconds, bound, Demand { seconds, link_s: link, host_s: 0.0, decode_threads: 0.0, overlapped: true, link_streams, fixed_s: 0.0, warm_saving_s: 0.0 })
            })
            .fold((0.0, "device CPU", Demand::default()), |a, b| if b.0 > a.0 { b } else { a });
        // Every fragment pays a fixed cost before its first batch, with a part per column its
        // leaves read (and a remote node's, as calibrated on its machine, is the host's round
        // trip at least).
        let columns = leaves.iter().map(|leaf| leaf.schema().fields().len()).sum();
        // A filter on the node over a leaf filters the scan as a host filter's pruning does.
        let filtered_on_node = root.exists(|plan| Ok(plan.downcast_ref::<FilterExec>().is_some_and(|f| f.input().is::<ScanLeafExec>()))).expect("visiting a plan cannot fail");
        let fixed = self.host.filtered_fixed_ns(columns, (passthrough && pruned) || filtered_on_node) / 1e9;
        let seconds = seconds + fixed;
        let bound = if fixed > seconds / 2.0 { "fixed cost" } else { bound };
        // A passthrough fragment's fixed cost is the host's work too (opening the segment,
        // reading its footer and page index, the first batch), which fragments decoding beside
        // it stretch (TPC-H SF 10 q08 under kim-isp-2015: `nation` beside `customer` and
        // `part` 1.3-4.6 ms, 0.55 predicted alone).
        // Opening right after another fragment opened, it pays less of it (as calibrated).
        let demand = if passthrough {
            Demand { seconds, host_s: demand.host_s + fixed, fixed_s: fixed, warm_saving_s: (self.host.warm_fragment_saving_ns / 1e9).min(fixed), ..demand }
        } else {
            Demand { seconds, ..demand }
        };
        if !unmeasured.is_empty() {
            assumed.push(format!("rates of {} not measured: defaults (run quarry calibrate on the machine)", unmeasured.join(", ")));
        }
        self.priced(Prediction { link_bytes, seconds, host_cpu_s, devices, joules: None, bound, assumed, demand })
    }
}

/// A fragment's CPU work at one side's rates, nanoseconds.
struct FragmentWork {
    /// Decoding its leaves (and the selections that run on their pages).
    decode_ns: f64,
    /// Its other operators, which spread over the side's threads.
    op_ns: f64,
    /// Its joins, which do not: the node's Grace hash join produces one output partition (and,
    /// when it spills, writes both inputs to its spill files and reads them back).
    join_ns: f64,
    /// Whether a join spills: its build side's join in memory exceeds `memory`.
    join_spills: bool,
}

fn fragment_work(root: &Arc<dyn ExecutionPlan>, rates: &Calibration, memory: u64) -> FragmentWork {
    let mut work = FragmentWork { decode_ns: decode_ns(root, rates), op_ns: 0.0, join_ns: 0.0, join_spills: false };
    root.apply(|plan| {
        let input_rows = || plan.children().first().map_or(0.0, |c| rows(c));
        match NodeOp::of(plan.as_ref()) {
            // On the node a star probe runs on the stored values as the pages are read
            // (`StarScanExec`): the decoding is counted with the leaf, the probe is cheaper than
            // over decoded batches.
            Some(NodeOp::StarProbe) => work.op_ns += input_rows() * rates.star_scan_ns_per_row,
            Some(op @ (NodeOp::Filter | NodeOp::Projection | NodeOp::PartialAggregate | NodeOp::TopK | NodeOp::StarDimension)) => {
                work.op_ns += input_rows() * op_ns_per_row(op, plan.as_ref(), rates)
            }
            Some(NodeOp::Join) => {
                let inputs = plan.children();
                let (build_rows, build_bytes) = (rows(inputs[0]), rows(inputs[0]) * row_width(&inputs[0].schema()));
                let spills = in_memory_cost(build_bytes as usize, build_rows as usize) as u64 > memory;
                let spilled: f64 = if spills { inputs.iter().map(|c| rows(c) * row_width(&c.schema())).sum() } else { 0.0 };
                work.join_ns += inputs.iter().map(|c| rows(c)).sum::<f64>() * rates.join_ns_per_row + 2.0 * spilled * rates.spill_ns_per_byte;
                work.join_spills |= spills;
            }
            // The scan is priced by `decode_ns`; a fragment holds nothing else.
            Some(NodeOp::Scan) | None => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("visiting a plan cannot fail");
    work
}

/// A leaf's stored bytes, from its segments' manifest entries; where those do not say, the
/// stated rule: its estimated rows at their Arrow width (stored pages are seldom larger).
fn leaf_stored_bytes(leaf: &ScanLeafExec) -> f64 {
    leaf.stored_bytes().map_or_else(|| known_rows(leaf).unwrap_or(0.0) * row_width(&leaf.schema()), |bytes| bytes as f64)
}

/// What the model assumed for `root`'s operators whose statistics give no row count (see
/// [`rows`]), for EXPLAIN.
fn unknown_rows(root: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    let mut assumed = Vec::new();
    root.apply(|plan| {
        if known_rows(plan.as_ref()).is_none() {
            assumed.push(format!("rows of {} unknown: taken as {}", plan.name(), unknown_rows_rule(plan).1));
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("visiting a plan cannot fail");
    assumed
}

impl PhysicalOptimizerRule for PlacementRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, _config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let _rows = RowsMemo::start();
        let plan = plan.transform_up(|node| self.visit(node))?.data;
        // The fragments under a host filter, which prunes their scans (`pruning_filters`), by
        // address: a fragment has no children, so `transform_up` below hands over the same Arc.
        let mut under_filter = HashSet::new();
        plan.apply(|node| {
            if let Some(filter) = node.downcast_ref::<FilterExec>()
                && filter.input().is::<FragmentExec>()
            {
                under_filter.insert(Arc::as_ptr(filter.input()) as *const () as usize);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        // Join filters (the semi-join reduction) may go to the nodes, except in passthrough; a
        // bare fragment's, under `auto` on a device slower than the host, where this model says
        // the node's filter is faster. On a node with the host's CPU they go as measured: the
        // model prices a page selection's gather at whole pages, which TPC-H SF 10 Q03-Q05's
        // key sets beat (0.81 -> 0.70 s, 0.50 -> 0.37 s, 0.76 -> 0.57 s; `with_key_set`).
        let pricing: Arc<dyn JoinFilterPricing> = Arc::new(self.clone());
        let slower_device = |fragment: &FragmentExec| {
            fragment.partitions().iter().any(|p| self.nodes.get(p.node.name()).is_some_and(|d| d.profile.compute_slowdown > 1.0))
        };
        // Each fragment once (every change to a leaf rebuilds the plan above it): how a
        // pushed-down fragment ships (compression of what it sends, where it pays, and its
        // weighted memory demand, for its node's admission), its join filters, its prediction.
        Ok(plan
            .transform_up(|node| {
                let Some(fragment) = node.downcast_ref::<FragmentExec>() else { return Ok(Transformed::no(node)) };
                let pruned = under_filter.contains(&(Arc::as_ptr(&node) as *const () as usize));
                let ready = match self.mode {
                    PushdownMode::Off => self.predicted(fragment, pruned),
                    _ => {
                        let shipped = if fragment.is_passthrough() { None } else { Some(fragment.with_shipping(self.link_codec(fragment), self.demand(fragment))?) };
                        let accepting = shipped.as_ref().unwrap_or(fragment).accepting_join_filters()?;
                        let priced = if self.mode == PushdownMode::Auto && slower_device(&accepting) { accepting.with_join_filter_pricing(Arc::clone(&pricing)) } else { accepting };
                        self.predicted(&priced, pruned)
                    }
                };
                Ok(Transformed::yes(Arc::new(ready) as Arc<dyn ExecutionPlan>))
            })?
            .data)
    }

    fn name(&self) -> &str {
        "quarry_placement"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

impl JoinFilterPricing for PlacementRule {
    fn predict(&self, root: &Arc<dyn ExecutionPlan>, partitions: &[FragmentPartition]) -> FragmentPrediction {
        self.as_fragment_prediction(&self.fragment_cost(root, partitions, false))
    }
}

/// What became of operators offered to a fragment.
enum Push {
    /// They moved into it: the new fragment.
    Pushed(Arc<dyn ExecutionPlan>),
    /// The cost model (or `--pushdown`) kept them on the host.
    Kept(Placement),
    /// The wire format cannot carry them.
    Unshippable,
}

/// `plan` with the fragment `depth` single-child levels below it replaced by `fragment`.
fn replace_fragment(plan: &Arc<dyn ExecutionPlan>, depth: usize, fragment: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    if depth == 0 {
        return Ok(fragment);
    }
    let [child] = plan.children()[..] else {
        return internal_err!("expected one child under {}", plan.name());
    };
    let child = replace_fragment(child, depth - 1, fragment)?;
    replace_children_if_necessary(Arc::clone(plan), vec![child])
}

/// All partitions of the given fragments on one node, as one partition with every leaf's
/// segments; `None` if they span nodes (a join runs in storage only where both inputs are).
fn merge_on_one_node(fragments: &[&[FragmentPartition]]) -> Option<FragmentPartition> {
    let first = fragments.first()?.first()?;
    let mut leaves = Vec::new();
    for partitions in fragments {
        let count = partitions.first()?.leaves.len();
        for leaf in 0..count {
            let mut version = None;
            let mut segments = Vec::new();
            for p in partitions.iter() {
                if p.node.name() != first.node.name() || version.is_some_and(|v| v != p.leaves[leaf].0) {
                    return None;
                }
                version = Some(p.leaves[leaf].0);
                segments.extend(p.leaves[leaf].1.iter().cloned());
            }
            leaves.push((version?, segments));
        }
    }
    Some(FragmentPartition { node: Arc::clone(&first.node), leaves })
}

/// Where pushdown does not halve the link's bytes, auto pushes down only for a predicted gain
/// of over 10%: the model leaves out the node's per-batch overheads, and a filter that keeps
/// every row was measured 15% slower on the node than passthrough where the model saw a tie
/// (the Smart SSD paper's 100% selectivity case). Where it does, the host-side work it saves
/// (repartitioning, receiving) is underestimated instead, and the plain comparison holds, a tie
/// going to the node: the time is then bound by work both sides share (the leaf's decoding, a
/// join below), and what the model leaves out grows with the bytes sent (the node encoding them,
/// the host decoding them on the same cores). One node, TPC-H SF 10, best of 3: Q06's partial
/// aggregate (a tie at 891 ms, 0 against 437 MB) 310 ms kept on the host, 239 ms pushed; Q22 349
/// against 278 ms; Q13's `o_comment` filter and projection 2.25 s against 1.87 s.
const AUTO_MARGIN: f64 = 0.9;

/// Predictions within 1% of each other are a tie (the two sides' sums of the same terms differ
/// in rounding: Q06's pushed aggregate was predicted 0.01 ms slower than the same work on the host).
const AUTO_TIE: f64 = 1.01;

/// Whether `--pushdown auto` runs an operator on the node, by time: it must win by
/// [`AUTO_MARGIN`], or where it at least halves the bytes sent, win at all, or only tie
/// ([`AUTO_TIE`]) when the node is `remote`. An embedded node's batches are handed over in
/// memory, with no encoding to save, and a tie stays with the host's own operators (its
/// small-group aggregate).
fn auto_pushes(on_node: &Prediction, on_host: &Prediction, remote: bool) -> bool {
    if on_node.link_bytes * 2.0 > on_host.link_bytes {
        on_node.seconds < on_host.seconds * AUTO_MARGIN
    } else if remote {
        on_node.seconds <= on_host.seconds * AUTO_TIE
    } else {
        on_node.seconds < on_host.seconds
    }
}

/// A `PageSelectExec`'s cost of gathering a column for the rows that pass, relative to
/// decoding the column whole: row by row (a run search and a bit extraction each, about 4x a
/// value decoded in bulk) while under a quarter of a page passes; above that it decodes the page
/// whole and picks the rows. So it pays only for selective filters: TPC-H SF 10 Q06 (2% of
/// lineitem passes) 0.59 s against 1.10 s decoding whole and filtering; Q07 (30%) 1.78 s
/// against 1.62 s; Q01 (98%) 3.1 s against 2.8 s.
///
/// A compressed page holding even one passing row is read and decompressed whole, so below a
/// quarter the share is at least the fraction of pages that hold a passing row: Synthetic64 at
/// 0.1% (20 of a page's 20K rows pass, every page is touched) spent 1.44 s of node CPU gathering
/// 63 columns, the whole decoding rate, where 4x the selectivity had predicted 0.05 s.
fn page_gather_share(selectivity: f64) -> f64 {
    if selectivity < 0.25 {
        let pages_touched = 1.0 - (1.0 - selectivity).powf(DATA_PAGE_ROWS as f64);
        (4.0 * selectivity).max(pages_touched)
    } else {
        1.0 + selectivity
    }
}

/// Most operators reconsidered together with the one above them (see `visit`).
const MAX_CHAIN: usize = 4;

/// Whether `visit` may move `plan` into the fragment below it: a node operator with one input
/// (a join is `visit_join`'s, with both inputs; a scan is the fragment itself).
fn can_run_on_node(plan: &dyn ExecutionPlan) -> bool {
    match NodeOp::of(plan) {
        Some(NodeOp::Filter | NodeOp::Projection | NodeOp::PartialAggregate | NodeOp::TopK | NodeOp::StarProbe | NodeOp::StarDimension) => true,
        Some(NodeOp::Join | NodeOp::Scan) | None => false,
    }
}

/// DataFusion's estimate of what a plan produces, over all its partitions.
pub fn plan_statistics(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<Statistics>> {
    StatisticsContext::new().compute(plan.as_ref(), &StatisticsArgs::new()).ok()
}

/// The rows a plan produces: DataFusion's estimate, except through filters
/// whose predicate is string comparisons (see [`string_filter_selectivity`]) and the
/// projections above them.
fn rows(plan: &Arc<dyn ExecutionPlan>) -> f64 {
    RowsMemo::rows(plan, rows_uncached)
}

/// Each plan's rows, computed once while the rule runs: every candidate is priced from its
/// inputs' rows, and DataFusion computes a subtree's statistics afresh at each call (a filter's
/// by interval analysis), which took a sixth of this rule's time. Plans are kept by address
/// with the plan itself, so that no address is reused while it is remembered.
struct RowsMemo;

type RowsByPlan = HashMap<usize, (Arc<dyn ExecutionPlan>, f64)>;

thread_local! {
    static ROWS: std::cell::RefCell<Option<RowsByPlan>> = const { std::cell::RefCell::new(None) };
}

impl RowsMemo {
    /// Remembers rows on this thread until the guard drops.
    fn start() -> RowsMemoGuard {
        ROWS.with(|rows| *rows.borrow_mut() = Some(HashMap::new()));
        RowsMemoGuard
    }

    fn rows(plan: &Arc<dyn ExecutionPlan>, compute: fn(&Arc<dyn ExecutionPlan>) -> f64) -> f64 {
        let address = Arc::as_ptr(plan) as *const () as usize;
        if let Some(rows) = ROWS.with(|memo| memo.borrow().as_ref().and_then(|m| m.get(&address).map(|(_, rows)| *rows))) {
            return rows;
        }
        let rows = compute(plan);
        ROWS.with(|memo| {
            if let Some(memo) = memo.borrow_mut().as_mut() {
                memo.insert(address, (Arc::clone(plan), rows));
            }
        });
        rows
    }
}

/// Ends [`RowsMemo::start`].
struct RowsMemoGuard;

impl Drop for RowsMemoGuard {
    fn drop(&mut self) {
        ROWS.with(|rows| *rows.borrow_mut() = None);
    }
}

fn rows_uncached(plan: &Arc<dyn ExecutionPlan>) -> f64 {
    if let Some(filter) = plan.downcast_ref::<FilterExec>() {
        if let Some(selectivity) = string_filter_selectivity(filter) {
            return rows(filter.input()) * selectivity;
        }
    } else if let Some(projection) = plan.downcast_ref::<ProjectionExec>() {
        return rows(projection.input());
    }
    known_rows(plan.as_ref()).unwrap_or_else(|| unknown_rows_rule(plan).0)
}

/// Groups a star probe is taken to produce per partition: they are known only once its
/// dimensions are built, after planning (SSB's star queries group into 1 to 800).
const STAR_PROBE_GROUPS: f64 = 1000.0;

/// The rows taken for `plan` when its statistics give none, and the rule, for EXPLAIN: a star
/// probe's groups ([`STAR_PROBE_GROUPS`] a partition, at most its input's rows); any other
/// operator as many as its largest input (no operator a fragment holds multiplies rows but a
/// join, and a node's join matches keys to a unique build side); a leaf none.
fn unknown_rows_rule(plan: &Arc<dyn ExecutionPlan>) -> (f64, &'static str) {
    let input = plan.children().iter().map(|c| rows(c)).fold(0.0, f64::max);
    if plan.is::<StarProbeExec>() {
        let partitions = plan.properties().partitioning.partition_count() as f64;
        return ((STAR_PROBE_GROUPS * partitions).min(input), "1,000 groups a partition");
    }
    if plan.children().is_empty() { (0.0, "none") } else { (input, "its largest input's") }
}

/// Rows of `plan` as its statistics estimate them, if they do.
fn known_rows(plan: &dyn ExecutionPlan) -> Option<f64> {
    let statistics = StatisticsContext::new().compute(plan, &StatisticsArgs::new()).ok()?;
    statistics.num_rows.get_value().map(|&n| n as f64)
}

/// The bytes a pushed-down plan sends: its rows at their Arrow width, or a star dimension's
/// keys and codes.
fn output_bytes(plan: &Arc<dyn ExecutionPlan>) -> f64 {
    match plan.downcast_ref::<StarDimensionExec>() {
        Some(dimension) => dimension.predicted_bytes(rows(dimension.input())),
        None => rows(plan) * row_width(&plan.schema()),
    }
}

/// The fraction of rows a filter of string comparisons (`column <op> 'literal'`, `<` `<=` `>`
/// `>=` `=`, ANDed) passes, from the columns' min, max and distinct count: a range's bounds are
/// placed between min and max by their first bytes after the common prefix, as a base-256
/// fraction; an equality keeps one distinct value. DataFusion cannot place strings and assumes
/// 20%, which sent SSB q2.2's and q2.3's part filters (8 brands of 1000, and one) to the host
/// as 4.8 MB of stored bytes. `None` for any other predicate.
fn string_filter_selectivity(filter: &FilterExec) -> Option<f64> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
    use datafusion::physical_expr::utils::split_conjunction;
    let statistics = plan_statistics(filter.input())?;
    let text = |value: &ScalarValue| -> Option<String> {
        match value {
            ScalarValue::Utf8(Some(s)) | ScalarValue::Utf8View(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
            _ => None,
        }
    };
    // Per column: its (min, max) and the range the conjuncts leave, as fractions of it.
    let mut ranges: HashMap<usize, (f64, f64)> = HashMap::new();
    let mut equalities = 1.0;
    for conjunct in split_conjunction(filter.predicate()) {
        let binary = conjunct.downcast_ref::<BinaryExpr>()?;
        let (column, literal, op) = match (binary.left().downcast_ref::<Column>(), binary.right().downcast_ref::<Literal>()) {
            (Some(c), Some(l)) => (c, l, *binary.op()),
            _ => match (binary.right().downcast_ref::<Column>(), binary.left().downcast_ref::<Literal>()) {
                (Some(c), Some(l)) => (c, l, binary.op().swap()?),
                _ => return None,
            },
        };
        let column_statistics = statistics.column_statistics.get(column.index())?;
        let (min, max) = (text(column_statistics.min_value.get_value()?)?, text(column_statistics.max_value.get_value()?)?);
        let value = text(literal.value())?;
        let place = string_place(&min, &max, &value);
        let range = ranges.entry(column.index()).or_insert((0.0, 1.0));
        match op {
            Operator::Lt | Operator::LtEq => range.1 = range.1.min(place),
            Operator::Gt | Operator::GtEq => range.0 = range.0.max(place),
            // One value of the column's distinct ones (none if outside its min and max).
            Operator::Eq => {
                let distinct = *column_statistics.distinct_count.get_value()?;
                equalities *= if value < min || value > max { 0.0 } else { 1.0 / distinct.max(1) as f64 };
            }
            _ => return None,
        }
    }
    let input_rows = statistics.num_rows.get_value().copied().unwrap_or(0).max(1) as f64;
    // At least one row's worth: a range between two neighbouring values still holds some.
    Some((equalities * ranges.values().map(|(low, high)| (high - low).max(0.0)).product::<f64>()).max(1.0 / input_rows))
}

/// Where `value` lies between `min` and `max` (0 to 1, clamped), by its first 6 bytes after
/// the prefix `min` and `max` share.
fn string_place(min: &str, max: &str, value: &str) -> f64 {
    let shared = min.bytes().zip(max.bytes()).take_while(|(a, b)| a == b).count();
    let number = |s: &str| -> f64 {
        let tail = s.as_bytes().get(shared..).unwrap_or_default();
        (0..6).fold(0.0, |n, i| n * 256.0 + f64::from(tail.get(i).copied().unwrap_or(0)))
    };
    if value.as_bytes().get(..shared) != min.as_bytes().get(..shared) {
        return if value < min { 0.0 } else { 1.0 };
    }
    let (low, high) = (number(min), number(max));
    if high <= low {
        return if value <= min { 0.0 } else { 1.0 };
    }
    ((number(value) - low) / (high - low)).clamp(0.0, 1.0)
}

/// Predicted CPU time of decoding the fragment's leaves, nanoseconds. A Parquet leaf alone is
/// decoded whole. A filter directly over a leaf of a table with PLAIN pages runs as
/// `PlainSelectExec`: the filter's columns copied whole, the others' selected values copied by
/// offset, a run at a time, every page split. Any other filter directly over a leaf whose
/// predicate has a comparison the page reader runs is a `PageSelectExec`: the filter's columns
/// decoded whole, the others gathered for the rows that pass.
fn decode_ns(root: &Arc<dyn ExecutionPlan>, rates: &Calibration) -> f64 {
    let mut total = 0.0;
    root.apply(|plan| {
        if let Some((filter, leaf, plain)) = selection(plan.as_ref()) {
            let schema = leaf.schema();
            let used: std::collections::HashSet<usize> = collect_columns(filter.predicate()).iter().map(|c| c.index()).collect();
            let width = |keep: &dyn Fn(usize) -> bool| {
                let fields: Vec<_> = schema.fields().iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, f)| f.as_ref().clone()).collect();
                (row_width(&Schema::new(fields.clone())) * (!fields.is_empty() as u8 as f64), fields.len() as f64)
            };
            let (mut filter_width, _) = width(&|i| used.contains(&i));
            if leaf.page_encoding() != PageEncoding::Plain {
                // A dictionary-encoded string is compared once per dictionary entry, and each
                // row costs its index, not its string (SSB q2.2's brand range over part: 8.9 ms
                // on the node, predicted 19.4 ms at a string's width; placed on the host, 14.6).
                let strings = used.iter().filter(|&&i| is_string(schema.field(i).data_type())).count();
                filter_width -= strings as f64 * (STRING_WIDTH - DICTIONARY_INDEX_WIDTH);
            }
            let (other_width, other_columns) = width(&|i| !used.contains(&i));
            let input = rows(filter.input());
            let selectivity = if input > 0.0 { (rows(plan) / input).clamp(0.0, 1.0) } else { 1.0 };
            total += if plain {
                let terms = plain_selection_terms(input, selectivity, filter_width, other_width, other_columns, schema.fields().len() as f64);
                terms.iter().zip(rates.plain_selection_rates()).map(|(term, rate)| term * rate).sum()
            } else {
                // Priced as a leaf decoded whole is (`leaf_decode_ns_per_row`), so that the two
                // sides of a placement compare alike: the filter's columns a value a row (a
                // dictionary string its index), the others' values and string bytes for the
                // pages the gather reads.
                let (strings, all_string_bytes) = leaf_string_bytes_per_row(leaf);
                let string_bytes = all_string_bytes / strings.max(1.0);
                let filter_strings = used.iter().filter(|&&i| is_string(schema.field(i).data_type())).count() as f64;
                let filter_string_bytes = if leaf.page_encoding() == PageEncoding::Plain { filter_strings * string_bytes } else { 0.0 };
                let filter_ns = used.len() as f64 * rates.value_ns + filter_string_bytes * rates.string_ns_per_byte;
                let other_ns = other_columns * rates.value_ns + (strings - filter_strings) * string_bytes * rates.string_ns_per_byte;
                input * (filter_ns + page_gather_share(selectivity) * other_ns)
            };
            return Ok(TreeNodeRecursion::Jump);
        }
        if let Some(leaf) = plan.downcast_ref::<ScanLeafExec>() {
            total += rows(plan) * leaf_decode_ns_per_row(leaf, rates);
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .expect("visiting a plan cannot fail");
    total
}

/// Decoding a row of a leaf's columns whole: a value each, and its strings' bytes (TPC-H SF 10
/// passthrough on one host thread: `l_shipmode` and `l_quantity`, 1 byte a row stored, 4-5 ns a
/// value; `l_comment`, 31 bytes, 27 ns; at Arrow widths, 24 and 16 bytes a value, the flags
/// were priced at 3-4 times their cost and the comments at two thirds).
fn leaf_decode_ns_per_row(leaf: &ScanLeafExec, rates: &Calibration) -> f64 {
    let (_, string_bytes) = leaf_string_bytes_per_row(leaf);
    leaf.schema().fields().len() as f64 * rates.value_ns + string_bytes * rates.string_ns_per_byte
}

/// A leaf's string columns and their decompressed bytes a row. A leaf whose string bytes are
/// unknown (an older node's) counts each string at [`STRING_WIDTH`].
fn leaf_string_bytes_per_row(leaf: &ScanLeafExec) -> (f64, f64) {
    let strings = leaf.schema().fields().iter().filter(|f| is_string(f.data_type())).count() as f64;
    (strings, leaf.string_bytes_per_row().unwrap_or(strings * STRING_WIDTH))
}

/// The amounts a selection over PLAIN pages (`PlainSelectExec`) is priced by, in the order of
/// [`Calibration::plain_selection_rates`]: bytes copied (the filter's columns whole, the others'
/// selected values), input rows, selected rows, runs of selected rows times the other columns
/// (each run a copy by offset per column), and pages split. `quarry calibrate` fits the rates to
/// these same terms.
pub fn plain_selection_terms(input: f64, selectivity: f64, filter_width: f64, other_width: f64, other_columns: f64, columns: f64) -> [f64; 5] {
    let pages = input / DATA_PAGE_ROWS as f64 * columns;
    let runs = input * selectivity * (1.0 - selectivity) + 1.0;
    [input * (filter_width + selectivity * other_width), input, input * selectivity, runs * other_columns, pages]
}

/// A filter a node runs as a selection over its leaf's pages (`PlainSelectExec` if `true`,
/// else `PageSelectExec`): the predicate evaluated on stored values, counted in decoding.
fn selection(plan: &dyn ExecutionPlan) -> Option<(&FilterExec, &ScanLeafExec, bool)> {
    let filter = plan.downcast_ref::<FilterExec>()?;
    let leaf = filter.input().downcast_ref::<ScanLeafExec>().filter(|leaf| leaf.leaf().limit.is_none())?;
    let schema = leaf.schema();
    let plain = leaf.page_encoding() == PageEncoding::Plain && PlainSelectExec::supports(&schema, filter.predicate());
    (plain || PageSelectExec::supports(&schema, filter.predicate())).then_some((filter, leaf, plain))
}

/// CPU cost per input row of an operator, from the calibration. A filter in DataFusion's
/// `FilterExec` costs by its predicate: TPC-H Q12's five comparisons, one an IN list of
/// strings, cost some 20 ns per row against 2 for one integer comparison. A node's selection
/// over pages evaluates a comparison once per dictionary entry and on the rows still alive, so
/// it is charged the simple rate; one over PLAIN pages is priced whole by [`decode_ns`].
fn op_ns_per_row(op: NodeOp, plan: &dyn ExecutionPlan, rates: &Calibration) -> f64 {
    match op {
        NodeOp::Filter => {
            let filter = plan.downcast_ref::<FilterExec>().expect("NodeOp::Filter is a FilterExec");
            match selection(plan) {
                // Priced with the selection's terms (its per-row rate evaluates the predicate).
                Some((_, _, true)) => 0.0,
                Some(_) => rates.filter_ns_per_row * (1.0 + residual_cost_per_row(filter)),
                None => rates.filter_ns_per_row * evaluation_cost(filter.predicate(), &filter.input().schema()),
            }
        }
        NodeOp::PartialAggregate => rates.aggregate_ns_per_row,
        NodeOp::StarProbe => rates.star_probe_ns_per_row,
        // Numbering groups and sorting keys: a hash join's build, per row.
        NodeOp::StarDimension => rates.join_ns_per_row,
        NodeOp::TopK => 2.0 * rates.filter_ns_per_row,
        NodeOp::Projection => 0.5 * rates.filter_ns_per_row * plan.schema().fields().len() as f64,
        // Priced on their own in `fragment_cost`.
        NodeOp::Scan | NodeOp::Join => 0.0,
    }
}

/// What a page selection's residual (the conjuncts its page reader cannot compare on the
/// pages, which DataFusion evaluates over the rows those comparisons keep) costs per input row,
/// in simple comparisons: its evaluation cost times the share of rows the comparisons keep, as
/// DataFusion estimates a filter of them alone. TPC-H SF 10 Q22's `substring(c_phone, 1, 2) IN
/// (...)` over the 91% of `customer` that `c_acctbal > 0` keeps took 146 ms of CPU on the
/// node, where the flat rate of one comparison priced 4 ms.
fn residual_cost_per_row(filter: &FilterExec) -> f64 {
    use datafusion::physical_expr::conjunction_opt;
    use datafusion::physical_expr::utils::split_conjunction;
    use quarry_storage::page_select::Comparison;
    let schema = filter.input().schema();
    let (compared, residual): (Vec<_>, Vec<_>) = split_conjunction(filter.predicate()).into_iter().cloned().partition(|c| Comparison::compile(c, &schema).is_some());
    let Some(residual) = conjunction_opt(residual) else { return 0.0 };
    let input = rows(filter.input());
    let kept = conjunction_opt(compared)
        .and_then(|compared| FilterExec::try_new(compared, Arc::clone(filter.input())).ok())
        .map_or(1.0, |comparisons| if input > 0.0 { (rows(&(Arc::new(comparisons) as Arc<dyn ExecutionPlan>)) / input).clamp(0.0, 1.0) } else { 1.0 });
    kept * evaluation_cost(&residual, &schema)
}

pub fn is_string(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Binary | DataType::BinaryView | DataType::LargeBinary)
}

/// Bytes a string is counted at in Arrow.
const STRING_WIDTH: f64 = 24.0;
/// Bytes a dictionary index is counted at, decoded.
const DICTIONARY_INDEX_WIDTH: f64 = 4.0;

/// Bytes per row of a schema in Arrow (strings counted at a typical 24 bytes).
pub fn row_width(schema: &Schema) -> f64 {
    schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            string if is_string(string) => STRING_WIDTH,
            DataType::Boolean => 0.125,
            other => other.primitive_width().unwrap_or(8) as f64,
        })
        .sum::<f64>()
        .max(1.0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};
    use quarry_storage::{Calibration, ScanLeaf, ScanLeafExec};

    use super::{Prediction, STRING_WIDTH, auto_pushes, leaf_decode_ns_per_row, string_place};

    /// A row costs a value per column and its strings' decompressed bytes; a leaf whose string
    /// bytes are unknown counts a string at the typical width.
    #[test]
    fn a_leaf_decodes_a_value_per_column_and_its_string_bytes() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false), Field::new("comment", DataType::Utf8View, false)]));
        let leaf = ScanLeafExec::new(ScanLeaf { table: "t".into(), version: 1, segments: Vec::new(), projection: vec!["k".into(), "comment".into()], limit: None }, schema);
        let rates = Calibration { value_ns: 3.0, string_ns_per_byte: 0.5, ..Calibration::default() };
        assert_eq!(leaf_decode_ns_per_row(&leaf, &rates), 2.0 * 3.0 + STRING_WIDTH * 0.5);
        let leaf = leaf.with_string_bytes_per_row(Some(100.0));
        assert_eq!(leaf_decode_ns_per_row(&leaf, &rates), 2.0 * 3.0 + 100.0 * 0.5);
    }

    fn prediction(link_bytes: f64, seconds: f64) -> Prediction {
        Prediction { link_bytes, seconds, host_cpu_s: 0.0, devices: Vec::new(), joules: None, bound: "device CPU", assumed: Vec::new(), demand: quarry_model::sharing::Demand { seconds, ..Default::default() } }
    }

    /// The node must win by 10%, unless it is remote and at least halves the link's bytes:
    /// then a tie (1%) is enough (TPC-H Q06's partial aggregate, 891 ms either way, 0 against
    /// 437 MB). An embedded node has no link to save.
    #[test]
    fn auto_pushes_by_a_margin_or_on_a_tie_that_halves_the_link() {
        let host = prediction(437e6, 0.891);
        assert!(auto_pushes(&prediction(0.0, 0.891), &host, true), "a tie that saves the link's bytes");
        assert!(auto_pushes(&prediction(0.0, 0.895), &host, true), "within 1%");
        assert!(!auto_pushes(&prediction(0.0, 0.91), &host, true), "2% slower");
        assert!(!auto_pushes(&prediction(300e6, 0.85), &host, true), "a 5% gain that keeps most bytes");
        assert!(auto_pushes(&prediction(300e6, 0.80), &host, true), "a 10% gain");
        assert!(!auto_pushes(&prediction(300e6, 0.891), &host, true), "a tie that keeps most bytes");
        assert!(!auto_pushes(&prediction(0.0, 0.891), &host, false), "embedded: a tie stays on the host");
        assert!(auto_pushes(&prediction(0.0, 0.88), &host, false), "embedded: a gain that saves the bytes");
        assert!(!auto_pushes(&prediction(300e6, 0.85), &host, false), "embedded: a 5% gain that keeps most bytes");
    }

    #[test]
    fn strings_are_placed_between_min_and_max_after_their_shared_prefix() {
        // SSB's brands: 'MFGR#111' .. 'MFGR#5540'; q2.2 asks 'MFGR#2221' ..= 'MFGR#2228'.
        let (low, high) = (string_place("MFGR#111", "MFGR#5540", "MFGR#2221"), string_place("MFGR#111", "MFGR#5540", "MFGR#2228"));
        assert!(low > 0.2 && low < 0.3, "{low}");
        assert!(high > low && high - low < 0.001, "{low} {high}");
        assert_eq!(string_place("b", "d", "a"), 0.0);
        assert_eq!(string_place("b", "d", "e"), 1.0);
        assert_eq!(string_place("MFGR#1", "MFGR#5", "AAAA"), 0.0, "below the shared prefix");
        assert_eq!(string_place("MFGR#1", "MFGR#5", "ZZZZ"), 1.0, "above the shared prefix");
        assert_eq!(string_place("same", "same", "same"), 0.0);
        let middle = string_place("a", "c", "b");
        assert!((middle - 0.5).abs() < 0.01, "{middle}");
    }
}
