//! Fragments on the wire: DataFusion physical plans in datafusion-proto, with [`ScanLeafExec`]
//! leaves, and the checks a node runs before trusting one.
//!
//! The host ships the operators it chose to push down exactly as its own planner built them
//! (filter, projection, partial aggregation, top-k, a join), so the partial states a node returns
//! are the ones the host's final aggregation expects. The only leaf a fragment may contain is a
//! [`ScanLeaf`], which names a table and segments; the node resolves those in its own catalog,
//! so a fragment can never reach a file by path.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Statistics, internal_err, plan_datafusion_err, plan_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
#[allow(deprecated)]
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::expressions::Column;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::common::JoinSide;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, SendableRecordBatchStream};
use datafusion_proto::bytes::{physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec};
use datafusion_proto::physical_plan::from_proto::parse_physical_expr;
use datafusion_proto::physical_plan::to_proto::serialize_physical_expr_with_converter;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::PhysicalExprNode;
use prost::Message;

use quarry_table::PageEncoding;

use crate::api::{Fragment, FragmentPlan, LinkCodec, ScanLeaf};
use crate::key_set::{KeySet, KeySetExpr};
use crate::node_ops::{NodeOp, refusal};
use crate::star::{StarDimensionExec, StarProbeExec, decode_probe, encode_probe};

/// A fragment's leaf: what a node scans. On the host it is a template the fragment's executor
/// fills with each partition's segments; on the node it is bound to a real scan before running.
#[derive(Debug, Clone)]
pub struct ScanLeafExec {
    leaf: ScanLeaf,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    /// The host's estimate of what the leaf produces, decoded (not shipped).
    statistics: Option<Arc<Statistics>>,
    /// How the table's pages are encoded, for the host's cost model (not shipped: the node
    /// reads its own manifest).
    page_encoding: PageEncoding,
    /// The stored (compressed) bytes of the columns it reads, for the host's cost model (not
    /// shipped). The statistics' `total_byte_size` is the decoded size, which DataFusion
    /// compares to choose a hash join's build side.
    stored_bytes: Option<u64>,
    /// The decompressed bytes per row of the string columns it reads (values and lengths,
    /// what decoding them copies), for the host's cost model (not shipped).
    string_bytes_per_row: Option<f64>,
    /// The host's estimate of the share of rows the filters above the leaf pass (not shipped):
    /// the default selectivity of those filters where DataFusion's analysis gives up.
    filter_selectivity: Option<f64>,
}

impl ScanLeafExec {
    /// A leaf reading `leaf`, producing `schema` (the projected columns).
    pub fn new(leaf: ScanLeaf, schema: SchemaRef) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        ScanLeafExec { leaf, schema, properties: Arc::new(properties), statistics: None, page_encoding: PageEncoding::default(), stored_bytes: None, string_bytes_per_row: None, filter_selectivity: None }
    }

    /// The leaf with the host's estimate of its output, which DataFusion propagates through
    /// the operators above it for placement decisions.
    pub fn with_statistics(mut self, statistics: Statistics) -> Self {
        self.statistics = Some(Arc::new(statistics));
        self
    }

    /// The leaf of a table whose pages are encoded as `page_encoding`.
    pub fn with_page_encoding(mut self, page_encoding: PageEncoding) -> Self {
        self.page_encoding = page_encoding;
        self
    }

    /// The leaf reading `stored_bytes` bytes as stored.
    pub fn with_stored_bytes(mut self, stored_bytes: u64) -> Self {
        self.stored_bytes = Some(stored_bytes);
        self
    }

    /// The leaf whose string columns decompress to `bytes` bytes a row (`None`: not known).
    pub fn with_string_bytes_per_row(mut self, bytes: Option<f64>) -> Self {
        self.string_bytes_per_row = bytes;
        self
    }

    /// See [`Self::with_string_bytes_per_row`].
    pub fn string_bytes_per_row(&self) -> Option<f64> {
        self.string_bytes_per_row
    }

    /// The leaf under filters that pass `selectivity` of its rows (the host's estimate).
    pub fn with_filter_selectivity(mut self, selectivity: Option<f64>) -> Self {
        self.filter_selectivity = selectivity;
        self
    }

    /// See [`Self::with_filter_selectivity`].
    pub fn filter_selectivity(&self) -> Option<f64> {
        self.filter_selectivity
    }

    /// The stored bytes of the columns it reads (as the host knows them).
    pub fn stored_bytes(&self) -> Option<u64> {
        self.stored_bytes
    }

    /// How the table's pages are encoded (as the host knows it).
    pub fn page_encoding(&self) -> PageEncoding {
        self.page_encoding
    }

    /// What it reads.
    pub fn leaf(&self) -> &ScanLeaf {
        &self.leaf
    }

    /// The same leaf over other segments of another version.
    pub fn with_segments(&self, version: u64, segments: Vec<String>) -> Self {
        let leaf = ScanLeaf { version, segments, ..self.leaf.clone() };
        ScanLeafExec { leaf, statistics: self.statistics.clone(), ..self.clone() }
    }
}

