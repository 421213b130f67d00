// The frostdb page: a selector, a time range, the value over time, a flame graph, the top
// table and a diff, all from /api/v1. Plain JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const view = (window.frostdbView = { names: [], total: 0, mode: "merge" });
const state = { types: [], range: null, step: 0, pinned: null, flame: null, zoom: null, top: [], sort: { key: "flat", asc: false } };

// ---------- API ----------
async function api(path, params) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  let r = await fetch(url, { headers: tenantHeaders() });
  if (r.status === 401) {
    const token = prompt("This server needs a bearer token:");
    if (token) {
      localStorage.setItem("frostdb-token", token);
      r = await fetch(url, { headers: tenantHeaders() });
    }
  }
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try { msg = (await r.json()).message || msg; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return r.headers.get("content-type")?.includes("json") ? r.json() : r.text();
}
function tenantHeaders() {
  const h = {};
  const t = new URLSearchParams(location.search).get("tenant");
  if (t) h["X-Scope-OrgID"] = t;
  const token = localStorage.getItem("frostdb-token");
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}
function status(text, error) {
  const s = $("status");
  s.textContent = text || "";
  s.className = error ? "error" : "";
}

// ---------- time ----------
const DUR = { m: 60e3, h: 3600e3, d: 86400e3 };
function currentRange() {
  const v = $("range").value;
  if (v === "all") return { from: null, to: null };
  if (v === "custom") {
    const f = Date.parse($("from").value), t = Date.parse($("to").value);
    if (isNaN(f) || isNaN(t) || f >= t) throw new Error("custom range: pick a start before the end");
    return { from: f, to: t };
  }
  const now = Date.now();
  const n = parseInt(v, 10), unit = v.replace(/[0-9]/g, "");
  return { from: now - n * DUR[unit], to: now };
}
const fmtTime = (ms) => new Date(ms).toLocaleString();

