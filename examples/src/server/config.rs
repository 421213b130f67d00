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
//!
//! [limits]
//! max_body_bytes = 16777216        # request body, as sent (compressed)
//! max_decompressed_bytes = 134217728   # a body or profile, decompressed
//! max_samples_per_profile = 4194304
//! max_locations_per_profile = 4194304
//! max_series_per_tenant = 10000    # counted across restarts
//! max_label_names_per_series = 30  # request and pprof labels (not span ids)
//! max_label_name_length = 1024     # bytes (the engine stores at most 255)
//! max_label_value_length = 2048    # bytes
//! request_timeout_secs = 60
//! max_query_memory_bytes = 1073741824   # per tenant, merges and SQL together
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
    /// How long this tenant's samples are kept, instead of the server's `retention`.
    #[serde(default, with = "optional_duration")]
    pub retention: Option<Duration>,
}

impl Config {
    /// The retention of every tenant: the server's, and the tenants' own.
    pub fn retention(&self) -> crate::server::tenants::Retention {
        crate::server::tenants::Retention {
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
            max_label_names_per_series: label_limits.max_label_names_per_series,
            max_label_name_length: label_limits.max_label_name_length,
            max_label_value_length: label_limits.max_label_value_length,
            request_timeout_secs: 60,
            max_tenants: 1_000,
            max_query_memory_bytes: 1 << 30,
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

mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
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
            crate::server::tenants::validate_tenant(&job.tenant)
                .map_err(|e| format!("scrape job {:?}: {e}", job.job))?;
        }
        if let Some(ebpf) = &self.ebpf {
            if !ebpf.pids.is_empty() && ebpf.cgroup.is_some() {
                return Err("[ebpf]: give `pids` or `cgroup`, not both".into());
            }
            crate::server::tenants::validate_tenant(&ebpf.tenant)
                .map_err(|e| format!("[ebpf]: {e}"))?;
            crate::server::ebpf::sampler_config(ebpf)
                .validate()
                .map_err(|e| format!("[ebpf]: {e}"))?;
        }
        for id in self.tenants.keys() {
            crate::server::tenants::validate_tenant(id).map_err(|e| format!("[tenants]: {e}"))?;
        }
        if self.token.as_deref() == Some("") {
            return Err("`token` is empty".into());
        }
        self.validate_cluster()
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
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\nprofiles=['cpux']").contains("cpux"));
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\ninterval='0s'").contains("positive"));
        assert!(bad("[[scrape]]\njob='a'\ntargets=[]\nscheme='https'").contains("https"));
        assert!(bad("colour = 1").contains("colour"));
        assert!(bad("[ebpf]\nfrequency_hz = 0").contains("frequency_hz"));
        assert!(bad("[ebpf]\npids = [1]\ncgroup = '/sys/fs/cgroup'").contains("not both"));
        assert!(bad("retention = '0d'").contains("positive"));
        assert!(bad("retention = 'a week'").contains("retention"));
        assert!(bad("[tenants.'a/b']\nretention = '1d'").contains("a/b"));
        assert!(bad("[cluster]\nrole = 'reader'").contains("[storage]"));
        assert!(bad("[storage]\nurl = 'gs://x'").contains("s3://"));
        assert!(
            bad("[storage]\nurl = 's3://b'\n[cluster]\nrole = 'reader'\n[[scrape]]\njob='a'\ntargets=[]")
                .contains("reader")
        );
        assert!(bad("[storage]\nurl = 's3://b'\n[cluster]\nworkers = ['x:1']").contains("http://"));
        assert!(bad("[storage]\nurl = 's3://b'\n[cluster]\nrole = 'leader'").contains("leader"));
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
