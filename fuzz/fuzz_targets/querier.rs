//! AFL++ target: Grafana Pyroscope query API and settings requests (first byte: the method), decoded as the Connect server decodes them: pre-scan, then prost and proto3 JSON.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        frostdb_pprof::fuzzing::querier_target(data);
    });
}
