//! Planning the star join (see `quarry_storage::star`): a logical rule that finds aggregates
//! over a fact table joined to dimension tables, the node that stands for them, and its
//! physical planner.
//!
//! [`StarJoinRule`] takes the join region under an `Aggregate` apart (as the join-ordering
//! rule does) and turns it into a [`StarJoinNode`] when it has the star's shape: one relation
//! much larger than the others (the fact, a table's scan under filters and projections only),
//! every other relation joined to it, directly or through
//! others (a snowflake: `nation` under `supplier`), by one equality of a fact column with a
//! column of that dimension; grouping expressions that each read one dimension; `sum`, `count`,
//! `min` and `max` of expressions over the fact's columns. Each dimension becomes a plan of its
//! own (its relations joined), the fact's plan stays as it was (its filter included), and the
//! original aggregate is kept as the node's last input, the fallback for a dimension whose keys
//! turn out not to be unique.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchemaRef, ExprSchema, Result, internal_err};
use datafusion::catalog::Session;
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use quarry_storage::star::{AggFunc, Domain, StarAggregate, StarDimensionExec, StarProbeExec, StarSpec, supported_key_type};

use crate::join_order::{Edge, Region};
use crate::star_exec::{StarAggregateExec, StarDimensionPlan};

/// A fact relation must be estimated at least this many times larger than each dimension.
const FACT_RATIO_MIN: f64 = 4.0;
/// A dimension key must have at least this share of distinct values among its table's rows
/// (the statistics' distinct counts are estimates, within a few percent).
const UNIQUE_KEY_SHARE_MIN: f64 = 0.8;

/// Distinct values of `column` over the rows of the table `plan` scans (looking through
/// filters, projections and aliases to the scan), if the statistics know them.
fn base_distinct_share(plan: &LogicalPlan, column: &Column) -> Option<f64> {
    match plan {
        LogicalPlan::TableScan(_) => {
            let estimate = crate::cardinality::estimate(plan);
            let distinct = estimate.columns.get(column)?.distinct;
            (estimate.rows > 0.0).then(|| distinct / estimate.rows)
        }
        LogicalPlan::Filter(f) => base_distinct_share(&f.input, column),
        LogicalPlan::Projection(p) if p.expr.iter().all(|e| matches!(e, Expr::Column(_))) => base_distinct_share(&p.input, column),
        LogicalPlan::SubqueryAlias(a) => {
            let inner = a.input.schema().columns().into_iter().find(|c| c.name == column.name)?;
            base_distinct_share(&a.input, &inner)
        }
        _ => None,
    }
}

/// Whether `plan` reads one table through filters, projections and aliases only. A star join
/// pays where its probe runs at the fact's scan (the dimensions' keys skip row groups, the
/// probe runs in storage); over a join or union the probe runs above it, while hash joins push
/// their key filters down through it to the scan. TPC-DS at SF 1: q80 (sales left-joined to
/// returns) 248 ms as a star join against 103 ms as hash joins, q05 (a union of sales and
/// returns) 155 against 97, q14 (a semi join below) 525 against 398.
fn scans_one_table(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::TableScan(_) => true,
        LogicalPlan::Filter(f) => scans_one_table(&f.input),
        LogicalPlan::Projection(p) => scans_one_table(&p.input),
        LogicalPlan::SubqueryAlias(a) => scans_one_table(&a.input),
        _ => false,
    }
}

/// An aggregate over a star join (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct StarJoinNode {
    /// The fact relation's plan.
    fact: LogicalPlan,
    /// Each dimension's plan (its relations joined).
    dims: Vec<LogicalPlan>,
    /// The original aggregate, run when a dimension's keys are not unique.
    fallback: LogicalPlan,
    /// Per dimension, the fact's foreign key and the dimension's key.
    keys: Vec<(Column, Column)>,
    /// The aggregate's grouping expressions, each with the dimension it reads.
    groups: Vec<(usize, Expr)>,
    /// The aggregates: function and argument over the fact (`None` for `count(*)`).
    aggregates: Vec<(AggFunc, Option<Expr>)>,
}

impl UserDefinedLogicalNodeCore for StarJoinNode {
    fn name(&self) -> &str {
        "StarJoin"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        std::iter::once(&self.fact).chain(&self.dims).chain(std::iter::once(&self.fallback)).collect()
    }

