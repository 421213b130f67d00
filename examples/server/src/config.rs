//! The server's configuration: command-line flags over an optional TOML file.
//!
//! ```toml
//! listen = "127.0.0.1:7070"
//! data = "frostdb-data"
//! token = "secret"                 # optional: require `Authorization: Bearer secret`
//! retention = "30d"                # optional: samples older than this are deleted (with
//!                                  # the symbols only they used); absent: kept for ever
//! rollup_retention = "90d"         # optional: hourly and daily rollups (what long-range
//!                                  # merges read) kept this long; absent: as long as samples
//!
//! [tenants.team-a]
//! retention = "7d"                 # a tenant's own retention
//! token = "team-a-secret"          # optional: a bearer token that acts for team-a only
//!                                  # (X-Scope-OrgID absent or team-a; /metrics shows
//!                                  # team-a's series only). `token` above acts for any.
//!
//! [limits]
//! max_body_bytes = 16777216        # request body, as sent (compressed)
//! max_decompressed_bytes = 134217728   # a body or profile, decompressed
//! max_samples_per_profile = 4194304
//! max_locations_per_profile = 4194304
//! max_series_per_tenant = 10000    # counted across restarts
//! max_label_names_per_tenant = 1000   # distinct label names, counted across restarts
//! max_label_names_per_series = 30  # request and pprof labels (not span ids)
//! max_label_name_length = 1024     # bytes (the engine stores at most 255)
//! max_label_value_length = 2048    # bytes
//! request_timeout_secs = 60
//! max_query_memory_bytes = 1073741824   # per tenant, merges and SQL together
//! ingest_rate_per_tenant = "8MiB"  # optional: bytes a second a tenant may push (429 past)
//!
//! [[scrape]]
//! job = "goapp"
//! targets = ["127.0.0.1:6060"]
//! interval = "15s"
//! profiles = ["cpu", "heap", "allocs", "goroutine", "mutex", "block"]
//! labels = { env = "dev" }
//!
//! # Past one machine (optional): tenants' databases in a bucket shared by several nodes.
//! [storage]
//! url = "s3://profiles/fleet"      # bucket and prefix; tenants under <prefix>/tenants/<id>
//! endpoint = "http://127.0.0.1:9000"   # an S3-compatible server (absent: AWS)
//! allow_http = true                # loopback test servers only
//! # credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or access_key_id = ...)
//!
//! [cluster]
//! role = "writer"                  # or "reader": follows the bucket, answers queries only
//! node = "writer-1"                # this writer's name in tenants' leases (unique)
//! flush_interval = "10s"           # writers: new data reaches the bucket (readers) this often
//! lease_ttl = "15s"                # writers: a dead writer's tenants are taken over after this
//! refresh_interval = "2s"          # readers: how often they look for what writers flushed
//! worker_listen = "127.0.0.1:7101" # serve merges' blocks to coordinators (gRPC)
//! secret = "cluster-secret"        # sent to workers, required by them (default: token)
//! workers = ["http://10.0.0.2:7101", "http://10.0.0.3:7101"]  # spread merges over these
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Everything `frostdb serve` needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where to listen (loopback unless told otherwise).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The data directory: one database per tenant under `tenants/`.
    #[serde(default = "default_data")]
    pub data: PathBuf,
    /// When set, every request but the web page's assets needs `Authorization: Bearer <token>`.
    #[serde(default)]
    pub token: Option<String>,
    /// Request and tenant limits.
    #[serde(default)]
    pub limits: Limits,
    /// Targets to scrape.
    #[serde(default)]
    pub scrape: Vec<ScrapeConfig>,
    /// Whole-host eBPF sampling (`--ebpf`); off when absent.
    #[serde(default)]
    pub ebpf: Option<EbpfConfig>,
    /// How long every tenant's samples are kept (`None`: for ever).
    #[serde(default, with = "optional_duration")]
    pub retention: Option<Duration>,
    /// How long every tenant's hourly and daily rollups are kept (`None`: as long as its
    /// samples). Longer than `retention`, merges over older ranges still answer from them.
    #[serde(default, with = "optional_duration")]
    pub rollup_retention: Option<Duration>,
    /// Settings of single tenants, by tenant id.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantConfig>,
    /// A bucket shared with other nodes for the tenants' databases (`None`: the data
    /// directory, the default).
    #[serde(default)]
    pub storage: Option<frostdb_core::Bucket>,
    /// This node's part in a cluster sharing `storage`.
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Names for frames stored as addresses (`[symbolizer]`).
    #[serde(default)]
    pub symbolizer: SymbolizerConfig,
    /// Prometheus remote write of the recording rules' series (`None`: only `/metrics`).
    #[serde(default)]
    pub remote_write: Option<crate::remote_write::RemoteWriteConfig>,
    /// Regressions found across deploys (`[regressions]`).
    #[serde(default)]
    pub regressions: RegressionsConfig,
}

/// `[regressions]`: each service's newest version compared with the one before, once
/// enough profiles of both have arrived ([`crate::regressions`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegressionsConfig {
    /// Whether the server compares versions at all.
    pub enabled: bool,
    /// The label naming a profile's service.
    pub service_label: String,
    /// The labels naming its version, the first a service has used.
    pub version_labels: Vec<String>,
    /// How often the open tenants are looked at.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// How far back versions are looked for.
    #[serde(with = "duration")]
    pub lookback: Duration,
    /// The most of each version compared: the old one's last `window`, the new one's first.
    #[serde(with = "duration")]
    pub window: Duration,
    /// The rise of a function's share of the total that counts (0.01: a percentage point).
    pub min_increase: f64,
    /// The false discovery rate over a comparison's tests.
    pub significance: f64,
    /// Profiles each version needs before it is compared.
    pub min_profiles: usize,
    /// Regressions listed per comparison at most.
    pub max_listed: usize,
}

