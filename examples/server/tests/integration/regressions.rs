//! Regressions across deploys, on a real program and a real change: a small Go service
//! (`fixtures/deployapp`) built twice, the second build's `encode` made four times slower
//! on purpose, both scraped by the server with their version label, the new version deployed
//! after the old one's first profiles; and the same code built twice more as another
//! service with two version labels. The server compares each
//! service's newest version with the one before by itself: the slowed function is reported
//! with its share before and after, the unchanged build reports none, `/metrics` counts
//! both for alerting, and `frostdb compare` finds the same on the stored data.
//!
//! Needs Go (`scripts/test.sh` installs golang-go). CI scrapes about 40 s (12 profiles a
//! version); `FROSTDB_DEPLOY_PROFILES=60` scrapes three minutes.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{HeldAddr, Reap, Server, eventually, get_json, wait_listening};

/// Builds `fixtures/deployapp` with `slowdown` into `out`.
fn build(dir: &Path, slowdown: u32, out: &str) -> std::path::PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deployapp/main.go");
    let binary = dir.join(out);
    let built = std::process::Command::new("go")
        .args(["build", "-trimpath", "-ldflags"])
        .arg(format!("-X main.slowdown={slowdown}"))
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .env("HOME", dir)
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPROXY", "off")
        .env("GO111MODULE", "off")
        .output()
        .expect("go build");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    binary
}

/// Starts `binary` on the address `held` kept for it, once it listens there.
async fn start(binary: &Path, held: HeldAddr) -> Reap {
    let addr = held.release();
    let child = std::process::Command::new(binary)
        .args(["-addr", &addr])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("deployapp");
    let mut app = Reap(child);
    wait_listening(&mut app.0, &addr).await;
    app
}