impl DisplayAs for ScanLeafExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "Scan: table={}, projection=[{}]", self.leaf.table, self.leaf.projection.join(", "))?;
        if let Some(limit) = self.leaf.limit {
            write!(f, ", limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ScanLeafExec {
    fn name(&self) -> &str {
        "ScanLeafExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() { Ok(self) } else { internal_err!("ScanLeafExec has no children") }
    }

    fn execute(&self, _partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        internal_err!("a fragment's scan leaf runs only once a storage node has bound it to its files")
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        match (&self.statistics, partition) {
            (Some(statistics), None) => Ok(Arc::clone(statistics)),
            _ => Ok(Arc::new(Statistics::new_unknown(&self.schema))),
        }
    }
}

/// Resolves a leaf against a node's catalog: checks the table, version, segments and columns,
/// and returns the schema the leaf produces.
pub type LeafResolver = Arc<dyn Fn(&ScanLeaf) -> Result<SchemaRef> + Send + Sync>;

/// The first byte of an encoded star probe (a scan leaf's encoding is JSON, starting with `{`).
const STAR_PROBE_TAG: u8 = b'S';
const STAR_DIMENSION_TAG: u8 = b'D';

/// The first byte of an encoded key set expression.
const KEY_SET_TAG: u8 = b'K';

/// The codec for fragment leaves and star probes. Encoding needs no catalog; decoding resolves
/// every leaf.
struct LeafCodec {
    resolve: Option<LeafResolver>,
    /// Encoding to check that a plan can be shipped, before it runs: a star probe's tables,
    /// built only when the query runs, are then encoded empty.
    planning: bool,
}

impl fmt::Debug for LeafCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeafCodec")
    }
}

impl PhysicalExtensionCodec for LeafCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        _proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some((&tag @ (STAR_PROBE_TAG | STAR_DIMENSION_TAG), payload)) = buf.split_first() {
            let [input] = inputs else { return plan_err!("fragment: a star probe or dimension needs one input") };
            let input_schema = input.schema();
            let decode_expr = |bytes: &[u8]| {
                let node = PhysicalExprNode::decode(bytes).map_err(|e| plan_datafusion_err!("fragment: malformed expression: {e}"))?;
                parse_physical_expr(&node, ctx, &input_schema, self)
            };
            if tag == STAR_DIMENSION_TAG {
                return Ok(Arc::new(StarDimensionExec::decode(payload, Arc::clone(input), &decode_expr)?));
            }
            return Ok(Arc::new(decode_probe(payload, Arc::clone(input), &decode_expr)?));
        }
        if !inputs.is_empty() {
            return plan_err!("fragment: a scan leaf cannot have inputs");
        }
        let leaf: ScanLeaf = serde_json::from_slice(buf).map_err(|e| plan_datafusion_err!("fragment: malformed scan leaf: {e}"))?;
        let resolve = self.resolve.as_ref().ok_or_else(|| plan_datafusion_err!("fragment decoding needs a catalog"))?;
        let schema = resolve(&leaf)?;
        Ok(Arc::new(ScanLeafExec::new(leaf, schema)))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(leaf) = node.downcast_ref::<ScanLeafExec>() {
            serde_json::to_writer(buf, &leaf.leaf).map_err(|e| plan_datafusion_err!("encoding a scan leaf: {e}"))?;
            return Ok(());
        }
        if let Some(probe) = node.downcast_ref::<StarProbeExec>() {
            let encode_expr = |expr: &Arc<dyn PhysicalExpr>| Ok(serialize_physical_expr_with_converter(expr, self, proto_converter)?.encode_to_vec());
            buf.push(STAR_PROBE_TAG);
            buf.extend(encode_probe(probe, self.planning, &encode_expr)?);
            return Ok(());
        }
        if let Some(dimension) = node.downcast_ref::<StarDimensionExec>() {
            let encode_expr = |expr: &Arc<dyn PhysicalExpr>| Ok(serialize_physical_expr_with_converter(expr, self, proto_converter)?.encode_to_vec());
            buf.push(STAR_DIMENSION_TAG);
            buf.extend(dimension.encode(&encode_expr)?);
            return Ok(());
        }
        plan_err!("operator {} cannot be shipped to a storage node", node.name())
    }

    /// A join's key set: its one child (the probe column) travels as a proto node, the keys as
    /// [`KeySet::encode`]'s bytes.
    fn try_encode_expr(&self, node: &Arc<dyn PhysicalExpr>, buf: &mut Vec<u8>, _ctx: &PhysicalExprEncodeCtx<'_>) -> Result<()> {
        let Some(key_set) = node.downcast_ref::<KeySetExpr>() else {
            return plan_err!("expression {node} cannot be shipped to a storage node");
        };
        buf.push(KEY_SET_TAG);
        buf.extend(key_set.set().encode());
        Ok(())
    }

    fn try_decode_expr(&self, buf: &[u8], inputs: &[Arc<dyn PhysicalExpr>], _ctx: &PhysicalExprDecodeCtx<'_>) -> Result<Arc<dyn PhysicalExpr>> {
        match (buf.split_first(), inputs) {
            (Some((&KEY_SET_TAG, keys)), [column]) if column.is::<Column>() => Ok(Arc::new(KeySetExpr::new(Arc::clone(column), Arc::new(KeySet::decode(keys)?)))),
            _ => plan_err!("fragment: unknown extension expression"),
        }
    }
}