impl Default for RegressionsConfig {
    fn default() -> Self {
        let compare = frostdb_pprof::regress::CompareOptions::default();
        Self {
            enabled: true,
            service_label: "service_name".into(),
            version_labels: ["version", "service_version", "commit"]
                .map(String::from)
                .to_vec(),
            interval: Duration::from_secs(60),
            lookback: Duration::from_secs(24 * 3600),
            window: Duration::from_secs(3600),
            min_increase: compare.min_increase,
            significance: compare.significance,
            min_profiles: 20,
            max_listed: compare.max_listed,
        }
    }
}

impl RegressionsConfig {
    /// The comparison's options.
    pub fn compare_options(&self) -> frostdb_pprof::regress::CompareOptions {
        frostdb_pprof::regress::CompareOptions {
            min_increase: self.min_increase,
            significance: self.significance,
            min_profiles: self.min_profiles,
            max_listed: self.max_listed,
            ..Default::default()
        }
    }
}

/// How frames stored as addresses get names: `[symbolizer]` in the TOML. Debug files are
/// looked for among the tenant's uploads (Parca's `DebuginfoService`), then on the
/// debuginfod servers, and kept in a bounded cache under the data directory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SymbolizerConfig {
    /// Whether queries name unsymbolized frames at all.
    pub enabled: bool,
    /// debuginfod servers, asked in order (absent: `DEBUGINFOD_URLS`, space-separated).
    pub debuginfod_urls: Option<Vec<String>>,
    /// Most bytes of debug files cached on disk (least recently used go first).
    pub cache_bytes: u64,
    /// Longest a fetch of one debug file may take.
    #[serde(with = "duration")]
    pub fetch_timeout: Duration,
    /// Most time a query spends finding debug files; frames not reached stay addresses.
    #[serde(with = "duration")]
    pub query_budget: Duration,
    /// Most debug files read at once (queries and the background resolver together).
    pub workers: usize,
}

impl Default for SymbolizerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            debuginfod_urls: None,
            cache_bytes: 4 << 30,
            fetch_timeout: Duration::from_secs(30),
            query_budget: Duration::from_secs(2),
            workers: 2,
        }
    }
}

/// A node's role in a cluster: `[cluster]` in the TOML.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Writes its tenants (one writer per tenant at a time, by lease), and answers queries.
    #[default]
    Writer,
    /// Follows what writers flushed to the bucket and answers queries; refuses writes.
    Reader,
}

/// `[cluster]`: how this node shares the bucket with others.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Writer or reader.
    pub role: Role,
    /// This writer's name in its tenants' leases; unique among writers (default: the host
    /// name and the listen port).
    pub node: Option<String>,
    /// How often a writer persists every table's new data to the bucket.
    #[serde(with = "duration")]
    pub flush_interval: Duration,
    /// How long a writer's lease runs without renewal.
    #[serde(with = "duration")]
    pub lease_ttl: Duration,
    /// How often a reader looks for what writers persisted.
    #[serde(with = "duration")]
    pub refresh_interval: Duration,
    /// Where to serve as a worker of other nodes' merges (gRPC); not served when absent.
    pub worker_listen: Option<SocketAddr>,
    /// Workers (`http://host:port`) to spread this node's merges over; when empty, merges
    /// read every block here.
    pub workers: Vec<String>,
    /// The secret a node sends the workers it asks and a worker requires of the plans it
    /// takes (absent: the server's `token`). A worker listening beyond loopback needs one.
    pub secret: Option<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            role: Role::Writer,
            node: None,
            flush_interval: Duration::from_secs(10),
            lease_ttl: Duration::from_secs(15),
            refresh_interval: Duration::from_secs(2),
            worker_listen: None,
            workers: Vec::new(),
            secret: None,
        }
    }
}

impl ClusterConfig {
    /// The writer's name: `node`, or this host's name and `port`.
    pub fn node_name(&self, port: u16) -> String {
        self.node.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into());
            format!("{host}:{port}")
        })
    }
}

/// One tenant's settings: `[tenants.<id>]` in the TOML.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// A bearer token that acts for this tenant only: a request carrying it is this
    /// tenant's whatever it asks for (another tenant in `X-Scope-OrgID` is refused 403), and
    /// sees only this tenant's series in `/metrics` and problems in `/healthz`.
    #[serde(default)]
    pub token: Option<String>,
    /// How long this tenant's samples are kept, instead of the server's `retention`.
    #[serde(default, with = "optional_duration")]
    pub retention: Option<Duration>,
    /// Recording rules of this tenant (`[[tenants.<id>.recording_rules]]`), besides those
    /// set through `/api/v1/rules`.
    #[serde(default)]
    pub recording_rules: Vec<frostdb_pprof::rules::RecordingRule>,
    /// Bytes a second this tenant's clients may push, instead of the server's
    /// `limits.ingest_rate_per_tenant` (a size, such as `"64MiB"`).
    #[serde(default, with = "optional_bytes")]
    pub ingest_rate: Option<u64>,
    /// Bytes this tenant may push at once at its `ingest_rate` (absent: the larger of a
    /// second of it and `max_body_bytes`).
    #[serde(default, with = "optional_bytes")]
    pub ingest_burst: Option<u64>,
    /// Bytes this tenant may store, instead of the server's
    /// `limits.max_stored_bytes_per_tenant`.
    #[serde(default, with = "optional_bytes")]
    pub max_stored_bytes: Option<u64>,
}

