//! The other formats profiles arrive in, converted to pprof: [`folded`] stacks (and
//! "lines") and OpenTelemetry profiles ([`otlp`]). A conversion that fails says where with
//! [`Error::Convert`](crate::Error::Convert) (the line or the field path) or, over a limit,
//! [`Error::TooLarge`](crate::Error::TooLarge).

pub mod folded;
pub mod otlp;
