//! Table schemas: columns, dynamic columns and sorting columns.
//!
//! A [`Schema`] lists column definitions and the ordered sorting columns. A column marked
//! *dynamic* (say `labels`) is a family: inserts bring concrete columns `labels.<name>`, and a
//! table's effective schema ([`TableSchema`]) is the union of every name it has seen, absent
//! ones reading as null.

mod by_name;
mod effective;
mod names;
pub(crate) mod types;

use arrow::datatypes::DataType;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub(crate) use by_name::{Columns, FieldIndex};
pub use effective::TableSchema;
pub(crate) use effective::field_for;
pub use names::MAX_NAME_LEN;
pub(crate) use names::{ColumnName, validate_static_name};

/// How a column's values are laid out, in memory where it matters and in persisted Parquet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Encoding {
    /// Values as they are.
    #[default]
    Plain,
    /// Dictionary encoding: in memory, string and binary columns are Arrow dictionary arrays;
    /// persisted, Parquet RLE_DICTIONARY. The choice for low-cardinality values (labels).
    RleDictionary,
    /// Delta encoding of integers (timestamps).
    DeltaBinaryPacked,
    /// Delta encoding of the lengths of byte arrays.
    DeltaLengthByteArray,
    /// Incremental (prefix) encoding of byte arrays.
    DeltaByteArray,
}

/// Compression of a column's persisted pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "codec")]
#[non_exhaustive]
pub enum Compression {
    /// No compression.
    Uncompressed,
    /// Snappy.
    Snappy,
    /// LZ4 (raw block format).
    Lz4Raw,
    /// Zstandard at the given level (1..=22).
    Zstd {
        /// Compression level.
        level: i32,
    },
    /// Zstandard at level 3, the default.
    #[default]
    ZstdDefault,
}

/// One column definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnDef {
    pub(crate) name: String,
    pub(crate) data_type: DataType,
    pub(crate) encoding: Encoding,
    pub(crate) compression: Compression,
    pub(crate) nullable: bool,
    pub(crate) dynamic: bool,
}

impl ColumnDef {
    /// A non-nullable, plain-encoded, zstd-compressed static column.
    pub fn new(name: impl Into<String>, data_type: DataType) -> Self {
        Self {
            name: name.into(),
            data_type,
            encoding: Encoding::Plain,
            compression: Compression::default(),
            nullable: false,
            dynamic: false,
        }
    }

    /// A dynamic column family: inserts bring concrete columns `<name>.<label>`, all nullable.
    pub fn dynamic(name: impl Into<String>, data_type: DataType) -> Self {
        Self {
            nullable: true,
            dynamic: true,
            ..Self::new(name, data_type)
        }
    }

    /// Sets the encoding.
    pub fn encoding(mut self, encoding: Encoding) -> Self {
        self.encoding = encoding;
        self
    }

    /// Sets the compression.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Makes the column nullable (dynamic columns always are).
    pub fn nullable(mut self, nullable: bool) -> Self {
        self.nullable = nullable || self.dynamic;
        self
    }

    /// The column's (or family's) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The logical value type.
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }

    /// The encoding hint.
    pub fn encoding_hint(&self) -> Encoding {
        self.encoding
    }

    /// The compression hint.
    pub fn compression_hint(&self) -> Compression {
        self.compression
    }

    /// Whether the column accepts nulls.
    pub fn is_nullable(&self) -> bool {
        self.nullable
    }

    /// Whether this is a dynamic column family.
    pub fn is_dynamic(&self) -> bool {
        self.dynamic
    }

    /// The Arrow type the engine holds the column's values in: dictionary-encoded byte
    /// columns are `Dictionary(Int32, _)`, everything else is the logical type.
    pub fn storage_type(&self) -> DataType {
        if self.encoding == Encoding::RleDictionary && types::is_bytes(&self.data_type) {
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(self.data_type.clone()))
        } else {
            self.data_type.clone()
        }
    }

    fn validate(&self) -> Result<()> {
        validate_static_name(&self.name)?;
        if !types::is_supported(&self.data_type) {
            return Err(Error::InvalidSchema(format!(
                "column {:?} has unsupported type {}",
                self.name, self.data_type
            )));
        }
        let encoding_fits = match self.encoding {
            Encoding::Plain | Encoding::RleDictionary => true,
            Encoding::DeltaBinaryPacked => types::is_integer(&self.data_type),
            Encoding::DeltaLengthByteArray | Encoding::DeltaByteArray => {
                types::is_bytes(&self.data_type)
            }
        };
        if !encoding_fits {
            return Err(Error::InvalidSchema(format!(
                "column {:?}: encoding {:?} does not apply to {}",
                self.name, self.encoding, self.data_type
            )));
        }
        if let Compression::Zstd { level } = self.compression
            && !(1..=22).contains(&level)
        {
            return Err(Error::InvalidSchema(format!(
                "column {:?}: zstd level {level} is outside 1..=22",
                self.name
            )));
        }
        if self.dynamic && !self.nullable {
            return Err(Error::InvalidSchema(format!(
                "dynamic column {:?} must be nullable: absent names read as null",
                self.name
            )));
        }
        Ok(())
    }
}