impl Config {
    /// The bytes tenant `id` may store, and whether the quota is its own (not the
    /// server's `limits.max_stored_bytes_per_tenant`); `None`: no quota.
    pub fn stored_quota(&self, id: &str) -> Option<(u64, bool)> {
        match self.tenants.get(id).and_then(|t| t.max_stored_bytes) {
            Some(own) => Some((own, true)),
            None => self.limits.max_stored_bytes_per_tenant.map(|q| (q, false)),
        }
    }

    /// The retention of every tenant: the server's, and the tenants' own.
    pub fn retention(&self) -> crate::tenants::Retention {
        crate::tenants::Retention {
            default: self.retention,
            tenants: self
                .tenants
                .iter()
                .filter_map(|(id, t)| Some((id.clone(), t.retention?)))
                .collect(),
            rollups: self.rollup_retention,
        }
    }
}

/// The eBPF sampler's settings: `[ebpf]` in the TOML, or `--ebpf` for the defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EbpfConfig {
    /// Samples per second per CPU.
    #[serde(default = "default_ebpf_frequency")]
    pub frequency_hz: u64,
    /// How often each process's profile is stored, e.g. `10s`.
    #[serde(default = "default_ebpf_interval", with = "duration")]
    pub interval: Duration,
    /// Only these processes (host pids); all when empty.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Only processes in this cgroup (v2) directory or below.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// The tenant to store into.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// Kernel memory for unwind tables (user stacks of code without frame pointers), MiB;
    /// 0 walks frame pointers only.
    #[serde(default = "default_unwind_table_mib")]
    pub unwind_table_mib: u64,
}

fn default_unwind_table_mib() -> u64 {
    frostdb_ebpf_ingest::DEFAULT_UNWIND_TABLE_BYTES >> 20
}

impl Default for EbpfConfig {
    fn default() -> Self {
        Self {
            frequency_hz: default_ebpf_frequency(),
            interval: default_ebpf_interval(),
            pids: Vec::new(),
            cgroup: None,
            tenant: default_tenant(),
            unwind_table_mib: default_unwind_table_mib(),
        }
    }
}

fn default_ebpf_frequency() -> u64 {
    19
}

fn default_ebpf_interval() -> Duration {
    Duration::from_secs(10)
}

