//! Sorting by a table's sort key, and the k-way merge of sorted batch streams that both
//! compaction and sorted scans use.

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array, new_null_array};
use arrow::compute::{SortOptions, interleave, take};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};

use crate::error::Result;
use crate::schema::{Columns, TableSchema};

/// A stream of batches.
pub(crate) type BatchStream = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// One input of a [`Merge`]: a stream whose batches are each sorted (`sorted`) or not, in
/// which case the merge sorts each batch's row order itself (without copying the batch).
/// Either way the stream's batches must follow each other in order.
pub(crate) struct Input {
    pub(crate) stream: BatchStream,
    pub(crate) sorted: bool,
}

impl Input {
    pub(crate) fn sorted(stream: BatchStream) -> Self {
        Self {
            stream,
            sorted: true,
        }
    }

    /// A single batch in any order.
    pub(crate) fn unsorted_batch(batch: Result<Option<RecordBatch>>) -> Self {
        Self {
            stream: Box::new(batch.transpose().into_iter()),
            sorted: false,
        }
    }
}

/// One column of a sort key.
#[derive(Debug, Clone)]
struct KeyColumn {
    name: String,
    data_type: DataType,
    options: SortOptions,
    field: SortField,
    /// For a dictionary column: every value it may hold, sorted. Rows then compare the value's
    /// rank (4 bytes) instead of its bytes, which makes row conversion and comparison of
    /// label-heavy keys several times cheaper.
    ranks: Option<Arc<Vec<Vec<u8>>>>,
}

/// The expanded sort key of a table schema: concrete column names with their sort options.
/// Batches lacking a key column sort as if it were all null.
#[derive(Debug, Clone)]
pub(crate) struct SortKey {
    columns: Vec<KeyColumn>,
    /// How many of the leading columns (all ranked) are packed into one `u64` of the rows,
    /// and each one's place there: a profile's key is its profile type and labels (a
    /// dozen ranked columns, each a few bits) before its stack and time, and one word
    /// converts and compares several times faster than a dozen.
    packed: Vec<Packing>,
}

/// A ranked column's place in the packed word: its codes (null and each rank, in the
/// column's order) take the bits from `shift` up that `codes` needs.
#[derive(Debug, Clone, Copy)]
struct Packing {
    shift: u32,
    /// Codes: the ranks and null.
    codes: u64,
}

impl Packing {
    /// The code of rank `rank` (`None`: null) in a column sorted by `options`.
    fn code(self, rank: Option<usize>, options: SortOptions) -> u64 {
        // Values take `values` codes in their order (reversed when descending), after
        // null's or before it.
        let values = self.codes - 1;
        let code = match rank {
            None if options.nulls_first => 0,
            None => values,
            Some(r) => {
                let r = r as u64;
                let place = if options.descending {
                    values - 1 - r
                } else {
                    r
                };
                place + u64::from(options.nulls_first)
            }
        };
        code << self.shift
    }
}

impl SortKey {
    pub(crate) fn new(schema: &TableSchema) -> Self {
        let arrow = schema.arrow_schema();
        let columns = schema
            .sort_key()
            .into_iter()
            .map(|(i, options)| {
                let field = arrow.field(i);
                KeyColumn {
                    name: field.name().clone(),
                    data_type: field.data_type().clone(),
                    options,
                    field: SortField::new_with_options(field.data_type().clone(), options),
                    ranks: None,
                }
            })
            .collect();
        Self {
            columns,
            packed: Vec::new(),
        }
    }