/// One sorting column: a column (or a whole dynamic family, sorted by its concrete columns:
/// those named in `first` in that order, then the rest in name order) with direction and
/// null placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SortingColumn {
    /// Column or dynamic family name.
    pub name: String,
    /// Sort descending instead of ascending.
    #[serde(default)]
    pub descending: bool,
    /// Place nulls before non-null values.
    #[serde(default)]
    pub nulls_first: bool,
    /// For a dynamic family: the labels that lead its part of the key, in this order (a
    /// hierarchy such as namespace, pod, container keeps a pod's rows together, where name
    /// order would put every pod's `container` first). Labels not listed follow by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first: Vec<String>,
}

impl SortingColumn {
    /// Ascending, nulls first.
    pub fn asc(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            descending: false,
            nulls_first: true,
            first: Vec::new(),
        }
    }

    /// Descending, nulls first.
    pub fn desc(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            descending: true,
            nulls_first: true,
            first: Vec::new(),
        }
    }

    /// Sets null placement.
    pub fn nulls_first(mut self, nulls_first: bool) -> Self {
        self.nulls_first = nulls_first;
        self
    }

    /// For a dynamic family: these labels lead its part of the key, in this order.
    pub fn labels_first<S: Into<String>>(mut self, labels: impl IntoIterator<Item = S>) -> Self {
        self.first = labels.into_iter().map(Into::into).collect();
        self
    }

    /// Where a dynamic family's label sorts among its others: listed ones first, in their
    /// order, then the rest by name.
    pub(crate) fn label_rank<'a>(&self, label: &'a str) -> (usize, &'a str) {
        match self.first.iter().position(|l| l == label) {
            Some(i) => (i, ""),
            None => (self.first.len(), label),
        }
    }

    pub(crate) fn sort_options(&self) -> arrow::compute::SortOptions {
        arrow::compute::SortOptions {
            descending: self.descending,
            nulls_first: self.nulls_first,
        }
    }
}

/// A table schema: column definitions and sorting columns. Immutable once built.
///
/// ```
/// use arrow::datatypes::DataType;
/// use frostdb_core::{ColumnDef, Encoding, Schema, SortingColumn};
///
/// let schema = Schema::builder("samples")
///     .column(ColumnDef::new("name", DataType::Utf8).encoding(Encoding::RleDictionary))
///     .column(ColumnDef::dynamic("labels", DataType::Utf8).encoding(Encoding::RleDictionary))
///     .column(ColumnDef::new("timestamp", DataType::Int64))
///     .column(ColumnDef::new("value", DataType::Int64))
///     .sort_by(SortingColumn::asc("name"))
///     .sort_by(SortingColumn::asc("labels"))
///     .sort_by(SortingColumn::asc("timestamp"))
///     .build()?;
/// let json = schema.to_json()?;
/// assert_eq!(Schema::from_json(&json)?, schema);
/// # Ok::<(), frostdb_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "SchemaRepr", try_from = "SchemaRepr")]
pub struct Schema {
    name: String,
    columns: Vec<ColumnDef>,
    sorting: Vec<SortingColumn>,
}

impl Schema {
    /// Whether `other` describes the same rows: the same columns, types, encodings and sort
    /// order. Compression hints may differ: they only shape blocks written later, and any
    /// block reads whatever its pages were compressed with.
    pub fn same_rows_as(&self, other: &Schema) -> bool {
        let strip = |s: &Schema| {
            let mut s = s.clone();
            for c in &mut s.columns {
                c.compression = Compression::default();
            }
            s
        };
        strip(self) == strip(other)
    }
}

