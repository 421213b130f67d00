//! The server against hostile and buggy clients: each test is an attack (or a buggy
//! client's habit) that once crashed, hung or exhausted the server, and asserts that the
//! server refuses it early with a 4xx (or 503 for load) naming the limit, and keeps
//! answering everyone else.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, enc, eventually, get, get_json, metric_in, post_json, testdata};

/// A request on a raw socket: what the server answered (status line, headers, body).
pub(crate) fn raw(url: &str, request: &[u8]) -> String {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The JSON body of a raw answer.
fn json_body(answer: &str) -> serde_json::Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

async fn push_pprof(s: &Server, tenant: &str, name: &str, body: Vec<u8>) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("{}/ingest?name={}&format=pprof", s.url, enc(name)))
        .header("X-Scope-OrgID", tenant)
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Stores a real Go CPU profile in the default tenant, so that it has tables to query.
async fn push_go_cpu(s: &Server) {
    push_go_cpu_for(s, "anonymous").await;
}

/// Stores a real Go CPU profile in `tenant`.
async fn push_go_cpu_for(s: &Server, tenant: &str) {
    let (status, body) = push_pprof(
        s,
        tenant,
        "app.cpu",
        testdata("pprof/pyroscope__go-cpu.pb.gz"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_cross_join_neither_starves_the_server_nor_outlives_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nrequest_timeout_secs = 3\nshutdown_grace_secs = 2\n"),
    );
    push_go_cpu(&s).await;
    // Hours of work each, more of them than the server has cores.
    let endless = "SELECT count(*) FROM generate_series(1, 1000000) a CROSS JOIN generate_series(1, 1000000) b";
    let queries: Vec<_> = (0..4)
        .map(|_| {
            let url = format!("{}/api/v1/sql?q={}", s.url, enc(endless));
            tokio::spawn(async move {
                let started = Instant::now();
                let (status, body) = get(&url, None).await;
                (status, body, started.elapsed())
            })
        })
        .collect();
    // While they run, health, queries of stored data and pushes answer.
    for _ in 0..5 {
        assert_eq!(get(&format!("{}/healthz", s.url), None).await.0, 200);
        let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
        assert!(!types.as_array().unwrap().is_empty());
        let (status, _) = push_pprof(
            &s,
            "other",
            "app.cpu",
            testdata("pprof/pyroscope__go-cpu.pb.gz"),
        )
        .await;
        assert_eq!(status, 200);
    }
    for q in queries {
        let (status, body, _) = q.await.unwrap();
        // Cancelled at its time limit (408), or refused for load before it began (503).
        assert!(matches!(status, 408 | 503), "{status} {body}");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            json["error"].as_str().unwrap().contains("limits."),
            "the answer names the limit: {body}"
        );
    }
    // The cancelled plans stopped: SIGTERM ends the server within its grace period.
    assert_eq!(
        s.terminate_within(Duration::from_secs(30)),
        Some(true),
        "the server did not stop on SIGTERM"
    );
}

/// One tenant's endless queries leave a query slot for the others: another tenant's query
/// is answered while they still run. (Six endless SQL queries of one tenant held the four
/// query slots, and another tenant's query waited for the first of them to reach its
/// deadline: 58 s at the default.)
#[tokio::test]
async fn one_tenants_endless_queries_leave_a_slot_for_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmax_concurrent_queries = 3\nrequest_timeout_secs = 20\nshutdown_grace_secs = 2\n",
        ),
    );
    push_go_cpu(&s).await;
    push_go_cpu_for(&s, "other").await;
    let endless = "SELECT sum(value) FROM generate_series(1, 100000000000) AS t(value)";
    let queries: Vec<_> = (0..3)
        .map(|_| {
            let url = format!("{}/api/v1/sql?q={}", s.url, enc(endless));
            tokio::spawn(async move { get(&url, None).await })
        })
        .collect();
    // All three in: two run, the third waits for one of them (with every slot theirs,
    // three ran).
    assert!(
        eventually(Duration::from_secs(20), async || {
            gauge(&s, "frostdb_query_jobs_running").await
                + gauge(&s, "frostdb_query_jobs_waiting").await
                == 3
        })
        .await,
        "the endless queries never all arrived"
    );
    assert_eq!(gauge(&s, "frostdb_query_jobs_running").await, 2);
    let (status, body) = get(
        &format!(
            "{}/api/v1/sql?q={}",
            s.url,
            enc("SELECT count(*) AS n FROM samples")
        ),
        Some("other"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""n":"#), "{body}");
    assert!(
        queries.iter().all(|q| !q.is_finished()),
        "the other tenant was answered only once an endless query ended"
    );
    for q in queries {
        q.abort();
    }
}

/// Statements whose operators copy values where no memory limit sees them are refused
/// by name before they run: an unnest copying a row's 5 MB value onto each of 100,000
/// elements (500 GB in one allocation: the process aborted), a cross join of a 64-bit
/// offset column (41 GB), a window over a whole partition (its input kept, uncharged),
/// and `to_char` writing 24 bytes for each 2 of its format (40 GB a batch) is charged as
/// it is made. Ordinary windows and joins still answer.
#[tokio::test]
async fn operators_that_copy_outside_the_pool_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_query_memory_bytes = 268435456\n"),
    );
    push_go_cpu(&s).await;
    let to_char = (0..3)
        .map(|k| format!("to_char(to_timestamp(v + {k}), repeat('%c', 2048)) AS c{k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let to_char = format!("SELECT {to_char} FROM generate_series(1, 8192) t(v)");
    let attacks = [
        (
            "SELECT unnest(l) AS v, s FROM (SELECT array_agg(v) AS l, repeat('x', 5000000 + min(v)) AS s FROM generate_series(1, 100000) t(v)) q",
            "UnnestExec",
        ),
        (
            "SELECT a.s FROM (SELECT arrow_cast(repeat('x', 5000000 + v), 'LargeUtf8') AS s FROM generate_series(1, 1) t(v)) a CROSS JOIN generate_series(1, 8192) b",
            "LargeUtf8",
        ),
        (
            "SELECT count(*) OVER () AS n, s FROM (SELECT repeat('x', 4096) AS s FROM generate_series(1, 100000000) t(v)) q",
            "WindowAggExec",
        ),
        (to_char.as_str(), "query memory limit"),
        // A growing window of lists: each row a list of its whole frame (5 GB and 42 s of
        // CPU at 32,768 rows, uncounted); and a frame reaching a billion rows ahead, all of
        // them buffered.
        (
            "SELECT count(l) AS n FROM (SELECT array_agg(v) OVER (ORDER BY v) AS l FROM generate_series(1, 32768) t(v)) q",
            "array_agg() as a window function",
        ),
        (
            "SELECT max(n) FROM (SELECT count(v) OVER (ORDER BY v ROWS BETWEEN CURRENT ROW AND 1000000000 FOLLOWING) AS n FROM generate_series(1, 100000000) t(v)) q",
            "1000000000 rows past the current row",
        ),
    ];
    for (q, why) in attacks {
        let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
        let shown = &body[..body.len().min(400)];
        assert!((400..500).contains(&status), "{q}: {status} {shown}");
        assert!(body.contains(why), "{q}: {shown}");
    }
    assert!(s.running(), "the server died");
    assert!(
        s.status("VmHWM") < 1 << 20,
        "peak RSS {} kB",
        s.status("VmHWM")
    );
    for q in [
        "SELECT v, sum(v) OVER (ORDER BY v) AS running FROM generate_series(1, 4) t(v)",
        "SELECT v, avg(v) OVER (ORDER BY v ROWS BETWEEN 2 PRECEDING AND 2 FOLLOWING) AS m FROM generate_series(1, 9) t(v)",
        "SELECT array_agg(v) AS l FROM generate_series(1, 4) t(v)",
        "SELECT count(*) AS n FROM generate_series(1, 3) a CROSS JOIN generate_series(1, 3) b",
    ] {
        let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
        assert_eq!(status, 200, "{q}: {body}");
    }
}

/// A window keeps the rows its frame may still reach in a buffer of its own, which no
/// memory pool saw: a frame reaching a billion rows back kept all of its input (three
/// million rows, 24 MB of values, answered under a 16 MiB limit). Its input is charged as
/// it is read: a 413 naming the limit and the window, and the server answers the next
/// query.
#[tokio::test]
async fn a_window_keeping_more_rows_than_the_limit_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_query_memory_bytes = 16777216\n"),
    );
    push_go_cpu(&s).await;
    let q = "SELECT max(n) AS n FROM (SELECT sum(v) OVER (ORDER BY v ROWS BETWEEN 1000000000 \
             PRECEDING AND CURRENT ROW) AS n FROM generate_series(1, 3000000) t(v)) q";
    let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("query memory limit") && body.contains("BoundedWindowAggExec"),
        "{body}"
    );
    assert!(s.running(), "the server died");
    let q = "SELECT max(n) AS n FROM (SELECT sum(v) OVER (ORDER BY v ROWS BETWEEN 2 PRECEDING \
             AND CURRENT ROW) AS n FROM generate_series(1, 1000) t(v)) q";
    let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("2997"), "{body}");
}

/// A query spilling past its part of `max_spill_bytes` (the bound over its query slots) is
/// a 413 naming the setting; before, every query shared one bound, so that one tenant's
/// spilling queries failed another's, and the refusal was a 500 quoting DataFusion's
/// `max_temp_directory_size`.
#[tokio::test]
async fn a_query_spilling_past_its_share_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmax_query_memory_bytes = 33554432\nmax_spill_bytes = 2097152\n\
             max_concurrent_queries = 2\n",
        ),
    );
    push_go_cpu(&s).await;
    // Four million rows (64 MB) sorted under 32 MiB: it spills, past its 1 MiB.
    let q = "SELECT max(r) AS r FROM (SELECT row_number() OVER (ORDER BY v * 7919 % 1000003) AS r \
             FROM generate_series(1, 4000000) t(v)) q";
    let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.contains("limits.max_spill_bytes") && body.contains("1024.0 KB"),
        "{body}"
    );
}