    /// This key, comparing dictionary columns by rank among the values `batches` hold. Every
    /// batch later given to the key must draw its dictionary values from these.
    pub(crate) fn with_ranks<'a>(mut self, batches: impl Iterator<Item = &'a RecordBatch>) -> Self {
        let dictionary_columns: Vec<usize> = (0..self.columns.len())
            .filter(|&i| matches!(self.columns[i].data_type, DataType::Dictionary(_, _)))
            .collect();
        if dictionary_columns.is_empty() {
            return self;
        }
        let mut values: Vec<Vec<Vec<u8>>> = vec![Vec::new(); self.columns.len()];
        for batch in batches {
            let columns = Columns::new(batch);
            for &i in &dictionary_columns {
                if let Some(dict) = columns
                    .get(&self.columns[i].name)
                    .and_then(|c| c.as_any_dictionary_opt())
                {
                    values[i].extend(dictionary_values(dict.values().as_ref()));
                }
            }
        }
        for i in dictionary_columns {
            let mut v = std::mem::take(&mut values[i]);
            v.sort_unstable();
            v.dedup();
            let column = &mut self.columns[i];
            column.field = SortField::new_with_options(DataType::UInt32, column.options);
            column.ranks = Some(Arc::new(v));
        }
        // A dictionary column without a value in any batch is null in every row: it orders
        // nothing, and is left out of the key. A table keeps every label column it ever
        // had, and each was 5 bytes of every row's key: a tenant of 1,000 label names made
        // a 4-million-row part's key 21 GB, outside any budget.
        self.columns
            .retain(|c| c.ranks.as_ref().is_none_or(|ranks| !ranks.is_empty()));
        // The leading ranked columns whose codes fit one word together, the first the most
        // significant (two or more: one alone gains nothing).
        let mut bits = Vec::new();
        for c in &self.columns {
            let Some(ranks) = &c.ranks else { break };
            let codes = ranks.len() as u64 + 1;
            let width = 64 - (codes - 1).leading_zeros().min(63);
            if bits.iter().sum::<u32>() + width > 64 {
                break;
            }
            bits.push(width);
        }
        if bits.len() >= 2 {
            let mut shift = 64;
            self.packed = bits
                .iter()
                .zip(&self.columns)
                .map(|(&width, c)| {
                    shift -= width;
                    Packing {
                        shift,
                        codes: c.ranks.as_ref().map_or(1, |r| r.len() as u64 + 1),
                    }
                })
                .collect();
        }
        self
    }

    /// The key's columns with (descending, nulls first).
    pub(crate) fn columns_with_options(&self) -> Vec<(String, bool, bool)> {
        self.columns
            .iter()
            .map(|c| (c.name.clone(), c.options.descending, c.options.nulls_first))
            .collect()
    }

    /// Names of the key's columns.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }

    fn converter(&self) -> Result<RowConverter> {
        let packed = (!self.packed.is_empty()).then(|| SortField::new(DataType::UInt64));
        Ok(RowConverter::new(
            packed
                .into_iter()
                .chain(
                    self.columns[self.packed.len()..]
                        .iter()
                        .map(|c| c.field.clone()),
                )
                .collect(),
        )?)
    }

    /// The order of `batch`'s rows by this key (stable: rows alike keep their order); `None`
    /// when they are in order already, which takes one comparison a row to find.
    pub(crate) fn order(&self, batch: &RecordBatch) -> Result<Option<Vec<u32>>> {
        let converter = self.converter()?;
        let rows = self.rows(&converter, batch)?;
        Ok(order_of(&rows))
    }

    fn rows(&self, converter: &RowConverter, batch: &RecordBatch) -> Result<Rows> {
        let columns = Columns::new(batch);
        let packed = (!self.packed.is_empty())
            .then(|| self.pack(&columns, batch.num_rows()))
            .transpose()?;
        let arrays: Vec<ArrayRef> = packed
            .into_iter()
            .map(Ok)
            .chain(self.columns[self.packed.len()..].iter().map(|c| {
                let column = columns.get(&c.name);
                match (&c.ranks, column) {
                    (None, Some(a)) => Ok(a.clone()),
                    (None, None) => Ok(new_null_array(&c.data_type, batch.num_rows())),
                    (Some(_), None) => Ok(new_null_array(&DataType::UInt32, batch.num_rows())),
                    (Some(ranks), Some(a)) => rank_array(a.as_ref(), ranks),
                }
            }))
            .collect::<Result<_>>()?;
        Ok(converter.convert_columns(&arrays)?)
    }

    /// The packed leading columns of `rows` rows, one word a row.
    fn pack(&self, columns: &Columns<'_>, rows: usize) -> Result<ArrayRef> {
        let mut words = vec![0u64; rows];
        for (c, &packing) in self.columns.iter().zip(&self.packed) {
            let null = packing.code(None, c.options);
            // Absent, or a dictionary of no values (every row null).
            let Some(dict) = columns
                .get(&c.name)
                .map(|a| a.as_any_dictionary())
                .filter(|d| !d.values().is_empty())
            else {
                words.iter_mut().for_each(|w| *w |= null);
                continue;
            };
            let ranks = c.ranks.as_deref().map_or(&[][..], Vec::as_slice);
            let codes = dictionary_values_with_nulls(dict.values().as_ref())
                .into_iter()
                .map(|v| match v {
                    None => Ok(null),
                    Some(v) => Ok(packing.code(Some(rank_of(ranks, v)?), c.options)),
                })
                .collect::<Result<Vec<u64>>>()?;
            let keys = dict.normalized_keys();
            match dict.keys().logical_nulls() {
                None => {
                    for (w, &k) in words.iter_mut().zip(&keys) {
                        *w |= codes[k];
                    }
                }
                Some(nulls) => {
                    for (i, (w, &k)) in words.iter_mut().zip(&keys).enumerate() {
                        *w |= if nulls.is_valid(i) { codes[k] } else { null };
                    }
                }
            }
        }
        Ok(Arc::new(arrow::array::UInt64Array::from(words)))
    }
}