/// Limits that keep one client from hurting the others.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body accepted, as sent (413 beyond).
    pub max_body_bytes: usize,
    /// Largest body or profile after decompression (413 beyond).
    pub max_decompressed_bytes: usize,
    /// Most samples a profile may hold (413 beyond).
    pub max_samples_per_profile: usize,
    /// Most locations a profile may hold (413 beyond).
    pub max_locations_per_profile: usize,
    /// Largest number of distinct series (profile name and labels) a tenant may hold (429
    /// beyond; series already stored keep being accepted). Stored series count across
    /// restarts, until their samples expire.
    pub max_series_per_tenant: usize,
    /// Largest number of distinct label names a tenant may hold (429 beyond; names already
    /// stored keep being accepted). Each is a column of the tenant's tables, which every
    /// selector scan and series listing reads and every block describes: a client
    /// inventing names (one per request id) is refused here. Counted across restarts.
    pub max_label_names_per_tenant: usize,
    /// Most labels a series may have, request and pprof sample labels together (span and
    /// trace ids, kept per sample, do not count) (413 beyond).
    pub max_label_names_per_series: usize,
    /// Longest label name, bytes (413 beyond; the engine stores names of up to 255).
    pub max_label_name_length: usize,
    /// Longest label value, bytes (413 beyond).
    pub max_label_value_length: usize,
    /// A request taking longer is answered 408 and dropped.
    pub request_timeout_secs: u64,
    /// Number of tenants that may exist (a guard against header spraying).
    pub max_tenants: usize,
    /// Memory a tenant's queries may hold at once (merges and SQL together); a query over
    /// it fails with "resources exhausted" naming the limit.
    pub max_query_memory_bytes: usize,
    /// Bytes SQL operators past `max_query_memory_bytes` may spill to `<data>/spill`, all
    /// tenants' queries together, each query at most its `max_concurrent_queries`-th part
    /// (so that one tenant's spilling queries leave every other query its room); a query
    /// that would spill more fails, 413 naming it. 0: no spilling (such a query fails at
    /// the memory limit).
    pub max_spill_bytes: u64,
    /// Connections open at once; more are answered 503 and closed. Absent: as many as the
    /// process's descriptor limit (`ulimit -n`) leaves room for beside open tenants.
    pub max_connections: Option<usize>,
    /// Connections one client address holds at once (an IPv6 client: its /64); more are
    /// answered 503 naming this, so one client cannot take every connection (nor the
    /// health checks' room). Absent: half of `max_connections`. Behind a proxy that does
    /// not pass clients' addresses, every client is the proxy: set it to `max_connections`.
    pub max_connections_per_address: Option<usize>,
    /// Tenants whose databases are open at once; the least recently used idle one is
    /// closed to open another (it reopens on its next request). Absent: as many as the
    /// descriptor limit leaves room for, at most `max_tenants`.
    pub max_open_tenants: Option<usize>,
    /// Seconds a client has to send a request's headers (and an HTTP/1 connection may stay
    /// idle between requests).
    pub header_read_timeout_secs: u64,
    /// Seconds a connection may stay open with no request in flight.
    pub idle_timeout_secs: u64,
    /// On SIGTERM, seconds requests in flight may take to finish before their connections
    /// are closed.
    pub shutdown_grace_secs: u64,
    /// Longest request URI (path and query), bytes (414 beyond; at most 65,534, past which
    /// the HTTP library refuses a URI itself).
    pub max_uri_bytes: usize,
    /// Most request headers, and their total bytes (431 beyond).
    pub max_headers: usize,
    /// See `max_headers`.
    pub max_header_bytes: usize,
    /// Queries (merges, reports, SQL) running at once; more wait, and past 16 times as many
    /// waiting are answered 503. Absent: twice the cores. One tenant holds at most three
    /// quarters of the slots and the queue (429 beyond), and runs in all slots but one
    /// (from three on): its slow queries never hold up another tenant's.
    pub max_concurrent_queries: Option<usize>,
    /// Profiles being decoded and stored at once; more wait, and past 16 times as many
    /// waiting are answered 503. Shared among tenants as `max_concurrent_queries` is.
    pub max_concurrent_ingest: usize,
    /// The memory budget of the whole server: request bodies and their decoding, queries
    /// (merges, reports, SQL, their functions) and the tenants' in-memory blocks share it;
    /// work that does not fit waits briefly or is answered 503 with `Retry-After`. One
    /// tenant's requests, queries and the debug files read to name its frames hold at
    /// most three quarters of it (429 with `Retry-After` beyond, naming the tenant's
    /// share), so a tenant holding all it may (bodies stalled midway, say) leaves the
    /// others room. What connections send before a request is made of it (a head being
    /// read, HTTP/2 frames not yet taken) is charged as it arrives, and the answers they
    /// were handed until written to their sockets, within a quarter of the budget split
    /// between client addresses as connections are
    /// (`max_connections_per_address` of `max_connections`); a connection whose bytes do
    /// not fit is closed. Bytes, or a size such as `"4GiB"`. Absent: 60% of the memory of
    /// the machine or of the cgroup the server runs in.
    #[serde(with = "optional_bytes")]
    pub memory: Option<u64>,
    /// Settings (`settings.v1`) a tenant may keep.
    pub max_settings: usize,
    /// Bytes of settings (names and values) a tenant may keep.
    pub max_settings_bytes: usize,
    /// Recording rules a tenant may have (config and API together).
    pub max_recording_rules: usize,
    /// Series a tenant's recording rules may record, all rules together.
    pub max_recording_rule_series: usize,
    /// Bytes of debug files a tenant may keep, and upload at once, together (413 beyond).
    pub max_debuginfo_bytes: u64,
    /// Bytes a second a tenant's clients may push (request bodies as sent, every ingest
    /// route together): past it a push is refused before it is decoded, 429 with
    /// `Retry-After` saying when it fits. Scrapes and the eBPF sampler are not held to it.
    /// Bytes, or a size such as `"8MiB"`. Absent: no limit.
    #[serde(with = "optional_bytes")]
    pub ingest_rate_per_tenant: Option<u64>,
    /// Bytes a tenant may push at once at `ingest_rate_per_tenant` after pushing nothing
    /// for a while; a push larger than this is refused, 413. Absent: the larger of a
    /// second of the rate and `max_body_bytes`, so that any body taken can pass.
    #[serde(with = "optional_bytes")]
    pub ingest_burst_per_tenant: Option<u64>,
    /// Bytes a tenant may store (its persisted blocks and its WAL): at it, its pushes are
    /// refused, 429 naming this, until its retention frees space, so that one tenant
    /// cannot fill the disk every tenant writes to (a full disk refuses everyone's writes).
    /// Checked against what it stored up to a second before. Bytes, or a size such as
    /// `"50GiB"`. Absent: no quota.
    #[serde(with = "optional_bytes")]
    pub max_stored_bytes_per_tenant: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        let label_limits = frostdb_pprof::LabelLimits::default();
        Self {
            max_body_bytes: 16 << 20,
            max_decompressed_bytes: 128 << 20,
            max_samples_per_profile: frostdb_pprof::Limits::default().max_samples,
            max_locations_per_profile: frostdb_pprof::Limits::default().max_locations,
            max_series_per_tenant: 10_000,
            max_label_names_per_tenant: 1_000,
            max_label_names_per_series: label_limits.max_label_names_per_series,
            max_label_name_length: label_limits.max_label_name_length,
            max_label_value_length: label_limits.max_label_value_length,
            request_timeout_secs: 60,
            max_tenants: 1_000,
            max_query_memory_bytes: 1 << 30,
            max_spill_bytes: 4 << 30,
            max_connections: None,
            max_connections_per_address: None,
            max_open_tenants: None,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 60,
            shutdown_grace_secs: 10,
            max_uri_bytes: 16 << 10,
            max_headers: 100,
            max_header_bytes: 64 << 10,
            max_concurrent_queries: None,
            max_concurrent_ingest: 64,
            max_settings: 100,
            max_settings_bytes: 1 << 20,
            max_recording_rules: 100,
            max_recording_rule_series: 10_000,
            max_debuginfo_bytes: 16 << 30,
            memory: None,
            ingest_rate_per_tenant: None,
            ingest_burst_per_tenant: None,
            max_stored_bytes_per_tenant: None,
        }
    }
}

/// One scrape job, as in Prometheus and Parca.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeConfig {
    /// The `job` label.
    pub job: String,
    /// `host:port` of each target (the `instance` label).
    pub targets: Vec<String>,
    /// How often to scrape, e.g. `15s`.
    #[serde(default = "default_interval", with = "duration")]
    pub interval: Duration,
    /// Which profiles to pull: `cpu`, `heap`, `allocs`, `goroutine`, `mutex`, `block`.
    #[serde(default = "default_profiles")]
    pub profiles: Vec<String>,
    /// `http`, the only scheme built in (no TLS stack, to keep the build lean).
    #[serde(default = "default_scheme")]
    pub scheme: String,
    /// The tenant to store into.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// Labels added to every profile of these targets.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7070))
}