#[tokio::test]
async fn functions_that_amplify_memory_are_refused_and_the_server_lives() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_query_memory_bytes = 268435456\n"),
    );
    push_go_cpu(&s).await;
    // `||` doubling a string in each of 40 CTEs: 2^40 times its 64 bytes.
    let mut doubling = "WITH c0 AS (SELECT repeat('x', 64) AS s)".to_owned();
    for i in 1..=40 {
        doubling += &format!(", c{i} AS (SELECT s || s AS s FROM c{})", i - 1);
    }
    doubling += " SELECT length(s) FROM c40";
    let attacks = [
        "SELECT repeat('x', 1000000000)",
        "SELECT length(repeat('x', 1000000000)) FROM samples",
        "SELECT lpad('x', 2000000000)",
        // A literal repeated on every row of a batch.
        "SELECT length(concat(CAST(v AS VARCHAR), repeat('x', 100000))) FROM generate_series(1, 100000) t(v)",
        doubling.as_str(),
    ];
    let answers = futures::future::join_all(attacks.iter().map(|q| {
        let url = format!("{}/api/v1/sql?q={}", s.url, enc(q));
        async move { get(&url, None).await }
    }))
    .await;
    for (q, (status, body)) in attacks.iter().zip(answers) {
        let shown = &body[..body.len().min(300)];
        assert!((400..500).contains(&status), "{q}: {status} {shown}");
        assert!(body.contains("query memory limit"), "{q}: {shown}");
    }
    // Statements whose plans outgrow their text: 3,000 chained CTEs (planning them took
    // a minute and 6.5 GB), a sum of 60,000 terms (a tree as deep), refused before they
    // are planned.
    let chain = (1..=3_000).fold("WITH c0 AS (SELECT 1 AS s)".to_owned(), |sql, i| {
        sql + &format!(", c{i} AS (SELECT s + 1 AS s FROM c{})", i - 1)
    }) + " SELECT s FROM c3000";
    let sum = format!("SELECT 1{}", " + 1".repeat(60_000));
    for (sql, what) in [
        (chain, "queries (CTEs and subqueries)"),
        (sum, "expression terms"),
    ] {
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/sql", s.url))
            .body(sql)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
        let body = r.text().await.unwrap();
        assert!(body.contains(what), "{body}");
    }
    assert!(s.running(), "the server died");
    assert!(
        s.status("VmHWM") < 1 << 20,
        "peak RSS {} kB",
        s.status("VmHWM")
    );
    // Within the pool, the same functions answer.
    let ok = get_json(
        &format!(
            "{}/api/v1/sql?q={}",
            s.url,
            enc("SELECT repeat('ab', 3) AS r")
        ),
        None,
    )
    .await;
    assert_eq!(ok["rows"][0]["r"], "ababab");
}

/// A regular expression whose automaton is stepped at every byte (`[ -~]{5000}`: a
/// PikeVM of 5,005 states) is refused before it searches, however SQL runs it: a function
/// or `~` (planned as `regexp_like`) for the steps of its call, an operator's kernel
/// (`SIMILAR TO`, `LIKE`) at planning. Before, one call over 8,192 strings of 5 KB took
/// an hour on a query thread no deadline reaches. Everyday patterns answer.
#[tokio::test]
async fn patterns_searched_slower_than_linear_are_refused_and_the_server_lives() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(&dir.path().join("d"), None);
    push_go_cpu(&s).await;
    let rows = "FROM (SELECT repeat('a', 5000 + v % 2) AS s FROM generate_series(1, 8192) t(v))";
    let wide = "[ -~]{5000}";
    let underscores = "_".repeat(1500);
    let attacks = [
        (
            format!("SELECT count(*) {rows} WHERE regexp_like(s, '{wide}')"),
            "steps",
        ),
        (
            format!("SELECT sum(regexp_count(s, '{wide}')) {rows}"),
            "steps",
        ),
        (
            format!("SELECT count(*) {rows} WHERE s ~* '{wide}'"),
            "steps",
        ),
        (
            format!("SELECT count(*) {rows} WHERE s SIMILAR TO '{wide}'"),
            "linear",
        ),
        (
            format!("SELECT count(*) {rows} WHERE s LIKE '%{underscores}%'"),
            "linear",
        ),
    ];
    let answers = futures::future::join_all(attacks.iter().map(|(q, _)| {
        let url = format!("{}/api/v1/sql?q={}", s.url, enc(q));
        async move { get(&url, None).await }
    }))
    .await;
    for ((q, why), (status, body)) in attacks.iter().zip(answers) {
        let shown = &body[..body.len().min(300)];
        assert!((400..500).contains(&status), "{q}: {status} {shown}");
        assert!(body.contains(why), "{q}: {shown}");
    }
    assert!(s.running(), "the server died");
    let ok = get_json(
        &format!(
            "{}/api/v1/sql?q={}",
            s.url,
            enc("SELECT count(*) AS n FROM (SELECT CAST(v AS VARCHAR) AS s \
                 FROM generate_series(1, 100) t(v)) WHERE s ~ '^1[0-9]$' AND s LIKE '%5'")
        ),
        None,
    )
    .await;
    assert_eq!(ok["rows"][0]["n"], 1);
}

/// A selector's regex is costed by the steps matching one label value takes, before any
/// scan: `.*[ -~]{2000}x` steps 2,015 states at each byte of a value (29 ms a 2 KB value,
/// thousands of values a granule, between two deadline checks) and is refused with a 400
/// naming the bound: on Pyroscope's render, the query API and Connect's merge alike, as
/// all parse selectors alike. Everyday regexes answer.
#[tokio::test]
async fn selector_regexes_slower_than_linear_on_a_value_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("d"), None);
    push_go_cpu(&s).await;
    let selector = |matcher: &str| {
        format!("process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=~\"{matcher}\"}}")
    };
    let slow = selector(".*[ -~]{2000}x");
    let render = |sel: &str| format!("{}/pyroscope/render?query={}&from=0", s.url, enc(sel));
    let query = |sel: &str| format!("{}/api/v1/query?selector={}&from=0", s.url, enc(sel));
    for url in [render(&slow), query(&slow)] {
        let (status, body) = get(&url, None).await;
        assert_eq!(status, 400, "{url}: {body}");
        assert!(body.contains("steps to match one label value"), "{body}");
        assert!(body.contains("1048576"), "{body}");
    }
    let (status, body) = post_json(
        &format!("{}/querier.v1.QuerierService/SelectMergeStacktraces", s.url),
        &serde_json::json!({
            "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector": "{service_name=~\".*[ -~]{2000}x\"}",
            "start": 0,
            "end": i64::MAX / 1_000_000,
        }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("steps to match one label value"), "{body}");
    // Regexes of every day, a Unicode class included, answer with the profile.
    for ok in ["ap.*", "\\\\w+", "(?i)APP|web", "a.*|.*[ -~]{200}x"] {
        let fb = get_json(&render(&selector(ok)), None).await;
        let ticks = fb["flamebearer"]["numTicks"].as_u64();
        assert!(ticks.is_some_and(|t| t > 0), "{ok}: nothing selected: {fb}");
    }
}

/// One client address cannot take every connection (and the health checks' room with
/// them): past its share it is answered 503 naming `limits.max_connections_per_address`,
/// and a client at another address still gets in. Before, one client holding idle sockets
/// up to `max_connections` shut out everyone.
#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_connections = 64\nmax_connections_per_address = 8\n"),
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    let _held: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // The server accepts connections in the order they came: the ninth is refused.
    let answer = raw(
        &s.url,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    let error = json_body(&answer)["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains("limits.max_connections_per_address") && error.contains(" 8 "),
        "{error}"
    );
    // Another address on the loopback network is a client of its own.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(addr.parse().unwrap()).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    other.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[tokio::test]
async fn idle_and_slow_connections_are_closed_and_the_server_stays_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmax_connections = 200\nmax_connections_per_address = 200\nheader_read_timeout_secs = 2\nidle_timeout_secs = 2\n",
        ),
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    // More idle sockets than the server takes connections, and a slowloris that sends a
    // header byte now and then.
    let mut idle: Vec<TcpStream> = (0..1_100)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    // Over the limit a new connection is answered at once: 503 naming the limit, or (with
    // 64 refusals being answered already) closed unanswered.
    let answer = raw(
        &s.url,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    if answer.starts_with("HTTP/1.1 503") {
        assert!(
            json_body(&answer)["error"]
                .as_str()
                .unwrap()
                .contains("limits.max_connections")
        );
        assert!(answer.to_ascii_lowercase().contains("retry-after: 1"));
    } else {
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 200"),
            "{answer}"
        );
    }
    // The idle connections time out, and then the server answers as usual.
    let health = format!("{}/healthz", s.url);
    assert!(
        eventually(Duration::from_secs(60), async || {
            // While the flood holds every connection, a request may also meet a closed
            // socket: that is unreachable too, not a failure of the test.
            let answer = reqwest::Client::new().get(&health).send().await;
            answer.is_ok_and(|r| r.status() == 200)
        })
        .await,
        "the server stayed unreachable"
    );
    for socket in idle.iter_mut().take(50) {
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 1];
        // Closed by the server: end of stream (or a reset), not a timeout.
        match socket.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("an idle connection stayed open: {other:?}"),
        }
    }
    let _ = slow.write_all(b"X-Slow: 1\r\n");
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(
        !String::from_utf8_lossy(&rest).contains("200 OK"),
        "a slowloris request was served"
    );
}

/// A SQL answer of about `kib` KiB (a JSON row per KiB).
fn large_sql_request(kib: usize, close: bool) -> Vec<u8> {
    let q = format!("SELECT repeat('x', 1000) AS s FROM generate_series(1, {kib})");
    let connection = if close { "Connection: close\r\n" } else { "" };
    format!(
        "GET /api/v1/sql?q={} HTTP/1.1\r\nHost: localhost\r\n{connection}\r\n",
        enc(&q)
    )
    .into_bytes()
}

/// An answer read by [`read_slowly`].
struct SlowAnswer {
    /// The status line, lowercased.
    status: String,
    /// The body's bytes read, and its Content-Length.
    body: usize,
    length: usize,
    /// The connection, still open on the client's side.
    stream: tokio::net::TcpStream,
}

/// Sends `request` on a socket whose receive buffer is small, and reads its answer at about
/// `bytes_per_sec`, until its body is whole or the server ends the connection.
async fn read_slowly(addr: &str, request: &[u8], bytes_per_sec: usize) -> SlowAnswer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // The window the client grants stays small, so the answer waits in the server.
    socket.set_recv_buffer_size(16 << 10).unwrap();
    let mut stream = socket.connect(addr.parse().unwrap()).await.unwrap();
    stream.write_all(request).await.unwrap();
    let chunk = 8 << 10;
    let pause = Duration::from_secs_f64(chunk as f64 / bytes_per_sec as f64);
    let mut buf = vec![0u8; chunk];
    let mut answer = Vec::new();
    let parse = |answer: &[u8]| {
        let head_end = answer.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map(|v| v.trim().parse().unwrap())
            .expect("a Content-Length");
        let status = head.lines().next().unwrap_or("").to_owned();
        Some((status, answer.len() - head_end - 4, length))
    };
    loop {
        let read = stream.read(&mut buf).await.unwrap_or(0);
        let ended = read == 0;
        answer.extend_from_slice(&buf[..read]);
        if let Some((status, body, length)) = parse(&answer)
            && (ended || body >= length)
        {
            return SlowAnswer {
                status,
                body,
                length,
                stream,
            };
        }
        assert!(!ended, "the connection ended before an answer's head");
        // The client's pace: reading is what it does slowly, not what the test waits for.
        tokio::time::sleep(pause).await;
    }
}