/// The order of `rows` (stable), or `None` when they are in order already: a writer that
/// sorted its rows (as the profile store does) spares compaction and persistence the sort.
fn order_of(rows: &Rows) -> Option<Vec<u32>> {
    let sorted = (1..rows.num_rows()).all(|i| rows.row(i - 1) <= rows.row(i));
    (!sorted).then(|| {
        let mut order: Vec<u32> = (0..rows.num_rows() as u32).collect();
        order.sort_by(|&a, &b| rows.row(a as usize).cmp(&rows.row(b as usize)));
        order
    })
}

/// Rows `offset..offset + whole.len()` of `array` in buffers of their own (a dictionary
/// holding only the values they use), as a merge's output holds them; `whole` is every
/// row of the range, `(0, i)`, what a dictionary is gathered by.
fn copy_range(array: &dyn Array, offset: usize, whole: &[(usize, usize)]) -> Result<ArrayRef> {
    let len = whole.len();
    let slice = array.slice(offset, len);
    if let Some(gathered) = crate::dictionary::gather(&[slice.as_ref()], whole)? {
        return Ok(gathered);
    }
    let data = slice.to_data();
    let mut copy = arrow::array::MutableArrayData::new(vec![&data], false, len);
    copy.try_extend(0, 0, len)?;
    Ok(arrow::array::make_array(copy.freeze()))
}

/// The byte values of a (string or binary) dictionary values array; nulls are skipped.
fn dictionary_values(values: &dyn Array) -> Vec<Vec<u8>> {
    match values.data_type() {
        DataType::Utf8 => values
            .as_string::<i32>()
            .iter()
            .flatten()
            .map(|v| v.as_bytes().to_vec())
            .collect(),
        DataType::Binary => values
            .as_binary::<i32>()
            .iter()
            .flatten()
            .map(<[u8]>::to_vec)
            .collect(),
        _ => Vec::new(),
    }
}

