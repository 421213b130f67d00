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
