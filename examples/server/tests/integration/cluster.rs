//! Several `frostdb serve` processes over one bucket (moto's S3 server on 127.0.0.1): a
//! writer, two read-only workers and a coordinator spreading merges over them. Queries
//! answer on every node as on the writer; a killed writer's tenants are taken over by a
//! new writer once its lease runs out, with every acknowledged profile; a killed worker
//! fails the merges that needed it, clearly, never answering in part.

use crate::common;

use std::time::{Duration, Instant};

use common::{Server, enc, get, testdata};
use frostdb_core::testing::{S3Server, free_port};

const GO_CPU: &str = "pprof/pyroscope__go-cpu.pb.gz";
const SELECTOR: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"demo\"}";

/// The cpu total of one push of [`GO_CPU`].
fn one_push() -> i64 {
    let bytes = testdata(GO_CPU);
    let p = frostdb_pprof::decode(&bytes, &frostdb_pprof::Limits::default())
        .unwrap()
        .into_inner();
    common::cpu_total(&p)
}

fn config(s3: &S3Server, cluster: &str) -> String {
    format!(
        r#"
[storage]
url = "s3://cluster/fleet"
endpoint = "{}"
region = "us-east-1"
allow_http = true
access_key_id = "test"
secret_access_key = "test"

[cluster]
{cluster}
"#,
        s3.endpoint()
    )
}

/// Pushes profile `i` (pod `p<i>`) through the legacy `/ingest`; the status.
async fn push(node: &Server, i: usize) -> u16 {
    let url = format!(
        "{}/ingest?name={}&format=pprof",
        node.url,
        enc(&format!("demo.cpu{{pod=p{i}}}"))
    );
    reqwest::Client::new()
        .post(url)
        .body(testdata(GO_CPU))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The merge's top table and total on `node`, as `(status, body)`.
async fn top(node: &Server) -> (u16, String) {
    get(
        &format!(
            "{}/api/v1/query?format=top&selector={}",
            node.url,
            enc(SELECTOR)
        ),
        None,
    )
    .await
}

fn total_of(body: &str) -> i64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["total"].as_i64().unwrap()
}

