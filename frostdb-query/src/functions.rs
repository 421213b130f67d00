//! Scalar functions whose output is not bounded by the size of their input: `repeat('x',
//! 1e9)` turns a few bytes of SQL into a gigabyte, outside the memory pool DataFusion's
//! operators reserve from. Each is replaced, in every session, by the same function behind
//! a check: the most its output can hold is computed from its arguments before it runs
//! (a count times a length, a pad width, a string's matches times the replacement) and
//! reserved from the session's pool for the call, so an answer over the query memory limit
//! is an error naming the function, never an allocation that takes the process down.
//!
//! `encode`, `upper`, `lower` and `initcap` are bounded by what they can multiply a value by
//! (hex doubles it; nested, each call doubles again).
//!
//! `concat` and `concat_ws` are bounded too: the size of their output is their arguments',
//! but a literal given once in the SQL is repeated on every row of a batch. So is the `||`
//! operator of two strings or of two binary values ([`OperatorPlanner`] plans it as the
//! bounded `string_concat` or `binary_concat`, which keep the operator's NULL): a chain of
//! CTEs each doubling a value would otherwise grow it exponentially in the size of the SQL.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::common::DFSchema;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::sqlparser::ast::BinaryOperator;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExprSchemable, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

use crate::regex_cost::{self, RegexFn};

/// How many bytes a call may produce at most, per row, from its arguments' values
/// ([`Arg`]): the functions bounded, by name.
type Bound = fn(&[Arg], usize) -> f64;

const BOUNDED: &[(&str, Bound)] = &[
    ("repeat", |a, r| len(a, 0, r) * num(a, 1, r).max(0.0)),
    // Pad widths count characters, of up to 4 bytes each.
    ("lpad", |a, r| 4.0 * num(a, 1, r).max(0.0) + len(a, 0, r)),
    ("rpad", |a, r| 4.0 * num(a, 1, r).max(0.0) + len(a, 0, r)),
    ("replace", |a, r| {
        let (s, from, to) = (len(a, 0, r), len(a, 1, r), len(a, 2, r));
        // An empty pattern matches between every two characters.
        let matches = if from == 0.0 { s + 1.0 } else { s / from };
        s + matches * to
    }),
    ("translate", |a, r| 4.0 * len(a, 0, r)),
    // Hex doubles a value, base64 takes 4 bytes for 3: nested, each call multiplies
    // (29 nested hex encodings of one byte made 512 MiB).
    ("encode", |a, r| 2.0 * len(a, 0, r) + 4.0),
    // A character's case mapping takes up to three times its bytes (`ΐ` upper-cased).
    ("upper", |a, r| 3.0 * len(a, 0, r)),
    ("lower", |a, r| 3.0 * len(a, 0, r)),
    ("initcap", |a, r| 3.0 * len(a, 0, r)),
    // A format's specifier of two bytes writes up to 32 (`%+`, `%c`: 24), and its
    // literal text as it is.
    ("to_char", |a, r| 16.0 * len(a, 1, r) + 64.0),
    ("overlay", |a, r| len(a, 0, r) + len(a, 1, r)),
    ("concat", |a, r| (0..a.len()).map(|i| len(a, i, r)).sum()),
    ("concat_ws", |a, r| {
        let separators = (a.len().saturating_sub(2)) as f64 * len(a, 0, r);
        separators + (1..a.len()).map(|i| len(a, i, r)).sum::<f64>()
    }),
    // Array functions, when DataFusion is built with them: elements of 16 bytes at least.
    ("array_repeat", |a, r| {
        num(a, 1, r).max(0.0) * (len(a, 0, r) + 16.0)
    }),
    ("array_resize", |a, r| {
        num(a, 1, r).max(0.0) * 16.0 + len(a, 0, r) * 16.0
    }),
    ("range", range_bound),
    ("generate_series", range_bound),
];