fn default_data() -> PathBuf {
    PathBuf::from("frostdb-data")
}

fn default_interval() -> Duration {
    Duration::from_secs(15)
}

fn default_profiles() -> Vec<String> {
    ["cpu", "heap", "allocs", "goroutine", "mutex", "block"]
        .map(String::from)
        .to_vec()
}

fn default_scheme() -> String {
    "http".into()
}

/// The tenant requests without `X-Scope-OrgID` belong to (Pyroscope's name for it).
pub const DEFAULT_TENANT: &str = "anonymous";

fn default_tenant() -> String {
    DEFAULT_TENANT.into()
}

pub(crate) mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        let ms = crate::time::parse_duration_ms(&s).map_err(serde::de::Error::custom)?;
        if ms <= 0 {
            return Err(serde::de::Error::custom(format!(
                "{s:?}: the interval must be positive"
            )));
        }
        Ok(Duration::from_millis(ms as u64))
    }
}

impl Limits {
    /// Checks what serde cannot: limits that would refuse everything.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("request_timeout_secs", self.request_timeout_secs as usize),
            (
                "header_read_timeout_secs",
                self.header_read_timeout_secs as usize,
            ),
            ("idle_timeout_secs", self.idle_timeout_secs as usize),
            ("max_tenants", self.max_tenants),
            ("max_concurrent_ingest", self.max_concurrent_ingest),
            ("max_headers", self.max_headers),
            ("max_body_bytes", self.max_body_bytes),
            ("max_decompressed_bytes", self.max_decompressed_bytes),
            ("max_query_memory_bytes", self.max_query_memory_bytes),
            ("max_connections", self.max_connections.unwrap_or(1)),
            (
                "max_connections_per_address",
                self.max_connections_per_address.unwrap_or(1),
            ),
            ("max_open_tenants", self.max_open_tenants.unwrap_or(1)),
            (
                "ingest_rate_per_tenant",
                self.ingest_rate_per_tenant.map_or(1, |v| v as usize),
            ),
            (
                "ingest_burst_per_tenant",
                self.ingest_burst_per_tenant.map_or(1, |v| v as usize),
            ),
            (
                "max_stored_bytes_per_tenant",
                self.max_stored_bytes_per_tenant.map_or(1, |v| v as usize),
            ),
            (
                "max_concurrent_queries",
                self.max_concurrent_queries.unwrap_or(1),
            ),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be positive"));
        }
        if self.max_uri_bytes < 1024 || self.max_header_bytes < 1024 {
            return Err("`max_uri_bytes` and `max_header_bytes` must be at least 1024".into());
        }
        if self.max_uri_bytes > crate::connections::HYPER_MAX_URI_BYTES {
            return Err(format!(
                "`max_uri_bytes` must be at most {}",
                crate::connections::HYPER_MAX_URI_BYTES
            ));
        }
        let hyper = crate::connections::HYPER_MAX_HEAD_BYTES;
        if self.max_uri_bytes + self.max_header_bytes > hyper {
            return Err(format!(
                "`max_uri_bytes` and `max_header_bytes` together must be at most {hyper}"
            ));
        }
        if self.max_headers > crate::connections::HYPER_MAX_HEADERS {
            return Err(format!(
                "`max_headers` must be at most {}",
                crate::connections::HYPER_MAX_HEADERS
            ));
        }
        Ok(())
    }

    /// The memory budget in bytes: `memory`, else 60% of what the machine or cgroup has
    /// (4 GiB when that cannot be read).
    pub fn memory_budget(&self) -> u64 {
        self.memory.unwrap_or_else(|| {
            frostdb_core::available_memory().map_or(4 << 30, |b| b as u64 / 10 * 6)
        })
    }
}

/// A size: bytes, or a number with a unit (`512MiB`, `4GiB`, `100MB`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or e.g. 512MiB, 4GiB)"))?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ));
        }
    };
    let bytes = number * factor as f64;
    if !(1.0..=(u64::MAX as f64)).contains(&bytes) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(bytes as u64)
}

mod optional_bytes {
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Size {
        Bytes(u64),
        Text(String),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        match Size::deserialize(d)? {
            Size::Bytes(0) => Err(serde::de::Error::custom("the size must be positive")),
            Size::Bytes(b) => Ok(Some(b)),
            Size::Text(t) => super::parse_bytes(&t)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

mod optional_duration {
    use std::time::Duration;

    use serde::Deserializer;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::duration::deserialize(d).map(Some)
    }
}

/// The profiles a Go program serves under `/debug/pprof/`.
pub const KNOWN_PROFILES: [&str; 6] = ["cpu", "heap", "allocs", "goroutine", "mutex", "block"];

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            data: default_data(),
            token: None,
            limits: Limits::default(),
            scrape: Vec::new(),
            ebpf: None,
            retention: None,
            rollup_retention: None,
            tenants: BTreeMap::new(),
            storage: None,
            cluster: ClusterConfig::default(),
            symbolizer: SymbolizerConfig::default(),
            remote_write: None,
            regressions: RegressionsConfig::default(),
        }
    }
}