    fn schema(&self) -> &DFSchemaRef {
        self.fallback.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        Vec::new()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let keys: Vec<String> = self.keys.iter().map(|(fact, dim)| format!("{fact} = {dim}")).collect();
        let groups: Vec<String> = self.groups.iter().map(|(d, e)| format!("{e} (dimension {d})")).collect();
        let aggregates: Vec<String> = self.aggregates.iter().map(|(f, a)| format!("{f:?}({})", a.as_ref().map_or("*".into(), |e| e.to_string()))).collect();
        write!(f, "StarJoin: keys=[{}], groups=[{}], aggregates=[{}]", keys.join(", "), groups.join(", "), aggregates.join(", "))
    }

    fn with_exprs_and_inputs(&self, exprs: Vec<Expr>, mut inputs: Vec<LogicalPlan>) -> Result<Self> {
        if !exprs.is_empty() || inputs.len() != self.dims.len() + 2 {
            return internal_err!("StarJoin rebuilt with {} expressions and {} inputs", exprs.len(), inputs.len());
        }
        let fallback = inputs.pop().expect("checked");
        let fact = inputs.remove(0);
        Ok(StarJoinNode { fact, dims: inputs, fallback, ..self.clone() })
    }

    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}

/// The rule (see the module docs).
#[derive(Debug, Default)]
pub struct StarJoinRule;

impl OptimizerRule for StarJoinRule {
    fn name(&self) -> &str {
        "quarry_star_join"
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        plan.transform_down(|node| {
            if let LogicalPlan::Extension(extension) = &node
                && extension.node.as_any().is::<StarJoinNode>()
            {
                // Its inputs, the fallback above all, are not star joins again.
                return Ok(Transformed::new(node, false, TreeNodeRecursion::Jump));
            }
            let LogicalPlan::Aggregate(aggregate) = &node else { return Ok(Transformed::no(node)) };
            match star_join(aggregate, &node)? {
                Some(star) => Ok(Transformed::new(LogicalPlan::Extension(Extension { node: Arc::new(star) }), true, TreeNodeRecursion::Jump)),
                None => Ok(Transformed::no(node)),
            }
        })
    }
}