/// Functions whose work grows faster than their input and output, as steps per row: each
/// runs inside one call, where neither the deadline nor a cancel reaches it (the cancel
/// check is between batches), so a call's steps are bounded ([`MAX_CALL_STEPS`]). Their
/// outputs are bounded as [`BOUNDED`]'s are: a trim's by its string, a distance is 8 bytes.
const STEPPED: &[(&str, Bound, Bound)] = &[
    // Every character of one string against every one of the other.
    (
        "levenshtein",
        |_, _| 8.0,
        |a, r| len(a, 0, r) * len(a, 1, r),
    ),
    // A trimmed character is looked for among all the characters given (a linear scan).
    ("btrim", |a, r| len(a, 0, r), trim_steps),
    ("ltrim", |a, r| len(a, 0, r), trim_steps),
    ("rtrim", |a, r| len(a, 0, r), trim_steps),
    // A pattern searches its string: a step a byte, times what the pattern costs a byte
    // (`regex_cost`), multiplied in from its automaton by [`Bounded`].
    ("regexp_like", |_, _| 1.0, searched),
    ("regexp_count", |_, _| 8.0, searched),
    ("regexp_instr", |_, _| 8.0, searched),
    // Any pattern may match everywhere, even an empty string; a replacement's group
    // references (`$1`, `\1`) each stand for up to the whole string.
    (
        "regexp_replace",
        |a, r| {
            let s = len(a, 0, r);
            s + (s + 1.0) * (len(a, 2, r) + refs(a, 2) * s)
        },
        searched,
    ),
    // Its list holds the match of every capture group, each up to the whole string, and
    // groups nest (60 nested groups copy a match 60 times): a pattern of n bytes has at
    // most n groups. Offsets and the list's own, 16 bytes a row.
    (
        "regexp_match",
        |a, r| len(a, 0, r) * (len(a, 1, r) + 1.0) + 16.0,
        searched,
    ),
];

/// Bytes a pattern searches in a row (an empty string is a step too).
fn searched(a: &[Arg], r: usize) -> f64 {
    len(a, 0, r) + 1.0
}

fn trim_steps(a: &[Arg], r: usize) -> f64 {
    len(a, 0, r) * len(a, 1, r).max(1.0)
}

/// Most steps one call of a [`STEPPED`] function may take, all its rows together: about a
/// second's work. Levenshtein distances of 8,192 frame names of 300 bytes each take a
/// seventh of it; of two 1 MB strings, a thousand times as much.
pub(crate) const MAX_CALL_STEPS: f64 = (1u64 << 30) as f64;

/// Elements of `range(stop)`, `range(start, stop)` or `range(start, stop, step)`, 8 bytes
/// each.
fn range_bound(a: &[Arg], r: usize) -> f64 {
    let (start, stop, step) = match a.len() {
        1 => (0.0, num(a, 0, r), 1.0),
        2 => (num(a, 0, r), num(a, 1, r), 1.0),
        _ => (num(a, 0, r), num(a, 1, r), num(a, 2, r)),
    };
    let step = step.abs().max(1.0);
    ((stop - start).abs() / step + 1.0) * 8.0
}

/// An argument of one call: per row, its length (bytes of a string or binary, elements of
/// a list) and its value as a number (numbers; 0 otherwise), and for a string literal the
/// group references it holds.
#[derive(Debug)]
struct Arg {
    lengths: Per,
    numbers: Per,
    refs: f64,
}

/// A value for every row, or one for all (a scalar argument).
#[derive(Debug)]
enum Per {
    All(f64),
    Rows(Vec<f64>),
}

impl Per {
    fn at(&self, row: usize) -> f64 {
        match self {
            Per::All(v) => *v,
            Per::Rows(v) => v.get(row).copied().unwrap_or(0.0),
        }
    }
}

/// The length of argument `i` at row `row`.
fn len(a: &[Arg], i: usize, row: usize) -> f64 {
    a.get(i).map_or(0.0, |a| a.lengths.at(row))
}

/// The number argument `i` is at row `row`.
fn num(a: &[Arg], i: usize, row: usize) -> f64 {
    a.get(i).map_or(0.0, |a| a.numbers.at(row))
}

fn refs(a: &[Arg], i: usize) -> f64 {
    a.get(i).map_or(0.0, |a| a.refs)
}

impl Arg {
    fn of(value: &ColumnarValue) -> Result<Self> {
        Ok(match value {
            ColumnarValue::Scalar(s) => {
                let array = s.to_array_of_size(1)?;
                let text = scalar_text(s);
                Arg {
                    lengths: Per::All(lengths(&array)?.first().copied().unwrap_or(0.0)),
                    numbers: Per::All(numbers(&array)?.first().copied().unwrap_or(0.0)),
                    refs: text.map_or(0.0, |t| t.matches(['$', '\\']).count() as f64),
                }
            }
            ColumnarValue::Array(array) => {
                let lengths = lengths(array)?;
                // A replacement given per row may reference a group at every character.
                let refs = lengths.iter().copied().fold(0.0, f64::max);
                Arg {
                    lengths: Per::Rows(lengths),
                    numbers: Per::Rows(numbers(array)?),
                    refs,
                }
            }
        })
    }
}

fn scalar_text(s: &ScalarValue) -> Option<&str> {
    match s {
        ScalarValue::Utf8(Some(t))
        | ScalarValue::LargeUtf8(Some(t))
        | ScalarValue::Utf8View(Some(t)) => Some(t),
        _ => None,
    }
}

