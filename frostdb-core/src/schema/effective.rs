//! A table's effective schema: the definition plus every dynamic column seen so far.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::compute::SortOptions;
use arrow::datatypes::{Field, FieldRef, SchemaRef};

use super::{ColumnName, Schema};

/// The effective schema of a table at one snapshot: static columns in definition order, each
/// dynamic family expanded in place into its concrete columns in label order.
///
/// It only grows: a snapshot's data never holds a column its `TableSchema` lacks, and a column
/// a part or granule lacks reads as null.
#[derive(Debug, Clone)]
pub struct TableSchema {
    definition: Arc<Schema>,
    columns: Vec<ColumnName>,
    arrow: SchemaRef,
    /// Field positions by name: scans, predicates and merges look columns up by name, each
    /// of possibly thousands of label columns (Arrow's `index_of` compares them one by one).
    by_name: HashMap<String, usize>,
}

impl TableSchema {
    /// The effective schema of a table that has seen no dynamic column yet.
    pub(crate) fn new(definition: Arc<Schema>) -> Self {
        let columns = (0..definition.columns().len())
            .filter(|&def| !definition.columns()[def].is_dynamic())
            .map(|def| ColumnName { def, label: None })
            .collect();
        Self::from_columns(definition, columns)
    }

    fn from_columns(definition: Arc<Schema>, columns: Vec<ColumnName>) -> Self {
        let fields: Vec<FieldRef> = columns
            .iter()
            .map(|c| Arc::new(field_for(&definition, c)))
            .collect();
        let arrow = Arc::new(arrow::datatypes::Schema::new(fields));
        let by_name = arrow
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name().clone(), i))
            .collect();
        Self {
            definition,
            columns,
            arrow,
            by_name,
        }
    }

    /// This schema grown by `added`, or `None` when it already has all of them.
    pub(crate) fn grown<'a>(
        &self,
        added: impl IntoIterator<Item = &'a ColumnName>,
    ) -> Option<Self> {
        let mut new: BTreeSet<&ColumnName> = BTreeSet::new();
        for c in added {
            if self.columns.binary_search(c).is_err() {
                new.insert(c);
            }
        }
        if new.is_empty() {
            return None;
        }
        let mut columns = self.columns.clone();
        columns.extend(new.into_iter().cloned());
        columns.sort();
        Some(Self::from_columns(self.definition.clone(), columns))
    }

    /// The table's schema definition.
    pub fn definition(&self) -> &Arc<Schema> {
        &self.definition
    }

    /// The effective Arrow schema, with storage types (dictionary-encoded columns are
    /// `Dictionary(Int32, _)`).
    pub fn arrow_schema(&self) -> &SchemaRef {
        &self.arrow
    }

    /// Index of the field called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Indices of the concrete columns of the dynamic family `def`, in label order.
    pub(crate) fn family(&self, def: usize) -> impl Iterator<Item = usize> + '_ {
        self.columns
            .iter()
            .enumerate()
            .filter(move |(_, c)| c.def == def)
            .map(|(i, _)| i)
    }

    /// The expanded sort key: field indices with their sort options, a dynamic sorting column
    /// contributing each of its concrete columns, those it lists first in that order and the
    /// rest in label order. The order of two labels never depends on which others exist, so
    /// rows sorted before the schema grew stay sorted (a new label is null in them).
    pub(crate) fn sort_key(&self) -> Vec<(usize, SortOptions)> {
        let def = &self.definition;
        def.sorting_columns()
            .iter()
            .flat_map(|s| {
                let (idx, _) = def.column(&s.name).expect("validated sorting column");
                let opts = s.sort_options();
                let mut family: Vec<usize> = self.family(idx).collect();
                if !s.first.is_empty() {
                    family.sort_by_key(|&i| {
                        s.label_rank(self.columns[i].label.as_deref().unwrap_or(""))
                    });
                }
                family
                    .into_iter()
                    .map(move |i| (i, opts))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// The Arrow field of a resolved column.
pub(crate) fn field_for(definition: &Schema, column: &ColumnName) -> Field {
    let def = &definition.columns()[column.def];
    Field::new(
        column.full_name(definition),
        def.storage_type(),
        def.is_nullable(),
    )
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;
    use crate::schema::{ColumnDef, SortingColumn};

    #[test]
    fn grows_in_canonical_order() {
        let def = Schema::builder("t")
            .column(ColumnDef::new("a", DataType::Int64))
            .column(ColumnDef::dynamic("labels", DataType::Utf8))
            .column(ColumnDef::new("z", DataType::Int64))
            .sort_by(SortingColumn::asc("labels"))
            .sort_by(SortingColumn::asc("a"))
            .build()
            .unwrap();
        let s = TableSchema::new(Arc::new(def.clone()));
        let names = |s: &TableSchema| {
            s.arrow_schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&s), ["a", "z"]);
        let pod = ColumnName::resolve(&def, "labels.pod").unwrap();
        let job = ColumnName::resolve(&def, "labels.job").unwrap();
        let s = s.grown([&pod, &job]).unwrap();
        assert_eq!(names(&s), ["a", "labels.job", "labels.pod", "z"]);
        assert!(s.grown([&pod]).is_none());
        assert_eq!(
            s.sort_key().iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [1, 2, 0]
        );
    }

    #[test]
    fn listed_labels_lead_the_key_and_the_rest_follow_by_name() {
        let def = Schema::builder("t")
            .column(ColumnDef::dynamic("labels", DataType::Utf8))
            .sort_by(SortingColumn::asc("labels").labels_first(["pod", "container"]))
            .build()
            .unwrap();
        let key = |labels: &[&str]| {
            let columns: Vec<ColumnName> = labels
                .iter()
                .map(|l| ColumnName::resolve(&def, &format!("labels.{l}")).unwrap())
                .collect();
            let s = TableSchema::new(Arc::new(def.clone()))
                .grown(columns.iter())
                .unwrap();
            s.sort_key()
                .iter()
                .map(|(i, _)| s.arrow_schema().field(*i).name().clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            key(&["node", "container", "pod", "app"]),
            [
                "labels.pod",
                "labels.container",
                "labels.app",
                "labels.node"
            ]
        );
        // Two labels keep their order whatever else the schema has.
        assert_eq!(
            key(&["node", "container"]),
            ["labels.container", "labels.node"]
        );
        assert_eq!(key(&["app", "node"]), ["labels.app", "labels.node"]);

        // Only a dynamic family lists labels, each once, each a valid label.
        let bad = |sort: SortingColumn| {
            Schema::builder("t")
                .column(ColumnDef::dynamic("labels", DataType::Utf8))
                .column(ColumnDef::new("a", DataType::Int64))
                .sort_by(sort)
                .build()
                .unwrap_err()
                .to_string()
        };
        assert!(bad(SortingColumn::asc("a").labels_first(["x"])).contains("not a dynamic column"));
        assert!(bad(SortingColumn::asc("labels").labels_first(["x", "x"])).contains("twice"));
        assert!(bad(SortingColumn::asc("labels").labels_first(["a.b"])).contains("a.b"));
        // And the order survives the manifest's JSON.
        assert_eq!(Schema::from_json(&def.to_json().unwrap()).unwrap(), def);
    }
}