/// The star join computing `aggregate` (the plan `original`), if it has the shape.
fn star_join(aggregate: &Aggregate, original: &LogicalPlan) -> Result<Option<StarJoinNode>> {
    // A projection computing the aggregates' inputs is folded into them.
    let (input, inline): (&LogicalPlan, Vec<(Column, Expr)>) = match aggregate.input.as_ref() {
        LogicalPlan::Projection(p) if p.expr.iter().any(|e| !matches!(e, Expr::Column(_))) => {
            (p.input.as_ref(), p.schema.columns().into_iter().zip(p.expr.iter().map(|e| e.clone().unalias())).collect())
        }
        other => (other, Vec::new()),
    };
    let substitute = |expr: &Expr| -> Result<Expr> {
        Ok(expr
            .clone()
            .transform(|e| match &e {
                Expr::Column(c) => Ok(match inline.iter().find(|(column, _)| column == c) {
                    Some((_, replacement)) => Transformed::yes(replacement.clone()),
                    None => Transformed::no(e),
                }),
                _ => Ok(Transformed::no(e)),
            })?
            .data)
    };
    if aggregate.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_))) {
        return Ok(None);
    }
    let groups: Vec<Expr> = aggregate.group_expr.iter().map(|e| substitute(&e.clone().unalias())).collect::<Result<_>>()?;
    let mut aggregates = Vec::new();
    for expr in &aggregate.aggr_expr {
        let Expr::AggregateFunction(function) = expr.clone().unalias() else { return Ok(None) };
        let params = &function.params;
        let Some(func) = AggFunc::from_name(function.func.name()) else { return Ok(None) };
        if params.distinct || params.filter.is_some() || !params.order_by.is_empty() || params.args.len() != 1 {
            return Ok(None);
        }
        let arg = substitute(&params.args[0])?;
        // count(1) and count(*) count rows.
        let arg = if func == AggFunc::Count && matches!(arg, Expr::Literal(ref v, _) if !v.is_null()) { None } else { Some(arg) };
        aggregates.push((func, arg));
    }

    let needed: Vec<Column> = groups.iter().chain(aggregates.iter().filter_map(|(_, a)| a.as_ref())).flat_map(|e| e.column_refs()).cloned().collect::<BTreeSet<_>>().into_iter().collect();
    let Some(region) = Region::collect_ordered(input, needed)? else { return Ok(None) };
    if !region.conditions.is_empty() || !region.semis.is_empty() || region.relations.len() < 2 {
        return Ok(None);
    }
    // The fact: the largest relation, by a margin.
    let rows: Vec<f64> = region.relations.iter().map(|r| r.estimate.rows).collect();
    let fact = (0..rows.len()).max_by(|&a, &b| rows[a].total_cmp(&rows[b])).expect("two relations");
    if rows.iter().enumerate().any(|(i, &r)| i != fact && r * FACT_RATIO_MIN > rows[fact]) {
        return Ok(None);
    }
    if !scans_one_table(&region.relations[fact].plan) {
        return Ok(None);
    }
    let owner = |c: &Column| region.relations.iter().position(|r| r.plan.schema().index_of_column(c).is_ok());

    // The dimensions: the other relations in groups connected without the fact.
    let n = region.relations.len();
    let mut component: Vec<usize> = (0..n).collect();
    let find = |component: &Vec<usize>, mut i: usize| {
        while component[i] != i {
            i = component[i];
        }
        i
    };
    for edge in region.stated_edges() {
        if edge.left != fact && edge.right != fact {
            let (a, b) = (find(&component, edge.left), find(&component, edge.right));
            component[a.max(b)] = a.min(b);
        }
    }
    let roots: Vec<usize> = (0..n).filter(|&i| i != fact && find(&component, i) == i).collect();
    let mut keys = Vec::new();
    for &root in &roots {
        let to_fact: Vec<&Edge> = region.stated_edges().filter(|e| (e.left == fact) != (e.right == fact) && find(&component, if e.left == fact { e.right } else { e.left }) == root).collect();
        let [edge] = to_fact.as_slice() else { return Ok(None) };
        let (fact_key, dim_key) = if edge.left == fact { (&edge.left_column, &edge.right_column) } else { (&edge.right_column, &edge.left_column) };
        let fact_type = region.relations[fact].plan.schema().field_from_column(fact_key)?.data_type().clone();
        let dim_type = region.relations[owner(dim_key).expect("an edge's column")].plan.schema().field_from_column(dim_key)?.data_type().clone();
        if !supported_key_type(&fact_type) || !supported_key_type(&dim_type) || fact_type.is_numeric() != dim_type.is_numeric() {
            return Ok(None);
        }
        // A key its table's statistics show repeating would only make the star join fall back.
        let dim_relation = &region.relations[owner(dim_key).expect("an edge's column")].plan;
        if base_distinct_share(dim_relation, dim_key).is_some_and(|share| share < UNIQUE_KEY_SHARE_MIN) {
            return Ok(None);
        }
        keys.push((fact_key.clone(), dim_key.clone()));
    }
    // Grouping expressions read one dimension each; aggregates read the fact only.
    let dimension_of = |expr: &Expr| -> Option<usize> {
        let owners: BTreeSet<Option<usize>> = expr.column_refs().into_iter().map(|c| owner(c).filter(|&o| o != fact).map(|o| find(&component, o))).collect();
        match owners.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(root)] => roots.iter().position(|r| r == root),
            _ => None,
        }
    };
    let mut grouped = Vec::with_capacity(groups.len());
    for expr in groups {
        let Some(d) = dimension_of(&expr) else { return Ok(None) };
        grouped.push((d, expr));
    }
    let fact_schema = region.relations[fact].plan.schema().clone();
    for (func, arg) in &aggregates {
        if let Some(arg) = arg {
            if !arg.column_refs().iter().all(|c| fact_schema.index_of_column(c).is_ok()) {
                return Ok(None);
            }
            let data_type = arg.to_field(&fact_schema)?.1.data_type().clone();
            if Domain::of(*func, Some(&data_type)).is_none() {
                return Ok(None);
            }
        }
    }
    // Each dimension's plan: its relations joined, keeping its key and grouped columns.
    let mut dims = Vec::with_capacity(roots.len());
    for (d, &root) in roots.iter().enumerate() {
        let members: Vec<usize> = (0..n).filter(|&i| i != fact && find(&component, i) == root).collect();
        let local = |i: usize| members.iter().position(|&m| m == i);
        let edges = region
            .stated_edges()
            .filter_map(|e| Some(Edge::stated(local(e.left)?, e.left_column.clone(), local(e.right)?, e.right_column.clone())))
            .collect();
        let mut output = vec![keys[d].1.clone()];
        output.extend(grouped.iter().filter(|(g, _)| *g == d).flat_map(|(_, e)| e.column_refs()).cloned());
        let plans = members.iter().map(|&m| region.relations[m].plan.clone()).collect();
        let Some(plan) = Region::of(plans, edges, output).order()? else { return Ok(None) };
        dims.push(plan);
    }
    // Projections that only drop columns are left out of the fact's plan: the probe reads its
    // columns by name, and a scan with a filter directly above it reads pages selectively.
    let mut fact_plan = &region.relations[fact].plan;
    while let LogicalPlan::Projection(p) = fact_plan
        && p.expr.iter().all(|e| matches!(e, Expr::Column(_)))
    {
        fact_plan = p.input.as_ref();
    }
    Ok(Some(StarJoinNode {
        fact: fact_plan.clone(),
        dims,
        fallback: original.clone(),
        keys,
        groups: grouped,
        aggregates,
    }))
}