/// Per row: the byte length of a string or binary value, the element count of a list, 0
/// for anything else and for nulls.
fn lengths(array: &ArrayRef) -> Result<Vec<f64>> {
    let n = array.len();
    let out = match array.data_type() {
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::List(_)
        | DataType::LargeList(_) => {
            let lengths = arrow::compute::kernels::length::length(array)?;
            let lengths = arrow::compute::cast(&lengths, &DataType::Float64)?;
            let lengths = lengths.as_primitive::<Float64Type>();
            (0..n)
                .map(|i| {
                    if lengths.is_null(i) {
                        0.0
                    } else {
                        lengths.value(i)
                    }
                })
                .collect()
        }
        DataType::Dictionary(_, _) => {
            let values = arrow::compute::cast(array, &DataType::Utf8)?;
            return lengths(&values);
        }
        _ => vec![0.0; n],
    };
    Ok(out)
}

/// Per row: the value of a number (0 for anything else and for nulls).
fn numbers(array: &ArrayRef) -> Result<Vec<f64>> {
    let n = array.len();
    if !array.data_type().is_numeric() {
        return Ok(vec![0.0; n]);
    }
    let values = arrow::compute::cast(array, &DataType::Float64)?;
    let values = values.as_primitive::<Float64Type>();
    Ok((0..n)
        .map(|i| {
            if values.is_null(i) {
                0.0
            } else {
                values.value(i)
            }
        })
        .collect())
}

/// Most bytes a call of constants may produce (`repeat('-', 80)`, a padded label): the
/// literal it becomes is repeated on every row of a batch (8,192), outside the pool, 32 MiB
/// at this size (64 KiB made half a gigabyte a batch).
pub(crate) const MAX_CONSTANT_BYTES: usize = 4 << 10;

/// The most bytes `bound` says a call of `args` over `rows` rows produces.
fn call_bound(bound: Bound, args: &[ColumnarValue], rows: usize) -> Result<f64> {
    let args: Vec<Arg> = args.iter().map(Arg::of).collect::<Result<_>>()?;
    let per_row = args.iter().any(|a| matches!(a.lengths, Per::Rows(_)));
    if !per_row {
        // A call of constants is one value, which a projection then repeats on every row
        // of its batch (`SELECT repeat('x', 100000000) FROM t`): charged as many times.
        return Ok(bound(&args, 0) * rows.max(1) as f64);
    }
    let mut total = 0.0;
    for row in 0..rows {
        total += bound(&args, row);
    }
    Ok(total)
}

/// A function whose output is reserved from the session's memory pool before it runs, and
/// whose steps, for a [`STEPPED`] function, are counted against [`MAX_CALL_STEPS`] first.
#[derive(Debug)]
struct Bounded {
    inner: ScalarUDF,
    bound: Bound,
    steps: Option<Bound>,
    /// For a function of regular expressions, where its pattern is: its steps are then
    /// multiplied by what the pattern costs a byte.
    regex: Option<&'static RegexFn>,
    pool: Arc<dyn MemoryPool>,
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
    }
}

impl Eq for Bounded {}

impl Hash for Bounded {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(
        &self,
        args: ReturnFieldArgs<'_>,
    ) -> Result<arrow::datatypes::FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.inner.name();
        if let Some(steps) = self.steps {
            // A pattern's worst cost a byte, and the pattern's states to name if refused.
            let (per_byte, states) = match self.regex {
                Some(regex) => pattern_cost(regex, &args.args)?
                    .map_or((1.0, 0), |c| (c.per_byte(regex.captures), c.states)),
                None => (1.0, 0),
            };
            let steps = call_bound(steps, &args.args, args.number_rows)? * per_byte;
            if steps.is_nan() || steps > MAX_CALL_STEPS {
                let why = match self.regex {
                    Some(regex) if per_byte > 1.0 => format!(
                        " (its pattern's automaton has {states} states, each stepped at every \
                         byte, {})",
                        if regex.captures {
                            "finding its groups' spans"
                        } else {
                            "no DFA of it fitting its bound"
                        }
                    ),
                    _ => String::new(),
                };
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "{name}() of these arguments takes some {steps:.0} steps for {} rows{why}, \
                     over the {MAX_CALL_STEPS:.0} a call may take",
                    args.number_rows
                )));
            }
        }
        let bytes = call_bound(self.bound, &args.args, args.number_rows)?;
        // A call of constants is folded into one literal when the query is planned, and
        // the literal is then repeated on every row of every batch that projects it, out of
        // any pool: a constant is kept small enough for that.
        let constant = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        if constant && bytes / args.number_rows.max(1) as f64 > MAX_CONSTANT_BYTES as f64 {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{name}() of constants could produce {bytes:.0} bytes, which every row of a \
                 batch would repeat: over the query memory limit of a constant \
                 ({MAX_CONSTANT_BYTES} bytes)"
            )));
        }
        let too_large = || {
            DataFusionError::ResourcesExhausted(format!(
                "{name}() could produce {bytes:.0} bytes for {} rows, over the query memory limit ({})",
                args.number_rows,
                match self.pool.memory_limit() {
                    datafusion::execution::memory_pool::MemoryLimit::Finite(n) =>
                        format!("{n} bytes"),
                    _ => "none set".to_owned(),
                }
            ))
        };
        if !bytes.is_finite() || bytes > usize::MAX as f64 / 2.0 {
            return Err(too_large());
        }
        let reservation = MemoryConsumer::new(format!("{name}()")).register(&self.pool);
        reservation
            .try_grow(bytes as usize)
            .map_err(|_| too_large())?;
        Ok(match self.inner.invoke_with_args(args)? {
            ColumnarValue::Array(array) => ColumnarValue::Array(holding(array, reservation)),
            scalar => scalar,
        })
    }
}