/// Encodes a plan whose leaves are [`ScanLeafExec`]s.
pub fn encode_fragment(plan: Arc<dyn ExecutionPlan>) -> Result<Fragment> {
    encode_with(plan, false)
}

/// A fragment of `plan` for a node in this process: not encoded (see [`FragmentPlan`]).
pub fn built_fragment(plan: Arc<dyn ExecutionPlan>) -> Fragment {
    Fragment { plan: FragmentPlan::Built(plan), link_codec: LinkCodec::None, demand: 0, progress: Default::default() }
}

fn encode_with(plan: Arc<dyn ExecutionPlan>, planning: bool) -> Result<Fragment> {
    let codec = LeafCodec { resolve: None, planning };
    let plan = FragmentPlan::Encoded(physical_plan_to_bytes_with_extension_codec(plan, &codec)?);
    Ok(Fragment { plan, link_codec: LinkCodec::None, demand: 0, progress: Default::default() })
}

/// The bytes of a fragment's plan, for a wire: encoded now if it was built in this process.
pub fn encode_plan(plan: &FragmentPlan) -> Result<bytes::Bytes> {
    match plan {
        FragmentPlan::Encoded(bytes) => Ok(bytes.clone()),
        FragmentPlan::Built(plan) => match encode_fragment(Arc::clone(plan))?.plan {
            FragmentPlan::Encoded(bytes) => Ok(bytes),
            FragmentPlan::Built(_) => unreachable!("encode_fragment encodes"),
        },
    }
}

/// A fragment's plan, checked, its leaves resolved with `resolve`. Encoded bytes are decoded,
/// under `catch_unwind` (untrusted bytes: a malformed fragment must produce an error, never
/// take the node down); a plan built in this process has each leaf resolved as decoding
/// would, and must have the schema that gives. Either is then checked by
/// [`validate_fragment`].
pub fn decode_fragment(fragment: &Fragment, ctx: &TaskContext, resolve: LeafResolver) -> Result<Arc<dyn ExecutionPlan>> {
    let bytes = match &fragment.plan {
        FragmentPlan::Encoded(bytes) => bytes,
        FragmentPlan::Built(plan) => {
            plan.apply(|node| {
                if let Some(leaf) = node.downcast_ref::<ScanLeafExec>()
                    && resolve(&leaf.leaf)?.fields() != leaf.schema.fields()
                {
                    return plan_err!("fragment: leaf of table '{}' does not have the table's columns", leaf.leaf.table);
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
            validate_fragment(plan)?;
            return Ok(Arc::clone(plan));
        }
    };
    let codec = LeafCodec { resolve: Some(resolve), planning: false };
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        physical_plan_from_bytes_with_extension_codec(bytes, ctx, &codec)
    }))
    .map_err(|_| plan_datafusion_err!("fragment: malformed plan (the decoder failed)"))?
    .map_err(|e| plan_datafusion_err!("fragment rejected: the plan does not decode: {}", decode_reason(&e)))?;
    validate_fragment(&decoded)?;
    Ok(decoded)
}