/// Plans [`StarJoinNode`]s.
#[derive(Debug)]
struct StarJoinPlanner;

#[async_trait]
impl ExtensionPlanner for StarJoinPlanner {
    async fn plan_extension(
        &self,
        planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        session: &dyn Session,
        planning_ctx: &PhysicalPlanningContext,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(star) = node.as_any().downcast_ref::<StarJoinNode>() else { return Ok(None) };
        let expr = |e: &Expr, input: &LogicalPlan| planner.create_physical_expr(e, input.schema(), session, planning_ctx);
        let fact_schema = star.fact.schema();
        let keys = star.keys.iter().map(|(fact_key, _)| fact_schema.index_of_column(fact_key)).collect::<Result<Vec<_>>>()?;
        let aggregates = star
            .aggregates
            .iter()
            .map(|(func, arg)| {
                let arg = arg.as_ref().map(|a| expr(a, &star.fact)).transpose()?;
                let input_type = arg.as_ref().map(|a| a.data_type(&physical_inputs[0].schema())).transpose()?;
                let domain = Domain::of(*func, input_type.as_ref()).ok_or_else(|| datafusion::error::DataFusionError::Internal(format!("no star domain for {func:?} of {input_type:?}")))?;
                Ok(StarAggregate { func: *func, arg, domain })
            })
            .collect::<Result<Vec<_>>>()?;
        let spec = Arc::new(StarSpec { keys, aggregates });
        let probe = Arc::new(StarProbeExec::try_new(Arc::clone(&physical_inputs[0]), spec, Arc::new(OnceLock::new()))?);
        let dims = star
            .dims
            .iter()
            .enumerate()
            .map(|(d, plan)| {
                let key = expr(&Expr::Column(star.keys[d].1.clone()), plan)?;
                let (positions, groups): (Vec<usize>, Vec<_>) = star.groups.iter().enumerate().filter(|(_, (g, _))| *g == d).map(|(i, (_, e))| Ok((i, expr(e, plan)?))).collect::<Result<Vec<_>>>()?.into_iter().unzip();
                let label = key.to_string();
                let plan = Arc::new(StarDimensionExec::try_new(Arc::clone(&physical_inputs[1 + d]), key, groups)?);
                Ok(StarDimensionPlan { plan, key: label, positions, shared: None })
            })
            .collect::<Result<Vec<_>>>()?;
        let fallback = Arc::clone(physical_inputs.last().expect("the fallback"));
        let fact_distinct = star.keys.iter().map(|(fact_key, _)| crate::cardinality::estimate(&star.fact).column(fact_key).distinct).collect();
        Ok(Some(Arc::new(StarAggregateExec::try_new(probe, dims, fact_distinct, star.groups.len(), fallback)?)))
    }
}

/// The query planner: DataFusion's, with star joins planned.
#[derive(Debug)]
pub struct QuarryQueryPlanner;

#[async_trait]
impl QueryPlanner for QuarryQueryPlanner {
    async fn create_physical_plan(&self, logical_plan: &LogicalPlan, session: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        let planner = DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(StarJoinPlanner)]);
        planner.create_physical_plan(logical_plan, session).await
    }
}

/// `builder` with the star join's rule and planner.
pub fn with_star_joins(builder: SessionStateBuilder) -> SessionStateBuilder {
    builder.with_optimizer_rule(Arc::new(StarJoinRule)).with_query_planner(Arc::new(QuarryQueryPlanner))
}