/// A dictionary column as the ranks of its values among `ranks`.
fn rank_array(array: &dyn Array, ranks: &[Vec<u8>]) -> Result<ArrayRef> {
    let dict = array.as_any_dictionary();
    let values = dict.values();
    let mut value_ranks: Vec<Option<u32>> = Vec::with_capacity(values.len());
    let bytes = dictionary_values_with_nulls(values.as_ref());
    for v in bytes {
        value_ranks.push(match v {
            None => None,
            Some(v) => Some(rank_of(ranks, v)? as u32),
        });
    }
    let value_ranks = UInt32Array::from(value_ranks);
    Ok(take(&value_ranks, dict.keys(), None)?)
}

/// The rank of `value` among `ranks`.
fn rank_of(ranks: &[Vec<u8>], value: &[u8]) -> Result<usize> {
    ranks
        .binary_search_by(|r| r.as_slice().cmp(value))
        .map_err(|_| {
            crate::error::Error::Internal(
                "a merged dictionary value is missing from the key's rank table".into(),
            )
        })
}

fn dictionary_values_with_nulls(values: &dyn Array) -> Vec<Option<&[u8]>> {
    match values.data_type() {
        DataType::Utf8 => values
            .as_string::<i32>()
            .iter()
            .map(|v| v.map(str::as_bytes))
            .collect(),
        DataType::Binary => values.as_binary::<i32>().iter().collect(),
        _ => vec![None; values.len()],
    }
}

/// `batch`'s columns rearranged onto `schema`: columns matched by name, absent ones null.
pub(crate) fn align_columns(batch: &RecordBatch, schema: &SchemaRef) -> Vec<ArrayRef> {
    let columns = Columns::new(batch);
    schema
        .fields()
        .iter()
        .map(|f| match columns.get(f.name()) {
            Some(a) => a.clone(),
            None => new_null_array(f.data_type(), batch.num_rows()),
        })
        .collect()
}

/// `batch` rearranged onto `schema`.
pub(crate) fn align_batch(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        align_columns(batch, schema),
        &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
    )?)
}

struct Cursor {
    input: Input,
    rows: Rows,
    /// Row order of an unsorted batch; `None` when the batch is sorted.
    order: Option<Vec<u32>>,
    pos: usize,
    slot: usize,
}

impl Cursor {
    /// Index in the current batch of the cursor's current row.
    fn row(&self) -> usize {
        match &self.order {
            Some(order) => order[self.pos] as usize,
            None => self.pos,
        }
    }
}

/// A loaded batch: its key rows, its row order if it had to be sorted, its slot.
type Loaded = (Rows, Option<Vec<u32>>, usize);

/// A k-way merge of sorted streams into sorted batches of at most `batch_rows` rows, aligned
/// onto `output` (which must hold every column of the inputs that the caller wants to keep).
///
/// Memory: the current batch of each input plus one output batch.
pub(crate) struct Merge {
    key: SortKey,
    converter: RowConverter,
    output: SchemaRef,
    batch_rows: usize,
    remaining: usize,
    pending: Vec<Input>,
    cursors: Vec<Cursor>,
    heap: Vec<usize>,
    slots: Vec<Vec<ArrayRef>>,
}

impl std::fmt::Debug for Merge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merge")
            .field("inputs", &(self.pending.len() + self.cursors.len()))
            .field("batch_rows", &self.batch_rows)
            .finish()
    }
}

impl Merge {
    pub(crate) fn new(
        key: SortKey,
        inputs: Vec<Input>,
        output: SchemaRef,
        batch_rows: usize,
        limit: Option<usize>,
    ) -> Result<Self> {
        let converter = key.converter()?;
        Ok(Self {
            key,
            converter,
            output,
            batch_rows: batch_rows.max(1),
            remaining: limit.unwrap_or(usize::MAX),
            pending: inputs,
            cursors: Vec::new(),
            heap: Vec::new(),
            slots: Vec::new(),
        })
    }

