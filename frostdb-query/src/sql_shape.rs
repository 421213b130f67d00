//! The shape of a SQL text, checked before it is planned: DataFusion plans and optimises
//! a query by walking its plan, once per rule, and a plan's size is not bounded by the
//! text's. A chain of 3,000 CTEs (120 KB of SQL) took a server over a minute of planning
//! and 6.5 GB; a sum of 50,000 terms is a tree 50,000 deep. Counted on the parsed text
//! (the parser bounds nesting, so the count's walk is shallow), refused past
//! [`SqlLimits`] with the count and the limit named.

use std::ops::ControlFlow;

use datafusion::common::DataFusionError;
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::sqlparser::ast::{Expr, Query, TableFactor, Visit, Visitor};

/// How large a SQL statement may be, in the parts that make its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlLimits {
    /// Queries: the statement's own, each CTE, each subquery.
    pub max_queries: usize,
    /// Tables read (each named table, derived table or table function in a `FROM`).
    pub max_tables: usize,
    /// Expression nodes: `a + b * 2` is five.
    pub max_expressions: usize,
}

impl Default for SqlLimits {
    fn default() -> Self {
        Self {
            max_queries: 100,
            max_tables: 100,
            max_expressions: 10_000,
        }
    }
}

/// What SQL may do over the stored tables, wherever it comes from (the server's SQL API,
/// the `frostdb sql` command): read. DDL (`CREATE`, `DROP`), DML (`INSERT`, `DELETE`) and
/// statements (`SET`, transactions) are refused at planning, naming what was refused.
pub fn read_only_sql() -> datafusion::execution::context::SQLOptions {
    datafusion::execution::context::SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// Largest literal a statement may hold, in bytes: a literal is copied onto every row of
/// each batch that projects it, outside the memory pool (a 250 KB string over
/// `generate_series(1, 8192)` was 2 GiB a column), as a bounded function's constant output
/// is (and bounded the same).
pub const MAX_LITERAL_BYTES: usize = crate::functions::MAX_CONSTANT_BYTES;

/// Widest fixed-size value a plan may make, in bytes: a typed null of
/// `FixedSizeBinary(2147483647)` takes no bytes until a projection expands it to a batch's
/// rows, 17.6 TB a column, and an allocation that fails aborts the process.
pub const MAX_FIXED_WIDTH: usize = 64 << 10;

/// `sql`, planned read-only ([`read_only_sql`]) in `ctx`, and refused when its plan holds
/// what is made outside the memory pool in proportion to the rows rather than to the text
/// ([`check_sql_plan`]). Every SQL a caller runs over the stored tables goes through here.
pub async fn read_sql(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
) -> Result<datafusion::prelude::DataFrame, DataFusionError> {
    let frame = ctx.sql_with_options(sql, read_only_sql()).await?;
    check_sql_plan(frame.logical_plan())?;
    Ok(frame)
}

/// Operators a statement's physical plan may not hold, and why: each makes what no memory
/// pool sees, in proportion to what it reads.
const REFUSED_OPERATORS: [(&str, &str); 2] = [
    (
        "UnnestExec",
        "unnest copies each row's other values onto every element of its list, in one \
         allocation no memory limit sees (a 5 MB value onto 100,000 elements asked for \
         500 GB)",
    ),
    (
        "WindowAggExec",
        "a window over a whole partition (OVER () or without ORDER BY) keeps all of its \
         input, outside the query memory limit; give the window an ORDER BY, or join an \
         aggregate instead",
    ),
];

/// Refuses a physical plan holding an operator of [`REFUSED_OPERATORS`], naming it and why.
pub fn check_sql_physical_plan(
    plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
) -> Result<(), DataFusionError> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    plan.apply(|node| {
        if let Some((name, why)) = REFUSED_OPERATORS
            .iter()
            .find(|(name, _)| node.name() == *name)
        {
            return Err(DataFusionError::Plan(format!(
                "the statement's plan holds {name}, which is not supported: {why}"
            )));
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Refuses a plan holding a literal over [`MAX_LITERAL_BYTES`], a value of a fixed-size
/// type (in any node's output, nested too) wider than [`MAX_FIXED_WIDTH`], or a pattern
/// that differs by row or costs more than it may ([`check_patterns`]); the error names
/// which, and the limit.
pub fn check_sql_plan(plan: &datafusion::logical_expr::LogicalPlan) -> Result<(), DataFusionError> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    use datafusion::logical_expr::Expr;
    plan.apply_with_subqueries(|node| {
        for field in node.schema().fields() {
            check_width(field.data_type())?;
        }
        for expr in node.expressions() {
            expr.apply(|e| {
                check_patterns(e)?;
                check_window(e)?;
                if let Expr::Literal(value, _) = e {
                    check_width(&value.data_type())?;
                    let bytes = literal_bytes(value);
                    if bytes > MAX_LITERAL_BYTES {
                        return Err(DataFusionError::Plan(format!(
                            "a literal of {bytes} bytes, over the {MAX_LITERAL_BYTES} a \
                             statement's literals may have (it is copied onto every row)"
                        )));
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })?;
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Most rows a window frame may reach past the current row: the window operator keeps
/// them buffered, outside the query memory limit, until it can answer the row
/// (`ROWS BETWEEN CURRENT ROW AND 1000000000 FOLLOWING` kept its whole input: 2.6 GB under
/// a 512 MiB budget, stopped by nothing but the deadline).
pub(crate) const MAX_WINDOW_FOLLOWING_ROWS: u64 = 1 << 16;

/// Aggregates whose value is as large as what they aggregate: as window functions, each row
/// gets a value of its whole frame so far, made outside the query memory limit (over
/// 32,768 rows, `array_agg(v) OVER (ORDER BY v)` took 5 GB and 42 s of CPU, in batches no
/// cancel reaches).
const GROWING_AGGREGATES: [&str; 2] = ["array_agg", "string_agg"];

/// Refuses a window function that is one of [`GROWING_AGGREGATES`], or whose `ROWS` frame
/// ends more than [`MAX_WINDOW_FOLLOWING_ROWS`] past the current row.
fn check_window(e: &datafusion::logical_expr::Expr) -> Result<(), DataFusionError> {
    use datafusion::common::ScalarValue;
    use datafusion::logical_expr::{
        Expr, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition,
    };
    let Expr::WindowFunction(w) = e else {
        return Ok(());
    };
    if let WindowFunctionDefinition::AggregateUDF(f) = &w.fun
        && GROWING_AGGREGATES.contains(&f.name())
    {
        return Err(DataFusionError::Plan(format!(
            "{}() as a window function is not supported: every row gets a value holding its \
             whole frame, memory and time quadratic in the rows, outside the query memory \
             limit; aggregate with GROUP BY instead",
            f.name()
        )));
    }
    let frame = &w.params.window_frame;
    if frame.units == WindowFrameUnits::Rows
        && let WindowFrameBound::Following(rows) = &frame.end_bound
    {
        let rows = match rows {
            ScalarValue::UInt64(Some(n)) => *n,
            // UNBOUNDED FOLLOWING: a window over the whole partition, refused as its
            // operator (`WindowAggExec`).
            v if v.is_null() => 0,
            v => v
                .cast_to(&datafusion::arrow::datatypes::DataType::UInt64)
                .ok()
                .and_then(|v| match v {
                    ScalarValue::UInt64(Some(n)) => Some(n),
                    _ => None,
                })
                .unwrap_or(u64::MAX),
        };
        if rows > MAX_WINDOW_FOLLOWING_ROWS {
            return Err(DataFusionError::Plan(format!(
                "a window frame reaching {rows} rows past the current row, over the \
                 {MAX_WINDOW_FOLLOWING_ROWS} a frame may (the rows it reaches ahead are kept \
                 outside the query memory limit)"
            )));
        }
    }
    Ok(())
}

/// A pattern `e` compiles ([`pattern`]): the expression giving it, the one giving its
/// flags, and how it is run.
struct Pattern<'a> {
    pattern: &'a datafusion::logical_expr::Expr,
    flags: Option<&'a datafusion::logical_expr::Expr>,
    run: Run,
}

/// How a pattern is compiled and run.
#[derive(Clone, Copy)]
enum Run {
    /// By a function whose steps are counted as it runs (`functions.rs`).
    Function,
    /// As a regular expression by an operator's kernel (`~`, `SIMILAR TO`), over a whole
    /// batch: it must be linear.
    Operator { case_insensitive: bool },
    /// As a `LIKE` pattern by Arrow's kernel, over a whole batch: it must be linear.
    Like {
        case_insensitive: bool,
        escape: char,
    },
}

/// The pattern `e` compiles as a regular expression, if it is a `regexp_` function, a `~`
/// operator, a `LIKE` or a `SIMILAR TO`.
fn pattern(e: &datafusion::logical_expr::Expr) -> Option<Pattern<'_>> {
    use datafusion::logical_expr::{Expr, Operator as O};
    let operator = |pattern, case_insensitive| Pattern {
        pattern,
        flags: None,
        run: Run::Operator { case_insensitive },
    };
    let like = |pattern, case_insensitive, escape: Option<char>| Pattern {
        pattern,
        flags: None,
        run: Run::Like {
            case_insensitive,
            escape: escape.unwrap_or('\\'),
        },
    };
    match e {
        Expr::BinaryExpr(b) => match b.op {
            O::RegexMatch | O::RegexNotMatch => Some(operator(&b.right, false)),
            O::RegexIMatch | O::RegexNotIMatch => Some(operator(&b.right, true)),
            O::LikeMatch | O::NotLikeMatch => Some(like(&b.right, false, None)),
            O::ILikeMatch | O::NotILikeMatch => Some(like(&b.right, true, None)),
            _ => None,
        },
        Expr::Like(l) => Some(like(&l.pattern, l.case_insensitive, l.escape_char)),
        Expr::SimilarTo(l) => Some(operator(&l.pattern, l.case_insensitive)),
        Expr::ScalarFunction(f) => {
            let regex = crate::regex_cost::regex_fn(f.func.name())?;
            Some(Pattern {
                pattern: f.args.get(regex.pattern)?,
                flags: f.args.get(regex.flags),
                run: Run::Function,
            })
        }
        _ => None,
    }
}

/// Refuses the pattern of `e` when it is not a constant: one read from a row, or made by a
/// volatile function, is compiled anew for each distinct value. A constant one is costed
/// ([`crate::regex_cost`]): refused when its automaton is over the bound, and, run by an
/// operator's kernel (which no step count reaches), when its search is not linear.
fn check_patterns(e: &datafusion::logical_expr::Expr) -> Result<(), DataFusionError> {
    use crate::regex_cost::{MAX_LINEAR_DFA_BYTES, cost, cut, like_regex, with_flags};
    let Some(Pattern {
        pattern,
        flags,
        run,
    }) = pattern(e)
    else {
        return Ok(());
    };
    if let Some(varying) = [Some(pattern), flags]
        .into_iter()
        .flatten()
        .find(|p| !constant(p))
    {
        return Err(DataFusionError::Plan(format!(
            "the pattern `{varying}` is not a constant: a regular expression or LIKE \
             pattern that differs by row is compiled for each row, work no deadline \
             reaches; give it as a constant"
        )));
    }
    let Some(text) = fold_text(pattern) else {
        return Ok(());
    };
    let regex = match run {
        Run::Function => {
            let flags = flags.and_then(fold_text);
            with_flags(&text, flags.as_deref())
        }
        Run::Operator { case_insensitive } => with_flags(&text, case_insensitive.then_some("i")),
        Run::Like {
            case_insensitive,
            escape,
        } => match like_regex(&text, case_insensitive, escape) {
            Some(regex) => regex,
            None => return Ok(()),
        },
    };
    let cost = cost(&regex).map_err(DataFusionError::Plan)?;
    if let (Some(cost), Run::Operator { .. } | Run::Like { .. }) = (cost, run)
        && !cost.linear
    {
        return Err(DataFusionError::Plan(format!(
            "the pattern `{}` cannot be searched in time linear in its strings (its \
             automaton has {} states and no DFA of it fits in {MAX_LINEAR_DFA_BYTES} \
             bytes), and an operator runs it over a whole batch, out of reach of the \
             deadline; call regexp_like(), whose steps are counted, or simplify it",
            cut(&text),
            cost.states
        )));
    }
    Ok(())
}

/// The string constant `e` folds to, if it is one.
fn fold_text(e: &datafusion::logical_expr::Expr) -> Option<String> {
    use datafusion::logical_expr::Expr;
    use datafusion::logical_expr::simplify::SimplifyContext;
    use datafusion::optimizer::simplify_expressions::ExprSimplifier;
    let folded = ExprSimplifier::new(SimplifyContext::default())
        .simplify(e.clone())
        .ok()?;
    let Expr::Literal(value, _) = folded else {
        return None;
    };
    match crate::filter::scalar(&value)? {
        frostdb_core::Scalar::Utf8(text) => Some(text),
        _ => None,
    }
}

/// Whether `e` is the same on every row: no column, subquery or parameter in it, and no
/// volatile function (`random()`).
fn constant(e: &datafusion::logical_expr::Expr) -> bool {
    use datafusion::common::tree_node::TreeNode;
    use datafusion::logical_expr::Expr;
    !e.is_volatile()
        && !e
            .exists(|x| {
                Ok(matches!(
                    x,
                    Expr::Column(_)
                        | Expr::OuterReferenceColumn(..)
                        | Expr::ScalarSubquery(_)
                        | Expr::Exists(_)
                        | Expr::InSubquery(_)
                        | Expr::Placeholder(_)
                ))
            })
            .unwrap_or(true)
}

/// The bytes a literal's value holds (a string's, a binary's, a list's values).
fn literal_bytes(value: &datafusion::common::ScalarValue) -> usize {
    use datafusion::common::ScalarValue as V;
    match value {
        V::Utf8(Some(s)) | V::LargeUtf8(Some(s)) | V::Utf8View(Some(s)) => s.len(),
        V::Binary(Some(b))
        | V::LargeBinary(Some(b))
        | V::BinaryView(Some(b))
        | V::FixedSizeBinary(_, Some(b)) => b.len(),
        other => other.size().saturating_sub(std::mem::size_of_val(other)),
    }
}

/// Refuses a type holding a fixed-size value wider than [`MAX_FIXED_WIDTH`], walked with
/// a stack of its own (a type may nest deeply).
fn check_width(data_type: &datafusion::arrow::datatypes::DataType) -> Result<(), DataFusionError> {
    use datafusion::arrow::datatypes::DataType as T;
    // Each type to look at, with how many of it one value holds.
    let mut left = vec![(data_type, 1usize)];
    while let Some((t, times)) = left.pop() {
        let width = |n: i32| times.saturating_mul(usize::try_from(n).unwrap_or(usize::MAX));
        match t {
            // 64-bit offsets: one column of a batch may outgrow 2 GiB, which 32-bit ones
            // refuse before making it (a 5 MB value unnested onto 100,000 rows asked for
            // 500 GB in one allocation, and the process aborted).
            T::LargeUtf8 | T::LargeBinary | T::LargeList(_) | T::LargeListView(_) => {
                return Err(DataFusionError::Plan(format!(
                    "values of {t} are not supported (their columns may outgrow 2 GiB a \
                     batch); use the type without Large"
                )));
            }
            T::FixedSizeBinary(n) if width(*n) > MAX_FIXED_WIDTH => {
                return Err(DataFusionError::Plan(format!(
                    "a value of {t} is {} bytes, over the {MAX_FIXED_WIDTH} a plan may make",
                    width(*n)
                )));
            }
            T::FixedSizeList(f, n) => {
                if width(*n) > MAX_FIXED_WIDTH {
                    return Err(DataFusionError::Plan(format!(
                        "a value of {t} holds {} values, over the {MAX_FIXED_WIDTH} a plan \
                         may make",
                        width(*n)
                    )));
                }
                left.push((f.data_type(), width(*n)));
            }
            T::List(f) | T::ListView(f) | T::Map(f, _) => {
                left.push((f.data_type(), times));
            }
            T::Struct(fields) => left.extend(fields.iter().map(|f| (f.data_type(), times))),
            T::Union(fields, _) => left.extend(fields.iter().map(|(_, f)| (f.data_type(), times))),
            T::Dictionary(_, v) => left.push((v, times)),
            T::RunEndEncoded(_, v) => left.push((v.data_type(), times)),
            _ => {}
        }
    }
    Ok(())
}

/// Parses `sql` and refuses it when a statement has more queries, tables or expressions
/// than `limits` allow (a plan error naming which); a text that does not parse is left
/// for the planner to report.
pub fn check_sql_shape(sql: &str, limits: &SqlLimits) -> Result<(), DataFusionError> {
    let Ok(statements) = DFParser::parse_sql(sql) else {
        return Ok(());
    };
    for statement in statements {
        let mut count = Count {
            limits: *limits,
            ..Count::default()
        };
        let mut statement = statement;
        // EXPLAIN plans the statement it explains.
        while let Statement::Explain(explain) = statement {
            statement = *explain.statement;
        }
        let Statement::Statement(statement) = statement else {
            continue;
        };
        if let ControlFlow::Break(over) = statement.visit(&mut count) {
            return Err(DataFusionError::Plan(over));
        }
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Count {
    limits: SqlLimits,
    queries: usize,
    tables: usize,
    expressions: usize,
}

impl Count {
    fn over(n: usize, limit: usize, what: &str) -> ControlFlow<String> {
        if n > limit {
            return ControlFlow::Break(format!(
                "the SQL has more than {limit} {what}, over the limit of the SQL API; split it"
            ));
        }
        ControlFlow::Continue(())
    }
}

impl Visitor for Count {
    type Break = String;

    fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<String> {
        self.queries += 1;
        Self::over(
            self.queries,
            self.limits.max_queries,
            "queries (CTEs and subqueries)",
        )
    }

    fn pre_visit_table_factor(&mut self, _: &TableFactor) -> ControlFlow<String> {
        self.tables += 1;
        Self::over(self.tables, self.limits.max_tables, "tables read")
    }

    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<String> {
        self.expressions += 1;
        Self::over(
            self.expressions,
            self.limits.max_expressions,
            "expression terms",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctes(n: usize) -> String {
        let mut sql = "WITH c0 AS (SELECT 1 AS s)".to_owned();
        for i in 1..=n {
            sql += &format!(", c{i} AS (SELECT s + 1 AS s FROM c{})", i - 1);
        }
        sql + &format!(" SELECT s FROM c{n}")
    }

    #[test]
    fn statements_within_the_limits_pass_and_larger_ones_are_refused_by_what() {
        let limits = SqlLimits::default();
        for ok in [
            "SELECT 1",
            "SELECT a.x, b.y FROM a JOIN b ON a.id = b.id WHERE a.x IN (SELECT x FROM c)",
            ctes(90).as_str(),
            "not SQL at all",
        ] {
            check_sql_shape(ok, &limits).unwrap();
        }
        let sum = format!("SELECT 1{}", " + 1".repeat(20_000));
        let joins = format!(
            "SELECT 1 FROM t0{}",
            (1..200)
                .map(|i| format!(" JOIN t{i} USING (x)"))
                .collect::<String>()
        );
        for (sql, what) in [
            (ctes(200), "more than 100 queries (CTEs and subqueries)"),
            (format!("EXPLAIN {}", ctes(200)), "more than 100 queries"),
            (sum, "more than 10000 expression terms"),
            (joins, "more than 100 tables read"),
        ] {
            let e = check_sql_shape(&sql, &limits).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    /// What a plan makes outside the pool in proportion to its rows is refused before it
    /// runs, naming the limit: a literal over the bound, a fixed-size type wider than the
    /// bound (the typed null that was 17.6 TB a column once projected); small ones run.
    #[tokio::test]
    async fn literals_and_fixed_widths_past_their_bounds_are_refused_before_they_run() {
        let ctx = datafusion::prelude::SessionContext::new();
        let refused = |sql: String| {
            let ctx = ctx.clone();
            async move {
                match read_sql(&ctx, &sql).await {
                    Ok(_) => panic!("planned: {}", &sql[..sql.len().min(80)]),
                    Err(e) => e.to_string(),
                }
            }
        };
        let e = refused(
            "SELECT arrow_cast(NULL, 'FixedSizeBinary(2147483647)') FROM generate_series(1, 3)"
                .into(),
        )
        .await;
        assert!(e.contains("over the 65536"), "{e}");
        let e =
            refused("SELECT arrow_cast(NULL, 'List(FixedSizeList(100000, Int64))') AS l".into())
                .await;
        assert!(e.contains("over the 65536"), "{e}");
        let e = refused(format!("SELECT lower('{}') AS s", "x".repeat(5000))).await;
        assert!(e.contains("a literal of 5000 bytes"), "{e}");
        let fine = read_sql(
            &ctx,
            &format!(
                "SELECT '{}' AS s, arrow_cast(NULL, 'FixedSizeBinary(16)') AS b \
                 FROM generate_series(1, 3)",
                "x".repeat(MAX_LITERAL_BYTES)
            ),
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        assert_eq!(fine.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
    }

    /// A pattern an operator's kernel runs over a whole batch (`~`, `SIMILAR TO`, `LIKE`),
    /// where no step count reaches, must search in linear time: one whose DFA does not fit
    /// its bound is refused at planning, naming why; one whose automaton is over its bound
    /// is refused wherever it is. Patterns of every day, and the same pattern given to
    /// `regexp_like` (whose steps are counted), are planned.
    #[tokio::test]
    async fn patterns_operators_cannot_search_in_linear_time_are_refused() {
        let ctx = datafusion::prelude::SessionContext::new();
        let rows = "FROM (SELECT CAST(v AS VARCHAR) AS s FROM generate_series(1, 5) t(v)) r";
        let underscores = "_".repeat(1500);
        for slow in [
            "s ~ '[ -~]{5000}'".to_owned(),
            "s !~* concat('[ -~]', '{5000}')".to_owned(),
            "s SIMILAR TO '[ -~]{5000}'".to_owned(),
            format!("s LIKE '%{underscores}%'"),
            format!("s NOT ILIKE '%{underscores}'"),
        ] {
            let sql = format!("SELECT {slow} AS m {rows}");
            match read_sql(&ctx, &sql).await {
                Ok(_) => panic!("planned: {}", &sql[..80]),
                Err(e) => assert!(
                    e.to_string().contains("cannot be searched in time linear"),
                    "{}: {e}",
                    &sql[..80]
                ),
            }
        }
        for huge in [
            "regexp_like(s, '[ -~]{50000}{20}')".to_owned(),
            format!("s LIKE '{}'", "_".repeat(4000)),
        ] {
            let sql = format!("SELECT {huge} AS m {rows}");
            let e = read_sql(&ctx, &sql).await.unwrap_err();
            assert!(e.to_string().contains("over the 1048576 bytes"), "{e}");
        }
        for fine in [
            "s ~ '^[0-9]+$'",
            "s SIMILAR TO '(1|2)+'",
            "s LIKE '%1%2%'",
            "s ILIKE '1_'",
            "regexp_like(s, '[ -~]{5000}')",
            "s ~ '\\w+'",
        ] {
            let sql = format!("SELECT {fine} AS m {rows}");
            let batches = read_sql(&ctx, &sql).await.unwrap().collect().await.unwrap();
            assert_eq!(
                batches.iter().map(|b| b.num_rows()).sum::<usize>(),
                5,
                "{sql}"
            );
        }
    }

    /// A pattern read from a row (or made by `random()`) would be compiled once per
    /// distinct row, work the deadline cannot reach: refused at planning for each way SQL
    /// compiles one. Constant patterns, however written, still run.
    #[tokio::test]
    async fn patterns_that_differ_by_row_are_refused_and_constant_ones_run() {
        let ctx = datafusion::prelude::SessionContext::new();
        let rows = "FROM (SELECT CAST(v AS VARCHAR) AS s FROM generate_series(1, 5) t(v)) r";
        for per_row in [
            "regexp_like(s, s)",
            "regexp_like(s, 'a', s)",
            "regexp_match(s, concat('(a+)+', s)) IS NULL",
            "regexp_count(s, s) > 0",
            "regexp_replace(s, s, 'x') = ''",
            "s ~ s",
            "s !~* concat(s, 'x')",
            "s LIKE s",
            "s ILIKE concat('%', s)",
            "s SIMILAR TO s",
            "s ~ CAST(random() AS VARCHAR)",
        ] {
            let sql = format!("SELECT {per_row} AS m {rows}");
            match read_sql(&ctx, &sql).await {
                Ok(_) => panic!("planned: {sql}"),
                Err(e) => assert!(e.to_string().contains("is not a constant"), "{sql}: {e}"),
            }
        }
        for constant in [
            "regexp_like(s, '^[0-9]+$')",
            "s ~ concat('^', '3')",
            "s LIKE '%3%'",
            "regexp_replace(s, '3', s) = s",
            "levenshtein(s, s) = 0",
        ] {
            let sql = format!("SELECT {constant} AS m {rows}");
            let batches = read_sql(&ctx, &sql).await.unwrap().collect().await.unwrap();
            assert_eq!(
                batches.iter().map(|b| b.num_rows()).sum::<usize>(),
                5,
                "{sql}"
            );
        }
    }
}
