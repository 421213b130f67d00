//! Sorting by a table's sort key, and the k-way merge of sorted batch streams that both
//! compaction and sorted scans use.

use std::cmp::Ordering;

use arrow::array::{Array, ArrayRef, RecordBatch, new_null_array};
use arrow::compute::interleave;
use arrow::datatypes::{DataType, SchemaRef};
use arrow::row::{RowConverter, Rows, SortField};

use crate::error::Result;
use crate::schema::TableSchema;

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

/// The expanded sort key of a table schema: concrete column names with their sort options.
/// Batches lacking a key column sort as if it were all null.
#[derive(Debug, Clone)]
pub(crate) struct SortKey {
    columns: Vec<(String, DataType, SortField)>,
}

impl SortKey {
    pub(crate) fn new(schema: &TableSchema) -> Self {
        let arrow = schema.arrow_schema();
        let columns = schema
            .sort_key()
            .into_iter()
            .map(|(i, options)| {
                let field = arrow.field(i);
                (
                    field.name().clone(),
                    field.data_type().clone(),
                    SortField::new_with_options(field.data_type().clone(), options),
                )
            })
            .collect();
        Self { columns }
    }

    /// Names of the key's columns.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|(n, _, _)| n.as_str())
    }

    fn converter(&self) -> Result<RowConverter> {
        Ok(RowConverter::new(
            self.columns.iter().map(|(_, _, f)| f.clone()).collect(),
        )?)
    }

    fn rows(&self, converter: &RowConverter, batch: &RecordBatch) -> Result<Rows> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|(name, data_type, _)| match batch.column_by_name(name) {
                Some(a) => a.clone(),
                None => new_null_array(data_type, batch.num_rows()),
            })
            .collect();
        Ok(converter.convert_columns(&arrays)?)
    }
}

/// `batch`'s columns rearranged onto `schema`: columns matched by name, absent ones null.
pub(crate) fn align_columns(batch: &RecordBatch, schema: &SchemaRef) -> Vec<ArrayRef> {
    schema
        .fields()
        .iter()
        .map(|f| match batch.column_by_name(f.name()) {
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
            let order = (!input.sorted).then(|| {
                let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
                order.sort_by(|&a, &b| rows.row(a as usize).cmp(&rows.row(b as usize)));
                order
            });
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

    fn less(&self, a: usize, b: usize) -> bool {
        let (ca, cb) = (&self.cursors[a], &self.cursors[b]);
        match ca.rows.row(ca.row()).cmp(&cb.rows.row(cb.row())) {
            Ordering::Less => true,
            Ordering::Greater => false,
            Ordering::Equal => a < b,
        }
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
        while indices.len() < target {
            let Some(&top) = self.heap.first() else { break };
            let cursor = &mut self.cursors[top];
            indices.push((cursor.slot, cursor.row()));
            cursor.pos += 1;
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
}