/// A client reading a large answer slowly gets all of it, however short the idle and
/// header timeouts, as long as it takes some every idle period, whether the connection is
/// kept alive after it or the server closes it first (`Connection: close`). The answers
/// were cut mid-body (under a 200) once the handler had returned for longer than the idle
/// timeout and the grace period. And a connection kept alive is not closed while its
/// answer is still on its way: hyper's header timer started once the answer was all in
/// the kernel's buffers, and closed the socket with megabytes in them, which the kernel
/// then loses when the client's window stays shut for long (a reader with a large buffer).
#[tokio::test]
async fn a_slow_reader_gets_all_of_a_large_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nheader_read_timeout_secs = 1\nidle_timeout_secs = 2\nshutdown_grace_secs = 1\n",
        ),
    );
    // SQL answers a tenant that has stored something (requests without a tenant are
    // `anonymous`'s).
    push_go_cpu_for(&s, "anonymous").await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    let server_port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    for close in [false, true] {
        let started = Instant::now();
        // Twice what the kernel buffers of a socket's answer (tcp_wmem's 4 MiB by
        // default), read in some 8 s: the last 4 MiB take 4 s after the server wrote them.
        let answer = read_slowly(&addr, &large_sql_request(8_000, close), 1 << 20).await;
        assert!(
            answer.status.starts_with("http/1.1 200"),
            "{}",
            answer.status
        );
        assert!(answer.length > 8_000_000, "{}", answer.length);
        assert_eq!(
            answer.body,
            answer.length,
            "Connection: close {close}: the answer was cut after {:?}",
            started.elapsed()
        );
        if !close {
            let port = answer.stream.local_addr().unwrap().port();
            let inode = socket_inode(server_port, port).unwrap_or(0);
            assert!(
                inode != 0 && holds_socket(s.pid(), inode),
                "the server closed the connection while its answer was on its way"
            );
        }
    }
}

/// The inode of the socket of the connection between local port `local` and remote port
/// `remote` on the loopback (IPv4), from `/proc/net/tcp`.
fn socket_inode(local: u16, remote: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |f: &str| u16::from_str_radix(f.rsplit(':').next()?, 16).ok();
        (port(fields[1])? == local && port(fields[2])? == remote)
            .then(|| fields[9].parse().ok())
            .flatten()
    })
}

/// Whether process `pid` holds the socket of `inode` open.
fn holds_socket(pid: u32, inode: u64) -> bool {
    let link = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|target| target.to_string_lossy() == link)
}

/// A client that asks for a large answer and reads none of it does not hold its
/// connection: the server closes it once an idle period passes without the client taking
/// anything.
#[tokio::test]
async fn a_reader_that_takes_nothing_loses_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nheader_read_timeout_secs = 1\nidle_timeout_secs = 1\nshutdown_grace_secs = 1\n",
        ),
    );
    push_go_cpu_for(&s, "anonymous").await;
    let addr: std::net::SocketAddr = s.url.trim_start_matches("http://").parse().unwrap();
    use tokio::io::AsyncWriteExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 << 10).unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    stalled
        .write_all(&large_sql_request(8_000, false))
        .await
        .unwrap();
    let client_port = stalled.local_addr().unwrap().port();
    // Its inode is 0 until the server accepts it.
    let mut inode = 0;
    assert!(
        eventually(Duration::from_secs(10), async || {
            inode = socket_inode(addr.port(), client_port).unwrap_or(0);
            inode != 0 && holds_socket(s.pid(), inode)
        })
        .await,
        "the server never held the connection"
    );
    assert!(
        eventually(Duration::from_secs(30), async || !holds_socket(
            s.pid(),
            inode
        ))
        .await,
        "a client reading nothing kept its connection"
    );
    drop(stalled);
}