    /// Loads the next non-empty batch of `input` into a new slot.
    fn load(&mut self, input: &mut Input) -> Result<Option<Loaded>> {
        for batch in input.stream.by_ref() {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let rows = self.key.rows(&self.converter, &batch)?;
            let order = if input.sorted { None } else { order_of(&rows) };
            self.slots.push(align_columns(&batch, &self.output));
            return Ok(Some((rows, order, self.slots.len() - 1)));
        }
        Ok(None)
    }

    fn start(&mut self) -> Result<()> {
        for mut input in std::mem::take(&mut self.pending) {
            if let Some((rows, order, slot)) = self.load(&mut input)? {
                self.cursors.push(Cursor {
                    input,
                    rows,
                    order,
                    pos: 0,
                    slot,
                });
            }
        }
        self.heap = (0..self.cursors.len()).collect();
        for i in (0..self.heap.len() / 2).rev() {
            self.sift_down(i);
        }
        Ok(())
    }

    /// Whether cursor `a` at position `pos_a` sorts before cursor `b`'s current row (ties go
    /// to the lower cursor index, which keeps the merge stable).
    fn before(&self, a: usize, pos_a: usize, b: usize) -> bool {
        let (ca, cb) = (&self.cursors[a], &self.cursors[b]);
        let row_a = ca.order.as_ref().map_or(pos_a, |o| o[pos_a] as usize);
        match ca.rows.row(row_a).cmp(&cb.rows.row(cb.row())) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => a < b,
        }
    }

    fn less(&self, a: usize, b: usize) -> bool {
        self.before(a, self.cursors[a].pos, b)
    }

    /// One past the last position of the heap's top cursor that still sorts before every
    /// other cursor, capped at `max` rows.
    fn run_end(&self, top: usize, max: usize) -> usize {
        let cursor = &self.cursors[top];
        let len = cursor.rows.num_rows().min(cursor.pos + max);
        let second = match (self.heap.get(1), self.heap.get(2)) {
            (Some(&l), Some(&r)) => Some(if self.less(l, r) { l } else { r }),
            (Some(&l), None) => Some(l),
            _ => None,
        };
        let Some(second) = second else {
            return len;
        };
        // The current row sorts first (it is the heap's top); gallop for the first that does
        // not, then binary search the last step.
        let (mut lo, mut step) = (cursor.pos + 1, 1);
        while lo < len && self.before(top, lo, second) {
            lo += step;
            step *= 2;
        }
        let mut hi = lo.min(len);
        let mut lo = lo.saturating_sub(step / 2).max(cursor.pos + 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.before(top, mid, second) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn sift_down(&mut self, mut i: usize) {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut smallest = i;
            if l < self.heap.len() && self.less(self.heap[l], self.heap[smallest]) {
                smallest = l;
            }
            if r < self.heap.len() && self.less(self.heap[r], self.heap[smallest]) {
                smallest = r;
            }
            if smallest == i {
                return;
            }
            self.heap.swap(i, smallest);
            i = smallest;
        }
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        if !self.pending.is_empty() {
            self.start()?;
        }
        let target = self.batch_rows.min(self.remaining);
        let mut indices: Vec<(usize, usize)> = Vec::with_capacity(target);
        let mut direct: Option<Vec<ArrayRef>> = None;
        while indices.len() < target {
            let Some(&top) = self.heap.first() else { break };
            // Emit the run of `top`'s rows that sort before every other cursor's current row:
            // found by galloping, so inputs that do not interleave cost a few comparisons per
            // run instead of a heap sift per row.
            let end = self.run_end(top, target - indices.len());
            let cursor = &mut self.cursors[top];
            // A whole output batch of one sorted input's consecutive rows (a lone sorted
            // part flushed, the tail of a merge) is copied as a range, not row by row.
            if indices.is_empty() && cursor.order.is_none() && end - cursor.pos == target {
                let whole: Vec<(usize, usize)> = (0..target).map(|i| (0, i)).collect();
                direct = Some(
                    self.slots[cursor.slot]
                        .iter()
                        .map(|a| copy_range(a.as_ref(), cursor.pos, &whole))
                        .collect::<Result<Vec<_>>>()?,
                );
            } else {
                indices.extend((cursor.pos..end).map(|p| {
                    let row = cursor.order.as_ref().map_or(p, |o| o[p] as usize);
                    (cursor.slot, row)
                }));
            }
            cursor.pos = end;
            if cursor.pos == cursor.rows.num_rows() {
                let mut input = std::mem::replace(
                    &mut self.cursors[top].input,
                    Input::sorted(Box::new(std::iter::empty())),
                );
                match self.load(&mut input)? {
                    Some((rows, order, slot)) => {
                        let cursor = &mut self.cursors[top];
                        cursor.input = input;
                        cursor.rows = rows;
                        cursor.order = order;
                        cursor.pos = 0;
                        cursor.slot = slot;
                    }
                    None => {
                        let last = self.heap.len() - 1;
                        self.heap.swap(0, last);
                        self.heap.pop();
                    }
                }
            }
            self.sift_down(0);
            if direct.is_some() {
                break;
            }
        }
        if let Some(columns) = direct {
            self.remaining -= target;
            let batch = RecordBatch::try_new_with_options(
                self.output.clone(),
                columns,
                &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(target)),
            )?;
            self.release_slots();
            return Ok(Some(batch));
        }
        if indices.is_empty() {
            return Ok(None);
        }
        self.remaining -= indices.len();
        let columns = (0..self.output.fields().len())
            .map(|j| {
                let arrays: Vec<&dyn Array> = self.slots.iter().map(|s| s[j].as_ref()).collect();
                match crate::dictionary::gather(&arrays, &indices)? {
                    Some(gathered) => Ok(gathered),
                    None => Ok(interleave(&arrays, &indices)?),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new_with_options(
            self.output.clone(),
            columns,
            &arrow::record_batch::RecordBatchOptions::new().with_row_count(Some(indices.len())),
        )?;
        self.release_slots();
        Ok(Some(batch))
    }

    /// Keeps only the slots live cursors still read from.
    fn release_slots(&mut self) {
        let old = std::mem::take(&mut self.slots);
        let mut old: Vec<Option<Vec<ArrayRef>>> = old.into_iter().map(Some).collect();
        for &i in &self.heap {
            let cursor = &mut self.cursors[i];
            if let Some(arrays) = old[cursor.slot].take() {
                self.slots.push(arrays);
            }
            cursor.slot = self.slots.len() - 1;
        }
    }
}

impl Iterator for Merge {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.next_batch().transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{AsArray, Int64Array};
    use arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;
    use crate::schema::{ColumnDef, SortingColumn};

    fn table_schema() -> TableSchema {
        let def = crate::schema::Schema::builder("t")
            .column(ColumnDef::new("k", DataType::Int64))
            .sort_by(SortingColumn::asc("k"))
            .build()
            .unwrap();
        TableSchema::new(Arc::new(def))
    }

    fn batch(values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap()
    }

    /// A dictionary column's Arrow type.
    fn dictionary_type() -> DataType {
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
    }

    /// A table of the dictionary columns `names` and an Int64 `k`, sorted by `key` and
    /// then `k`.
    fn dictionary_schema<const N: usize>(names: &[&str], key: [SortingColumn; N]) -> TableSchema {
        let mut builder = crate::schema::Schema::builder("t");
        for name in names {
            builder = builder.column(
                ColumnDef::new(*name, DataType::Utf8)
                    .encoding(crate::schema::Encoding::RleDictionary),
            );
        }
        builder = builder.column(ColumnDef::new("k", DataType::Int64));
        for column in key {
            builder = builder.sort_by(column);
        }
        let def = builder.sort_by(SortingColumn::asc("k")).build().unwrap();
        TableSchema::new(Arc::new(def))
    }

    fn stream(batches: Vec<RecordBatch>) -> Input {
        Input::sorted(Box::new(batches.into_iter().map(Ok)))
    }

    #[test]
    fn merges_sorted_streams_with_limits() {
        let schema = table_schema();
        let key = SortKey::new(&schema);
        let inputs = vec![
            stream(vec![batch(&[1, 4]), batch(&[]), batch(&[7, 9])]),
            stream(vec![batch(&[2, 3, 8])]),
            stream(vec![]),
            stream(vec![batch(&[0]), batch(&[5, 6, 10])]),
        ];
        let merge =
            Merge::new(key.clone(), inputs, schema.arrow_schema().clone(), 3, None).unwrap();
        let out: Vec<RecordBatch> = merge.collect::<Result<_>>().unwrap();
        assert!(out.iter().all(|b| b.num_rows() <= 3));
        let values: Vec<i64> = out
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(values, (0..=10).collect::<Vec<_>>());

        let limited = Merge::new(
            key,
            vec![stream(vec![batch(&[1, 3])]), stream(vec![batch(&[2])])],
            schema.arrow_schema().clone(),
            10,
            Some(2),
        )
        .unwrap();
        let rows: usize = limited.map(|b| b.unwrap().num_rows()).sum();
        assert_eq!(rows, 2);
    }

    #[test]
    fn sorts_unsorted_inputs_while_merging() {
        let schema = table_schema();
        let inputs = vec![
            Input::unsorted_batch(Ok(Some(batch(&[3, 1, 2])))),
            stream(vec![batch(&[0, 5])]),
            Input::unsorted_batch(Ok(Some(batch(&[9, 4])))),
        ];
        let merge = Merge::new(
            SortKey::new(&schema),
            inputs,
            schema.arrow_schema().clone(),
            100,
            None,
        )
        .unwrap();
        let values: Vec<i64> = merge
            .flat_map(|b| {
                b.unwrap()
                    .column(0)
                    .as_primitive::<Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(values, [0, 1, 2, 3, 4, 5, 9]);
    }

    /// A ranked key packs its leading dictionary columns into one word: rows sort as
    /// their values do column by column (nulls first or last, ascending or descending as
    /// each column says), for any values, nulls and absent columns.
    #[test]
    fn a_packed_key_orders_rows_as_their_columns_do() {
        use arrow::array::DictionaryArray;
        use arrow::datatypes::Int32Type;
        use proptest::prelude::*;
        use proptest::test_runner::TestRunner;
        let dict = dictionary_type;
        let schema = dictionary_schema(
            &["a", "b", "c"],
            [
                SortingColumn::asc("a"),
                SortingColumn::desc("b").nulls_first(false),
                SortingColumn::asc("c").nulls_first(false),
            ],
        );
        type Row = (Option<u8>, Option<u8>, Option<u8>, i64);
        let value = || proptest::option::of(0u8..6);
        let rows = proptest::collection::vec((value(), value(), value(), 0i64..4), 1..60);
        let mut runner = TestRunner::default();
        runner
            .run(&(rows, any::<bool>()), |(rows, with_c)| {
                let text = |v: Option<u8>| v.map(|v| format!("v{v}"));
                let column = |f: &dyn Fn(&Row) -> Option<u8>| -> ArrayRef {
                    let texts: Vec<Option<String>> = rows.iter().map(|r| text(f(r))).collect();
                    let a: DictionaryArray<Int32Type> =
                        texts.iter().map(|t| t.as_deref()).collect();
                    Arc::new(a)
                };
                let mut fields = vec![Field::new("a", dict(), true), Field::new("b", dict(), true)];
                let mut columns = vec![column(&|r| r.0), column(&|r| r.1)];
                if with_c {
                    fields.push(Field::new("c", dict(), true));
                    columns.push(column(&|r| r.2));
                }
                fields.push(Field::new("k", DataType::Int64, false));
                columns.push(Arc::new(Int64Array::from(
                    rows.iter().map(|r| r.3).collect::<Vec<_>>(),
                )));
                let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
                let key = SortKey::new(&schema).with_ranks(std::iter::once(&batch));
                let order = key
                    .order(&batch)
                    .unwrap()
                    .unwrap_or_else(|| (0..rows.len() as u32).collect());
                // The model: a ascending nulls first; b descending nulls last; c ascending
                // nulls last (all null when absent); k ascending; ties in row order.
                let rank = |v: Option<u8>, nulls_first: bool| match v {
                    None if nulls_first => -1,
                    None => 1000,
                    Some(v) => i32::from(v),
                };
                let c = |r: &Row| if with_c { r.2 } else { None };
                let mut expected: Vec<u32> = (0..rows.len() as u32).collect();
                expected.sort_by_key(|&i| {
                    let r = &rows[i as usize];
                    (
                        rank(r.0, true),
                        std::cmp::Reverse(match r.1 {
                            None => -1,
                            Some(v) => i32::from(v),
                        }),
                        rank(c(r), false),
                        r.3,
                    )
                });
                prop_assert_eq!(order, expected);
                Ok(())
            })
            .unwrap();
    }

    /// A dictionary column no batch holds a value of is left out of a ranked key (it was
    /// 5 bytes of every row's key, for each label column the table ever had), and the
    /// rows still merge in the key's order.
    #[test]
    fn a_ranked_key_leaves_out_dictionary_columns_no_batch_holds() {
        use arrow::array::{DictionaryArray, StringArray};
        use arrow::datatypes::Int32Type;
        let dict = dictionary_type;
        let schema = dictionary_schema(
            &["a", "b"],
            [SortingColumn::asc("a"), SortingColumn::asc("b")],
        );
        // `a` with values, `b` all null (in the second batch, a dictionary of no values),
        // `k`.
        let make = |a: &[&str], k: &[i64], with_b: bool| {
            let a: DictionaryArray<Int32Type> = a.iter().copied().collect();
            let mut fields = vec![Field::new("a", dict(), true)];
            let mut columns: Vec<ArrayRef> = vec![Arc::new(a)];
            if with_b {
                let b = DictionaryArray::<Int32Type>::try_new(
                    vec![None::<i32>; k.len()].into(),
                    Arc::new(StringArray::from(Vec::<&str>::new())),
                )
                .unwrap();
                fields.push(Field::new("b", dict(), true));
                columns.push(Arc::new(b));
            }
            fields.push(Field::new("k", DataType::Int64, false));
            columns.push(Arc::new(Int64Array::from(k.to_vec())));
            RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
        };
        let batches = [
            make(&["y", "x", "y"], &[2, 9, 1], false),
            make(&["x", "z"], &[3, 0], true),
        ];
        let key = SortKey::new(&schema).with_ranks(batches.iter());
        assert_eq!(key.names().collect::<Vec<_>>(), ["a", "k"]);
        let inputs = batches
            .iter()
            .map(|b| Input::unsorted_batch(Ok(Some(b.clone()))))
            .collect();
        let output = Arc::new(Schema::new(vec![
            Field::new("a", dict(), true),
            Field::new("k", DataType::Int64, false),
        ]));
        let merged: Vec<(String, i64)> = Merge::new(key, inputs, output, 100, None)
            .unwrap()
            .flat_map(|b| {
                let b = b.unwrap();
                let a = arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
                let (a, k) = (
                    a.as_string::<i32>().clone(),
                    b.column(1).as_primitive::<Int64Type>().clone(),
                );
                (0..b.num_rows())
                    .map(move |i| (a.value(i).to_owned(), k.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let expected: Vec<(String, i64)> = [("x", 3), ("x", 9), ("y", 1), ("y", 2), ("z", 0)]
            .iter()
            .map(|(a, k)| ((*a).to_owned(), *k))
            .collect();
        assert_eq!(merged, expected);
    }
}