impl Config {
    /// Reads a TOML file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: Config =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        config
            .validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(config)
    }

    /// Checks what serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        for (id, t) in &self.tenants {
            match (t.ingest_rate, t.ingest_burst) {
                (Some(0), _) | (_, Some(0)) => {
                    return Err(format!(
                        "tenants.{id}: `ingest_rate` and `ingest_burst` must be positive"
                    ));
                }
                (None, Some(_)) => {
                    return Err(format!(
                        "tenants.{id}: `ingest_burst` is the burst of the tenant's own \
                         `ingest_rate`: set that too"
                    ));
                }
                _ => {}
            }
        }
        for job in &self.scrape {
            if job.job.is_empty() {
                return Err("a scrape job has an empty `job` name".into());
            }
            if job.scheme != "http" {
                return Err(format!(
                    "scrape job {:?}: scheme {:?} is not supported (only http)",
                    job.job, job.scheme
                ));
            }
            for p in &job.profiles {
                if !KNOWN_PROFILES.contains(&p.as_str()) {
                    return Err(format!(
                        "scrape job {:?}: unknown profile {p:?} (one of {})",
                        job.job,
                        KNOWN_PROFILES.join(", ")
                    ));
                }
            }
            crate::tenants::validate_tenant(&job.tenant)
                .map_err(|e| format!("scrape job {:?}: {e}", job.job))?;
            // Each scrape adds `job` and `instance` itself: given here too, every scrape of
            // the job was refused at store time (two labels of one name), for ever.
            if let Some(name) = job
                .labels
                .keys()
                .find(|n| ["job", "instance"].contains(&n.as_str()) || n.starts_with("__"))
            {
                return Err(format!(
                    "scrape job {:?}: label {name:?} is the scrape's own (job and instance are \
                     set by each scrape; names starting with __ are reserved)",
                    job.job
                ));
            }
        }
        if let Some(remote) = &self.remote_write {
            let url = reqwest::Url::parse(&remote.url).map_err(|e| {
                let url = frostdb_core::redacted_url(&remote.url);
                format!("[remote_write]: url {url:?}: {e}")
            })?;
            if !["http", "https"].contains(&url.scheme()) {
                return Err(format!(
                    "[remote_write]: url {:?} is not http or https",
                    frostdb_core::redacted_url(&remote.url)
                ));
            }
            for (name, value) in [("interval", remote.interval), ("timeout", remote.timeout)] {
                if value.is_zero() {
                    return Err(format!("[remote_write]: {name} must be positive"));
                }
            }
        }
        // A target's status is known by its job (as Prometheus, which refuses two jobs of
        // one name): two jobs alike, of two tenants, shared one status, each tenant shown
        // the other's errors and timings.
        let mut jobs = std::collections::BTreeSet::new();
        if let Some(job) = self.scrape.iter().find(|j| !jobs.insert(j.job.as_str())) {
            return Err(format!(
                "two scrape jobs are named {:?}: a job's name must be its own",
                job.job
            ));
        }
        if let Some(ebpf) = &self.ebpf {
            if !ebpf.pids.is_empty() && ebpf.cgroup.is_some() {
                return Err("[ebpf]: give `pids` or `cgroup`, not both".into());
            }
            crate::tenants::validate_tenant(&ebpf.tenant).map_err(|e| format!("[ebpf]: {e}"))?;
            crate::ebpf::sampler_config(ebpf)
                .validate()
                .map_err(|e| format!("[ebpf]: {e}"))?;
        }
        let mut tokens = std::collections::HashSet::new();
        tokens.extend(self.token.as_deref());
        let mut folded = std::collections::HashMap::new();
        for (id, tenant) in &self.tenants {
            crate::tenants::validate_tenant(id).map_err(|e| format!("[tenants]: {e}"))?;
            // Two ids one file system may take for one name are never two tenants.
            if let Some(other) = folded.insert(id.to_ascii_lowercase(), id) {
                return Err(format!(
                    "[tenants]: {other:?} and {id:?} differ only in case; on a file system that does not tell case apart they would share one database"
                ));
            }
            if let Some(token) = &tenant.token {
                if token.trim().is_empty() {
                    return Err(format!("[tenants.{id}]: `token` is empty"));
                }
                // A token shared by two tenants (or with the server's) would act for
                // whichever is matched first: the other could never be told apart.
                if !tokens.insert(token.as_str()) {
                    return Err(format!(
                        "[tenants.{id}]: `token` is also another tenant's or the server's `token`; each must be its own"
                    ));
                }
            }
        }
        if self.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err("`token` is empty".into());
        }
        self.limits
            .validate()
            .map_err(|e| format!("[limits]: {e}"))?;
        let r = &self.regressions;
        r.compare_options()
            .validate()
            .map_err(|e| format!("[regressions]: {e}"))?;
        if r.max_listed > 1000 {
            return Err("[regressions]: max_listed may be at most 1000".into());
        }
        if r.service_label.is_empty() || r.version_labels.iter().any(String::is_empty) {
            return Err("[regressions]: service_label and version_labels cannot be empty".into());
        }
        if r.interval < Duration::from_secs(1) || r.window.is_zero() || r.lookback.is_zero() {
            return Err(
                "[regressions]: interval must be at least 1s, window and lookback above 0".into(),
            );
        }
        self.validate_cluster()
    }

    /// The secret of the cluster: `[cluster] secret`, else the server's token.
    pub fn cluster_secret(&self) -> Option<&str> {
        self.cluster.secret.as_deref().or(self.token.as_deref())
    }

    /// Checks `[storage]` and `[cluster]` together.
    fn validate_cluster(&self) -> Result<(), String> {
        let cluster = &self.cluster;
        let Some(storage) = &self.storage else {
            let clustered = cluster.role == Role::Reader
                || cluster.worker_listen.is_some()
                || !cluster.workers.is_empty();
            if clustered {
                return Err(
                    "[cluster]: readers and workers share a bucket: set [storage] url".into(),
                );
            }
            return Ok(());
        };
        storage.prefix().map_err(|e| format!("[storage]: {e}"))?;
        if cluster.role == Role::Reader {
            if !self.scrape.is_empty() {
                return Err("[[scrape]] writes profiles: a reader node cannot scrape".into());
            }
            if self.ebpf.is_some() {
                return Err("[ebpf] writes profiles: a reader node cannot sample".into());
            }
        }
        if cluster.node.as_deref() == Some("") {
            return Err("[cluster]: `node` is empty".into());
        }
        let shared = frostdb_core::SharedOptions::new("check")
            .lease_ttl(cluster.lease_ttl)
            .flush_interval(cluster.flush_interval);
        shared.validate().map_err(|e| format!("[cluster]: {e}"))?;
        if cluster.secret.as_deref() == Some("") {
            return Err("[cluster]: `secret` is empty".into());
        }
        if let Some(listen) = cluster.worker_listen
            && !listen.ip().is_loopback()
            && self.cluster_secret().is_none()
        {
            return Err(format!(
                "[cluster]: worker_listen = \"{listen}\" takes plans that read every tenant's data from beyond this host: set [cluster] secret (or token), which the nodes asking it send"
            ));
        }
        for w in &cluster.workers {
            if !(w.starts_with("http://") || w.starts_with("https://")) {
                return Err(format!(
                    "[cluster]: worker {w:?} must be an address such as http://host:7101"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field names of a struct, from its `Debug` (`Name { a: .., b: .. }`).
    fn field_names(debug: &str) -> Vec<String> {
        let mut names = Vec::new();
        let (mut depth, mut start) = (0usize, None);
        for (i, c) in debug.char_indices() {
            match c {
                '{' | '[' | '(' => {
                    depth += 1;
                    if depth == 1 {
                        start = Some(i + 1);
                    }
                }
                '}' | ']' | ')' => depth -= 1,
                ',' if depth == 1 => start = Some(i + 1),
                ':' if depth == 1 => {
                    if let Some(s) = start.take() {
                        names.push(debug[s..i].trim().to_owned());
                    }
                }
                _ => {}
            }
        }
        names
    }

    #[test]
    fn the_example_config_parses_sets_the_defaults_and_lists_every_key() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../frostdb.example.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let c = Config::load(&path).unwrap();
        let defaults: Config = toml::from_str("").unwrap();
        assert_eq!(format!("{:?}", c.limits), format!("{:?}", defaults.limits));
        assert_eq!(
            format!("{:?}", c.cluster),
            format!("{:?}", defaults.cluster)
        );
        assert_eq!(c.symbolizer, defaults.symbolizer);
        assert_eq!((c.listen, &c.data), (defaults.listen, &defaults.data));
        assert!(c.token.is_none() && c.retention.is_none() && c.scrape.is_empty());
        // Every key, set or commented out ("# key = ..."), in every section.
        let scrape: ScrapeConfig = toml::from_str("job = \"j\"\ntargets = []").unwrap();
        let sections = [
            ("", field_names(&format!("{defaults:?}"))),
            ("[limits]", field_names(&format!("{:?}", defaults.limits))),
            ("[cluster]", field_names(&format!("{:?}", defaults.cluster))),
            (
                "[ebpf]",
                field_names(&format!("{:?}", EbpfConfig::default())),
            ),
            ("[[scrape]]", field_names(&format!("{scrape:?}"))),
            (
                "[storage]",
                field_names(&format!("{:?}", frostdb_core::Bucket::default())),
            ),
            (
                "[tenants.<id>]",
                field_names(&format!("{:?}", TenantConfig::default())),
            ),
            (
                "[symbolizer]",
                field_names(&format!("{:?}", SymbolizerConfig::default())),
            ),
            (
                "[regressions]",
                field_names(&format!("{:?}", RegressionsConfig::default())),
            ),
            (
                "[remote_write]",
                field_names(&format!(
                    "{:?}",
                    toml::from_str::<crate::remote_write::RemoteWriteConfig>("url = \"u\"")
                        .unwrap()
                )),
            ),
        ];
        let tables = [
            "limits",
            "scrape",
            "ebpf",
            "tenants",
            "storage",
            "cluster",
            "symbolizer",
            "remote_write",
            "regressions",
        ];
        for (section, keys) in sections {
            assert!(!keys.is_empty(), "{section}");
            for key in keys {
                if section.is_empty() && tables.contains(&key.as_str()) {
                    continue;
                }
                let listed = text.lines().any(|l| {
                    let l = l.trim_start_matches(['#', ' ']);
                    l.starts_with(&format!("{key} =")) || l.starts_with(&format!("{key}="))
                });
                assert!(listed, "{section} {key} is missing from {}", path.display());
            }
        }
    }

    #[test]
    fn parses_a_full_config() {
        let c: Config = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            data = "/tmp/x"
            retention = "30d"
            rollup_retention = "90d"
            [limits]
            max_series_per_tenant = 5
            max_samples_per_profile = 1000
            max_locations_per_profile = 2000
            max_label_names_per_series = 12
            max_label_name_length = 100
            max_label_value_length = 200
            [[scrape]]
            job = "go"
            targets = ["127.0.0.1:6060"]
            interval = "2s"
            profiles = ["cpu", "heap"]
            labels = { env = "dev" }
            [tenants.team-a]
            retention = "7d"
            [ebpf]
            frequency_hz = 99
            interval = "2s"
            unwind_table_mib = 64
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.limits.max_series_per_tenant, 5);
        assert_eq!(
            (
                c.limits.max_samples_per_profile,
                c.limits.max_locations_per_profile
            ),
            (1000, 2000)
        );
        assert_eq!(
            (
                c.limits.max_label_names_per_series,
                c.limits.max_label_name_length,
                c.limits.max_label_value_length
            ),
            (12, 100, 200)
        );
        assert_eq!(c.limits.max_body_bytes, Limits::default().max_body_bytes);
        assert_eq!(c.scrape[0].interval, Duration::from_secs(2));
        assert_eq!(c.scrape[0].labels["env"], "dev");
        assert_eq!(c.scrape[0].tenant, DEFAULT_TENANT);
        let ebpf = c.ebpf.clone().unwrap();
        assert_eq!(
            (ebpf.frequency_hz, ebpf.interval, ebpf.unwind_table_mib),
            (99, Duration::from_secs(2), 64)
        );
        assert_eq!(ebpf.tenant, DEFAULT_TENANT);
        let days = |n: u64| Some(Duration::from_secs(n * 86_400));
        assert_eq!(c.retention().of("team-a"), days(7));
        assert_eq!(c.retention().of("anyone-else"), days(30));
        assert_eq!(Config::default().retention().of("x"), None);
        assert_eq!(c.retention().rollups, days(90));
        for (text, bytes) in [
            ("1024", 1024),
            ("'512MiB'", 512 << 20),
            ("'4GiB'", 4 << 30),
            ("'2GB'", 2_000_000_000),
        ] {
            let c: Config = toml::from_str(&format!("[limits]\nmemory = {text}")).unwrap();
            assert_eq!(c.limits.memory_budget(), bytes, "{text}");
        }
    }

    #[test]
    fn rejects_what_it_cannot_do() {
        let bad = |s: &str| {
            toml::from_str::<Config>(s)
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate())
                .unwrap_err()
        };
        assert!(bad("listen = 'nowhere'").contains("listen"));
        assert!(bad("[tenants.a]\ningest_burst = '1MiB'").contains("set that too"));
        assert!(bad("[tenants.a]\ningest_rate = '0KiB'").contains("out of range"));
        assert!(bad("[limits]\ningest_rate_per_tenant = 0").contains("positive"));
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\nprofiles=['cpux']").contains("cpux"));
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\ninterval='0s'").contains("positive"));
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\nscheme='https'").contains("https"));
        assert!(
            bad("[[scrape]]\njob='a'\ntargets=[]\n[[scrape]]\njob='a'\ntargets=[]\ntenant='b'")
                .contains("two scrape jobs are named \"a\"")
        );
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\nlabels={instance='x'}").contains("instance"));
        assert!(bad("[remote_write]\nurl='prometheus:9090/x'").contains("not http or https"));
        assert!(bad("[remote_write]\nurl='http://p/x'\ninterval='0s'").contains("interval must"));
        assert!(bad("colour = 1").contains("colour"));
        assert!(bad("[ebpf]\nfrequency_hz = 0").contains("frequency_hz"));
        assert!(bad("[ebpf]\npids = [1]\ncgroup = '/sys/fs/cgroup'").contains("not both"));
        assert!(bad("retention = '0d'").contains("positive"));
        assert!(bad("retention = 'a week'").contains("retention"));
        assert!(bad("[tenants.'a/b']\nretention = '1d'").contains("a/b"));
        assert!(
            bad("[tenants.Acme]\nretention = '1d'\n[tenants.acme]\nretention = '2d'")
                .contains("differ only in case")
        );
        assert!(bad("[cluster]\nrole = 'reader'").contains("[storage]"));
        assert!(bad("[storage]\nurl = 'gs://x'").contains("s3://"));
        assert!(
            bad("[storage]\nurl = 's3://b'\n[cluster]\nrole = 'reader'\n[[scrape]]\njob='a'\ntargets=[]")
                .contains("reader")
        );
        assert!(bad("[storage]\nurl = 's3://b'\n[cluster]\nworkers = ['x:1']").contains("http://"));
        assert!(bad("[storage]\nurl = 's3://b'\n[cluster]\nrole = 'leader'").contains("leader"));
        // A worker beyond loopback runs anyone's plans unless it requires a secret.
        let open = "[storage]\nurl = 's3://b'\n[cluster]\nworker_listen = '0.0.0.0:7101'";
        assert!(bad(open).contains("secret"));
        for closed in [
            format!("{open}\nsecret = 's'"),
            format!("token = 't'\n{open}"),
        ] {
            let c: Config = toml::from_str(&closed).unwrap();
            c.validate().unwrap();
        }
        assert!(bad("[limits]\nheader_read_timeout_secs = 0").contains("header_read_timeout_secs"));
        assert!(bad("[limits]\nmax_uri_bytes = 100000").contains("max_uri_bytes"));
        assert!(bad("[limits]\nmemory = '12 parsecs'").contains("parsecs"));
    }

    #[test]
    fn parses_a_cluster_node() {
        let c: Config = toml::from_str(
            r#"
            [storage]
            url = "s3://profiles/fleet"
            endpoint = "http://127.0.0.1:9000"
            allow_http = true
            [cluster]
            role = "reader"
            refresh_interval = "500ms"
            worker_listen = "127.0.0.1:7101"
            workers = ["http://127.0.0.1:7102"]
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.cluster.role, Role::Reader);
        assert_eq!(c.cluster.refresh_interval, Duration::from_millis(500));
        assert_eq!(c.storage.unwrap().prefix().unwrap(), "fleet");
        let writer = Config::default().cluster;
        assert_eq!(writer.role, Role::Writer);
        assert!(writer.node_name(7070).ends_with(":7070"));
    }
}