#[tokio::test]
async fn every_refusal_has_a_json_body_and_a_bounded_echo() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nrequest_timeout_secs = 2\n"),
    );
    // 414: a URI over the limit.
    // (Past 64 KiB hyper refuses the URI itself, with no body.)
    let long = format!(
        "GET /api/v1/labels?selector={} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        "a".repeat(30_000)
    );
    let answer = raw(&s.url, long.as_bytes());
    assert!(
        answer.starts_with("HTTP/1.1 414"),
        "{}",
        &answer[..80.min(answer.len())]
    );
    assert!(
        json_body(&answer)["error"]
            .as_str()
            .unwrap()
            .contains("max_uri_bytes")
    );
    // 400: a query string the route cannot read (axum's refusal was plain text).
    for query in [
        "/api/v1/query?selector=a&from=1&from=2",
        "/api/v1/query?selector=a&max_nodes=-1",
        "/api/v1/labels?from=1&from=2",
    ] {
        let (status, body) = get(&format!("{}{query}", s.url), None).await;
        assert_eq!(status, 400, "{query}: {body}");
        let error: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{query}: {e}: {body}"));
        assert_eq!(error["code"], "invalid_argument", "{query}: {body}");
        assert!(
            error["error"].as_str().unwrap().contains("query string")
                || error["error"].as_str().unwrap().contains("max"),
            "{query}: {body}"
        );
    }
    // 431: too many headers.
    let mut many =
        String::from("GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for i in 0..150 {
        many.push_str(&format!("X-H{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let answer = raw(&s.url, many.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(
        json_body(&answer)["error"]
            .as_str()
            .unwrap()
            .contains("max_headers")
    );
    // 408: a body that never finishes within the request's time.
    let addr = s.url.trim_start_matches("http://");
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(
        b"POST /ingest?name=a&format=pprof HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\npartial",
    )
    .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    let answer = String::from_utf8_lossy(&out);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        json_body(&answer)["error"]
            .as_str()
            .unwrap()
            .contains("request_timeout_secs")
    );
    // A bad selector of megabytes is not echoed back whole.
    let selector = format!(
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds{{{}",
        "x".repeat(4 << 20)
    );
    let r = reqwest::Client::new()
        .post(format!(
            "{}/querier.v1.QuerierService/SelectMergeStacktraces",
            s.url
        ))
        .header("Content-Type", "application/json")
        .body(serde_json::json!({"profileTypeID": "", "labelSelector": selector}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body = r.text().await.unwrap();
    assert!(body.len() < 10_000, "an error of {} bytes", body.len());
    // Parca's gRPC API asked in another protocol is told which it speaks (tonic's own answer
    // was a 400 with no body).
    let r = reqwest::Client::new()
        .post(format!(
            "{}/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw",
            s.url
        ))
        .header("Content-Type", "application/proto")
        .body(vec![0x12, 0x00])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let body: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("gRPC-Web"),
        "{body}"
    );
}

/// A request refused before its body is read to its end is answered `Connection: close`:
/// hyper closes such a connection after answering, and a client that kept it for its next
/// request (reqwest's pool does) had that request fail to send (found by the mutation test:
/// a malformed form refused on its first part, then the next push lost).
#[tokio::test]
async fn a_request_refused_before_its_body_is_read_closes_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("d"), None);
    let client = reqwest::Client::new();
    let mut body = b"--XYZ\r\nnot a header line\r\n\r\n".to_vec();
    body.resize(4 << 20, b'x');
    let r = client
        .post(format!("{}/ingest?name=app.cpu&from=1700000000", s.url))
        .header("Content-Type", "multipart/form-data; boundary=XYZ")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        r.headers().get("connection").map(|v| v.to_str().unwrap()),
        Some("close"),
        "{:?}",
        r.headers()
    );
    drop(r.text().await);
    // The same client's next request is answered (on a new connection).
    for _ in 0..3 {
        let (status, body) = push_pprof(
            &s,
            "anonymous",
            "app.cpu",
            testdata("pprof/pyroscope__go-cpu.pb.gz"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let r = client
        .post(format!(
            "{}/ingest?name=app.cpu&format=folded&from=1700000000",
            s.url
        ))
        .body("a;b 1\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers().get("connection").is_none(),
        "a body read whole keeps its connection"
    );
}

/// A server whose log cannot be written (stderr a pipe nobody reads any more, or a file on
/// a full disk) keeps storing and stops on SIGTERM. Each log line that failed was reported
/// with `eprintln!`, which panicked: the group commit's leader unwound holding the lead,
/// every later push of the tenant waited for good, and SIGTERM waited for them.
#[tokio::test]
async fn a_server_whose_log_cannot_be_written_keeps_storing() {
    let dir = tempfile::tempdir().unwrap();
    let addr = common::HeldAddr::new().release();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_frostdb"))
        .args(["serve", "--listen", &addr, "--data"])
        .arg(dir.path().join("d"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_listening(&mut child, &addr).await;
    // Nobody reads the log from here on.
    drop(child.stderr.take());
    let mut child = common::Reap(child);
    let url = format!("http://{addr}");
    let client = reqwest::Client::new();
    for i in 0..20 {
        // A new tenant each time: opening one logs a line per table it makes.
        let r = client
            .post(format!(
                "{url}/ingest?name=app.cpu&format=folded&from=1700000000"
            ))
            .header("X-Scope-OrgID", format!("t{i}"))
            .body(format!("main;work{i} 10\n"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("push {i}: {e}"));
        assert_eq!(r.status().as_u16(), 200, "push {i}");
    }
    let (status, body) = get(
        &format!(
            "{url}/api/v1/query?selector={}&format=top",
            enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
        ),
        Some("t19"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("work19"), "{body}");
    std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    let stopped = eventually(Duration::from_secs(30), async || {
        child.0.try_wait().unwrap().is_some()
    })
    .await;
    assert!(stopped, "the server did not stop on SIGTERM");
}

#[tokio::test]
async fn values_that_would_wrap_or_vanish_are_refused_where_they_enter() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("d"), None);
    let selector = enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}");
    for from in [
        "now%2B9223372036854775807ms",
        "-9223372036854775808",
        "9223372036854775807",
        // A character of two bytes where the sign goes: a panic, not a 400, before.
        "now%C3%A9",
        "now%C3%A91h",
    ] {
        let (status, body) = get(
            &format!("{}/api/v1/query?selector={selector}&from={from}", s.url),
            None,
        )
        .await;
        assert_eq!(status, 400, "from={from}: {body}");
    }
    // A flame graph of more nodes than Pyroscope's routes allow: its JSON would be sized
    // by the request, not by the cap.
    let (status, body) = get(
        &format!(
            "{}/api/v1/query?selector={selector}&max_nodes=1048577",
            s.url
        ),
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("max_nodes may be at most 1048576"), "{body}");
    for from in ["-9223372036854775808", "now%C3%A9"] {
        let (status, body) = get(
            &format!("{}/pyroscope/render?query={selector}&from={from}", s.url),
            None,
        )
        .await;
        assert_eq!(status, 400, "from={from}: {body}");
    }
    // A sample rate whose samples would be worth nothing.
    for rate in ["2000000000", "9223372036854775807"] {
        let r = reqwest::Client::new()
            .post(format!("{}/ingest?name=app&sampleRate={rate}", s.url))
            .body("main;work 10\n")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "sampleRate={rate}");
        assert!(r.text().await.unwrap().contains("sampleRate"));
    }
    // A profile name no selector can name: refused at push, not stored for ever unread.
    use base64::Engine;
    let raw =
        base64::engine::general_purpose::STANDARD.encode(testdata("pprof/pyroscope__go-cpu.pb.gz"));
    for name in ["a:b", "my app", "x{y}"] {
        let body = serde_json::json!({"series": [{
            "labels": [{"name": "__name__", "value": name}, {"name": "service_name", "value": "s"}],
            "samples": [{"rawProfile": raw}]
        }]});
        let r = reqwest::Client::new()
            .post(format!("{}/push.v1.PusherService/Push", s.url))
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{name:?}: {text}");
        assert!(text.contains("profile type"), "{name:?}: {text}");
    }
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), None).await;
    assert_eq!(types, serde_json::json!([]), "nothing was stored");
    // An aggregation the protos lack is not read as the default (a sum): the series would
    // answer another question than the one asked. (A format the protos lack is answered
    // with the flame graph, as Pyroscope does: Grafana's Drilldown sends newer formats and
    // reads a plain flame graph as "compute it yourself".)
    let (status, body) = post_json(
        &format!("{}/querier.v1.QuerierService/SelectSeries", s.url),
        &serde_json::json!({
            "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector": "{}",
            "start": 0,
            "end": 1000,
            "step": 1.0,
            "aggregation": "TIME_SERIES_AGGREGATION_TYPE_MEDIAN"
        }),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("TIME_SERIES_AGGREGATION_TYPE_MEDIAN"),
        "{body}"
    );
    // A setting dated far ahead would win over every later update.
    let r = reqwest::Client::new()
        .post(format!("{}/settings.v1.SettingsService/Set", s.url))
        .header("Content-Type", "application/json")
        .body(
            serde_json::json!({"setting": {"name": "x", "value": "1", "modifiedAt": i64::MAX.to_string()}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.unwrap().contains("modifiedAt"));
}

/// Selectors and settings are bounded where they enter, before anything is parsed or
/// decoded: a request's matchers together at most one selector's bytes (each value of a
/// list becomes a string, all kept while its scans run), a settings request at most a
/// tenant's settings (it is decoded on the thread that took it).
#[tokio::test]
async fn a_requests_selectors_and_a_settings_body_are_bounded_before_they_are_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("d"), None);
    push_go_cpu(&s).await;
    let post = |method: &str, body: String| {
        reqwest::Client::new()
            .post(format!("{}/{method}", s.url))
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    // 8 selectors of 200,000 bytes each: each within a selector's bound, not together.
    let values: Vec<String> = (0..20_000).map(|i| format!("{i:08x}")).collect();
    let list = format!("{{service_name=~\"{}\"}}", values.join("|"));
    let r = post(
        "querier.v1.QuerierService/LabelNames",
        serde_json::json!({"matchers": vec![list.clone(); 8]}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("matchers") && text.contains("more than 1048576"),
        "{text}"
    );
    // One of them answers.
    let r = post(
        "querier.v1.QuerierService/LabelNames",
        serde_json::json!({"matchers": [list]}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    // A settings request of 4 MiB, past the 1 MiB a tenant's settings may hold.
    let big = "x".repeat(4 << 20);
    let r = post(
        "settings.v1.SettingsService/Get",
        serde_json::json!({"unknown": big}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let text = r.text().await.unwrap();
    assert!(text.contains("limits.max_settings_bytes"), "{text}");
}

#[tokio::test]
async fn a_spray_of_tenants_under_1024_descriptors_neither_locks_out_nor_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let s = Server::start_with(&data, Some("[limits]\nmax_tenants = 300\n"), Some(1024));
    let cpu = testdata("pprof/pyroscope__go-cpu.pb.gz");
    let mut fds_peak = 0;
    for i in 0..300 {
        let (status, body) = push_pprof(&s, &format!("t{i}"), "app.cpu", cpu.clone()).await;
        assert_eq!(status, 200, "tenant t{i}: {body}");
        fds_peak = fds_peak.max(s.open_fds());
    }
    assert!(fds_peak < 1024, "{fds_peak} descriptors open");
    // Past max_tenants, a new tenant is refused by name; known ones still work.
    let (status, body) = push_pprof(&s, "one-too-many", "app.cpu", cpu.clone()).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("limits.max_tenants"), "{body}");
    let r = reqwest::Client::new()
        .post(format!("{}/settings.v1.SettingsService/Set", s.url))
        .header("X-Scope-OrgID", "another-new-one")
        .header("Content-Type", "application/json")
        .body(r#"{"setting": {"name": "x", "value": "1"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    // Every tenant's data is still there, closed or not.
    for i in [0, 150, 299] {
        let tenant = format!("t{i}");
        let types = get_json(&format!("{}/api/v1/profile_types", s.url), Some(&tenant)).await;
        assert!(!types.as_array().unwrap().is_empty(), "tenant {tenant}");
    }
    eprintln!("descriptors: peak {fds_peak} with 300 tenants");
    assert_eq!(s.terminate_within(Duration::from_secs(60)), Some(true));
    // And it starts again under the same limit.
    let s = Server::start_with(&data, Some("[limits]\nmax_tenants = 300\n"), Some(1024));
    let types = get_json(&format!("{}/api/v1/profile_types", s.url), Some("t7")).await;
    assert!(!types.as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_scrape_targets() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[[scrape]]\njob = \"secret-job\"\ntargets = [\"127.0.0.1:9\"]\ninterval = \"1h\"\nprofiles = [\"heap\"]\ntenant = \"team-a\"\n",
        ),
    );
    let mine = get_json(&format!("{}/api/v1/targets", s.url), Some("team-a")).await;
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(mine[0]["job"], "secret-job");
    for other in [None, Some("team-b")] {
        let theirs = get_json(&format!("{}/api/v1/targets", s.url), other).await;
        assert_eq!(
            theirs,
            serde_json::json!([]),
            "{other:?} sees team-a's targets"
        );
    }
}

/// A debug file upload is streamed to the object store in parts: it holds what it keeps in
/// flight of the memory budget, not every byte it sends. An upload larger than the whole
/// budget is taken, and pushes meanwhile are not refused for memory it never held.
#[tokio::test]
async fn an_upload_larger_than_the_memory_budget_streams_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmemory = \"128MiB\"\n"),
    );
    const SIZE: usize = 200 << 20;
    // What is not an ELF file is refused at its first bytes: nothing else is symbolized.
    let r = reqwest::Client::new()
        .put(format!("{}/api/v1/debuginfo/abcd1234", s.url))
        .body(vec![0u8; 1 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.unwrap().contains("not an ELF file"));
    // An ELF file's first bytes, then zeros (its build id unreadable, so taken as named).
    let mut file = b"\x7fELF".to_vec();
    file.resize(SIZE, 0);
    let upload = reqwest::Client::new()
        .put(format!("{}/api/v1/debuginfo/abcd1234", s.url))
        .header("Content-Length", SIZE.to_string())
        .body(file)
        .send();
    let push = push_pprof(
        &s,
        "anonymous",
        "app.cpu",
        testdata("pprof/pyroscope__go-cpu.pb.gz"),
    );
    let (uploaded, (pushed, answer)) = tokio::join!(upload, push);
    let uploaded = uploaded.unwrap();
    let status = uploaded.status().as_u16();
    let body = uploaded.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("\"bytes\":{SIZE}")), "{body}");
    assert_eq!(pushed, 200, "{answer}");
}

/// A pprof of `samples` samples, each its own root function calling one location of
/// `lines` inlined lines: few stacks, and `samples * lines` call paths.
fn few_stacks_of_many_frames(samples: u64, lines: u64) -> Vec<u8> {
    use frostdb_pprof::proto::{Function, Line, Location, Sample};
    let mut string_table: Vec<String> = ["", "cpu", "nanoseconds", "deep"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut function = vec![Function {
        id: 1,
        name: 3,
        system_name: 3,
        ..Function::default()
    }];
    let mut location = vec![Location {
        id: 1,
        line: (1..=lines)
            .map(|l| Line {
                function_id: 1,
                line: l as i64,
                column: 0,
            })
            .collect(),
        ..Location::default()
    }];
    let mut sample = Vec::new();
    for i in 0..samples {
        string_table.push(format!("root{i}"));
        let id = i + 2;
        function.push(Function {
            id,
            name: string_table.len() as i64 - 1,
            system_name: string_table.len() as i64 - 1,
            ..Function::default()
        });
        location.push(Location {
            id,
            line: vec![Line {
                function_id: id,
                line: 1,
                column: 0,
            }],
            ..Location::default()
        });
        sample.push(Sample {
            location_id: vec![1, id],
            value: vec![10],
            label: Vec::new(),
        });
    }
    cpu_pprof(string_table, function, location, sample)
}

/// A CPU profile (period 10) of these tables, encoded; `string_table[1..3]` are "cpu" and
/// "nanoseconds".
fn cpu_pprof(
    string_table: Vec<String>,
    function: Vec<frostdb_pprof::proto::Function>,
    location: Vec<frostdb_pprof::proto::Location>,
    sample: Vec<frostdb_pprof::proto::Sample>,
) -> Vec<u8> {
    use frostdb_pprof::proto::{Profile, ValueType};
    use prost::Message;
    let cpu = ValueType { r#type: 1, unit: 2 };
    Profile {
        sample_type: vec![cpu],
        sample,
        location,
        function,
        string_table,
        period_type: Some(cpu),
        period: 10,
        ..Profile::default()
    }
    .encode_to_vec()
}

/// A merge of few stacks of many frames each (here 4,000 stacks of a thousand inlined
/// frames: four million call paths) is charged its call tree, not its stack count: under a
/// small budget it is refused with a 413 naming what it needed (more than the whole
/// budget, so no retry helps), before any tree is built,
/// and the server answers the next query. (Charged per stack, it built four million nodes
/// past the budget; a hundred thousand stacks of 4,000 frames took the process down.)
#[tokio::test]
async fn a_flame_graph_of_few_stacks_and_many_frames_is_charged_its_tree() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmemory = \"256MiB\"\n"),
    );
    let (status, body) = push_pprof(
        &s,
        "anonymous",
        "deep.cpu",
        few_stacks_of_many_frames(4_000, 1_000),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = push_pprof(
        &s,
        "anonymous",
        "small.cpu",
        few_stacks_of_many_frames(3, 2),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let query = |name: &str| {
        format!(
            "{}/api/v1/query?selector={}&format=flamegraph&max_nodes=1",
            s.url,
            enc(&format!(
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=\"{name}\"}}"
            ))
        )
    };
    let (status, body) = get(&query("deep"), None).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("building the report"), "{body}");
    assert!(body.contains("whole budget (limits.memory"), "{body}");
    let (status, body) = get(&query("small"), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total\":30"), "{body}");
}

