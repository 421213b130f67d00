'use strict';
// A real Node program profiled by Pyroscope's official Node client
// (@pyroscope/nodejs) and pushed to a server (frostdb serve, or anything that
// speaks Pyroscope's /ingest).
//
//   node app.js SERVER_URL SECONDS [--cpu-time]
//
// FROSTDB_TENANT, when set, is sent as the tenant (the client's tenantID
// option, i.e. the X-Scope-OrgID header); FROSTDB_TOKEN as the client's
// authToken (Authorization: Bearer); FROSTDB_FLUSH_MS sets flushIntervalMs
// (default 1000).
//
// What the client sends (read from @pyroscope/nodejs 0.6.4 and observed on
// the wire): every flushIntervalMs, one POST per profiler to
//   SERVER_URL/ingest?format=pprof&from=S&name=APP{tags}&spyName=nodespy&until=S[&sampleRate=N]
// with Content-Type application/octet-stream and a raw gzipped pprof body
// (no multipart). The wall profile carries sampleRate; the heap profile does not.
//
// The client never reports a failed push to its caller: it only logs it
// through the `debug` module under the 'pyroscope' namespace, which this
// program turns on. To let the exit status tell, the program also wraps the
// global fetch (which the client calls for every push) and counts each /ingest
// answer. It exits 0 only if at least one wall and one heap profile were
// pushed and every push was answered 2xx.
//
// Stopping: Pyroscope.stop() awaits a push that is still in flight, then takes
// and pushes the last wall profile. The heap profiler's stop() pushes nothing,
// so heap profiles only arrive at each flush interval: SECONDS should be a few
// flush intervals long.

const process = require('node:process');

// V8 would inline frostdbNodeInner into frostdbNodeOuter, and the CPU profiler
// then reports only the outer frame. Turn inlining off before anything is
// optimized so both functions are on the profiled stacks.
require('node:v8').setFlagsFromString('--no-turbo-inlining');

const args = process.argv.slice(2);
const positional = args.filter((a) => !a.startsWith('--'));
const flags = new Set(args.filter((a) => a.startsWith('--')));
if (positional.length !== 2) {
  console.error('usage: node app.js SERVER_URL SECONDS [--cpu-time]');
  process.exit(2);
}
const serverAddress = positional[0].replace(/\/+$/, '');
const seconds = Number(positional[1]);
if (!Number.isFinite(seconds) || seconds <= 0) {
  console.error(`SECONDS must be a positive number, not ${positional[1]}`);
  process.exit(2);
}
const collectCpuTime = flags.has('--cpu-time');
const tenantID = process.env.FROSTDB_TENANT || undefined;
const authToken = process.env.FROSTDB_TOKEN || undefined;
const flushIntervalMs = Number(process.env.FROSTDB_FLUSH_MS || 1000);

// The client's own error log ('Server rejected data ingest: HTTP %d', 'Error
// sending data ingest: %s') goes to stderr. DEBUG=pyroscope* shows more.
const debug = require('debug');
if (!process.env.DEBUG) {
  debug.enable('pyroscope');
}

// Count every push the client makes, with the server's answer.
const pushes = [];
const inFlight = new Set();
const realFetch = globalThis.fetch;
globalThis.fetch = function countedFetch(input, init) {
  const url = new URL(typeof input === 'string' ? input : input.url);
  if (!url.pathname.endsWith('/ingest')) {
    return realFetch(input, init);
  }
  const push = {
    kind: url.searchParams.has('sampleRate') ? 'wall' : 'heap',
    query: url.search,
    status: null,
    error: null,
  };
  pushes.push(push);
  const answer = realFetch(input, init).then(
    async (response) => {
      push.status = response.status;
      if (!response.ok) {
        // Read a copy, so the client can still read its own.
        push.error = await response.clone().text();
        console.error(`push ${push.kind} rejected: HTTP ${response.status} ${push.error}`);
      }
      return response;
    },
    (error) => {
      push.error = String(error && error.message ? error.message : error);
      console.error(`push ${push.kind} failed: ${push.error}`);
      throw error;
    },
  );
  const settled = answer.then(
    () => undefined,
    () => undefined,
  );
  inFlight.add(settled);
  settled.then(() => inFlight.delete(settled));
  return answer;
};

const Pyroscope = require('@pyroscope/nodejs');

// ---- The profiled program ------------------------------------------------

// CPU work: frostdbNodeOuter -> frostdbNodeInner.
function frostdbNodeInner(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 31 + i) % 1000003;
    x ^= x << 3;
    x &= 0xffffff;
  }
  return x;
}

function frostdbNodeOuter(ms) {
  const until = Date.now() + ms;
  let acc = 0;
  while (Date.now() < until) {
    acc ^= frostdbNodeInner(20000);
  }
  return acc;
}

// Allocation: objects that stay reachable, so the heap (in-use) profile has
// them. Bounded to about 64 MiB of retained buffers.
const retained = [];
const RETAINED_MAX = 2048;
function frostdbNodeAlloc(count) {
  for (let i = 0; i < count; i++) {
    const item = {
      id: retained.length,
      payload: Buffer.alloc(32 * 1024, i & 0xff),
      words: new Array(256).fill('frostdb'),
    };
    if (retained.length < RETAINED_MAX) {
      retained.push(item);
    } else {
      retained[(i * 7919) % RETAINED_MAX] = item;
    }
  }
  return retained.length;
}

function runFor(ms) {
  return new Promise((resolve) => {
    const until = Date.now() + ms;
    let sink = 0;
    const step = () => {
      if (Date.now() >= until) {
        resolve(sink);
        return;
      }
      // Yield to the event loop between slices so the client's flush timers run.
      sink ^= frostdbNodeOuter(25);
      frostdbNodeAlloc(8);
      setImmediate(step);
    };
    step();
  });
}

async function main() {
  Pyroscope.init({
    serverAddress,
    appName: 'frostdb-e2e-node',
    tags: { env: 'e2e' },
    tenantID,
    authToken,
    flushIntervalMs,
    wall: { collectCpuTime },
    heap: { samplingIntervalBytes: 64 * 1024 },
  });
  Pyroscope.start();

  await runFor(seconds * 1000);

  await Pyroscope.stop();
  // stop() awaits at most one push per profiler; wait for any other in flight.
  while (inFlight.size > 0) {
    await Promise.all([...inFlight]);
  }

  const summary = {
    retained: retained.length,
    collectCpuTime,
    tenant: tenantID ?? null,
    pushes: pushes.length,
    wall: pushes.filter((p) => p.kind === 'wall').length,
    heap: pushes.filter((p) => p.kind === 'heap').length,
    failed: pushes.filter((p) => p.status === null || p.status < 200 || p.status > 299),
  };
  console.log(JSON.stringify(summary));
  const ok = summary.failed.length === 0 && summary.wall > 0 && summary.heap > 0;
  // The client can leave a flush timer armed when stop() lands between its
  // timeout and setImmediate; exit explicitly.
  process.exit(ok ? 0 : 1);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
