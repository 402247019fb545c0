//! Cost-based join ordering: a logical optimizer rule.
//!
//! DataFusion joins tables in the order the query lists them (its physical `JoinSelection` only
//! swaps the sides of each join), so `FROM lineorder, date, part` probes every fact row through
//! the `date` join before the selective `part` one. This rule takes each *join region* (a tree
//! of inner equi-joins, with the filters and column-only projections between them and the
//! semi/anti joins that decorrelated `IN`/`EXISTS` subqueries become) apart into its relations
//! and conditions, and builds the tree with the least estimated work:
//!
//! * relations are put in a canonical order (by their plan text), so any FROM order and
//!   explicit `JOIN ... ON` give the same plan;
//! * up to [`MAX_EXHAUSTIVE`] relations, dynamic programming over connected subsets (DPsub
//!   without cross products, Moerkotte & Neumann 2006) finds the cheapest bushy tree; beyond it,
//!   greedy operator ordering (Fegaras 1998) joins the pair with the smallest result first;
//! * the cost of a tree is the work of its hash joins: each join reads its probe side once,
//!   inserts its build side (the smaller, put on the left, where DataFusion builds) at twice
//!   that, and produces its output ([`cardinality`] estimates every size);
//! * a filter or semi/anti join over one relation moves onto it; one over several runs as soon
//!   as they are joined; after each join only the columns still needed are kept.
//!
//! A region whose graph is not connected (it needs a cross product) is left as written.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchemaRef, NullEquality, Result};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{Expr, Filter, Join, JoinConstraint, JoinType, LogicalPlan, Projection};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use crate::cardinality::{self, Estimate};

/// Most relations ordered exhaustively; 3^10 / 2 splits take a few milliseconds.
pub const MAX_EXHAUSTIVE: usize = 10;
/// Relations in a region at most (masks are `u64`).
const MAX_RELATIONS: usize = 64;
/// A semi or anti join over one relation whose right side has more rows than this share of the
/// relation's waits for the joins that shrink the relation (see [`SemiJoin`]).
const DEFER_SEMI_RIGHT_SHARE: f64 = 0.25;

/// The join-ordering rule (see the module docs).
#[derive(Debug, Default)]
pub struct JoinOrderRule;

impl OptimizerRule for JoinOrderRule {
    fn name(&self) -> &str {
        "quarry_join_order"
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let rewritten = order_joins(plan.clone())?;
        Ok(if rewritten == plan { Transformed::no(plan) } else { Transformed::yes(rewritten) })
    }
}

/// `plan` with its join regions reordered, and those of the uncorrelated subqueries in its
/// expressions. DataFusion runs an uncorrelated scalar subquery as an expression
/// (`ScalarSubqueryExec`), not as a join, so the walk over the plan's children does not reach
/// it: TPC-H Q11's subquery probed all 8M `partsupp` rows through the join with all 100K
/// suppliers before the one that keeps a nation's 4K.
fn order_joins(plan: LogicalPlan) -> Result<LogicalPlan> {
    let plan = rewrite(plan, None)?;
    let ordered = plan.transform_up(|node| {
        node.map_subqueries(|subquery| match subquery {
            LogicalPlan::Subquery(mut subquery) if subquery.outer_ref_columns.is_empty() => {
                subquery.subquery = Arc::new(order_joins(subquery.subquery.as_ref().clone())?);
                Ok(Transformed::yes(LogicalPlan::Subquery(subquery)))
            }
            other => Ok(Transformed::no(other)),
        })
    })?;
    Ok(ordered.data)
}