/// A pprof of one sample whose stack is one function of a `name_bytes`-byte name, `depth`
/// times over (recursion).
fn a_long_name_down_a_deep_stack(name_bytes: usize, depth: usize) -> Vec<u8> {
    use frostdb_pprof::proto::{Function, Line, Location, Sample};
    let string_table = vec![
        String::new(),
        "cpu".into(),
        "nanoseconds".into(),
        "f".repeat(name_bytes),
    ];
    let sample = vec![Sample {
        location_id: vec![1; depth],
        value: vec![10],
        label: Vec::new(),
    }];
    let location = vec![Location {
        id: 1,
        line: vec![Line {
            function_id: 1,
            line: 1,
            column: 0,
        }],
        ..Location::default()
    }];
    let function = vec![Function {
        id: 1,
        name: 3,
        system_name: 3,
        ..Function::default()
    }];
    cpu_pprof(string_table, function, location, sample)
}

/// A report writes a frame's name at every node it is: one function named with 64 KiB
/// (the most a frame's name may have), 4,000 deep, is 262 MB of flame graph from a small
/// push and one query (charged 100 bytes a frame, it was built past any budget; with a
/// megabyte's name, before names were bounded, 4 GB). It is charged its names: refused
/// with a 413 naming the report under a 128 MiB budget, and the server answers the next
/// query, its memory flat.
#[tokio::test]
async fn a_report_is_charged_the_names_it_writes_at_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmemory = \"128MiB\"\n"),
    );
    for (name, profile) in [
        ("long", a_long_name_down_a_deep_stack(65_535, 4_000)),
        ("short", a_long_name_down_a_deep_stack(10, 40)),
    ] {
        let (status, body) = push_pprof(&s, "anonymous", &format!("{name}.cpu"), profile).await;
        assert_eq!(status, 200, "{body}");
    }
    let query = |name: &str, format: &str| {
        format!(
            "{}/api/v1/query?selector={}&format={format}&max_nodes=8192",
            s.url,
            enc(&format!(
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=\"{name}\"}}"
            ))
        )
    };
    for format in ["flamegraph", "folded"] {
        let (status, body) = get(&query("long", format), None).await;
        assert_eq!(status, 413, "{}", &body[..body.len().min(300)]);
        assert!(body.contains("building the report"), "{body}");
    }
    let (status, body) = get(&query("short", "flamegraph"), None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"total\":10"), "{body}");
    assert!(s.running(), "the server died");
    assert!(
        s.status("VmHWM") < 1 << 20,
        "peak RSS {} kB",
        s.status("VmHWM")
    );
}

/// Pyroscope's render builds its flame graph in one job of the query lane and reads its
/// timelines and writes its JSON in a second: between the two, the request waits for the
/// lane with its flame graph. The flame graph kept its merge's reservation only for the
/// first job, so renders queued behind one another held flame graphs the budget did not
/// see (40 of them, 3.9 GB under a 1 GiB budget). Kept reserved until the JSON is written,
/// renders past the budget are refused naming it, and the others answer whole.
#[tokio::test]
async fn renders_waiting_for_their_second_job_keep_their_flame_graphs_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmemory = \"128MiB\"\nmax_concurrent_queries = 1\n"),
    );
    // A report of 48 MB of names: one fits the budget, three do not.
    let (status, body) = push_pprof(
        &s,
        "anonymous",
        "long.cpu",
        a_long_name_down_a_deep_stack(16_000, 3_000),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let url = format!(
        "{}/pyroscope/render?query={}&from=0&until=now",
        s.url,
        enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"long\"}")
    );
    let before = gauge(&s, "frostdb_memory_reserved_bytes").await;
    // One query slot: the renders' first jobs queue behind one another, and each one's
    // second job behind the first jobs that came after it.
    let renders: Vec<_> = (0..12)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url, None).await })
        })
        .collect();
    let (mut answered, mut refused) = (0, 0);
    for render in renders {
        let (status, body) = render.await.unwrap();
        match status {
            200 => {
                assert!(body.contains(&"f".repeat(16_000)), "not the flame graph");
                answered += 1;
            }
            _ => {
                assert!(
                    body.contains("building the report") && body.contains("memory"),
                    "{status}: {}",
                    &body[..body.len().min(400)]
                );
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "{answered} renders of 48 MB answered under a 128 MiB budget, none refused"
    );
    assert!(answered > 0, "every render was refused");
    assert!(
        eventually(Duration::from_secs(30), async || {
            gauge(&s, "frostdb_memory_reserved_bytes").await < before + (1 << 20)
        })
        .await,
        "the renders' memory was not given back"
    );
    let (status, _) = get(&url, None).await;
    assert_eq!(status, 200, "a render alone answers");
}

/// A gzipped "pprof" of 120 KB that inflates to 120 MiB (empty samples, `12 00`).
fn gzip_bomb() -> Vec<u8> {
    use flate2::write::GzEncoder;
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk: Vec<u8> = std::iter::repeat_n([0x12u8, 0x00], 1 << 20)
        .flatten()
        .collect();
    for _ in 0..60 {
        gz.write_all(&chunk).unwrap();
    }
    gz.finish().unwrap()
}

/// A pprof gzipped inside the body (no Content-Encoding: the budget sees 120 KB) that
/// inflates to 120 MiB: the inflated bytes are charged to the request before they are made,
/// so under a 64 MiB budget it is answered 413 naming them (more than the whole budget:
/// a retry would be refused again), not inflated and parsed
/// uncharged (64 such requests at once were 8 GiB the budget never saw). A usual push
/// after it is stored.
#[tokio::test]
async fn a_profile_gzipped_inside_the_body_is_charged_what_it_inflates_to() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmemory = \"64MiB\"\n"),
    );
    let bomb = gzip_bomb();
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    let (status, answer) = push_pprof(&s, "anonymous", "app.cpu", bomb).await;
    assert_eq!(status, 413, "{answer}");
    assert!(answer.contains("gunzipping a profile"), "{answer}");
    assert!(answer.contains("can never be served"), "{answer}");
    let (status, answer) = push_pprof(
        &s,
        "anonymous",
        "app.cpu",
        testdata("pprof/pyroscope__go-cpu.pb.gz"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

/// An SQL answer is cut to the rows that fit its byte cap (64 MiB), not to the whole batch
/// that crossed it: 2,000 rows of 60 KB (120 MB, one batch) answer about 1,100 of them,
/// marked truncated.
#[tokio::test]
async fn an_sql_answer_keeps_only_the_rows_that_fit_its_byte_cap() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("d"), None);
    push_go_cpu(&s).await;
    let q = "SELECT concat(CAST(v AS VARCHAR), repeat('x', 60000 + v % 2)) AS s FROM generate_series(1, 2000) t(v)";
    let (status, body) = get(&format!("{}/api/v1/sql?q={}", s.url, enc(q)), None).await;
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    assert!(body.len() < 70 << 20, "{} bytes answered", body.len());
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = answer["rows"].as_array().unwrap().len();
    assert!((500..2_000).contains(&rows), "{rows} rows");
    assert_eq!(answer["truncated"], true);
}

/// Column names repeat in every row of a SQL answer's JSON: a 200 KB query naming its one
/// column with 200 KB answers 100,000 rows of 8 bytes in Arrow, far under that cap, and
/// 20 GB as JSON. The JSON is capped too (64 MiB): the rows that fit, marked truncated,
/// and the server's memory stays flat.
#[tokio::test]
async fn an_sql_answer_is_capped_in_json_not_only_in_arrow() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(&dir.path().join("d"), None);
    push_go_cpu(&s).await;
    let alias = "a".repeat(200_000);
    let q = format!("SELECT 1 AS \"{alias}\" FROM generate_series(1, 100000)");
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/sql", s.url))
        .body(q)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.unwrap();
    assert!(body.len() <= 64 << 20, "{} bytes answered", body.len());
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = answer["rows"].as_array().unwrap();
    // 64 MiB of rows of 200 KB: 335 whole rows, each the one column.
    assert!((300..=335).contains(&rows.len()), "{} rows", rows.len());
    assert!(rows.iter().all(|r| r[alias.as_str()] == 1));
    assert_eq!(answer["truncated"], true);
    assert!(s.running(), "the server died");
    assert!(
        s.status("VmHWM") < 1 << 20,
        "peak RSS {} kB",
        s.status("VmHWM")
    );
}

/// A scrape target answering a gzip bomb (a pprof that inflates to 120 MiB from 120 KB) is
/// charged what it inflates to, as a push of it is: under a 64 MiB budget the scrape fails
/// naming the budget, and the target shows it, instead of 120 MiB made uncharged each
/// interval by every such target.
#[tokio::test]
async fn a_scrape_target_answering_a_bomb_is_charged_what_it_inflates_to() {
    let bomb = gzip_bomb();
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        bomb.len()
    )
    .into_bytes();
    answer.extend_from_slice(&bomb);
    let (at, _) = target_answering(answer).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[limits]\nmemory = \"64MiB\"\n\n[[scrape]]\njob = \"bomb\"\ntargets = [\"{at}\"]\ninterval = \"1h\"\nprofiles = [\"heap\"]\n"
    );
    let s = Server::start(&dir.path().join("d"), Some(&config));
    let last = first_scrape_failure(&s).await;
    let error = last[0]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("limits.memory"), "{error}");
    assert_eq!(last[0]["scrapes"], 0, "{last}");
}