/// What the costliest pattern (with its flags) of a call of `regex` costs
/// ([`regex_cost::Cost`]); `None` when none parses. A pattern differing by row is refused
/// at planning; here its distinct values are costed, at most [`MAX_CALL_PATTERNS`] of them.
fn pattern_cost(regex: &RegexFn, args: &[ColumnarValue]) -> Result<Option<regex_cost::Cost>> {
    let patterns = distinct_texts(args.get(regex.pattern))?;
    let flags = distinct_texts(args.get(regex.flags))?;
    if patterns.len().saturating_mul(flags.len().max(1)) > MAX_CALL_PATTERNS {
        return Err(DataFusionError::ResourcesExhausted(format!(
            "{}() was given {} distinct patterns in one call, over the {MAX_CALL_PATTERNS} \
             it compiles; give the pattern as a constant",
            regex.name,
            patterns.len()
        )));
    }
    let mut worst: Option<regex_cost::Cost> = None;
    for pattern in &patterns {
        for flag in flags
            .iter()
            .map(Some)
            .chain(flags.is_empty().then_some(None))
        {
            let text = regex_cost::with_flags(pattern, flag.map(String::as_str));
            let cost = regex_cost::cost(&text).map_err(DataFusionError::ResourcesExhausted)?;
            let per_byte =
                |c: &Option<regex_cost::Cost>| c.map_or(0.0, |c| c.per_byte(regex.captures));
            if per_byte(&cost) > per_byte(&worst) {
                worst = cost;
            }
        }
    }
    Ok(worst)
}

/// Most distinct patterns one call may be given (a pattern is costed, and compiled, once
/// each).
const MAX_CALL_PATTERNS: usize = 16;

/// The distinct non-null strings of `value` (none for a missing argument or a non-string).
fn distinct_texts(value: Option<&ColumnarValue>) -> Result<Vec<String>> {
    let array = match value {
        None => return Ok(Vec::new()),
        Some(ColumnarValue::Scalar(s)) => {
            return Ok(scalar_text(s).map(str::to_owned).into_iter().collect());
        }
        Some(ColumnarValue::Array(a)) => a,
    };
    if !matches!(
        array.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Dictionary(_, _)
    ) {
        return Ok(Vec::new());
    }
    let strings = arrow::compute::cast(array, &DataType::Utf8)?;
    let mut out: Vec<String> = Vec::new();
    for text in strings.as_string::<i32>().iter().flatten() {
        if !out.iter().any(|o| o == text) {
            out.push(text.to_owned());
            if out.len() > MAX_CALL_PATTERNS {
                break;
            }
        }
    }
    Ok(out)
}

/// `array`, holding `reservation` (resized to what the array takes) for as long as its
/// largest buffer lives: an output stays counted in the pool while the operators after the
/// call hold it (an aggregate gathering thousands of them), not only while it is made.
fn holding(array: ArrayRef, reservation: MemoryReservation) -> ArrayRef {
    /// A buffer's bytes, and the reservation they are counted in (released when dropped).
    struct Held {
        bytes: arrow::buffer::Buffer,
        _reservation: MemoryReservation,
    }
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            self.bytes.as_slice()
        }
    }
    reservation.resize(array.get_array_memory_size());
    let data = array.to_data();
    let Some(at) = (0..data.buffers().len()).max_by_key(|&i| data.buffers()[i].len()) else {
        return array;
    };
    let mut buffers = data.buffers().to_vec();
    let held = Held {
        bytes: buffers[at].clone(),
        _reservation: reservation,
    };
    buffers[at] = arrow::buffer::Buffer::from(bytes::Bytes::from_owner(held));
    match data.into_builder().buffers(buffers).build() {
        Ok(data) => arrow::array::make_array(data),
        Err(_) => array,
    }
}

/// `a || b` of two strings (`string_concat`) or of two binary values (`binary_concat`) as
/// a function: NULL when either is, else the two joined.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Concat {
    name: &'static str,
    /// Utf8 or Binary: what both arguments are cast to, and what it returns.
    of: DataType,
    signature: Signature,
}

