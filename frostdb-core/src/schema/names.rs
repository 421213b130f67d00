//! Column name rules and resolution of a name (`timestamp`, `labels.pod`) to a definition.

use super::Schema;
use crate::error::{Error, Result};

/// Longest accepted column, table or label name, in bytes (a dynamic column's label is
/// checked alone: `labels.<label>` may be longer).
pub const MAX_NAME_LEN: usize = 255;

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("name is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("name is longer than 255 bytes");
    }
    if name.contains('.') {
        return Err("'.' separates a dynamic column from its label and may not appear here");
    }
    if name.chars().any(char::is_control) {
        return Err("name contains a control character");
    }
    if name.trim() != name {
        return Err("name starts or ends with whitespace");
    }
    Ok(())
}

/// Validates a table, schema or static column name.
pub(crate) fn validate_static_name(name: &str) -> Result<()> {
    check_name(name).map_err(|reason| Error::InvalidColumnName {
        name: name.to_owned(),
        reason,
    })
}

/// Validates the label part of a dynamic column name (`pod` in `labels.pod`).
pub(crate) fn validate_label_name(full: &str, label: &str) -> Result<()> {
    check_name(label).map_err(|reason| Error::InvalidColumnName {
        name: full.to_owned(),
        reason,
    })
}

/// A resolved concrete column name: a static column, or one label of a dynamic family.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ColumnName {
    /// Index of the definition in the schema.
    pub(crate) def: usize,
    /// The label of a dynamic column; `None` for static columns.
    pub(crate) label: Option<String>,
}

impl ColumnName {
    /// Resolves `name` as a concrete column of `schema` (what a batch or predicate may name).
    pub(crate) fn resolve(schema: &Schema, name: &str) -> Result<Self> {
        let unknown = || Error::UnknownColumn {
            table: schema.name().to_owned(),
            column: name.to_owned(),
        };
        match name.split_once('.') {
            None => {
                let (def, column) = schema.column(name).ok_or_else(unknown)?;
                if column.is_dynamic() {
                    return Err(Error::InvalidColumnName {
                        name: name.to_owned(),
                        reason: "names a dynamic column family, not one of its columns \
                                 (use <family>.<label>)",
                    });
                }
                Ok(Self { def, label: None })
            }
            Some((family, label)) => {
                let (def, column) = schema.column(family).ok_or_else(unknown)?;
                if !column.is_dynamic() {
                    return Err(Error::InvalidColumnName {
                        name: name.to_owned(),
                        reason: "the part before '.' is a static column, which has no sub-columns",
                    });
                }
                validate_label_name(name, label)?;
                Ok(Self {
                    def,
                    label: Some(label.to_owned()),
                })
            }
        }
    }

    /// The column's full name.
    pub(crate) fn full_name(&self, schema: &Schema) -> String {
        let family = schema.columns()[self.def].name();
        match &self.label {
            None => family.to_owned(),
            Some(label) => format!("{family}.{label}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use arrow::datatypes::DataType;

    use super::*;
    use crate::schema::ColumnDef;

    fn schema() -> Schema {
        Schema::builder("t")
            .column(ColumnDef::new("a", DataType::Int64))
            .column(ColumnDef::dynamic("labels", DataType::Utf8))
            .build()
            .unwrap()
    }

    #[test]
    fn resolves_static_and_dynamic() {
        let s = schema();
        assert_eq!(
            ColumnName::resolve(&s, "a").unwrap(),
            ColumnName {
                def: 0,
                label: None
            }
        );
        let pod = ColumnName::resolve(&s, "labels.pod").unwrap();
        assert_eq!(pod.label.as_deref(), Some("pod"));
        assert_eq!(pod.full_name(&s), "labels.pod");
    }

    #[test]
    fn rejects_dot_games() {
        let s = schema();
        for bad in [
            "labels",
            "labels.",
            "labels..x",
            "labels.a.b",
            "a.b",
            ".labels",
            "labels. x",
            "labels.\u{1}",
        ] {
            let err = ColumnName::resolve(&s, bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidColumnName { .. } | Error::UnknownColumn { .. }
                ),
                "{bad:?}: {err}"
            );
        }
        assert!(matches!(
            ColumnName::resolve(&s, "b").unwrap_err(),
            Error::UnknownColumn { .. }
        ));
    }
}