/// The server's scrape targets once the first has failed (within a minute).
async fn first_scrape_failure(s: &Server) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let failed = eventually(Duration::from_secs(60), async || {
        last = get_json(&format!("{}/api/v1/targets", s.url), None).await;
        last[0]["failures"].as_u64().unwrap_or(0) > 0
    })
    .await;
    assert!(failed, "the scrape did not fail: {last}\n{}", s.log());
    last
}

/// A scrape target on a port of its own (its address), answering every request `answer`
/// (a whole HTTP answer), and the count of requests it was sent.
async fn target_answering(
    answer: Vec<u8>,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let target = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = target.local_addr().unwrap();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = asked.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = target.accept().await else {
                return;
            };
            let (answer, count) = (answer.clone(), count.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = c.write_all(&answer).await;
            });
        }
    });
    (at, asked)
}

/// A target's password (`user:password@host:port`, the only way to give a scrape target a
/// credential) reaches the target as basic authentication, and nothing else: the targets
/// API, the `instance` label and the server's log name the address alone. They showed,
/// stored and logged the password.
#[tokio::test]
async fn a_scrape_targets_password_is_sent_and_shown_nowhere() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let heads: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let seen = heads.clone();
    let heap = testdata("pprof/pyroscope__go-cpu.pb.gz");
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let (seen, heap) = (seen.clone(), heap.clone());
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                seen.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&request).into_owned());
                let mut answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    heap.len()
                )
                .into_bytes();
                answer.extend_from_slice(&heap);
                let _ = c.write_all(&answer).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[scrape]]\njob = \"auth\"\ntargets = [\"u:s3cret@{at}\"]\ninterval = \"1h\"\nprofiles = [\"heap\"]\n"
    );
    let s = Server::start(&dir.path().join("d"), Some(&config));
    let mut targets = serde_json::Value::Null;
    let scraped = eventually(Duration::from_secs(60), async || {
        targets = get_json(&format!("{}/api/v1/targets", s.url), None).await;
        targets[0]["scrapes"].as_u64().unwrap_or(0) > 0
    })
    .await;
    assert!(scraped, "{targets}\n{}", s.log());
    let head = heads.lock().unwrap()[0].to_ascii_lowercase();
    assert!(
        head.contains("authorization: basic dtpzm2nyzxq="),
        "the target was sent its credential: {head}"
    );
    assert_eq!(targets[0]["instance"], at.to_string(), "{targets}");
    let (_, instances) = get(&format!("{}/api/v1/label/instance/values", s.url), None).await;
    assert!(instances.contains(&at.to_string()), "{instances}");
    for (what, text) in [
        ("the targets API", targets.to_string()),
        ("the instance label", instances),
        ("the server's log", s.log()),
    ] {
        assert!(
            !text.contains("s3cret"),
            "{what} shows the password: {text}"
        );
    }
}

/// A scrape target redirecting elsewhere (another host, here another port) is not
/// followed: the target shows why, and the other address is never asked. Before, the
/// server followed up to 10 redirects to any host, and showed what it found there.
#[tokio::test]
async fn a_scrape_target_redirecting_to_another_host_is_not_followed() {
    let (elsewhere, asked) = target_answering(
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
    )
    .await;
    let (at, _) = target_answering(
        format!(
            "HTTP/1.1 302 Found\r\nLocation: http://{elsewhere}/latest/meta-data/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .into_bytes(),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[[scrape]]\njob = \"redirect\"\ntargets = [\"{at}\"]\ninterval = \"1h\"\nprofiles = [\"heap\"]\n"
    );
    let s = Server::start(&dir.path().join("d"), Some(&config));
    let last = first_scrape_failure(&s).await;
    let error = last[0]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("another host"), "{error}");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// Small JSON documents carried by larger requests (a form's `sample_type_config`, a
/// recording rule) are refused on their size before they are parsed, and the form's part is
/// checked without being built: a 15 MB array of zeros in either made a tree of half a
/// gigabyte, outside the memory budget and on the threads that accept requests.
#[tokio::test]
async fn small_json_documents_are_refused_on_their_size_before_they_are_parsed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let heap = testdata("pprof/goapp__go119-heap.pb.gz");
    let form = |config: Vec<u8>| {
        reqwest::multipart::Form::new()
            .part(
                "profile",
                reqwest::multipart::Part::bytes(heap.clone()).file_name("profile.pprof"),
            )
            .part(
                "sample_type_config",
                reqwest::multipart::Part::bytes(config),
            )
    };
    let send = |config: Vec<u8>| {
        reqwest::Client::new()
            .post(format!("{}/ingest?name=goheap&format=pprof", s.url))
            .multipart(form(config))
            .send()
    };
    let zeros = |n: usize| {
        let mut json = br#"{"a":["#.to_vec();
        json.extend(b"0,".repeat(n));
        json.extend(b"0]}");
        json
    };
    let r = send(zeros(1 << 20)).await.unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("sample_type_config part has 2097161 bytes"),
        "{text}"
    );
    // Within the limit, any object is read past (its members are not needed).
    let r = send(zeros(30_000)).await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let r = send(b"[1, 2]".to_vec()).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("sample_type_config is not a JSON object"),
    );

    let put = |body: Vec<u8>| {
        reqwest::Client::new()
            .put(format!("{}/api/v1/rules/r", s.url))
            .body(body)
            .send()
    };
    let mut rule = br#"{"name":"r","profile_type":"a:b:c:d:e","keep_labels":["#.to_vec();
    rule.extend(br#""","#.repeat(100_000));
    rule.extend(br#"""]}"#);
    let r = put(rule).await.unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("the recording rule has 300058 bytes"),
        "{text}"
    );
    let r = put(
        br#"{"name":"r","profile_type":"process_cpu:cpu:nanoseconds:cpu:nanoseconds"}"#.to_vec(),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
}

/// The server's `name` gauge from `/metrics`.
async fn gauge(s: &Server, name: &str) -> u64 {
    let (status, text) = get(&format!("{}/metrics", s.url), None).await;
    assert_eq!(status, 200, "{text}");
    metric_in(&text, name).unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// An answer its client does not read stays in the server for as long as the connection
/// lasts. It was counted in the memory budget only while it was made, so clients that ask
/// for large answers and never read them held gigabytes the budget did not see: it is held
/// until the answer is sent or its connection closes.
#[tokio::test]
async fn an_answer_nobody_reads_holds_its_memory_until_its_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("d"), None);
    push_go_cpu(&s).await;
    let before = gauge(&s, "frostdb_memory_reserved_bytes").await;
    // A 30 MB answer, of which the client reads a few bytes.
    let q = "SELECT repeat('x', 1000) AS s FROM generate_series(1, 30000)";
    let addr = s.url.trim_start_matches("http://");
    let mut socket = TcpStream::connect(addr).unwrap();
    write!(
        socket,
        "GET /api/v1/sql?q={} HTTP/1.1\r\nHost: {addr}\r\n\r\n",
        enc(q)
    )
    .unwrap();
    let mut head = [0; 12];
    socket.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let held = 25 << 20;
    assert!(
        eventually(Duration::from_secs(30), async || {
            gauge(&s, "frostdb_memory_reserved_bytes").await >= before + held
        })
        .await,
        "the unread answer is not held in the budget"
    );
    drop(socket);
    assert!(
        eventually(Duration::from_secs(30), async || {
            gauge(&s, "frostdb_memory_reserved_bytes").await < before + (1 << 20)
        })
        .await,
        "the answer's memory was not given back when its connection closed"
    );
}

/// A tenant's debug files are bounded in all (`limits.max_debuginfo_bytes`), uploads in
/// progress counted as announced: any number of build ids of up to 1 GB each filled the
/// disk. Another tenant's quota is its own.
#[tokio::test]
async fn debug_files_are_bounded_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_debuginfo_bytes = 3000000\n"),
    );
    let upload = |tenant: &'static str, build_id: &'static str, size: usize| {
        let mut file = b"\x7fELF".to_vec();
        file.resize(size, 0);
        let url = format!("{}/api/v1/debuginfo/{build_id}", s.url);
        async move {
            let r = reqwest::Client::new()
                .put(url)
                .header("X-Scope-OrgID", tenant)
                .body(file)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(upload("a", "aaaa0001", 1 << 20).await.0, 200);
    assert_eq!(upload("a", "aaaa0002", 1 << 20).await.0, 200);
    let (status, text) = upload("a", "aaaa0003", 1 << 20).await;
    assert_eq!(status, 413, "{text}");
    assert!(
        text.contains("take 2097152 bytes") && text.contains("limits.max_debuginfo_bytes"),
        "{text}"
    );
    // Replacing a file counts the new one, not both.
    let (status, text) = upload("a", "aaaa0002", 1 << 20).await;
    assert_eq!(status, 409, "{text}");
    let r = reqwest::Client::new()
        .put(format!("{}/api/v1/debuginfo/aaaa0002?force=true", s.url))
        .header("X-Scope-OrgID", "a")
        .body({
            let mut file = b"\x7fELF".to_vec();
            file.resize(900_000, 0);
            file
        })
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    // Another tenant is not refused for a's files.
    assert_eq!(upload("b", "aaaa0003", 2 << 20).await.0, 200);
}

/// Requests whose bodies never come are each charged what a request in flight holds, so a
/// flood of them is refused by the memory budget at once (429 naming the tenant's share of
/// it, with `Retry-After`) rather than held until the deadline: under a 4 MiB budget, 400
/// such requests cannot all be in flight.
/// Before, an empty request cost the budget nothing, and 256 streams on each of thousands
/// of HTTP/2 connections were gigabytes the budget never saw.
#[tokio::test]
async fn requests_in_flight_are_charged_and_a_flood_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmemory = \"4MiB\"\nmax_connections = 1000\nmax_connections_per_address = 1000\n",
        ),
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    let stalled: Vec<TcpStream> = (0..400)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            c.write_all(
                b"POST /ingest?name=x.cpu&format=pprof HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n",
            )
            .unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c
        })
        .collect();
    // The last ones sent are refused by the budget at once, long before the deadline.
    let refused = stalled.into_iter().rev().take(10).find_map(|mut c| {
        let mut head = [0u8; 512];
        let n = c.read(&mut head).unwrap_or(0);
        let answer = String::from_utf8_lossy(&head[..n]).into_owned();
        answer.starts_with("HTTP/1.1 429").then_some(answer)
    });
    let refused = refused.expect("none of the last 10 of 400 requests was refused");
    assert!(
        refused.contains("share of the server's memory budget"),
        "{refused}"
    );
    assert!(
        refused.contains("Retry-After") || refused.contains("retry-after"),
        "{refused}"
    );
}