// ---------- units ----------
function fmtValue(v, unit) {
  const abs = Math.abs(v);
  const scale = (steps) => {
    for (const [f, u] of steps) if (abs >= f) return (v / f).toFixed(abs / f >= 100 ? 0 : 2) + u;
    return String(v);
  };
  if (unit === "nanoseconds") return scale([[3600e9, "h"], [60e9, "min"], [1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]]);
  if (unit === "bytes") return scale([[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"], [1, "B"]]);
  return scale([[1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""]]);
}
const pct = (v, total) => (total ? (100 * v / total).toFixed(2) + "%" : "0%");

// ---------- selector ----------
function fullSelector(text) {
  text = (text || "").trim();
  if (/^[^{]*:[^{]*/.test(text) && !text.startsWith("{")) return text.includes("{") ? text : text + "{}";
  const body = text === "" ? "{}" : text.startsWith("{") ? text : "{" + text + "}";
  return $("profile-type").value + body;
}
function unitOf(selector) {
  const parts = selector.split("{")[0].split(":");
  return parts[2] || "";
}

// Label autocompletion: names after `{` or `,`, values after `name="` / `name=~"`.
const cache = { names: null, values: {} };
async function labelNames() {
  if (!cache.names) cache.names = await api("/api/v1/labels");
  return cache.names;
}
async function labelValues(name) {
  if (!cache.values[name]) cache.values[name] = await api(`/api/v1/label/${encodeURIComponent(name)}/values`);
  return cache.values[name];
}
let suggestionState = { items: [], active: -1, replaceFrom: 0, suffix: "" };
async function suggest() {
  const input = $("selector");
  const upto = input.value.slice(0, input.selectionStart);
  let items = [], replaceFrom = 0, suffix = "";
  const valueCtx = upto.match(/([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)$/);
  const nameCtx = upto.match(/(?:^|[{,])\s*([A-Za-z_][A-Za-z0-9_]*)?$/);
  try {
    if (valueCtx) {
      const [, name, , prefix] = valueCtx;
      items = (await labelValues(name)).filter((v) => v.startsWith(prefix));
      replaceFrom = upto.length - prefix.length;
      suffix = '"';
    } else if (nameCtx && (upto.includes("{") || upto.trim() === "" || !upto.includes("="))) {
      const prefix = nameCtx[1] || "";
      items = (await labelNames()).filter((n) => n.startsWith(prefix));
      replaceFrom = upto.length - prefix.length;
      suffix = '="';
    }
  } catch (e) { items = []; }
  suggestionState = { items: items.slice(0, 50), active: -1, replaceFrom, suffix };
  renderSuggestions();
}
function renderSuggestions() {
  const ul = $("suggestions");
  ul.innerHTML = "";
  suggestionState.items.forEach((s, i) => {
    const li = document.createElement("li");
    li.textContent = s;
    li.className = i === suggestionState.active ? "active" : "";
    li.addEventListener("mousedown", (e) => { e.preventDefault(); accept(i); });
    ul.appendChild(li);
  });
  ul.hidden = suggestionState.items.length === 0 || document.activeElement !== $("selector");
}
function accept(i) {
  const input = $("selector");
  const s = suggestionState;
  const before = input.value.slice(0, s.replaceFrom);
  let after = input.value.slice(input.selectionStart);
  if (s.suffix === '"' && after.startsWith('"')) after = after.slice(1);
  const inserted = s.items[i] + s.suffix;
  input.value = before + inserted + after;
  const pos = (before + inserted).length;
  input.setSelectionRange(pos, pos);
  suggestionState.items = [];
  renderSuggestions();
  if (s.suffix === '="') suggest();
}
$("selector").addEventListener("input", suggest);
$("selector").addEventListener("focus", suggest);
$("selector").addEventListener("blur", () => { $("suggestions").hidden = true; });
$("selector").addEventListener("keydown", (e) => {
  const s = suggestionState;
  if ($("suggestions").hidden || !s.items.length) return;
  if (e.key === "ArrowDown" || e.key === "ArrowUp") {
    e.preventDefault();
    s.active = (s.active + (e.key === "ArrowDown" ? 1 : -1) + s.items.length) % s.items.length;
    renderSuggestions();
  } else if ((e.key === "Enter" || e.key === "Tab") && s.active >= 0) {
    e.preventDefault();
    accept(s.active);
  } else if (e.key === "Escape") {
    s.items = [];
    renderSuggestions();
  }
});

// ---------- metrics graph ----------
const COLORS = ["#2f6fde", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#e67700", "#5c940d"];
let graphPoints = [];
function drawGraph(result, unit) {
  const canvas = $("graph");
  const ctx = setupCanvas(canvas, 160);
  const w = canvas.clientWidth, h = 160, pad = { l: 64, r: 8, t: 8, b: 20 };
  ctx.clearRect(0, 0, w, h);
  graphPoints = [];
  const series = result.series || [];
  const all = series.flatMap((s) => s.points);
  $("graph-legend").innerHTML = "";
  if (!all.length) {
    ctx.fillStyle = "#7d8a97";
    ctx.fillText("no data in this range", pad.l, h / 2);
    return;
  }
  const r = state.range;
  const x0 = r.from ?? Math.min(...all.map((p) => p[0])), x1 = r.to ?? Math.max(...all.map((p) => p[0])) + result.step_ms;
  const ymax = Math.max(1, ...all.map((p) => p[1]));
  const X = (t) => pad.l + ((t - x0) / Math.max(1, x1 - x0)) * (w - pad.l - pad.r);
  const Y = (v) => h - pad.b - (v / ymax) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#dde2e7";
  ctx.fillStyle = "#7d8a97";
  ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const v = (ymax * i) / 4, y = Y(v);
    ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
    ctx.fillText(fmtValue(v, unit), 4, y + 4);
  }
  ctx.fillText(fmtTime(x0), pad.l, h - 4);
  const right = fmtTime(x1);
  ctx.fillText(right, w - pad.r - ctx.measureText(right).width, h - 4);
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    ctx.strokeStyle = ctx.fillStyle = color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.points.forEach(([t, v], j) => {
      const x = X(t + result.step_ms / 2), y = Y(v);
      j ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
      graphPoints.push({ x, y, t, v, labels: s.labels });
    });
    ctx.stroke();
    view.points = graphPoints.map((p) => ({ x: p.x, y: p.y, t: p.t }));
    for (const p of graphPoints.filter((p) => p.labels === s.labels)) { ctx.beginPath(); ctx.arc(p.x, p.y, 2.5, 0, 7); ctx.fill(); }
    if (i < 12) {
      const span = document.createElement("span");
      span.innerHTML = `<i style="background:${color}"></i>`;
      span.append(Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "all");
      $("graph-legend").appendChild(span);
    }
  });
}
$("graph").addEventListener("click", (e) => {
  const rect = $("graph").getBoundingClientRect();
  const x = e.clientX - rect.left, y = e.clientY - rect.top;
  let best = null, bestD = Infinity;
  for (const p of graphPoints) {
    const d = (p.x - x) ** 2 + (p.y - y) ** 2;
    if (d < bestD) { bestD = d; best = p; }
  }
  if (!best) return;
  state.pinned = { from: best.t, to: best.t + state.step, labels: best.labels };
  loadProfile().catch(fail);
});

// ---------- flame graph ----------
const ROW = 18;
function setupCanvas(canvas, height) {
  const dpr = window.devicePixelRatio || 1;
  canvas.style.height = height + "px";
  canvas.width = canvas.clientWidth * dpr;
  canvas.height = height * dpr;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}
// Lays the tree out: rects of [x, width] in fractions of the zoomed node's total. Ancestors
// of the zoomed node span the whole width above it.
function layout(root, zoomPath) {
  const rects = [];
  const chain = [root, ...zoomPath];
  const focus = chain[chain.length - 1];
  chain.slice(0, -1).forEach((node, depth) => rects.push({ node, x: 0, w: 1, depth, ancestor: true }));
  const total = weight(focus) || 1;
  const visit = (node, x, depth) => {
    const w = weight(node) / total;
    if (w < 0.0005) return;
    rects.push({ node, x, w, depth });
    let cx = x;
    for (const c of node.children || []) { visit(c, cx, depth + 1); cx += weight(c) / total; }
  };
  visit(focus, 0, chain.length - 1);
  return rects;
}
const weight = (n) => (view.mode === "diff" ? Math.max(n.compare, n.base) : n.total);
function color(rect, search) {
  const n = rect.node;
  if (search && !search.test(n.name)) return "#d5dbe1";
  if (view.mode === "diff") {
    const bt = state.flame.base || 1, ct = state.flame.compare || 1;
    const d = n.compare / ct - n.base / bt;
    const s = Math.min(1, Math.abs(d) * 8);
    return d > 0 ? `rgb(${220},${Math.round(220 - 160 * s)},${Math.round(220 - 160 * s)})` : `rgb(${Math.round(220 - 160 * s)},${220},${Math.round(220 - 160 * s)})`;
  }
  let h = 0;
  for (const ch of n.name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${15 + (h % 40)}, ${70 + (h % 20)}%, ${55 + (h % 15)}%)`;
}
let rects = [];
function drawFlame() {
  const canvas = $("flame");
  if (!state.flame) return;
  const root = state.flame.root || state.flame;
  const path = state.zoom || [];
  rects = layout(root, path);
  const depth = Math.max(1, ...rects.map((r) => r.depth + 1));
  const ctx = setupCanvas(canvas, depth * ROW + 4);
  const w = canvas.clientWidth;
  let search = null;
  try { search = $("search").value ? new RegExp($("search").value, "i") : null; } catch (_) { search = null; }
  ctx.font = "12px ui-monospace, monospace";
  ctx.textBaseline = "middle";
  let matched = 0;
  view.names = [];
  for (const r of rects) {
    const x = r.x * w, rw = r.w * w, y = r.depth * ROW;
    if (rw < 0.5) continue;
    ctx.fillStyle = color(r, search);
    ctx.fillRect(x, y, Math.max(rw - 1, 0.5), ROW - 1);
    if (search && search.test(r.node.name)) matched++;
    if (rw > 30) {
      ctx.fillStyle = r.ancestor ? "#555" : "#1d232b";
      ctx.save();
      ctx.beginPath(); ctx.rect(x, y, rw - 2, ROW); ctx.clip();
      ctx.fillText(r.node.name, x + 3, y + ROW / 2);
      ctx.restore();
      view.names.push(r.node.name);
    }
  }
  view.frames = rects.filter((r) => r.w * w >= 1).map((r) => ({ name: r.node.name, cx: (r.x + r.w / 2) * w, cy: r.depth * ROW + ROW / 2 }));
  const unit = state.flame.unit || "";
  $("flame-info").textContent = search ? `${matched} matching frames` : path.length ? `zoomed into ${path[path.length - 1].name}` : "";
  view.total = view.mode === "diff" ? state.flame.compare : root.total;
  view.unit = unit;
}
function hit(e) {
  const rect = $("flame").getBoundingClientRect();
  const x = (e.clientX - rect.left) / rect.width, d = Math.floor((e.clientY - rect.top) / ROW);
  return rects.find((r) => r.depth === d && x >= r.x && x < r.x + r.w);
}
$("flame").addEventListener("click", (e) => {
  const r = hit(e);
  if (!r) return;
  const root = state.flame.root || state.flame;
  // The path from the root to the clicked node.
  const find = (node, target, path) => {
    if (node === target) return path;
    for (const c of node.children || []) { const p = find(c, target, [...path, c]); if (p) return p; }
    return null;
  };
  state.zoom = r.node === root ? [] : find(root, r.node, []) || [];
  drawFlame();
});
$("flame").addEventListener("mousemove", (e) => {
  const r = hit(e), tip = $("tooltip");
  if (!r) { tip.hidden = true; return; }
  const n = r.node, unit = state.flame.unit || "";
  if (view.mode === "diff") {
    tip.textContent = `${n.name}\nbase: ${fmtValue(n.base, unit)} (self ${fmtValue(n.base_self, unit)})\ncompare: ${fmtValue(n.compare, unit)} (self ${fmtValue(n.compare_self, unit)})`;
  } else {
    const total = (state.flame.root || state.flame).total;
    tip.textContent = `${n.name}${n.filename ? "\n" + n.filename : ""}\ntotal: ${fmtValue(n.total, unit)} (${pct(n.total, total)})\nself: ${fmtValue(n.self, unit)} (${pct(n.self, total)})`;
  }
  tip.style.left = e.clientX + 12 + "px";
  tip.style.top = e.clientY + 12 + "px";
  tip.hidden = false;
});
$("flame").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
$("search").addEventListener("input", drawFlame);
$("reset-zoom").addEventListener("click", () => { state.zoom = null; drawFlame(); });
window.addEventListener("resize", () => { drawFlame(); });

// ---------- top table ----------
function drawTop() {
  const tbody = $("top").querySelector("tbody");
  tbody.innerHTML = "";
  const { key, asc } = state.sort;
  const rows = [...state.top].sort((a, b) => {
    const x = a[key], y = b[key];
    const c = typeof x === "string" ? x.localeCompare(y) : x - y;
    return asc ? c : -c;
  });
  for (const r of rows.slice(0, 500)) {
    const tr = document.createElement("tr");
    for (const v of [r.flatText, pct(r.flat, r.total), r.sum_pct.toFixed(2) + "%", r.cumText, pct(r.cum, r.total), r.name]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
  for (const th of $("top").querySelectorAll("th")) {
    th.classList.toggle("sorted", th.dataset.key === key);
    th.classList.toggle("asc", th.dataset.key === key && asc);
  }
}
for (const th of document.querySelectorAll("#top th")) {
  th.addEventListener("click", () => {
    const key = th.dataset.key;
    state.sort = { key, asc: state.sort.key === key ? !state.sort.asc : key === "name" };
    drawTop();
  });
}

// ---------- loading ----------
function fail(e) {
  status(e.message || String(e), true);
  document.body.dataset.state = "error";
}
function rangeParams(r) {
  return { from: r.from ?? undefined, to: r.to ?? undefined };
}
function pinnedSelector(sel) {
  const p = state.pinned;
  if (!p || !p.labels || !Object.keys(p.labels).length) return sel;
  const extra = Object.entries(p.labels).map(([k, v]) => `${k}="${v.replace(/["\\]/g, "\\$&")}"`).join(",");
  return sel.replace(/\}$/, (sel.endsWith("{}") ? "" : ",") + extra + "}");
}
async function loadProfile() {
  document.body.dataset.state = "loading";
  const sel = fullSelector($("selector").value);
  const unit = unitOf(sel);
  const r = state.pinned || state.range;
  const s = pinnedSelector(sel);
  if ($("diff-toggle").checked) {
    const compareSel = $("compare-selector").value.trim() ? fullSelector($("compare-selector").value) : sel;
    const span = (r.to ?? Date.now()) - (r.from ?? 0);
    const shift = { same: 0, previous: span, "1d": 86400e3 }[$("compare-range").value];
    const diff = await api("/api/v1/diff", {
      base: s, compare: pinnedSelector(compareSel),
      base_from: r.from != null ? r.from - shift : undefined, base_to: r.to != null ? r.to - shift : undefined,
      compare_from: r.from ?? undefined, compare_to: r.to ?? undefined,
    });
    view.mode = "diff";
    state.flame = { root: diff, base: diff.base, compare: diff.compare, unit };
    $("flame-title").textContent = `Diff: red grew, green shrank (base ${fmtValue(diff.base, unit)} → ${fmtValue(diff.compare, unit)})`;
  } else {
    const flame = await api("/api/v1/query", { selector: s, format: "flamegraph", ...rangeParams(r) });
    view.mode = "merge";
    state.flame = flame;
    $("flame-title").textContent = `Flame graph — ${flame.profile_type} — total ${fmtValue(flame.root.total, unit)}` +
      (state.pinned ? ` — at ${fmtTime(state.pinned.from)}` : "");
  }
  state.zoom = null;
  drawFlame();
  const top = await api("/api/v1/query", { selector: s, format: "top", node_fraction: 0, ...rangeParams(r) });
  let running = 0;
  state.top = top.rows.map((row) => {
    running += row.flat;
    return { ...row, name: row.name + (row.inline ? " " + row.inline : ""), total: top.total,
      flat_pct: row.flat / (top.total || 1), cum_pct: row.cum / (top.total || 1), sum_pct: (100 * running) / (top.total || 1),
      flatText: fmtValue(row.flat, unit), cumText: fmtValue(row.cum, unit) };
  });
  drawTop();
  status(state.flame && (view.total || 0) === 0 ? "No samples for this selector and range." : "");
  document.body.dataset.state = "ready";
}
async function run() {
  document.body.dataset.state = "loading";
  status("");
  state.range = currentRange();
  state.pinned = null;
  const sel = fullSelector($("selector").value);
  const params = new URLSearchParams({ selector: $("selector").value, type: $("profile-type").value, range: $("range").value });
  history.replaceState(null, "", "?" + params + (new URLSearchParams(location.search).get("tenant") ? "&tenant=" + new URLSearchParams(location.search).get("tenant") : ""));
  const result = await api("/api/v1/query_range", { selector: sel, ...rangeParams(state.range) });
  state.step = result.step_ms;
  drawGraph(result, unitOf(sel));
  await loadProfile();
  if (!(result.series || []).length && $("range").value !== "all") {
    // Profiles keep the time they were taken: old files pushed now are not in the last hour.
    const ts = await api("/api/v1/timestamps", { selector: sel });
    if (ts.length) {
      status(`No samples in this range; the newest profile of this selector is from ${fmtTime(ts[ts.length - 1])}. Pick "All time" to see everything.`);
    }
  }
}
$("query-form").addEventListener("submit", (e) => { e.preventDefault(); run().catch(fail); });
$("diff-form").addEventListener("submit", (e) => { e.preventDefault(); run().catch(fail); });
$("diff-toggle").addEventListener("change", () => { $("diff-form").hidden = !$("diff-toggle").checked; });
$("range").addEventListener("change", () => {
  $("custom-range").hidden = $("range").value !== "custom";
  if ($("range").value === "custom" && !$("from").value) {
    const local = (ms) => new Date(ms - new Date().getTimezoneOffset() * 60e3).toISOString().slice(0, 19);
    $("from").value = local(Date.now() - 3600e3);
    $("to").value = local(Date.now());
  }
});

// The profile types in `types` a page opens on: the one asked for, else CPU time (what
// most people look at first), wall time, eBPF samples, then whatever is stored.
function defaultType(types, asked) {
  const ids = types.map((t) => t.id);
  if (asked && ids.includes(asked)) return asked;
  for (const name of ["process_cpu", "wall", "ebpf_cpu"]) {
    const t = types.find((t) => t.name === name && /cpu|wall|samples/.test(t.sample_type));
    if (t) return t.id;
  }
  return ids[0];
}

// Fills the type picker with `types`, keeping the current type when it is among them.
function fillTypes(types, asked) {
  const select = $("profile-type");
  const keep = asked || select.value;
  select.replaceChildren(...types.map((t) => {
    const o = document.createElement("option");
    o.value = o.textContent = t.id;
    return o;
  }));
  if (types.length) select.value = defaultType(types, keep);
}

// The selector with its service_name matcher replaced by `service` (removed when empty).
function withService(text, service) {
  const inner = (text || "").trim().replace(/^\{|\}$/g, "");
  const kept = inner.split(/,(?=(?:[^"]*"[^"]*")*[^"]*$)/).map((m) => m.trim())
    .filter((m) => m && !/^service_name\s*(=|!=|=~|!~)/.test(m));
  if (service) kept.unshift(`service_name="${service.replace(/["\\]/g, "\\$&")}"`);
  return kept.length ? "{" + kept.join(", ") + "}" : "";
}

// The types a service has (all stored types without one).
async function typesOf(service) {
  if (!service) return state.types;
  const series = await api("/api/v1/series", { selector: `{service_name="${service}"}` });
  const ids = new Set(series.map((s) => s.profile_type));
  return state.types.filter((t) => ids.has(t.id));
}

$("service").addEventListener("change", async () => {
  document.body.dataset.state = "loading";
  try {
    const service = $("service").value;
    $("selector").value = withService($("selector").value, service);
    fillTypes(await typesOf(service));
    await run();
  } catch (e) {
    fail(e);
  }
});

async function init() {
  try {
    state.types = await api("/api/v1/profile_types");
    const q = new URLSearchParams(location.search);
    const services = await api("/api/v1/label/service_name/values");
    for (const name of services) {
      const o = document.createElement("option");
      o.value = o.textContent = name;
      $("service").appendChild(o);
    }
    if (q.get("selector")) $("selector").value = q.get("selector");
    const asked = /service_name="([^"]*)"/.exec($("selector").value);
    if (asked && services.includes(asked[1])) $("service").value = asked[1];
    fillTypes(await typesOf($("service").value), q.get("type"));
    if (q.get("range")) $("range").value = q.get("range");
    if (!state.types.length) {
      status("No profiles stored yet: push some (see the README) and reload.");
      document.body.dataset.state = "empty";
      return;
    }
    await run();
  } catch (e) {
    fail(e);
  }
}
init();