/// `plan` with its join regions reordered. `wanted`: the columns the consumer of `plan` reads,
/// by name; `None` when it reads all of them by position, so that their number and order must
/// stay.
fn rewrite(plan: LogicalPlan, wanted: Option<&[Column]>) -> Result<LogicalPlan> {
    if is_region(&plan) {
        let schema = plan.schema();
        let output = wanted.map_or_else(|| schema.columns(), |w| w.iter().filter(|c| schema.has_column(c)).cloned().collect());
        if let Some(region) = Region::collect(&plan, output)?
            && region.relations.len() + region.semis.len() >= 3
            && let Some(reordered) = region.order()?
        {
            return if wanted.is_some() || reordered.schema().columns() == schema.columns() { Ok(reordered) } else { restore_order(reordered, schema) };
        }
    }
    let refs = |exprs: &mut dyn Iterator<Item = &Expr>| -> Vec<Column> {
        let mut columns: Vec<Column> = Vec::new();
        for c in exprs.flat_map(|e| e.column_refs()) {
            if !columns.contains(c) {
                columns.push(c.clone());
            }
        }
        columns
    };
    let with = |wanted: Option<&[Column]>, more: Vec<Column>| wanted.map(|w| w.iter().cloned().chain(more).collect::<Vec<_>>());
    let for_children: Option<Vec<Column>> = match &plan {
        LogicalPlan::Projection(p) => Some(refs(&mut p.expr.iter())),
        LogicalPlan::Aggregate(a) => Some(refs(&mut a.group_expr.iter().chain(&a.aggr_expr))),
        LogicalPlan::Filter(f) => with(wanted, refs(&mut std::iter::once(&f.predicate))),
        LogicalPlan::Sort(s) => with(wanted, refs(&mut s.expr.iter().map(|e| &e.expr))),
        LogicalPlan::Limit(_) => wanted.map(<[Column]>::to_vec),
        _ => None,
    };
    let changed = read_through_column_projection(plan.map_children(|child| Ok(Transformed::yes(rewrite(child, for_children.as_deref())?)))?.data)?;
    match changed {
        // A projection of columns whose consumer reads by name lists them in its input's order,
        // so that the columns' order, too, does not depend on how the query was written.
        LogicalPlan::Projection(p) if wanted.is_some() && is_column_only(&p) => {
            let mut exprs = p.expr.clone();
            let position = |e: &Expr| e.try_as_col().and_then(|c| p.input.schema().index_of_column(c).ok()).unwrap_or(usize::MAX);
            exprs.sort_by_key(position);
            Ok(LogicalPlan::Projection(Projection::try_new(exprs, Arc::clone(&p.input))?))
        }
        other => other.recompute_schema(),
    }
}

/// A projection that only picks columns (no expression, no alias).
fn is_column_only(projection: &Projection) -> bool {
    projection.expr.iter().all(|e| matches!(e, Expr::Column(_)))
}

/// `plan`, a projection, without the column-only projection between it and its input: its
/// expressions read the same columns below it. A reordered region ends in such a projection
/// (the columns its consumer reads); left under the consumer's projection, DataFusion's
/// `optimize_projections` merged the two, the next pass of this rule stacked them again, and the
/// optimizer, never seeing a pass change nothing, ran all its passes on every query with a join
/// region.
fn read_through_column_projection(plan: LogicalPlan) -> Result<LogicalPlan> {
    match plan {
        LogicalPlan::Projection(outer) => match outer.input.as_ref() {
            LogicalPlan::Projection(inner) if is_column_only(inner) => Ok(LogicalPlan::Projection(Projection::try_new(outer.expr, Arc::clone(&inner.input))?)),
            _ => Ok(LogicalPlan::Projection(outer)),
        },
        other => Ok(other),
    }
}

/// `plan` rewritten for a consumer that reads all its columns by name.
fn rewrite_relation(plan: &LogicalPlan) -> Result<LogicalPlan> {
    let columns = plan.schema().columns();
    rewrite(plan.clone(), Some(&columns))
}

/// A projection giving `reordered` the column order of `schema`.
fn restore_order(reordered: LogicalPlan, schema: &DFSchemaRef) -> Result<LogicalPlan> {
    let exprs = schema.columns().into_iter().map(Expr::Column).collect();
    read_through_column_projection(LogicalPlan::Projection(Projection::try_new(exprs, Arc::new(reordered))?))
}

/// An inner equi-join whose keys compare with `=` (NULLs never match).
fn is_inner(join: &Join) -> bool {
    join.join_type == JoinType::Inner && join.null_equality == NullEquality::NullEqualsNothing && !join.on.is_empty()
}

/// A semi or anti join (what `IN` and `EXISTS` subqueries become): a filter on its left side.
fn is_semi(join: &Join) -> bool {
    matches!(join.join_type, JoinType::LeftSemi | JoinType::LeftAnti)
}

fn is_region(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::Join(join) if is_inner(join) || is_semi(join))
}

fn has_subquery(expr: &Expr) -> bool {
    expr.exists(|e| Ok(matches!(e, Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) | Expr::SetComparison(_) | Expr::OuterReferenceColumn(..))))
        .unwrap_or(true)
}

/// Whether `plan` is part of the region above it rather than one of its relations.
fn continues_region(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Join(join) => is_inner(join) || is_semi(join),
        LogicalPlan::Projection(p) => p.expr.iter().all(|e| matches!(e, Expr::Column(_))) && continues_region(&p.input),
        LogicalPlan::Filter(f) => !has_subquery(&f.predicate) && continues_region(&f.input),
        _ => false,
    }
}