impl Concat {
    fn new(name: &'static str, of: DataType) -> Self {
        Self {
            name,
            signature: Signature::exact(vec![of.clone(), of.clone()], Volatility::Immutable),
            of,
        }
    }
}

impl ScalarUDFImpl for Concat {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(self.of.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [left, right] = arrays.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "{} takes two arguments",
                self.name
            )));
        };
        use arrow::compute::kernels::concat_elements as kernels;
        let joined: ArrayRef = match self.of {
            DataType::Binary => Arc::new(kernels::concat_element_binary(
                left.as_binary::<i32>(),
                right.as_binary::<i32>(),
            )?),
            _ => Arc::new(kernels::concat_elements_utf8(
                left.as_string::<i32>(),
                right.as_string::<i32>(),
            )?),
        };
        if scalar {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(
                &joined, 0,
            )?));
        }
        Ok(ColumnarValue::Array(joined))
    }
}

/// Plans operators whose work a batch's size does not bound as bounded functions: `a || b`
/// of two strings as `string_concat`, of two binary values (or one and a string) as
/// `binary_concat` (other `||`, of arrays or of a string and a number, as DataFusion does:
/// the first grows only by what it is given, the second by a number's digits), and the
/// regular expression operators `~`, `~*`, `!~`, `!~*` as `regexp_like`, whose steps are
/// counted (the operator's kernel runs any pattern over any batch).
#[derive(Debug)]
struct OperatorPlanner {
    string_concat: Arc<ScalarUDF>,
    binary_concat: Arc<ScalarUDF>,
    regexp_like: Option<Arc<ScalarUDF>>,
}

impl ExprPlanner for OperatorPlanner {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        fn text(t: &DataType) -> bool {
            matches!(
                t,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
            )
        }
        fn binary(t: &DataType) -> bool {
            matches!(
                t,
                DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_)
            )
        }
        // The operator first (typing an operand walks its whole tree: done for every
        // operator of a long chain, `1 + 1 + ...`, planning is quadratic). For `~` and its
        // kin: whether it is negated, and whether case-insensitive.
        let regex = match expr.op {
            BinaryOperator::StringConcat => None,
            BinaryOperator::PGRegexMatch => Some((false, false)),
            BinaryOperator::PGRegexIMatch => Some((false, true)),
            BinaryOperator::PGRegexNotMatch => Some((true, false)),
            BinaryOperator::PGRegexNotIMatch => Some((true, true)),
            _ => return Ok(PlannerResult::Original(expr)),
        };
        let types = (expr.left.get_type(schema), expr.right.get_type(schema));
        let (Ok(left), Ok(right)) = &types else {
            return Ok(PlannerResult::Original(expr));
        };
        let Some((negated, insensitive)) = regex else {
            // Binary `||` doubles as a string's does (a chain of CTEs of `X'00'`: 512 MiB
            // in 28 of them, and a panic past i32 offsets in 30).
            let (concat, of) = if text(left) && text(right) {
                (&self.string_concat, DataType::Utf8)
            } else if (binary(left) || text(left)) && (binary(right) || text(right)) {
                (&self.binary_concat, DataType::Binary)
            } else {
                return Ok(PlannerResult::Original(expr));
            };
            let cast = |e: Expr| e.cast_to(&of, schema);
            return Ok(PlannerResult::Planned(
                concat.call(vec![cast(expr.left)?, cast(expr.right)?]),
            ));
        };
        // Dictionary-encoded labels are strings to `regexp_like` too.
        let string = |t: &DataType| match t {
            DataType::Dictionary(_, v) => text(v),
            t => text(t),
        };
        let Some(regexp_like) = self
            .regexp_like
            .as_ref()
            .filter(|_| string(left) && string(right))
        else {
            return Ok(PlannerResult::Original(expr));
        };
        let mut args = vec![expr.left, expr.right];
        if insensitive {
            args.push(Expr::Literal(ScalarValue::Utf8(Some("i".to_owned())), None));
        }
        let like = regexp_like.call(args);
        Ok(PlannerResult::Planned(if negated {
            Expr::Not(Box::new(like))
        } else {
            like
        }))
    }
}