/// Why a plan did not decode, in one line: DataFusion's first line, without the request to
/// file a bug report that it adds to internal errors (a bad plan from the wire is not its bug).
fn decode_reason(error: &DataFusionError) -> String {
    let message = error.message();
    message.lines().next().unwrap_or_default().trim().trim_end_matches('.').to_string()
}

/// Checks that `plan` survives the trip to a node: it encodes, decodes (some expressions encode
/// but cannot be decoded alone, e.g. a scalar subquery's), and passes [`validate_fragment`]. The
/// host pushes only such plans, so a node never rejects what the host chose to send it.
pub fn check_shippable(plan: &Arc<dyn ExecutionPlan>, ctx: &TaskContext) -> Result<()> {
    let fragment = encode_with(Arc::clone(plan), true)?;
    let mut schemas: Vec<(ScanLeaf, SchemaRef)> = Vec::new();
    plan.apply(|node| {
        if let Some(leaf) = node.downcast_ref::<ScanLeafExec>() {
            schemas.push((leaf.leaf.clone(), Arc::clone(&leaf.schema)));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    let resolve: LeafResolver = Arc::new(move |leaf: &ScanLeaf| {
        schemas.iter().find(|(l, _)| l == leaf).map(|(_, schema)| Arc::clone(schema)).ok_or_else(|| plan_datafusion_err!("unknown leaf"))
    });
    decode_fragment(&fragment, ctx, resolve).map(|_| ())
}

/// A node runs only the operators of [`NodeOp`], each over columns that exist in its input with
/// the names the fragment claims: anything else is rejected before a byte is read.
pub fn validate_fragment(plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
    let Some(op) = NodeOp::of(plan.as_ref()) else {
        return plan_err!("fragment: {}", refusal(plan.as_ref()));
    };
    if plan.children().len() != op.inputs() {
        return plan_err!("fragment: {} with {} inputs, not {}", op.name(), plan.children().len(), op.inputs());
    }
    match op {
        NodeOp::Scan => return Ok(()),
        NodeOp::Join => {
            let join = plan.downcast_ref::<HashJoinExec>().expect("NodeOp::Join is a HashJoinExec");
            let (left, right) = (join.left().schema(), join.right().schema());
            for (l, r) in join.on() {
                check_columns(l, &left, "join key")?;
                check_columns(r, &right, "join key")?;
            }
            if let Some(filter) = join.filter() {
                check_columns(filter.expression(), filter.schema(), "join filter")?;
                for index in filter.column_indices() {
                    let side = match index.side {
                        JoinSide::Left => &left,
                        JoinSide::Right => &right,
                        JoinSide::None => return plan_err!("fragment: join filter column without a side"),
                    };
                    if index.index >= side.fields().len() {
                        return plan_err!("fragment: join filter refers to column {} of a {}-column input", index.index, side.fields().len());
                    }
                }
            }
        }
        NodeOp::Filter | NodeOp::Projection | NodeOp::PartialAggregate | NodeOp::TopK | NodeOp::StarProbe | NodeOp::StarDimension => {
            check_plan_columns(plan, plan.children()[0].schema().as_ref())?;
        }
    }
    plan.children().into_iter().try_for_each(validate_fragment)
}

fn check_plan_columns(plan: &Arc<dyn ExecutionPlan>, input: &Schema) -> Result<()> {
    let mut outcome = Ok(());
    plan.apply_expressions(&mut |expr| {
        outcome = check_columns(expr, input, plan.name());
        Ok(if outcome.is_ok() { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
    })?;
    outcome
}

/// Every column an expression reads must be the input's column of that name at that index.
fn check_columns(expr: &Arc<dyn PhysicalExpr>, input: &Schema, context: &str) -> Result<()> {
    let mut outcome = Ok(());
    expr.apply(|e| {
        if let Some(column) = e.downcast_ref::<Column>() {
            match input.fields().get(column.index()) {
                Some(field) if field.name() == column.name() => {}
                _ => {
                    outcome = plan_err!("fragment: unknown column '{}' in {context}", column.name());
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    outcome
}
