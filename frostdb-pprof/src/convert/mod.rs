//! The other formats profiles arrive in, converted to pprof: [`folded`] stacks (and
//! "lines"), OpenTelemetry profiles ([`otlp`]) and Grafana Pyroscope's push requests
//! ([`push`], pprof samples under series labels). A conversion that fails says where with
//! [`Error::Convert`](crate::Error::Convert) (the line or the field path) or, over a limit,
//! [`Error::TooLarge`](crate::Error::TooLarge); a profile within a request that fails the
//! pprof checks is [`Error::At`](crate::Error::At), naming it and keeping the check's kind.

pub mod folded;
pub mod otlp;
pub mod push;