/// The latest comparison of `service` in an `/api/v1/regressions` answer.
fn latest<'a>(answer: &'a serde_json::Value, service: &str) -> Option<&'a serde_json::Value> {
    answer["comparisons"]
        .as_array()?
        .iter()
        .find(|c| c["service"] == service && c["profile_type"] == CPU)
}

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Profiles each version needs before it is compared: 12 (two-second profiles every 3 s,
/// about 40 s of scraping) unless `FROSTDB_DEPLOY_PROFILES` says more (60: three minutes).
fn min_profiles() -> u64 {
    std::env::var("FROSTDB_DEPLOY_PROFILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
        .max(12)
}

#[tokio::test]
async fn a_slowed_function_is_reported_across_deploys_and_an_unchanged_build_is_not() {
    if !common::have("go", "version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2_slow, v2_same) = (
        build(dir.path(), 1, "deployapp-1"),
        build(dir.path(), 4, "deployapp-2-slow"),
        build(dir.path(), 1, "deployapp-2-same"),
    );
    // (service, version, binary, address): the old versions run first; the new ones are
    // deployed once the server has profiles of the old. Their addresses are held until
    // then: scraping them is refused, as a target that is down, and no other test's server
    // takes their ports meanwhile.
    let apps = [
        ("shop", "1.0", &v1),
        ("cart", "1.0", &v1),
        ("shop", "2.0", &v2_slow),
        ("cart", "2.0", &v2_same),
    ]
    .map(|(service, version, binary)| (service, version, binary, HeldAddr::new()));
    let min_profiles = min_profiles();
    let mut config = format!(
        "[regressions]\ninterval = \"1s\"\nmin_profiles = {min_profiles}\nmin_increase = 0.05\n"
    );
    for (i, (service, version, _, held)) in apps.iter().enumerate() {
        // 2 s CPU profiles, every 3 s.
        config.push_str(&format!(
            "\n[[scrape]]\njob = \"app-{i}\"\ntargets = [\"{}\"]\ninterval = \"3s\"\n\
             profiles = [\"cpu\"]\nlabels = {{ service_name = \"{service}\", version = \"{version}\" }}\n",
            held.addr
        ));
    }
    let [old_shop, old_cart, new_shop, new_cart] = apps;
    let mut running = vec![
        start(old_shop.2, old_shop.3).await,
        start(old_cart.2, old_cart.3).await,
    ];
    let s = Server::start(&dir.path().join("data"), Some(&config));
    // The deploy: once both old versions have a profile stored, the new ones start.
    let deployed = eventually(Duration::from_secs(60), async || {
        // Only the old versions run yet: both services listed means both have profiles.
        let services = get_json(&format!("{}/api/v1/label/service_name/values", s.url), None).await;
        services == serde_json::json!(["cart", "shop"])
    })
    .await;
    assert!(deployed, "no profile of the old versions:\n{}", s.log());
    running.push(start(new_shop.2, new_shop.3).await);
    running.push(start(new_cart.2, new_cart.3).await);
    let url = format!("{}/api/v1/regressions", s.url);
    // Both services compared with enough profiles on each side (bounded wait).
    let mut answer = serde_json::Value::Null;
    let compared = eventually(Duration::from_secs(60 + 4 * min_profiles), async || {
        answer = get_json(&url, None).await;
        ["shop", "cart"].iter().all(|service| {
            latest(&answer, service).is_some_and(|c| {
                c["before"]["profiles"].as_u64() >= Some(min_profiles)
                    && c["after"]["profiles"].as_u64() >= Some(min_profiles)
            })
        })
    })
    .await;
    assert!(compared, "no comparisons: {answer:#}\n{}", s.log());
    eprintln!("{answer:#}");

    let shop = latest(&answer, "shop").unwrap();
    assert_eq!(shop["before"]["version"], "1.0", "{shop:#}");
    assert_eq!(shop["after"]["version"], "2.0", "{shop:#}");
    let regressions = shop["regressions"].as_array().unwrap();
    let encode = regressions
        .iter()
        .find(|r| r["function"] == "main.encode")
        .unwrap_or_else(|| panic!("main.encode not reported: {shop:#}"));
    let share = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    // encode does four times the work: its share rises by half or more (from about a
    // quarter: the loops' costs differ, and the runtime takes some).
    let (before, after) = (share(encode, "self_before"), share(encode, "self_after"));
    assert!((0.1..0.5).contains(&before), "{encode:#}");
    assert!(after > 1.5 * before && after - before > 0.1, "{encode:#}");
    assert!(
        encode["kind"].as_str().unwrap().contains("self"),
        "{encode:#}"
    );
    // parse and compute only shrank: never reported.
    for r in regressions {
        assert!(
            !["main.parse", "main.compute"].contains(&r["function"].as_str().unwrap()),
            "{r:#}"
        );
    }
    let cart = latest(&answer, "cart").unwrap();
    assert_eq!(
        cart["regressions"].as_array().unwrap().len(),
        0,
        "the same code under a new version label: {cart:#}"
    );
    // One service asked for.
    let only = get_json(&format!("{url}?service=cart"), None).await;
    assert!(
        only["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["service"] == "cart"),
        "{only:#}"
    );

    // The alert's metric.
    let metrics = reqwest::get(format!("{}/metrics", s.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let gauge = |service: &str| -> u64 {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("frostdb_regressions{")
                    && l.contains(&format!("service=\"{service}\""))
                    && l.contains(CPU)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no frostdb_regressions of {service}:\n{metrics}"))
    };
    assert!(gauge("shop") >= 1, "{metrics}");
    assert_eq!(gauge("cart"), 0, "{metrics}");

    // The CLI, on the stored data, between any two selectors.
    drop(running);
    drop(s);
    let compare = |service: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_frostdb"))
            .args(["compare", "--data"])
            .arg(dir.path().join("data"))
            .arg("--before")
            .arg(format!(
                "{CPU}{{service_name=\"{service}\",version=\"1.0\"}}"
            ))
            .arg("--after")
            .arg(format!(
                "{CPU}{{service_name=\"{service}\",version=\"2.0\"}}"
            ))
            .args(["--min-increase", "0.05", "--fail-on-regression"])
            .output()
            .unwrap()
    };
    let shop = compare("shop");
    let text = String::from_utf8_lossy(&shop.stdout);
    eprintln!("frostdb compare (shop):\n{text}");
    assert_eq!(
        shop.status.code(),
        Some(3),
        "{text}{}",
        String::from_utf8_lossy(&shop.stderr)
    );
    assert!(text.contains("main.encode"), "{text}");
    let cart = compare("cart");
    let text = String::from_utf8_lossy(&cart.stdout);
    eprintln!("frostdb compare (cart):\n{text}");
    assert_eq!(
        cart.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&cart.stderr)
    );
    assert!(text.contains("no regression"), "{text}");
}

/// Pushes `n` folded profiles of `service` at `version` to `tenant`, a second apart from
/// `start` (s): `encode` takes `encode` of every 100 samples (give or take 2), `parse` the
/// rest.
async fn push(s: &Server, tenant: &str, service: &str, version: &str, encode: i64, start: i64) {
    let client = reqwest::Client::new();
    for i in 0..12 {
        let e = encode + (i % 5) - 2;
        let body = format!("main;work;encode {e}\nmain;work;parse {}\n", 100 - e);
        let name = format!("{service}.cpu{{version=\"{version}\"}}");
        let r = client
            .post(format!(
                "{}/ingest?name={}&from={}&format=folded",
                s.url,
                common::enc(&name),
                start + i
            ))
            .header("X-Scope-OrgID", tenant)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_tenants_regressions_are_its_own_and_bad_requests_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("data"),
        Some("[regressions]\ninterval = \"1s\"\nmin_profiles = 10\n"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    push(&s, "team-a", "shop", "1.0", 30, now - 120).await;
    push(&s, "team-a", "shop", "2.0", 60, now - 60).await;
    // Two versions first seen within one minute, whose names sort the other way round
    // (1.10 before 1.9): ordered by their first profiles' times.
    let minute = now / 60 * 60 - 240;
    push(&s, "team-a", "api", "1.9", 30, minute).await;
    push(&s, "team-a", "api", "1.10", 60, minute + 12).await;
    // The same service name and versions, unchanged, in another tenant.
    push(&s, "team-b", "shop", "1.0", 30, now - 120).await;
    push(&s, "team-b", "shop", "2.0", 30, now - 60).await;
    let url = format!("{}/api/v1/regressions", s.url);
    let found = |answer: &serde_json::Value| {
        answer["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["service"] == "shop" && c["after"]["version"] == "2.0")
            .map(|c| c["regressions"].as_array().unwrap().len())
            .collect::<Vec<_>>()
    };
    let (mut a, mut b) = (serde_json::Value::Null, serde_json::Value::Null);
    let compared = eventually(Duration::from_secs(60), async || {
        a = get_json(&url, Some("team-a")).await;
        b = get_json(&url, Some("team-b")).await;
        let api = a["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["service"] == "api");
        !found(&a).is_empty() && !found(&b).is_empty() && api
    })
    .await;
    assert!(compared, "{a:#}\n{b:#}\n{}", s.log());
    let api = get_json(&format!("{url}?service=api"), Some("team-a")).await;
    let api = &api["comparisons"][0];
    assert_eq!(
        (&api["before"]["version"], &api["after"]["version"]),
        (&serde_json::json!("1.9"), &serde_json::json!("1.10")),
        "{api:#}"
    );
    assert_eq!(api["regressions"][0]["function"], "encode", "{api:#}");
    let shop = get_json(&format!("{url}?service=shop"), Some("team-a")).await;
    assert_eq!(
        shop["comparisons"][0]["regressions"][0]["function"], "encode",
        "{shop:#}"
    );
    assert!(found(&a).iter().all(|n| *n >= 1), "{a:#}");
    assert!(found(&b).iter().all(|n| *n == 0), "{b:#}");
    // Another tenant, and the default one, see none of them.
    for other in [Some("team-c"), None] {
        let none = get_json(&url, other).await;
        assert_eq!(none["comparisons"], serde_json::json!([]), "{none:#}");
    }
    // The web page lists it, and its link opens the diff of the two versions.
    if let Some(python) = common::venv_python("playwright")
        && common::have("chromium", "--version")
    {
        let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/e2e");
        let out = tokio::process::Command::new(&python)
            .arg(common::e2e_script("regressions_web.py"))
            .args([&s.url, "team-a", "shop", "encode", "1.0", "2.0"])
            .arg(&shots)
            .output()
            .await
            .unwrap();
        common::assert_ran(&out, "regressions_web.py");
    }
    // Hostile or mistaken requests: refused early, naming what is wrong.
    for (query, says) in [
        (format!("service={}", "s".repeat(5000)), "4096"),
        ("bogus=1".to_owned(), "bogus"),
    ] {
        let (status, body) = common::get(&format!("{url}?{query}"), Some("team-a")).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.contains(says), "{body}");
    }
}