/// Polls `node` until its merge totals `want` (readers see a writer's data once it is
/// flushed and they have refreshed: a bounded staleness, so a deadline, not a sleep).
async fn until_total(node: &Server, want: i64) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = top(node).await;
        if status == 200 && total_of(&body) == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{} never reached total {want}: {status} {body}",
            node.url
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_readers_workers_and_a_coordinator_share_one_bucket() {
    let Some(s3) = S3Server::start("the cluster test") else {
        return;
    };
    // The bucket exists before the nodes start.
    let _ = s3.bucket("cluster", "fleet");
    let dir = tempfile::tempdir().unwrap();
    let writer_config = |node: &str| {
        config(
            &s3,
            &format!(
                "role = \"writer\"\nnode = \"{node}\"\nflush_interval = \"1s\"\nlease_ttl = \"8s\""
            ),
        )
    };
    let a = Server::start(&dir.path().join("a"), Some(&writer_config("a")));
    let one = one_push();
    for i in 0..4 {
        assert_eq!(push(&a, i).await, 200);
    }
    let (status, single) = top(&a).await;
    assert_eq!((status, total_of(&single)), (200, 4 * one), "{single}");

    // Two read-only workers and a coordinator spreading merges over them.
    let (w1, w2) = (free_port(), free_port());
    let reader = |listen: u16| {
        config(
            &s3,
            &format!(
                "role = \"reader\"\nrefresh_interval = \"200ms\"\nworker_listen = \"127.0.0.1:{listen}\""
            ),
        )
    };
    let r1 = Server::start(&dir.path().join("r1"), Some(&reader(w1)));
    let r2 = Server::start(&dir.path().join("r2"), Some(&reader(w2)));
    let coordinator = Server::start(
        &dir.path().join("c"),
        Some(&config(
            &s3,
            &format!(
                "role = \"reader\"\nrefresh_interval = \"200ms\"\nworkers = [\"http://127.0.0.1:{w1}\", \"http://127.0.0.1:{w2}\"]"
            ),
        )),
    );
    // Every node answers as the writer does, once the writer's cut reached the bucket.
    for node in [&r1, &r2, &coordinator] {
        assert_eq!(until_total(node, 4 * one).await, single, "{}", node.url);
    }
    assert!(
        coordinator.log().contains("merges spread over workers"),
        "{}",
        coordinator.log()
    );
    // Readers take no writes.
    assert_eq!(push(&r1, 9).await, 421);

    // The writer is killed with acknowledged profiles only in the bucket's WAL.
    for i in 4..6 {
        assert_eq!(push(&a, i).await, 200);
    }
    drop(a); // SIGKILL
    let b = Server::start(&dir.path().join("b"), Some(&writer_config("b")));
    // b waits for a's lease to run out (503 naming a), then takes the tenant over.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refused = 0;
    loop {
        match push(&b, 6).await {
            200 => break,
            503 => refused += 1,
            other => panic!("push to the new writer: {other}\n{}", b.log()),
        }
        assert!(
            Instant::now() < deadline,
            "b never took the lease: {}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // (The lease outlasts b's start, which takes seconds on a loaded machine.)
    assert!(
        refused > 0,
        "a's lease must hold b off for a while: {}",
        b.log()
    );
    assert!(b.log().contains("is written by a"), "{}", b.log());
    // Every acknowledged profile: 4 flushed, 2 only in a's WAL, 1 by b.
    let (status, body) = top(&b).await;
    assert_eq!((status, total_of(&body)), (200, 7 * one), "{body}");
    until_total(&coordinator, 7 * one).await;

    // A worker killed: merges that need it fail, naming the workers, or answer rightly.
    drop(r2);
    let (status, body) = top(&coordinator).await;
    if status == 200 {
        assert_eq!(total_of(&body), 7 * one, "{body}");
    } else {
        assert_eq!(status, 503, "{body}");
        assert!(body.contains(&format!("127.0.0.1:{w2}")), "{body}");
    }
}

/// A writer serving merge tasks as a worker (the README's `[cluster]` example makes every
/// writer a worker of the others) reads the tenants it does not hold as a follower of the
/// bucket. It never opens one as its writer: that would take the lease (fencing off the
/// writer holding it), or fail every spread merge of its tenants while the holder keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_serving_merge_tasks_follows_tenants_it_does_not_hold() {
    use frostdb_server::config::Role;
    use frostdb_server::tenants::{Retention, SharedBucket, Storage, Tenants};
    let Some(s3) = S3Server::start("the cluster test") else {
        return;
    };
    let _ = s3.bucket("cluster", "fleet");
    let dir = tempfile::tempdir().unwrap();
    let a = Server::start(
        &dir.path().join("a"),
        Some(&config(
            &s3,
            "role = \"writer\"\nnode = \"a\"\nflush_interval = \"1s\"\nlease_ttl = \"8s\"",
        )),
    );
    for i in 0..2 {
        assert_eq!(push(&a, i).await, 200);
    }
    // Node b, a writer too, as its merge-task source sees the bucket.
    let b: frostdb_server::config::Config =
        toml::from_str(&config(&s3, "role = \"writer\"\nnode = \"b\"")).unwrap();
    let bucket = b.storage.clone().unwrap();
    let storage = Storage::Bucket(std::sync::Arc::new(SharedBucket {
        store: bucket.store().unwrap(),
        bucket,
        role: Role::Writer,
        shared: frostdb_core::SharedOptions::new("b".to_owned()),
    }));
    let tenants = Tenants::with_storage(
        storage,
        b.limits.clone(),
        Retention::default(),
        frostdb_core::WorkerPool::new(1).unwrap(),
    );
    let tenant = frostdb_server::config::DEFAULT_TENANT;
    // a's cut reaches the bucket within its flush interval: the follower sees it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let db = tenants.for_task(tenant).await.unwrap().unwrap();
        let samples = db.get_table("samples").map_or(0, |t| t.stats().rows);
        if samples > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "b never saw a's blocks");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // b holds nothing, and a still holds the tenant: its writes go on.
    assert_eq!(tenants.open_count(), 0);
    assert_eq!(push(&a, 2).await, 200);
    let (status, body) = top(&a).await;
    assert_eq!((status, total_of(&body)), (200, 3 * one_push()), "{body}");
    assert!(tenants.for_task("nobody").await.unwrap().is_none());
}