/// Replaces the functions of [`BOUNDED`] that `ctx` has by bounded ones reserving from
/// `pool`, and plans `||` of strings and of binary values as the bounded `string_concat`
/// and `binary_concat`.
pub(crate) fn bound_functions(ctx: &SessionContext, pool: &Arc<dyn MemoryPool>) -> Result<()> {
    let concat = |name, of| {
        let udf = Arc::new(ScalarUDF::new_from_impl(Bounded {
            inner: ScalarUDF::new_from_impl(Concat::new(name, of)),
            bound: |a, r| len(a, 0, r) + len(a, 1, r),
            steps: None,
            regex: None,
            pool: pool.clone(),
        }));
        ctx.register_udf(udf.as_ref().clone());
        udf
    };
    let string_concat = concat("string_concat", DataType::Utf8);
    let binary_concat = concat("binary_concat", DataType::Binary);
    let functions = ctx.state().scalar_functions().clone();
    let bounded = BOUNDED.iter().map(|&(name, bound)| (name, bound, None));
    let stepped = STEPPED
        .iter()
        .map(|&(name, bound, steps)| (name, bound, Some(steps)));
    let mut regexp_like = None;
    for (name, bound, steps) in bounded.chain(stepped) {
        if let Some(udf) = functions.get(name) {
            let udf = Arc::new(ScalarUDF::new_from_impl(Bounded {
                inner: udf.as_ref().clone(),
                bound,
                steps,
                regex: regex_cost::regex_fn(name),
                pool: pool.clone(),
            }));
            ctx.register_udf(udf.as_ref().clone());
            if name == "regexp_like" {
                regexp_like = Some(udf);
            }
        }
    }
    ctx.state_ref()
        .write()
        .register_expr_planner(Arc::new(OperatorPlanner {
            string_concat,
            binary_concat,
            regexp_like,
        }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(limit: usize) -> SessionContext {
        let pool = crate::memory_pool(Some(limit));
        let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
            .with_memory_pool(pool.clone())
            .build_arc()
            .unwrap();
        let ctx = SessionContext::new_with_config_rt(Default::default(), runtime);
        bound_functions(&ctx, &pool).unwrap();
        ctx
    }

    async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<arrow::array::RecordBatch>> {
        ctx.sql(sql).await?.collect().await
    }

    /// A function's output stays counted in the pool while it is held, and is given back
    /// when dropped; so what an aggregate gathers of many calls' outputs is refused past the
    /// limit, where it was counted only while each call ran.
    #[tokio::test]
    async fn outputs_stay_counted_while_they_are_held() {
        let ctx = session(64 << 20);
        let pool = ctx.runtime_env().memory_pool.clone();
        let batches = run(
            &ctx,
            "SELECT repeat(CAST(v AS VARCHAR), 250) AS s FROM generate_series(1, 10000) t(v)",
        )
        .await
        .unwrap();
        assert!(pool.reserved() >= 5_000_000, "{} held", pool.reserved());
        drop(batches);
        assert_eq!(pool.reserved(), 0);
        // 3,000 outputs of 60 KB gathered into one string: 180 MB, over a 64 MiB pool.
        let e = run(
            &ctx,
            "SELECT length(string_agg(repeat('y', 60000 + v % 2), ',')) \
             FROM generate_series(1, 3000) t(v)",
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("Resources exhausted"), "{e}");
        assert_eq!(pool.reserved(), 0);
    }

    #[tokio::test]
    async fn amplifying_functions_over_the_pool_are_refused_before_they_allocate() {
        let ctx = session(64 << 20);
        for sql in [
            "SELECT repeat('x', 1000000000)",
            "SELECT lpad('x', 1000000000)",
            "SELECT rpad('x', 1000000000, 'ab')",
            "SELECT replace(repeat('x', 10000), '', repeat('y', 10000))",
            "SELECT regexp_replace(repeat('x', 10000), '', repeat('y', 10000), 'g')",
            // A literal repeated on every row of a batch.
            "SELECT concat(repeat('x', 10000), v) FROM generate_series(1, 10000) t(v)",
            // A call of constants, its one value repeated on every row (819 GB as LargeUtf8).
            "SELECT arrow_cast(repeat('x', 100000000), 'LargeUtf8') AS s \
             FROM generate_series(1, 8192)",
            "SELECT repeat('x', 262000) FROM generate_series(1, 8192)",
            // `||` doubling a string in every CTE of a chain: 2^30 times its 64 bytes.
            doubling_ctes(30).as_str(),
            // Of binary values, and of large ones (i64 offsets: no overflow stops them).
            doubling(30, "X'0000'").as_str(),
            doubling(34, "arrow_cast(X'00', 'LargeBinary')").as_str(),
            doubling(34, "arrow_cast('x', 'LargeUtf8')").as_str(),
            doubling(34, "X'00' || ''").as_str(),
            // Nested encodings: hex doubles at every level (2^34 bytes).
            &format!(
                "SELECT length({}arrow_cast('x', 'LargeUtf8'){})",
                "encode(".repeat(34),
                ", 'hex')".repeat(34)
            ),
            &format!(
                "SELECT length({}repeat('ab', 100000 + v % 2){}) FROM generate_series(1, 8) t(v)",
                "encode(".repeat(24),
                ", 'base64')".repeat(24)
            ),
            // A match copied by each of 60 nested capture groups: of constants (a literal
            // every row would repeat), and by row.
            &format!(
                "SELECT count(m) FROM (SELECT regexp_match(repeat('a', 4000), '{}') AS m \
                 FROM generate_series(1, 2000))",
                nested_groups(60)
            ),
            &format!(
                "SELECT count(m) FROM (SELECT regexp_match(repeat('a', 4000 + v % 2), '{}') \
                 AS m FROM generate_series(1, 2000) t(v))",
                nested_groups(60)
            ),
        ] {
            let e = run(&ctx, sql).await.unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("over the query memory limit"),
                "{sql}: {text}"
            );
        }
    }

    /// A pattern whose automaton is stepped at every byte (no DFA of it fits) is refused
    /// before it searches, whichever function or operator runs it: one call of
    /// `[ -~]{5000}` over 8,192 strings of 5 KB is 2 × 10¹¹ steps, an hour inside one call
    /// no deadline reaches. The same pattern over a few short strings runs.
    #[tokio::test]
    async fn patterns_are_refused_for_the_steps_their_automaton_takes() {
        let ctx = session(256 << 20);
        let rows =
            "FROM (SELECT repeat('a', 5000 + v % 2) AS s FROM generate_series(1, 8192) t(v))";
        let wide = "[ -~]{5000}";
        for call in [
            format!("regexp_like(s, '{wide}')"),
            format!("regexp_like(s, '{wide}', 'i')"),
            format!("regexp_count(s, '{wide}')"),
            format!("regexp_instr(s, '{wide}')"),
            format!("regexp_replace(s, '{wide}', 'x')"),
            format!("regexp_match(s, '{wide}')"),
            format!("s ~ '{wide}'"),
            format!("s ~* '{wide}'"),
            format!("s !~ '{wide}'"),
            format!("s !~* concat('{wide}', '')"),
        ] {
            let sql = format!("SELECT count({call}) {rows}");
            let e = run(&ctx, &sql).await.unwrap_err().to_string();
            assert!(
                e.contains("steps for 8192 rows") && e.contains("automaton has"),
                "{sql}: {e}"
            );
        }
        // The same pattern over 3 strings of 10 bytes.
        let few = run(
            &ctx,
            &format!(
                "SELECT count(*) FILTER (WHERE s ~ '{wide}') AS n \
                 FROM (SELECT repeat('a', 10) AS s FROM generate_series(1, 3))"
            ),
        )
        .await
        .unwrap();
        let n = few[0]
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(n.value(0), 0);
    }

    /// `~`, `~*`, `!~` and `!~*`, planned as `regexp_like`, answer as the operators do: the
    /// case folded only where asked, NULL for a NULL string. Counted against a check in
    /// Rust over the same strings.
    #[tokio::test]
    async fn regex_operators_answer_as_before() {
        let ctx = session(256 << 20);
        let batches = run(
            &ctx,
            "SELECT count(*) FILTER (WHERE s ~ '^1') AS a, \
                    count(*) FILTER (WHERE s ~ 'X$') AS b, \
                    count(*) FILTER (WHERE s ~* 'X$') AS c, \
                    count(*) FILTER (WHERE s !~ '^1') AS d, \
                    count(*) FILTER (WHERE s !~* '7x') AS e, \
                    count(s ~ 'x') AS f \
             FROM (SELECT CASE WHEN v % 10 = 0 THEN NULL \
                               ELSE CAST(v AS VARCHAR) || 'x' END AS s \
                   FROM generate_series(1, 20000) t(v))",
        )
        .await
        .unwrap();
        let strings: Vec<String> = (1..=20000)
            .filter(|v| v % 10 != 0)
            .map(|v| format!("{v}x"))
            .collect();
        let count = |f: &dyn Fn(&str) -> bool| strings.iter().filter(|s| f(s)).count() as i64;
        let want = [
            count(&|s| s.starts_with('1')),
            0,
            count(&|_| true),
            count(&|s| !s.starts_with('1')),
            count(&|s| !s.contains("7x")),
            strings.len() as i64,
        ];
        let got: Vec<i64> = (0..6)
            .map(|i| {
                batches[0]
                    .column(i)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .value(0)
            })
            .collect();
        assert_eq!(got, want);
    }

    /// A pattern of `n` capture groups, each inside the one before.
    fn nested_groups(n: usize) -> String {
        format!("{}.*{}", "(".repeat(n), ")".repeat(n))
    }

    /// `regexp_match` keeps its answers within the bound: a capture group of each row.
    #[tokio::test]
    async fn regexp_match_answers_within_its_bound() {
        let ctx = session(64 << 20);
        let batches = run(
            &ctx,
            "SELECT regexp_match(CAST(v AS VARCHAR) || '.x', '(\\d+)\\.(x)') AS m \
             FROM generate_series(1, 3) t(v)",
        )
        .await
        .unwrap();
        let rows: Vec<Vec<String>> = batches
            .iter()
            .flat_map(|b| {
                let lists = b.column(0).as_list::<i32>();
                (0..b.num_rows())
                    .map(|i| {
                        let groups = lists.value(i);
                        let groups = groups.as_string::<i32>();
                        groups.iter().map(|g| g.unwrap_or("").to_owned()).collect()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(rows, [["1", "x"], ["2", "x"], ["3", "x"]]);
    }

    /// SQL whose CTEs each join the previous one's string to itself, `n` times.
    fn doubling_ctes(n: usize) -> String {
        doubling(n, "repeat('x', 64)")
    }

    /// `n` CTEs, each the one before concatenated with itself, from `start`.
    fn doubling(n: usize, start: &str) -> String {
        let mut sql = format!("WITH c0 AS (SELECT {start} AS s)");
        for i in 1..=n {
            sql += &format!(", c{i} AS (SELECT s || s AS s FROM c{})", i - 1);
        }
        sql + &format!(" SELECT length(s) FROM c{n}")
    }

    #[tokio::test]
    async fn string_concatenation_keeps_its_answers() {
        let ctx = session(64 << 20);
        let batches = run(
            &ctx,
            "SELECT 'a' || 'b' AS ab, 'a' || NULL AS n, v || '-' || v AS vv,              'n' || 7 AS num, arrow_typeof('a' || 'b') AS t              FROM (VALUES ('x'), (NULL)) t(v)",
        )
        .await
        .unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("| n7 ")).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(
            rows[0].contains("| ab |") && rows[0].contains("| x-x |"),
            "{text}"
        );
        // NULL on either side is NULL, as the operator has it (concat() would skip it).
        assert!(rows[1].starts_with("| ab |   |     |"), "{text}");
        let doubled = run(&ctx, &doubling_ctes(6)).await.unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&doubled)
            .unwrap()
            .to_string();
        assert!(text.contains(&(4 << 10).to_string()), "{text}");
        drop((batches, doubled));
        // Binary values join as binary, NULL on either side NULL.
        let batches = run(
            &ctx,
            "SELECT v || X'ff' AS j, arrow_typeof(v || X'ff') AS t, v || NULL AS n \
             FROM (VALUES (X'0102'), (NULL)) t(v)",
        )
        .await
        .unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        assert!(text.contains("| 0102ff | Binary |   |"), "{text}");
        assert!(text.contains("|        | Binary |   |"), "{text}");
        // What the answers held is given back with them.
        drop(batches);
        assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
    }

    #[tokio::test]
    async fn bounded_functions_answer_as_before_within_the_pool() {
        let ctx = session(64 << 20);
        let batches = run(
            &ctx,
            "SELECT repeat('ab', 3) AS r, lpad('7', 3, '0') AS l, replace('a-b', '-', '+') AS p, \
             concat('a', 'b', 'c') AS c, regexp_replace('pod-12', '-[0-9]+$', '') AS x",
        )
        .await
        .unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        for expected in ["ababab", "007", "a+b", "abc", "pod"] {
            assert!(text.contains(expected), "{text}");
        }
        // The reservation is the call's only: nothing stays reserved afterwards.
        assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
    }

    /// A function whose work grows faster than its strings is refused past the steps a
    /// call may take, before it runs (two 40,000-byte strings are 1.6e9 steps: seconds of
    /// work no cancel reaches); the same over short strings answers.
    #[tokio::test]
    async fn superlinear_functions_are_refused_past_the_steps_of_a_call() {
        let ctx = session(1 << 30);
        for q in [
            "SELECT levenshtein(repeat('a', v), repeat('b', v)) FROM generate_series(40000, 40000) t(v)",
            "SELECT length(btrim(repeat('b', v), concat(repeat('a', v), 'b'))) FROM generate_series(40000, 40000) t(v)",
            "SELECT length(ltrim(repeat('b', v), concat(repeat('a', v), 'b'))) FROM generate_series(40000, 40000) t(v)",
            // Each row under the bound, the call's eight over it.
            "SELECT levenshtein(repeat('a', 15000 + v), repeat('b', 15000 + v)) FROM generate_series(1, 8) t(v)",
        ] {
            let e = run(&ctx, q).await.unwrap_err().to_string();
            assert!(e.contains("a call may take"), "{q}: {e}");
        }
        let rows = run(
            &ctx,
            "SELECT levenshtein(repeat('a', v), repeat('b', 300)) AS d, \
             length(btrim(repeat('b', v), 'ab')) AS t FROM generate_series(1, 200) t(v)",
        )
        .await
        .unwrap();
        let d = rows[0]
            .column(0)
            .as_primitive::<arrow::datatypes::Int32Type>();
        assert_eq!(d.value(0), 300);
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 200);
    }
}