/// One relation of a region: a plan the region joins, and its estimate.
pub(crate) struct Relation {
    pub(crate) plan: LogicalPlan,
    pub(crate) estimate: Estimate,
}

/// An equality of a column of one relation with a column of another.
#[derive(Clone)]
pub(crate) struct Edge {
    pub(crate) left: usize,
    pub(crate) left_column: Column,
    pub(crate) right: usize,
    pub(crate) right_column: Column,
    /// Derived by transitivity from the query's equalities, not written in it.
    pub(crate) implied: bool,
    /// The edge's equivalence class, when that class is closed (see [`close_equalities`]): a
    /// join needs one edge of a closed class between its sides, and the estimates count one.
    pub(crate) class: Option<usize>,
}

impl Edge {
    /// An equality the query states.
    pub(crate) fn stated(left: usize, left_column: Column, right: usize, right_column: Column) -> Edge {
        Edge { left, left_column, right, right_column, implied: false, class: None }
    }
}

/// `edges` closed under transitivity: `c_nationkey = s_nationkey` and `s_nationkey =
/// n_nationkey` give `c_nationkey = n_nationkey`, so that `customer` can be joined with
/// `nation` (and shrink to a region's customers) before either meets `supplier` (TPC-H Q05).
/// The implied edges come after the stated ones. A class in which one relation has two columns
/// is left as it is: joining on one of them would drop the equality of the two.
fn close_equalities(mut edges: Vec<Edge>) -> Vec<Edge> {
    let mut nodes: Vec<(usize, Column)> = Vec::new();
    let mut parent: Vec<usize> = Vec::new();
    let node = |nodes: &mut Vec<(usize, Column)>, parent: &mut Vec<usize>, relation: usize, column: &Column| {
        nodes.iter().position(|(r, c)| *r == relation && c == column).unwrap_or_else(|| {
            nodes.push((relation, column.clone()));
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut ends = Vec::with_capacity(edges.len());
    for e in &edges {
        let (a, b) = (node(&mut nodes, &mut parent, e.left, &e.left_column), node(&mut nodes, &mut parent, e.right, &e.right_column));
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        parent[ra] = rb;
        ends.push(a);
    }
    let roots: Vec<usize> = (0..nodes.len()).map(|i| root(&mut parent, i)).collect();
    let roots = roots.as_slice();
    let members = |class: usize| (0..nodes.len()).filter(move |&i| roots[i] == class);
    let closed = |class: usize| {
        let relations: Vec<usize> = members(class).map(|i| nodes[i].0).collect();
        relations.iter().enumerate().all(|(k, r)| !relations[..k].contains(r))
    };
    for (e, end) in edges.iter_mut().zip(ends) {
        e.class = Some(roots[end]).filter(|&class| closed(class));
    }
    let classes: std::collections::BTreeSet<usize> = edges.iter().filter_map(|e| e.class).collect();
    for class in classes {
        let members: Vec<usize> = members(class).collect();
        for (k, &i) in members.iter().enumerate() {
            for &j in &members[k + 1..] {
                let ((a, ca), (b, cb)) = (&nodes[i], &nodes[j]);
                let joined = |e: &Edge| (e.left == *a && e.right == *b) || (e.left == *b && e.right == *a);
                if !edges.iter().any(|e| e.class == Some(class) && joined(e)) {
                    edges.push(Edge { left: *a, left_column: ca.clone(), right: *b, right_column: cb.clone(), implied: true, class: Some(class) });
                }
            }
        }
    }
    edges
}

/// A condition over several relations, applied as soon as they are all joined.
pub(crate) struct Condition {
    expr: Expr,
    relations: u64,
}

/// A semi or anti join over several relations, applied as soon as they are all joined; or over
/// one relation but with a larger right side (EXISTS over `lineitem` in TPC-H Q21), applied
/// where the tree above that relation has the fewest rows, so that its hash table holds them.
pub(crate) struct SemiJoin {
    join: Join,
    relations: u64,
    /// Placed by [`Region::place_semis`] rather than as soon as its relations are joined.
    deferred: bool,
}

/// A join region taken apart.
pub(crate) struct Region {
    pub(crate) relations: Vec<Relation>,
    pub(crate) edges: Vec<Edge>,
    pub(crate) conditions: Vec<Condition>,
    pub(crate) semis: Vec<SemiJoin>,
    /// The columns the region's output must have.
    pub(crate) output: Vec<Column>,
}

/// What the walk over a region collects before the relations are known.
#[derive(Default)]
struct Parts {
    relations: Vec<LogicalPlan>,
    equalities: Vec<(Expr, Expr)>,
    conditions: Vec<Expr>,
    semis: Vec<Join>,
    /// Whether the relations' own regions are ordered as they are collected.
    order_relations: bool,
}

impl Parts {
    /// `plan` as a relation of the region: its own regions ordered first, when asked (it is
    /// consumed by name).
    fn relation(&self, plan: &LogicalPlan) -> Result<LogicalPlan> {
        if self.order_relations { rewrite_relation(plan) } else { Ok(plan.clone()) }
    }

    fn walk(&mut self, plan: &LogicalPlan) -> Result<()> {
        match plan {
            LogicalPlan::Join(join) if is_inner(join) => {
                self.walk(&join.left)?;
                self.walk(&join.right)?;
                self.equalities.extend(join.on.iter().cloned());
                if let Some(filter) = &join.filter {
                    self.conditions.extend(split_conjunction(filter).into_iter().cloned());
                }
            }
            LogicalPlan::Join(join) if is_semi(join) => {
                self.walk(&join.left)?;
                let mut join = join.clone();
                join.right = Arc::new(self.relation(&join.right)?);
                self.semis.push(join);
            }
            LogicalPlan::Projection(p) if continues_region(plan) => self.walk(&p.input)?,
            LogicalPlan::Filter(f) if continues_region(plan) => {
                self.conditions.extend(split_conjunction(&f.predicate).into_iter().cloned());
                self.walk(&f.input)?;
            }
            other => {
                let relation = self.relation(other)?;
                self.relations.push(relation);
            }
        }
        Ok(())
    }
}

/// A hash of `plan` that is the same in every run (SipHash with fixed keys).
fn canonical_hash(plan: &LogicalPlan) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    plan.hash(&mut hasher);
    hasher.finish()
}

impl Region {
    /// The region rooted at `plan`, producing the `output` columns; `None` where it cannot be
    /// taken apart safely.
    pub(crate) fn collect(plan: &LogicalPlan, output: Vec<Column>) -> Result<Option<Region>> {
        Self::collect_relations(plan, output, true)
    }

    /// [`Self::collect`] of a plan whose relations' own regions are already ordered (the
    /// join-ordering rule ran): they are taken as they are, not ordered again.
    pub(crate) fn collect_ordered(plan: &LogicalPlan, output: Vec<Column>) -> Result<Option<Region>> {
        Self::collect_relations(plan, output, false)
    }

    fn collect_relations(plan: &LogicalPlan, output: Vec<Column>, order_relations: bool) -> Result<Option<Region>> {
        let mut parts = Parts { order_relations, ..Parts::default() };
        parts.walk(plan)?;
        if parts.relations.len() > MAX_RELATIONS {
            return Ok(None);
        }
        // The canonical order: by the plans' hashes (a fixed hasher's), whatever order the
        // query named them in. (Their text, before, took most of the rule's time: TPC-DS q14
        // formats subqueries of dozens of nodes.)
        let mut plans: Vec<(u64, LogicalPlan)> = parts.relations.into_iter().map(|p| (canonical_hash(&p), p)).collect();
        plans.sort_by_key(|(hash, _)| *hash);
        let mut relations: Vec<LogicalPlan> = plans.into_iter().map(|(_, p)| p).collect();

        let owner = |relations: &[LogicalPlan], column: &Column| relations.iter().position(|r| r.schema().index_of_column(column).is_ok());
        let mask_of = |relations: &[LogicalPlan], expr: &Expr| -> Option<u64> {
            expr.column_refs().into_iter().try_fold(0u64, |mask, c| owner(relations, c).map(|i| mask | 1 << i))
        };

        let mut edges = Vec::new();
        let mut conditions: Vec<Expr> = parts.conditions;
        for (left, right) in parts.equalities {
            match (&left, &right) {
                (Expr::Column(l), Expr::Column(r)) => match (owner(&relations, l), owner(&relations, r)) {
                    (Some(a), Some(b)) if a != b => edges.push(Edge::stated(a, l.clone(), b, r.clone())),
                    (Some(_), Some(_)) => conditions.push(left.eq(right)),
                    _ => return Ok(None),
                },
                _ => conditions.push(left.eq(right)),
            }
        }
        // Conditions on one relation move onto it; the rest wait for their relations.
        let mut multi = Vec::new();
        for expr in conditions {
            let Some(mask) = mask_of(&relations, &expr) else { return Ok(None) };
            if mask.count_ones() == 1 {
                let i = mask.trailing_zeros() as usize;
                relations[i] = LogicalPlan::Filter(Filter::try_new(expr, Arc::new(relations[i].clone()))?);
            } else {
                multi.push(Condition { expr, relations: mask });
            }
        }
        let mut semis = Vec::new();
        for join in parts.semis {
            // The relations its left keys (and the left side of its filter) read.
            let mut mask = 0u64;
            for (left, _) in &join.on {
                let Some(m) = mask_of(&relations, left) else { return Ok(None) };
                mask |= m;
            }
            if let Some(filter) = &join.filter {
                for column in filter.column_refs() {
                    if let Some(i) = owner(&relations, column) {
                        mask |= 1 << i;
                    } else if join.right.schema().index_of_column(column).is_err() {
                        return Ok(None);
                    }
                }
            }
            if mask == 0 {
                return Ok(None);
            }
            let single = mask.count_ones() == 1;
            let i = mask.trailing_zeros() as usize;
            let larger_right = || cardinality::estimate(&join.right).rows > cardinality::estimate(&relations[i]).rows * DEFER_SEMI_RIGHT_SHARE;
            if single && (relations.len() == 1 || !larger_right()) {
                relations[i] = semi_join_over(&join, relations[i].clone())?;
            } else {
                semis.push(SemiJoin { join, relations: mask, deferred: single });
            }
        }
        let relations = relations.into_iter().map(|plan| Relation { estimate: cardinality::estimate(&plan), plan }).collect();
        Ok(Some(Region { relations, edges: close_equalities(edges), conditions: multi, semis, output }))
    }

    /// A region of `relations` joined by the stated `edges` (indices into `relations`),
    /// producing `output`.
    pub(crate) fn of(relations: Vec<LogicalPlan>, edges: Vec<Edge>, output: Vec<Column>) -> Region {
        let relations = relations.into_iter().map(|plan| Relation { estimate: cardinality::estimate(&plan), plan }).collect();
        Region { relations, edges: close_equalities(edges), conditions: Vec::new(), semis: Vec::new(), output }
    }

    /// The equalities the query states (a star's shape is read from them, not from their
    /// closure).
    pub(crate) fn stated_edges(&self) -> impl Iterator<Item = &Edge> {
        self.edges.iter().filter(|e| !e.implied)
    }

    /// The region joined in the cheapest order found; `None` if it needs a cross product.
    pub(crate) fn order(&self) -> Result<Option<LogicalPlan>> {
        let sizes = Sizes::new(self);
        let n = self.relations.len();
        let tree = if n <= MAX_EXHAUSTIVE { self.exhaustive(&sizes) } else { self.greedy(&sizes) };
        let Some(tree) = tree else { return Ok(None) };
        let targets = self.place_semis(&tree, &sizes);
        let (plan, done) = self.build(&tree, &sizes, &targets)?;
        debug_assert_eq!(done, full_mask(n));
        Ok(Some(plan))
    }

    /// Relations adjacent (by an edge) to each relation.
    fn adjacency(&self) -> Vec<u64> {
        let mut adjacent = vec![0u64; self.relations.len()];
        for e in &self.edges {
            adjacent[e.left] |= 1 << e.right;
            adjacent[e.right] |= 1 << e.left;
        }
        adjacent
    }

    fn connected(adjacent: &[u64], a: u64, b: u64) -> bool {
        bits(a).any(|i| adjacent[i] & b != 0)
    }

    /// DPsub: the cheapest tree over every connected subset, subsets before their supersets.
    fn exhaustive(&self, sizes: &Sizes) -> Option<Tree> {
        let n = self.relations.len();
        let adjacent = self.adjacency();
        let mut best: Vec<Option<(f64, Tree)>> = vec![None; 1 << n];
        for i in 0..n {
            best[1 << i] = Some((0.0, Tree::Leaf(i)));
        }
        for set in 1..=full_mask(n) {
            if set.count_ones() < 2 {
                continue;
            }
            let lowest = set & set.wrapping_neg();
            let mut sub = (set - 1) & set;
            while sub > 0 {
                let other = set ^ sub;
                // Each split once: the part holding the lowest relation is `sub`.
                if sub & lowest != 0
                    && let (Some((cost_a, _)), Some((cost_b, _))) = (&best[sub as usize], &best[other as usize])
                    && Self::connected(&adjacent, sub, other)
                {
                    let cost = cost_a + cost_b + sizes.join_work(sub, other);
                    if best[set as usize].as_ref().is_none_or(|(c, _)| cost < *c) {
                        best[set as usize] = Some((cost, Tree::Join(sub, other)));
                    }
                }
                sub = (sub - 1) & set;
            }
        }
        // The chosen tree, as splits looked up from the table.
        fn expand(best: &[Option<(f64, Tree)>], set: u64) -> Option<Tree> {
            match best[set as usize].as_ref()?.1 {
                Tree::Leaf(i) => Some(Tree::Leaf(i)),
                Tree::Join(a, b) => Some(Tree::Node(Box::new(expand(best, a)?), Box::new(expand(best, b)?))),
                Tree::Node(..) => None,
            }
        }
        expand(&best, full_mask(n))
    }

    /// Greedy operator ordering: join the connected pair with the smallest result.
    fn greedy(&self, sizes: &Sizes) -> Option<Tree> {
        let adjacent = self.adjacency();
        let mut parts: Vec<(u64, Tree)> = (0..self.relations.len()).map(|i| (1u64 << i, Tree::Leaf(i))).collect();
        while parts.len() > 1 {
            let mut pick: Option<(f64, usize, usize)> = None;
            for a in 0..parts.len() {
                for b in a + 1..parts.len() {
                    if !Self::connected(&adjacent, parts[a].0, parts[b].0) {
                        continue;
                    }
                    let rows = sizes.rows(parts[a].0 | parts[b].0);
                    if pick.is_none_or(|(r, _, _)| rows < r) {
                        pick = Some((rows, a, b));
                    }
                }
            }
            let (_, a, b) = pick?;
            let (mask_b, tree_b) = parts.remove(b);
            let (mask_a, tree_a) = parts.remove(a);
            parts.push((mask_a | mask_b, Tree::Node(Box::new(tree_a), Box::new(tree_b))));
        }
        parts.pop().map(|(_, tree)| tree)
    }

    /// Per semi join, the set of relations after whose join it runs: for a deferred one, the
    /// subtree over its relation with the fewest rows (the lowest of equals); for the others,
    /// their relations.
    fn place_semis(&self, tree: &Tree, sizes: &Sizes) -> Vec<u64> {
        fn subtrees(tree: &Tree, out: &mut Vec<u64>) -> u64 {
            let set = match tree {
                Tree::Leaf(i) => 1 << i,
                Tree::Node(a, b) => subtrees(a, out) | subtrees(b, out),
                Tree::Join(a, b) => a | b,
            };
            out.push(set);
            set
        }
        let mut sets = Vec::new();
        subtrees(tree, &mut sets);
        self.semis
            .iter()
            .map(|semi| {
                if !semi.deferred {
                    return semi.relations;
                }
                let over = sets.iter().filter(|&&set| set & semi.relations == semi.relations);
                over.min_by(|&&a, &&b| sizes.rows(a).total_cmp(&sizes.rows(b)).then(a.count_ones().cmp(&b.count_ones()))).copied().unwrap_or(semi.relations)
            })
            .collect()
    }

    /// The plan of `tree` and the relations it covers; `targets` from [`Self::place_semis`].
    fn build(&self, tree: &Tree, sizes: &Sizes, targets: &[u64]) -> Result<(LogicalPlan, u64)> {
        let (a, b) = match tree {
            Tree::Leaf(i) => {
                let set = 1 << i;
                return Ok((self.with_deferred_semis(self.relations[*i].plan.clone(), set, targets)?, set));
            }
            Tree::Node(a, b) => (self.build(a, sizes, targets)?, self.build(b, sizes, targets)?),
            Tree::Join(..) => unreachable!("expanded before building"),
        };
        // The smaller side is built (DataFusion builds the left side of a hash join).
        let ((left, left_set), (right, right_set)) = if (sizes.rows(a.1), a.1) <= (sizes.rows(b.1), b.1) { (a, b) } else { (b, a) };
        let set = left_set | right_set;
        let mut on: Vec<(Expr, Expr)> = Vec::new();
        // One edge of a closed class suffices: each side's members of the class are already
        // equal (every join below took one of its edges), so the others would be redundant.
        let mut classes_on = Vec::new();
        for e in &self.edges {
            let crosses = (left_set & 1 << e.left != 0 && right_set & 1 << e.right != 0) || (left_set & 1 << e.right != 0 && right_set & 1 << e.left != 0);
            if !crosses {
                continue;
            }
            if let Some(class) = e.class {
                if classes_on.contains(&class) {
                    continue;
                }
                classes_on.push(class);
            }
            if left_set & 1 << e.left != 0 && right_set & 1 << e.right != 0 {
                on.push((Expr::Column(e.left_column.clone()), Expr::Column(e.right_column.clone())));
            } else if left_set & 1 << e.right != 0 && right_set & 1 << e.left != 0 {
                on.push((Expr::Column(e.right_column.clone()), Expr::Column(e.left_column.clone())));
            }
        }
        let newly = |mask: u64| mask & !set == 0 && mask & !left_set != 0 && mask & !right_set != 0;
        // Conditions over relations of both sides run in the join (a filter above it over
        // columns of equal names, such as two aliases of one table, was pushed down wrongly by
        // DataFusion's physical filter pushdown: TPC-H Q7 returned no rows).
        let ready = conjunction(self.conditions.iter().filter(|c| newly(c.relations)).map(|c| c.expr.clone()));
        let mut plan = LogicalPlan::Join(Join::try_new(Arc::new(left), Arc::new(right), on, ready, JoinType::Inner, JoinConstraint::On, NullEquality::NullEqualsNothing, false)?);
        for semi in self.semis.iter().filter(|s| !s.deferred && newly(s.relations)) {
            plan = semi_join_over(&semi.join, plan)?;
        }
        let plan = self.with_deferred_semis(plan, set, targets)?;
        Ok((self.keep_needed(plan, set, targets)?, set))
    }

    /// `plan` (covering `set`) with the deferred semi joins placed at `set`.
    fn with_deferred_semis(&self, mut plan: LogicalPlan, set: u64, targets: &[u64]) -> Result<LogicalPlan> {
        for (semi, _) in self.semis.iter().zip(targets).filter(|(s, target)| s.deferred && **target == set) {
            plan = semi_join_over(&semi.join, plan)?;
        }
        Ok(plan)
    }

    /// `plan` (covering `set`) without the columns nothing above it reads.
    fn keep_needed(&self, plan: LogicalPlan, set: u64, targets: &[u64]) -> Result<LogicalPlan> {
        let pending = |mask: u64| mask & set != 0 && mask & !set != 0;
        // A semi join is still to come if its relations are in and its place is above.
        let semi_pending = |semi: &SemiJoin, target: u64| if semi.deferred { semi.relations & !set == 0 && target & !set != 0 } else { pending(semi.relations) };
        let mut needed: Vec<&Column> = self.output.iter().collect();
        for e in &self.edges {
            if pending(1 << e.left | 1 << e.right) {
                needed.push(&e.left_column);
                needed.push(&e.right_column);
            }
        }
        let later_exprs = self.conditions.iter().filter(|c| pending(c.relations)).map(|c| &c.expr);
        let later_semis =
            self.semis.iter().zip(targets).filter(|(s, target)| semi_pending(s, **target)).flat_map(|(s, _)| s.join.on.iter().map(|(l, _)| l).chain(s.join.filter.iter()));
        let referenced: Vec<&Column> = later_exprs.chain(later_semis).flat_map(|e| e.column_refs()).collect();
        needed.extend(referenced);
        let columns = plan.schema().columns();
        let kept: Vec<Column> = columns.iter().filter(|c| needed.contains(c)).cloned().collect();
        if kept.len() == columns.len() {
            return Ok(plan);
        }
        Ok(LogicalPlan::Projection(Projection::try_new(kept.into_iter().map(Expr::Column).collect(), Arc::new(plan))?))
    }
}

/// `join` (a semi or anti join) with `left` as its left input.
fn semi_join_over(join: &Join, left: LogicalPlan) -> Result<LogicalPlan> {
    Ok(LogicalPlan::Join(Join::try_new(
        Arc::new(left),
        Arc::clone(&join.right),
        join.on.clone(),
        join.filter.clone(),
        join.join_type,
        join.join_constraint,
        join.null_equality,
        join.null_aware,
    )?))
}

/// A join tree: during the search a `Join` names the two subsets (looked up in the table);
/// the chosen tree is expanded into `Node`s.
#[derive(Debug, Clone)]
enum Tree {
    Leaf(usize),
    Join(u64, u64),
    Node(Box<Tree>, Box<Tree>),
}

/// Estimated rows of every subset of a region's relations, independent of the order they are
/// joined in (the product of the relations' rows and the selectivities of the edges,
/// conditions and semi joins within the subset).
struct Sizes {
    rows: Vec<f64>,
    /// Per pair of relations joined by edges, the selectivity of those edges together and the
    /// closed classes of the edges (`None`: an edge of no closed class); pairs joined by a
    /// stated edge come first.
    pairs: Vec<(u64, f64, Vec<Option<usize>>)>,
    conditions: Vec<(u64, f64)>,
    memo: std::cell::RefCell<std::collections::HashMap<u64, f64>>,
}

impl Sizes {
    fn new(region: &Region) -> Self {
        let rows = region.relations.iter().map(|r| r.estimate.rows.max(0.0)).collect();
        let mut grouped: std::collections::BTreeMap<(bool, usize, usize), Vec<&Edge>> = std::collections::BTreeMap::new();
        let stated: std::collections::BTreeSet<(usize, usize)> = region.edges.iter().filter(|e| !e.implied).map(|e| (e.left.min(e.right), e.left.max(e.right))).collect();
        for e in &region.edges {
            let (a, b) = (e.left.min(e.right), e.left.max(e.right));
            grouped.entry((!stated.contains(&(a, b)), a, b)).or_default().push(e);
        }
        let pairs = grouped
            .into_iter()
            .map(|((_, a, b), edges)| {
                let keys: Vec<(Column, Column)> =
                    edges.iter().map(|e| if e.left == a { (e.left_column.clone(), e.right_column.clone()) } else { (e.right_column.clone(), e.left_column.clone()) }).collect();
                let (ea, eb) = (&region.relations[a].estimate, &region.relations[b].estimate);
                let product = ea.rows * eb.rows;
                let selectivity = if product > 0.0 { cardinality::join_rows(ea, eb, &keys) / product } else { 1.0 };
                (1u64 << a | 1 << b, selectivity, edges.iter().map(|e| e.class).collect())
            })
            .collect();
        let combined = |mask: u64| {
            let mut columns = std::collections::HashMap::new();
            let mut rows = 1.0;
            for i in bits(mask) {
                let e = &region.relations[i].estimate;
                columns.extend(e.columns.iter().map(|(c, v)| (c.clone(), *v)));
                rows *= e.rows;
            }
            Estimate { rows, columns }
        };
        let mut conditions: Vec<(u64, f64)> = region.conditions.iter().map(|c| (c.relations, cardinality::selectivity(&c.expr, &combined(c.relations)))).collect();
        for semi in &region.semis {
            let left = combined(semi.relations);
            let right = cardinality::estimate(&semi.join.right);
            let left_keys: Vec<Column> = semi.join.on.iter().filter_map(|(l, _)| l.try_as_col().cloned()).collect();
            let right_keys: Vec<Column> = semi.join.on.iter().filter_map(|(_, r)| r.try_as_col().cloned()).collect();
            let matched = (right.distinct_of(&right_keys) / left.distinct_of(&left_keys).max(1.0)).clamp(0.0, 1.0);
            let selectivity = if semi.join.join_type == JoinType::LeftSemi { matched } else { (1.0 - matched).max(0.1) };
            conditions.push((semi.relations, selectivity));
        }
        Sizes { rows, pairs, conditions, memo: Default::default() }
    }

    /// Estimated rows of the relations in `set` joined. A pair whose every edge is of a closed
    /// class whose members it joins are already equal within `set` (by the pairs counted
    /// before it) is redundant, and not counted again: `c = s`, `s = n` and the implied
    /// `c = n` select as the first two do.
    fn rows(&self, set: u64) -> f64 {
        if let Some(&rows) = self.memo.borrow().get(&set) {
            return rows;
        }
        let mut rows: f64 = bits(set).map(|i| self.rows[i]).product();
        // Per closed class, the groups of relations of `set` already equal on it.
        let mut equal: Vec<(usize, u64)> = Vec::new();
        for (mask, selectivity, classes) in &self.pairs {
            if mask & !set != 0 {
                continue;
            }
            let group = |equal: &[(usize, u64)], class: usize, relations: u64| equal.iter().position(|&(c, m)| c == class && m & relations == relations);
            if classes.iter().all(|c| c.is_some_and(|c| group(&equal, c, *mask).is_some())) {
                continue;
            }
            rows *= selectivity;
            for class in classes.iter().flatten() {
                let merged = equal.iter().filter(|&&(c, m)| c == *class && m & mask != 0).fold(*mask, |acc, &(_, m)| acc | m);
                equal.retain(|&(c, m)| c != *class || m & mask == 0);
                equal.push((*class, merged));
            }
        }
        for &(mask, selectivity) in &self.conditions {
            if mask & !set == 0 {
                rows *= selectivity;
            }
        }
        self.memo.borrow_mut().insert(set, rows);
        rows
    }

    /// The work of joining `a` and `b`: reading the probe side, inserting the build side
    /// (about twice the cost of a probe), producing the output.
    fn join_work(&self, a: u64, b: u64) -> f64 {
        let (ra, rb) = (self.rows(a), self.rows(b));
        ra.max(rb) + 2.0 * ra.min(rb) + self.rows(a | b)
    }
}

fn full_mask(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// The indices of the set bits of `mask`.
fn bits(mask: u64) -> impl Iterator<Item = usize> {
    (0..64).filter(move |i| mask & 1 << i != 0)
}