/// Builds a [`Schema`]; [`SchemaBuilder::build`] validates it.
#[derive(Debug)]
pub struct SchemaBuilder {
    name: String,
    columns: Vec<ColumnDef>,
    sorting: Vec<SortingColumn>,
}

impl SchemaBuilder {
    /// Adds a column definition.
    pub fn column(mut self, column: ColumnDef) -> Self {
        self.columns.push(column);
        self
    }

    /// Appends a sorting column (the first added sorts first).
    pub fn sort_by(mut self, column: SortingColumn) -> Self {
        self.sorting.push(column);
        self
    }

    /// Validates and builds the schema.
    ///
    /// Fails on an empty or malformed name, a duplicate column, an unsupported type or
    /// encoding, or a sorting column that names no column or appears twice.
    pub fn build(self) -> Result<Schema> {
        let schema = Schema {
            name: self.name,
            columns: self.columns,
            sorting: self.sorting,
        };
        schema.validate()?;
        Ok(schema)
    }
}

impl Schema {
    /// Starts a schema named `name`.
    pub fn builder(name: impl Into<String>) -> SchemaBuilder {
        SchemaBuilder {
            name: name.into(),
            columns: Vec::new(),
            sorting: Vec::new(),
        }
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Column definitions in order.
    pub fn columns(&self) -> &[ColumnDef] {
        &self.columns
    }

    /// Sorting columns in order.
    pub fn sorting_columns(&self) -> &[SortingColumn] {
        &self.sorting
    }

    /// The definition named `name` and its index.
    pub fn column(&self, name: &str) -> Option<(usize, &ColumnDef)> {
        self.columns
            .iter()
            .enumerate()
            .find(|(_, c)| c.name == name)
    }

    fn validate(&self) -> Result<()> {
        validate_static_name(&self.name)
            .map_err(|e| Error::InvalidSchema(format!("schema name: {e}")))?;
        if self.columns.is_empty() {
            return Err(Error::InvalidSchema(format!(
                "schema {:?} has no columns",
                self.name
            )));
        }
        for (i, column) in self.columns.iter().enumerate() {
            column.validate()?;
            if let Some(earlier) = self.columns[..i].iter().find(|c| c.name == column.name) {
                let kind = if column.dynamic || earlier.dynamic {
                    "collides with another column (dynamic and static names share one namespace)"
                } else {
                    "is defined twice"
                };
                return Err(Error::InvalidSchema(format!(
                    "column {:?} {kind}",
                    column.name
                )));
            }
        }
        for (i, sort) in self.sorting.iter().enumerate() {
            if self.column(&sort.name).is_none() {
                return Err(Error::InvalidSchema(format!(
                    "sorting column {:?} is not a column of the schema",
                    sort.name
                )));
            }
            if self.sorting[..i].iter().any(|s| s.name == sort.name) {
                return Err(Error::InvalidSchema(format!(
                    "sorting column {:?} appears twice",
                    sort.name
                )));
            }
            if !sort.first.is_empty() {
                if !self.column(&sort.name).is_some_and(|(_, c)| c.dynamic) {
                    return Err(Error::InvalidSchema(format!(
                        "sorting column {:?} lists labels to sort first, but is not a dynamic column",
                        sort.name
                    )));
                }
                for (j, label) in sort.first.iter().enumerate() {
                    names::validate_label_name(&format!("{}.{label}", sort.name), label)?;
                    if sort.first[..j].contains(label) {
                        return Err(Error::InvalidSchema(format!(
                            "sorting column {:?} lists label {label:?} twice",
                            sort.name
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Serialises the schema as JSON (the form the manifest stores).
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string(&SchemaRepr::from(self))?)
    }

    /// Reads a schema written by [`Schema::to_json`], validating it again.
    pub fn from_json(json: &str) -> Result<Self> {
        let repr: SchemaRepr = serde_json::from_str(json)?;
        repr.try_into()
    }
}

#[derive(Clone, Serialize, Deserialize)]
struct SchemaRepr {
    name: String,
    columns: Vec<ColumnRepr>,
    sorting: Vec<SortingColumn>,
}

#[derive(Clone, Serialize, Deserialize)]
struct ColumnRepr {
    name: String,
    #[serde(rename = "type")]
    data_type: String,
    #[serde(default)]
    encoding: Encoding,
    #[serde(default)]
    compression: Compression,
    #[serde(default)]
    nullable: bool,
    #[serde(default)]
    dynamic: bool,
}

impl From<Schema> for SchemaRepr {
    fn from(s: Schema) -> Self {
        Self::from(&s)
    }
}

impl From<&Schema> for SchemaRepr {
    fn from(s: &Schema) -> Self {
        Self {
            name: s.name.clone(),
            columns: s
                .columns
                .iter()
                .map(|c| ColumnRepr {
                    name: c.name.clone(),
                    data_type: types::type_name(&c.data_type),
                    encoding: c.encoding,
                    compression: c.compression,
                    nullable: c.nullable,
                    dynamic: c.dynamic,
                })
                .collect(),
            sorting: s.sorting.clone(),
        }
    }
}

impl TryFrom<SchemaRepr> for Schema {
    type Error = Error;

    fn try_from(r: SchemaRepr) -> Result<Self> {
        let mut builder = Schema::builder(r.name);
        for c in r.columns {
            builder = builder.column(ColumnDef {
                data_type: types::parse_type_name(&c.data_type)?,
                name: c.name,
                encoding: c.encoding,
                compression: c.compression,
                nullable: c.nullable,
                dynamic: c.dynamic,
            });
        }
        for s in r.sorting {
            builder = builder.sort_by(s);
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SchemaBuilder {
        Schema::builder("t")
            .column(ColumnDef::new("a", DataType::Utf8).encoding(Encoding::RleDictionary))
            .column(ColumnDef::dynamic("labels", DataType::Utf8))
            .column(ColumnDef::new("ts", DataType::Int64).encoding(Encoding::DeltaBinaryPacked))
    }

    #[test]
    fn builds_and_round_trips() {
        let schema = base()
            .column(
                ColumnDef::new("id", DataType::FixedSizeBinary(16))
                    .compression(Compression::Zstd { level: 9 }),
            )
            .sort_by(SortingColumn::asc("a"))
            .sort_by(SortingColumn::desc("labels").nulls_first(false))
            .build()
            .unwrap();
        let back = Schema::from_json(&schema.to_json().unwrap()).unwrap();
        assert_eq!(back, schema);
        assert_eq!(
            schema.column("a").unwrap().1.storage_type(),
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
        );
        assert_eq!(
            schema.column("ts").unwrap().1.storage_type(),
            DataType::Int64
        );
    }

    #[test]
    fn rejects_bad_schemas() {
        let cases: Vec<(SchemaBuilder, &str)> = vec![
            (base().column(ColumnDef::new("", DataType::Int64)), "empty"),
            (base().column(ColumnDef::new("x.y", DataType::Int64)), "'.'"),
            (base().column(ColumnDef::new("a", DataType::Int64)), "twice"),
            (
                base().column(ColumnDef::new("labels", DataType::Int64)),
                "collides",
            ),
            (base().sort_by(SortingColumn::asc("nope")), "not a column"),
            (
                base()
                    .sort_by(SortingColumn::asc("a"))
                    .sort_by(SortingColumn::asc("a")),
                "twice",
            ),
            (
                base().column(
                    ColumnDef::new("b", DataType::Utf8).encoding(Encoding::DeltaBinaryPacked),
                ),
                "does not apply",
            ),
            (
                base().column(ColumnDef::new(
                    "d",
                    DataType::List(std::sync::Arc::new(arrow::datatypes::Field::new(
                        "i",
                        DataType::Int64,
                        true,
                    ))),
                )),
                "unsupported type",
            ),
            (
                base().column(
                    ColumnDef::new("z", DataType::Int64)
                        .compression(Compression::Zstd { level: 40 }),
                ),
                "zstd level",
            ),
        ];
        for (builder, needle) in cases {
            let err = builder.build().unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }

    #[test]
    fn from_json_validates() {
        let json = r#"{"name":"t","columns":[{"name":"a","type":"int64"},{"name":"a","type":"utf8"}],"sorting":[]}"#;
        assert!(Schema::from_json(json).is_err());
        let json = r#"{"name":"t","columns":[{"name":"a","type":"decimal"}],"sorting":[]}"#;
        assert!(Schema::from_json(json).is_err());
        assert!(Schema::from_json("{").is_err());
    }
}