/// One tenant's requests hold at most three quarters of the memory budget: another
/// tenant's push is stored while the first holds all it may, with bodies stalled midway
/// (each holds what it sent until the deadline), and the first is refused 429 naming its
/// share. Before, a sweep against the release server (256 MiB budget) had one tenant's
/// stalled uploads take the whole budget, and every other tenant's push was answered 503
/// for as long as they lasted.
#[tokio::test]
async fn one_tenants_stalled_bodies_leave_the_others_room() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmemory = \"64MiB\"\nmax_connections = 1000\nmax_connections_per_address = 1000\n",
        ),
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    // Bodies of which 4 MiB each arrive, then requests whose bodies never come (each
    // charged what a request in flight holds), to fill what the first leave: more than the
    // whole budget.
    let stall = |sent: usize| {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(
            b"POST /ingest?name=x.cpu&format=pprof HTTP/1.1\r\nHost: localhost\r\n\
              X-Scope-OrgID: hog\r\nContent-Length: 16000000\r\n\r\n",
        )
        .unwrap();
        // A body refused midway may have its connection closed under the write.
        let _ = c.write_all(&vec![0u8; sent]);
        c
    };
    let mut hog: Vec<TcpStream> = (0..15).map(|_| stall(4 << 20)).collect();
    hog.extend((0..400).map(|_| stall(0)));
    // The last of them no longer fit the tenant's share.
    let mut last = hog.last().unwrap();
    let mut answer = Vec::new();
    let _ = last.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.contains("tenant \\\"hog\\\"'s share of the server's memory budget"),
        "{answer}"
    );
    assert!(
        answer.to_ascii_lowercase().contains("retry-after"),
        "{answer}"
    );
    // Another tenant's push is stored meanwhile; the first tenant's is refused as its
    // stalled ones were, whether its body or its decoding finds the share full.
    let cpu = testdata("pprof/goapp__go119-cpu-2s.pb.gz");
    let (status, body) = push_pprof(&s, "victim", "app.cpu", cpu.clone()).await;
    assert_eq!(status, 200, "{body}");
    // It holds its share and no more, as /metrics shows.
    let held = gauge(&s, "frostdb_tenant_memory_reserved_bytes{tenant=\"hog\"}").await;
    assert!((40 << 20..=48 << 20).contains(&held), "{held}");
    let (status, body) = push_pprof(&s, "hog", "app.cpu", cpu).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("share of the server's memory budget"),
        "{body}"
    );
    drop(hog);
}

/// A client inventing a label name per push (a request id as a label) is refused with a 429
/// naming `max_label_names_per_tenant` once the tenant holds that many names, and every
/// invention after it too; names the tenant holds keep being accepted, and another tenant
/// is not held back. Each name is a column of the tenant's tables: before, every push
/// added one, which every selector scan and block footer then carried.
#[tokio::test]
async fn a_client_inventing_label_names_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_label_names_per_tenant = 6\n"),
    );
    let cpu = testdata("pprof/pyroscope__go-cpu.pb.gz");
    let push = |tenant: &'static str, label: String| {
        let (s, cpu) = (&s, cpu.clone());
        async move { push_pprof(s, tenant, &format!("app.cpu{{env=prod,{label}=x}}"), cpu).await }
    };
    let mut accepted = 0;
    let mut refused = None;
    for i in 0..12 {
        let (status, body) = push("team-a", format!("req_{i}")).await;
        match (status, refused) {
            (200, None) => accepted += 1,
            (429, _) => {
                assert!(body.contains("max_label_names_per_tenant"), "{body}");
                assert!(body.contains("limit of 6 label names"), "{body}");
                refused.get_or_insert(i);
            }
            _ => panic!("push {i}: {status} {body} (first refused: {refused:?})"),
        }
    }
    assert!(
        refused.is_some() && (1..6).contains(&accepted),
        "accepted {accepted}, first refused {refused:?}"
    );
    let (status, body) = push("team-a", "req_0".into()).await;
    assert_eq!(status, 200, "a name held: {body}");
    let (status, body) = push("team-b", "req_99".into()).await;
    assert_eq!(status, 200, "another tenant: {body}");
}

/// A tenant pushing faster than `limits.ingest_rate_per_tenant` is refused with 429 and a
/// `Retry-After` before its pushes are decoded, while another tenant's pushes go on; a push
/// larger than the whole burst is 413. Without the limit, one tenant within its series
/// limit pushed as fast as the ingest lane let it, and filled the disk every tenant shares.
#[tokio::test]
async fn a_tenant_pushing_past_its_ingest_rate_is_refused_and_the_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let (rate, burst) = (1024, 8 << 10);
    let s = Server::start(
        &dir.path().join("d"),
        Some(&format!(
            "[limits]\ningest_rate_per_tenant = {rate}\ningest_burst_per_tenant = {burst}\n"
        )),
    );
    let cpu = testdata("pprof/pyroscope__go-cpu.pb.gz");
    let push = |tenant: &'static str, body: Vec<u8>| {
        let url = s.url.clone();
        async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/ingest?name=app.cpu&format=pprof"))
                .header("X-Scope-OrgID", tenant)
                .body(body)
                .send()
                .await
                .unwrap();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_owned());
            (r.status().as_u16(), retry, r.text().await.unwrap())
        }
    };
    let started = Instant::now();
    let mut accepted = 0;
    loop {
        match push("hog", cpu.clone()).await {
            (200, _, _) => accepted += 1,
            (429, retry, body) => {
                assert!(body.contains("limits.ingest_rate_per_tenant"), "{body}");
                let secs: u64 = retry.expect("a Retry-After").parse().unwrap();
                assert!((1..=2).contains(&secs), "{secs}: {body}");
                break;
            }
            (status, _, body) => panic!("push {accepted}: {status} {body}"),
        }
        assert!(accepted < 1_000, "the hog was never refused");
    }
    // Refused only once the bucket could not take a push, and never past what it held
    // and refilled meanwhile.
    let elapsed = started.elapsed().as_secs_f64();
    let taken = (accepted * cpu.len()) as f64;
    assert!(
        taken > (burst - cpu.len()) as f64,
        "refused after {accepted} pushes of {} bytes",
        cpu.len()
    );
    assert!(
        taken <= burst as f64 + rate as f64 * elapsed,
        "took {taken} bytes in {elapsed} s"
    );
    // Another tenant's bucket is its own.
    let (status, _, body) = push("victim", cpu.clone()).await;
    assert_eq!(status, 200, "{body}");
    // More than the whole burst can never be taken, whatever the body holds.
    let (status, retry, body) = push("victim", vec![0; burst + 1]).await;
    assert_eq!((status, retry), (413, None), "{body}");
    assert!(body.contains("limits.ingest_burst_per_tenant"), "{body}");
    // The operator sees what each tenant's rate refused.
    let (status, metrics) = get(&format!("{}/metrics", s.url), None).await;
    assert_eq!(status, 200, "{metrics}");
    for line in [
        "frostdb_tenant_ingest_refused_total{tenant=\"hog\"} 1".to_owned(),
        format!(
            "frostdb_tenant_ingest_refused_bytes_total{{tenant=\"hog\"}} {}",
            cpu.len()
        ),
        "frostdb_tenant_ingest_refused_total{tenant=\"victim\"} 1".to_owned(),
        format!(
            "frostdb_tenant_ingest_refused_bytes_total{{tenant=\"victim\"}} {}",
            burst + 1
        ),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
}

/// Descriptors the server process has open.
fn descriptors(s: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", s.pid())).map_or(0, |d| d.count())
}

/// A flood of connections past the limit holds at most 64 descriptors being refused: the
/// first are answered 503 (a lingering close, up to a second each), the rest closed at
/// once. Before, each refusal held its descriptor for its second, outside the budget the
/// limits were sized from, and the tenants' WAL and block files then met EMFILE.
#[tokio::test]
async fn refusals_past_the_connection_limit_hold_few_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_connections = 4\nmax_connections_per_address = 4\n"),
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // Once the server has taken the four (the last is answered), count its descriptors.
    let answer = raw(&s.url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 503"),
        "{answer}"
    );
    let before = descriptors(&s);
    let started = Instant::now();
    let flood: Vec<TcpStream> = (0..400)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    // The connection after the flood is refused once every one before it was: its answer
    // (or its close) says the server has taken them all.
    let last = raw(&s.url, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert!(
        last.is_empty() || last.starts_with("HTTP/1.1 503"),
        "{last}"
    );
    let during = descriptors(&s);
    assert!(
        during <= before + 64 + 8,
        "{during} descriptors open while 400 are refused, {before} before"
    );
    // Each of the flood was answered 503 (lingering) or closed unanswered: at most 64 the
    // former at once, so (each lingering its second, as the client never closes) at most
    // 64 for each second the flood took to be refused (a connection the full accept queue
    // dropped comes again a second later), and one more.
    let mut answered = 0;
    for mut socket in flood {
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut got = Vec::new();
        let _ = socket.read_to_end(&mut got);
        answered += usize::from(got.starts_with(b"HTTP/1.1 503"));
    }
    let took = started.elapsed();
    let most = 64 * (took.as_secs() as usize + 2);
    assert!(
        (1..=most).contains(&answered),
        "{answered} of 400 answered in {took:?}"
    );
    drop(held);
}

/// A request's trailers are refused. tonic merges a unary call's trailers into its
/// metadata, over its headers: tenant A's token with an `x-scope-orgid: team-b` trailer
/// (after `authorize` had checked the header) acted for team B, reading and writing its
/// settings and profiles, over HTTP/2 or chunked HTTP/1.1.
#[tokio::test]
async fn a_trailer_cannot_name_another_tenant() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "token = \"ops\"\n[tenants.team-a]\ntoken = \"ta\"\n[tenants.team-b]\ntoken = \"tb\"\n",
        ),
    );
    let addr = s.url.trim_start_matches("http://").to_owned();
    // A grpc-web call of settings' Get (an empty message), team-a's token, no tenant header.
    let call = async |trailer: &str| {
        let request = format!(
            "POST /settings.v1.SettingsService/Get HTTP/1.1\r\nHost: localhost\r\n\
             Authorization: Bearer ta\r\nContent-Type: application/grpc-web+proto\r\n\
             Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
             5\r\n\0\0\0\0\0\r\n0\r\n{trailer}\r\n"
        );
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    };
    let own = call("").await;
    assert!(own.starts_with("HTTP/1.1 200"), "{own}");
    assert!(own.contains("grpc-status:0"), "{own}");
    let smuggled = call("x-scope-orgid: team-b\r\n").await;
    assert!(!smuggled.contains("grpc-status:0"), "{smuggled}");
    assert!(smuggled.contains("grpc-status: 3"), "{smuggled}");
    assert!(
        smuggled.contains("request%20trailers%20are%20not%20taken"),
        "{smuggled}"
    );
}

/// A push's multipart form of more parts than any client sends is refused, naming the
/// limit: a 16 MiB body of a million empty parts kept each, uncharged, parsed on an async
/// thread.
#[tokio::test]
async fn a_form_of_too_many_parts_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::start(&dir.path().join("d"), None);
    let mut form = reqwest::multipart::Form::new();
    for i in 0..17 {
        form = form.part(format!("p{i}"), reqwest::multipart::Part::bytes(Vec::new()));
    }
    let r = reqwest::Client::new()
        .post(format!("{}/ingest?name=app", s.url))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let body = r.text().await.unwrap();
    assert!(body.contains("more than 16 parts"), "{body}");
    assert!(s.running(), "the server died");
}

/// With no token, on loopback, the address is the only boundary a browser must not cross:
/// a request naming another host (a page whose name was made to point here: DNS
/// rebinding) is refused, as is a change posted by another site's page; the server's own
/// names and origin are served. Every answer says `nosniff` and may not be framed, and an
/// SVG answer may run no script. Before, any page the operator opened could read every
/// tenant by rebinding, and write profiles with a plain cross-site form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_page_of_another_site_can_neither_read_nor_change_a_server_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(&dir.path().join("data"), None);
    let port = s.url.rsplit(':').next().unwrap().to_owned();
    let answer = raw(
        &s.url,
        format!(
            "GET /api/v1/profile_types HTTP/1.1\r\nHost: rebind.attacker.example:{port}\r\n\
             X-Scope-OrgID: team-a\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("names host"), "{answer}");
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let answer = raw(
            &s.url,
            format!(
                "GET /api/v1/profile_types HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let post = |origin: &'static str| {
        reqwest::Client::new()
            .post(format!("{}/ingest?name=api&format=folded", s.url))
            .header("origin", origin.replace("SELF", &s.url))
            .header("content-type", "text/plain")
            .body("main;injected 100000000\n")
            .send()
    };
    let r = post("http://evil.example").await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("another site's page"));
    let r = post("null").await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = post("SELF").await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let r = reqwest::get(format!(
        "{}/api/v1/query?format=svg&selector={}",
        s.url,
        enc("process_cpu:cpu:nanoseconds:cpu:nanoseconds{}")
    ))
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let headers = r.headers();
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'none'")
    );
}

/// A GET from the local address `from` (another client than 127.0.0.1, the tests' own).
async fn get_from(from: std::net::IpAddr, url: &str) -> (u16, String) {
    let r = reqwest::Client::builder()
        .local_address(from)
        .build()
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A gauge of `/metrics`, as another client reads it.
async fn gauge_from(s: &Server, from: std::net::IpAddr, name: &str) -> u64 {
    let (status, text) = get_from(from, &format!("{}/metrics", s.url)).await;
    assert_eq!(status, 200, "{text}");
    metric_in(&text, name).unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// The memory held by requests, queries, tenants and connections, as another client reads it.
async fn reserved_from(s: &Server, from: std::net::IpAddr) -> u64 {
    gauge_from(s, from, "frostdb_memory_reserved_bytes").await
}

/// Connections sending heads they never finish are charged what they sent, within their
/// client address's share. hyper holds a head until it is complete, and nothing charged
/// it: 3,000 connections of a megabyte each held 3 GB under a 256 MiB budget. Past its
/// share an address's connections are closed, another address is still answered, and
/// the memory is given back when they close.
#[tokio::test]
async fn unfinished_heads_are_charged_and_held_within_their_addresss_share() {
    let dir = tempfile::tempdir().unwrap();
    let s = Server::start(
        &dir.path().join("d"),
        Some(
            "[limits]\nmemory = \"64MiB\"\nmax_connections = 1000\n\
             max_connections_per_address = 500\nheader_read_timeout_secs = 300\n",
        ),
    );
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let before = reserved_from(&s, other).await;
    // The connections' quarter of the budget, of which this address's half (500 of the
    // 1,000 connections).
    let share: usize = (64 << 20) / 4 / 2;
    const SENT: usize = 60_000;
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n".to_vec();
    while head.len() < SENT {
        head.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    head.truncate(SENT);
    let addr = s.url.trim_start_matches("http://").to_owned();
    let attack: Vec<TcpStream> = (0..400)
        .map(|_| {
            let mut c = TcpStream::connect(&addr).unwrap();
            // Refused as it writes, once the share is spent: the close is counted below.
            let _ = c.write_all(&head);
            c.set_nonblocking(true).unwrap();
            c
        })
        .collect();
    let open = || {
        attack
            .iter()
            .filter(|c| {
                let (mut c, mut byte): (&TcpStream, _) = (c, [0u8; 1]);
                matches!(c.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    let held = eventually(Duration::from_secs(60), async || open() * SENT <= share).await;
    let still = open();
    assert!(
        held,
        "{still} connections of {SENT} unfinished bytes each are open, past the address's \
         share of {share} bytes"
    );
    assert!(still > 0, "every connection was closed, none charged");
    let during = reserved_from(&s, other).await;
    assert!(
        during >= before + (still * SENT / 2) as u64,
        "{still} open connections of {SENT} bytes each, {} bytes charged",
        during.saturating_sub(before)
    );
    // Shown as the connections', not as a tenant's.
    let connections = gauge_from(&s, other, "frostdb_connections_memory_reserved_bytes").await;
    assert!(connections >= (still * SENT / 2) as u64, "{connections}");
    assert!(
        connections <= (share + (64 << 10)) as u64,
        "{connections} bytes held, past the address's share of {share}"
    );
    let (_, metrics) = get_from(other, &format!("{}/metrics", s.url)).await;
    assert!(!metrics.contains("tenant=\"connections"), "{metrics}");
    // Every connection the server closed is counted (400 opened, `still` open).
    let mut closed = 0;
    let counted = eventually(Duration::from_secs(10), async || {
        closed = gauge_from(&s, other, "frostdb_connections_closed_over_budget_total").await;
        closed == (400 - open()) as u64
    })
    .await;
    assert!(counted, "{closed} counted closed, {} closed", 400 - open());
    // Another client is answered meanwhile.
    let (status, body) = get_from(other, &format!("{}/healthz", s.url)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        s.log()
            .contains("what its address's connections hold: a connection's bytes before a request"),
        "{}",
        s.log()
    );
    drop(attack);
    assert!(
        eventually(Duration::from_secs(30), async || {
            reserved_from(&s, other).await < before + (1 << 20)
        })
        .await,
        "the closed connections' memory was not given back"
    );
}

/// HPACK's integer of `prefix` bits, after the `first` byte's flags.
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, mut value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// An HTTP/2 frame.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// Answers an HTTP/2 client asked for and never read, granting the server all the window
/// it could want, stay charged to the budget until its connections close. The budget
/// counted an answer only until its body had handed the connection its last bytes; hyper
/// then held up to 400 KiB of each of a connection's 64 streams: 200 such connections held
/// 300 MB under a 256 MiB budget that counted none of it.
#[tokio::test]
async fn answers_an_http2_client_never_reads_stay_charged_until_it_closes() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    // Room for every query at once in the lane (192 of the tenant's 204 places).
    let s = Server::start(
        &dir.path().join("d"),
        Some("[limits]\nmax_concurrent_queries = 16\n"),
    );
    push_go_cpu(&s).await;
    let before = gauge(&s, "frostdb_memory_reserved_bytes").await;
    let addr: std::net::SocketAddr = s.url.trim_start_matches("http://").parse().unwrap();
    // 300 KB answers, each less than what hyper buffers of a stream: handed over whole.
    let path = format!(
        "/api/v1/sql?q={}",
        enc("SELECT repeat('x', 1000) AS s FROM generate_series(1, 300)")
    );
    let (connections, streams) = (4, 48);
    let mut held = Vec::new();
    for _ in 0..connections {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        // Read nothing, and take little into the socket's own buffer.
        socket.set_recv_buffer_size(4096).unwrap();
        let mut c = socket.connect(addr).await.unwrap();
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // SETTINGS_INITIAL_WINDOW_SIZE, and the connection's window, at their largest.
        let mut settings = 4u16.to_be_bytes().to_vec();
        settings.extend(0x7fff_ffffu32.to_be_bytes());
        out.extend(h2_frame(4, 0, 0, &settings));
        out.extend(h2_frame(8, 0, 0, &(0x7fff_ffffu32 - 65_535).to_be_bytes()));
        for i in 0..streams {
            let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
            for (name, value) in [(4, path.as_str()), (1, &addr.to_string())] {
                hpack_int(&mut block, 0x00, 4, name); // literal, not indexed, name by index
                hpack_int(&mut block, 0x00, 7, value.len());
                block.extend(value.as_bytes());
            }
            // END_STREAM | END_HEADERS
            out.extend(h2_frame(1, 0x5, 1 + 2 * i, &block));
        }
        c.write_all(&out).await.unwrap();
        held.push(c);
    }
    // Once every query has run and been answered (no query running or waiting), the
    // answers wait in the connections: of 192 answers of 300 KB (58 MB), the sockets'
    // buffers take at most 4 MiB a connection, the rest is in the server and charged.
    let mut last = String::new();
    let charged = eventually(Duration::from_secs(120), async || {
        let (status, text) = get(&format!("{}/metrics", s.url), None).await;
        assert_eq!(status, 200, "{text}");
        let value =
            |name: &str| metric_in(&text, name).unwrap_or_else(|| panic!("no {name} in {text}"));
        let (running, waiting) = (
            value("frostdb_query_jobs_running"),
            value("frostdb_query_jobs_waiting"),
        );
        let reserved = value("frostdb_memory_reserved_bytes");
        last = format!(
            "{running} queries running, {waiting} waiting, {} bytes charged ({reserved} \
             reserved, {before} before)",
            reserved.saturating_sub(before)
        );
        running == 0 && waiting == 0 && reserved >= before + (16 << 20)
    })
    .await;
    assert!(charged, "answers of 58 MB wait for their client: {last}");
    drop(held);
    assert!(
        eventually(Duration::from_secs(30), async || {
            gauge(&s, "frostdb_memory_reserved_bytes").await < before + (1 << 20)
        })
        .await,
        "the unsent answers' memory was not given back when their connections closed"
    );
}
