// The frostdb page: a selector, a time range, the value over time, a flame graph, the top
// table and a diff (both sides over time, a delta table), all from /api/v1, the view kept in
// the URL. Plain JavaScript, no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const view = (window.frostdbView = { names: [], total: 0, mode: "merge" });
const state = {
  types: [], range: null, step: 0, pinned: null, flame: null, zoom: null, zoomNames: null, gen: 0,
  top: [], sort: { key: "flat", asc: false }, delta: [], dsort: { key: "delta", asc: false },
};

// ---------- API ----------
// GETs `path` with `params`: the parsed answer, or with `withHeaders` {body, headers}.
async function api(path, params, withHeaders) {
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
  const body = await (r.headers.get("content-type")?.includes("json") ? r.json() : r.text());
  return withHeaders ? { body, headers: r.headers } : body;
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
// A label value as a selector quotes it.
function quoted(value) {
  return value.replace(/["\\]/g, "\\$&");
}
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
const BASE_COLOR = "#8a96a3";
let graphPoints = [];
// Draws `result` (a query_range answer; the compare side in a diff) and, in a diff, `base`
// (the base side's answer) dashed and grey, moved by `shift` ms onto the same time axis.
function drawGraph(result, unit, base, shift) {
  const canvas = $("graph");
  const ctx = setupCanvas(canvas, 160);
  const w = canvas.clientWidth, h = 160, pad = { l: 64, r: 8, t: 8, b: 20 };
  ctx.clearRect(0, 0, w, h);
  graphPoints = [];
  const sides = [{ side: base ? "compare" : "merge", result, shift: 0 }];
  if (base) sides.push({ side: "base", result: base, shift: shift || 0 });
  const drawn = sides.flatMap((d) => (d.result.series || []).map((s) => ({ ...d, s,
    points: s.points.map(([t, v]) => [t + d.shift, v]) })));
  view.series = drawn.map((d) => ({ side: d.side, labels: d.s.labels, points: d.points.length }));
  view.points = [];
  const all = drawn.flatMap((d) => d.points);
  $("graph-legend").innerHTML = "";
  if (!all.length) {
    ctx.fillStyle = "#7d8a97";
    ctx.fillText("no data in this range", pad.l, h / 2);
    return;
  }
  const r = state.range, step = result.step_ms || (base && base.step_ms) || 0;
  const x0 = r.from ?? Math.min(...all.map((p) => p[0])), x1 = r.to ?? Math.max(...all.map((p) => p[0])) + step;
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
  // The base first, so the compare side is drawn over it where they coincide.
  const order = [...drawn.filter((d) => d.side === "base"), ...drawn.filter((d) => d.side !== "base")];
  order.forEach((d) => {
    const isBase = d.side === "base";
    const color = isBase ? BASE_COLOR : COLORS[drawn.indexOf(d) % COLORS.length];
    const mine = [];
    ctx.strokeStyle = ctx.fillStyle = color;
    ctx.lineWidth = 1.5;
    ctx.setLineDash(isBase ? [5, 4] : []);
    ctx.beginPath();
    d.points.forEach(([t, v], j) => {
      const x = X(t + step / 2), y = Y(v);
      j ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
      mine.push({ x, y, t, v, labels: d.s.labels, side: d.side });
    });
    ctx.stroke();
    ctx.setLineDash([]);
    for (const p of mine) {
      ctx.beginPath(); ctx.arc(p.x, p.y, 2.5, 0, 7);
      isBase ? ctx.stroke() : ctx.fill();
    }
    graphPoints.push(...mine);
  });
  // The compare (or only) side's points first: a click pins a time of the selection.
  view.points = [...graphPoints.filter((p) => p.side !== "base"), ...graphPoints.filter((p) => p.side === "base")]
    .map((p) => ({ x: p.x, y: p.y, t: p.t, side: p.side }));
  drawn.slice(0, 12).forEach((d, i) => {
    const isBase = d.side === "base";
    const span = document.createElement("span");
    span.dataset.side = d.side;
    span.innerHTML = isBase ? `<i class="dashed"></i>` : `<i style="background:${COLORS[i % COLORS.length]}"></i>`;
    const labels = Object.entries(d.s.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "all";
    const moved = isBase && d.shift ? ` (moved ${fmtShift(d.shift)} later)` : "";
    span.append((d.side === "merge" ? "" : d.side + ": ") + labels + moved);
    $("graph-legend").appendChild(span);
  });
}
function fmtShift(ms) {
  for (const [f, u] of [[86400e3, "d"], [3600e3, "h"], [60e3, "min"], [1e3, "s"]]) if (Math.abs(ms) >= f) return +(ms / f).toFixed(2) + u;
  return ms + "ms";
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
  // A base point sits on the compare side's time axis: it pins the same step of both.
  state.pinned = { from: best.t, to: best.t + state.step, labels: best.labels };
  state.zoomNames = null;
  saveUrl(true);
  loadProfile(++state.gen).catch(fail);
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
  view.total = view.mode === "diff" ? Math.max(state.flame.base, state.flame.compare) : root.total;
  view.zoom = path.map((n) => n.name);
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
  state.zoomNames = state.zoom.map((n) => n.name);
  saveUrl(true);
  drawFlame();
});
// The path of nodes named `names` from the root, as far as the tree has it (a zoom from
// the URL).
function zoomPath(root, names) {
  const path = [];
  let node = root;
  for (const name of names || []) {
    node = (node.children || []).find((c) => c.name === name);
    if (!node) break;
    path.push(node);
  }
  return path;
}
// A signed value, `+1.2 MiB` or `−340 KiB`.
function fmtDelta(v, unit) {
  return (v > 0 ? "+" : v < 0 ? "−" : "±") + fmtValue(Math.abs(v), unit);
}
// A relative change: `+12.50%`, `−100.00%`, `new` when there was nothing before.
function fmtRel(base, compare) {
  if (!base) return compare ? "new" : "0%";
  const r = (100 * (compare - base)) / base;
  return (r > 0 ? "+" : r < 0 ? "−" : "±") + Math.abs(r).toFixed(2) + "%";
}
$("flame").addEventListener("mousemove", (e) => {
  const r = hit(e), tip = $("tooltip");
  if (!r) { tip.hidden = true; return; }
  const n = r.node, unit = state.flame.unit || "";
  if (view.mode === "diff") {
    // Colours follow the change of share; the tip says both shares and both values.
    const bt = state.flame.base, ct = state.flame.compare;
    const pp = 100 * ((ct ? n.compare / ct : 0) - (bt ? n.base / bt : 0));
    const ppText = (pp >= 0.005 ? "+" : pp <= -0.005 ? "−" : "±") + Math.abs(pp).toFixed(2);
    tip.textContent = `${n.name}\n` +
      `base: ${fmtValue(n.base, unit)} (${pct(n.base, bt)}), self ${fmtValue(n.base_self, unit)}\n` +
      `compare: ${fmtValue(n.compare, unit)} (${pct(n.compare, ct)}), self ${fmtValue(n.compare_self, unit)}\n` +
      `change: ${fmtDelta(n.compare - n.base, unit)} (${fmtRel(n.base, n.compare)}), share ${ppText} pp`;
  } else {
    const total = (state.flame.root || state.flame).total;
    tip.textContent = `${n.name}${n.filename ? "\n" + n.filename : ""}\ntotal: ${fmtValue(n.total, unit)} (${pct(n.total, total)})\nself: ${fmtValue(n.self, unit)} (${pct(n.self, total)})`;
  }
  tip.style.left = e.clientX + 12 + "px";
  tip.style.top = e.clientY + 12 + "px";
  tip.hidden = false;
});
$("flame").addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
$("search").addEventListener("input", () => { drawFlame(); saveUrl(false); });
$("reset-zoom").addEventListener("click", () => {
  state.zoom = null;
  state.zoomNames = null;
  saveUrl(true);
  drawFlame();
});
window.addEventListener("resize", () => { drawFlame(); });

// ---------- tables ----------
// Sorts `rows` by `sort` ({key, asc}); strings by name, numbers by value.
function sorted(rows, { key, asc }) {
  return [...rows].sort((a, b) => {
    const x = a[key], y = b[key];
    const c = typeof x === "string" ? x.localeCompare(y) : (x > y) - (x < y);
    return asc ? c : -c;
  });
}
function fillTable(table, rows, sort, cells) {
  const tbody = $(table).querySelector("tbody");
  tbody.innerHTML = "";
  for (const r of sorted(rows, sort).slice(0, 500)) {
    const tr = document.createElement("tr");
    for (const [text, cls] of cells(r)) {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
  for (const th of $(table).querySelectorAll("th")) {
    th.classList.toggle("sorted", th.dataset.key === sort.key);
    th.classList.toggle("asc", th.dataset.key === sort.key && sort.asc);
  }
}
function drawTop() {
  fillTable("top", state.top, state.sort, (r) =>
    [r.flatText, pct(r.flat, r.total), r.sum_pct.toFixed(2) + "%", r.cumText, pct(r.cum, r.total), r.name].map((t) => [t]));
}
// The delta table: per function, its self value in the base and in the compare side.
function drawDelta() {
  const unit = state.flame?.unit || "";
  fillTable("delta", state.delta, state.dsort, (r) => {
    const cls = r.delta > 0 ? "grew" : r.delta < 0 ? "shrank" : "";
    return [[fmtValue(r.base, unit)], [fmtValue(r.compare, unit)], [fmtDelta(r.delta, unit), cls],
      [fmtRel(r.base, r.compare), cls], [r.name]];
  });
  view.delta = sorted(state.delta, state.dsort).slice(0, 500).map((r) => ({ name: r.name, base: r.base, compare: r.compare, delta: r.delta }));
}
// Joins two top answers by function: base and compare self values, delta, delta %; a
// function with no self value on either side (a caller only) is left out.
function deltaRows(base, compare) {
  const by = new Map();
  const add = (top, side) => {
    for (const row of top.rows) {
      const name = row.name + (row.inline ? " " + row.inline : "");
      const r = by.get(name) || { name, base: 0, compare: 0 };
      r[side] += row.flat;
      by.set(name, r);
    }
  };
  add(base, "base");
  add(compare, "compare");
  return [...by.values()].filter((r) => r.base || r.compare).map((r) => ({ ...r, delta: r.compare - r.base,
    delta_pct: r.base ? (r.compare - r.base) / r.base : (r.compare ? Infinity : 0) }));
}
function sortBy(th, sort, draw) {
  const key = th.dataset.key;
  const next = { key, asc: sort.key === key ? !sort.asc : key === "name" };
  return () => { draw(next); saveUrl(false); };
}
for (const th of document.querySelectorAll("#top th")) {
  th.addEventListener("click", () => sortBy(th, state.sort, (s) => { state.sort = s; drawTop(); })());
}
for (const th of document.querySelectorAll("#delta th")) {
  th.addEventListener("click", () => sortBy(th, state.dsort, (s) => { state.dsort = s; drawDelta(); })());
}

// ---------- the view in the URL ----------
// Everything on screen is in the query string: loading it shows the same view, and back and
// forward walk through the views shown.
const RANGES = ["15m", "1h", "6h", "24h", "7d", "all", "custom"];
const BASE_RANGES = ["same", "previous", "1d", "custom"];
const localTime = (ms) => new Date(ms - new Date(ms).getTimezoneOffset() * 60e3).toISOString().slice(0, ms % 1000 ? 23 : 19);
const sortText = (s) => (s.asc ? "" : "-") + s.key;
const sortOf = (text, fallback) => text ? { key: text.replace(/^-/, ""), asc: !text.startsWith("-") } : fallback;
function viewParams() {
  const q = new URLSearchParams();
  const set = (k, v) => { if (v !== undefined && v !== null && v !== "") q.set(k, v); };
  const tenant = new URLSearchParams(location.search).get("tenant");
  set("tenant", tenant);
  set("type", $("profile-type").value);
  set("selector", $("selector").value);
  set("range", $("range").value);
  if ($("range").value === "custom") {
    set("from", Date.parse($("from").value));
    set("to", Date.parse($("to").value));
  }
  set("aggregation", $("aggregation").value);
  if ($("view").value !== "all") set("view", $("view").value);
  if ($("diff-toggle").checked) {
    q.set("diff", "1");
    set("base", $("base-selector").value);
    set("base_range", $("base-range").value);
    if ($("base-range").value === "custom") {
      set("base_from", Date.parse($("base-from").value));
      set("base_to", Date.parse($("base-to").value));
    }
    if (state.dsort.key !== "delta" || state.dsort.asc) set("sort", sortText(state.dsort));
  } else if (state.sort.key !== "flat" || state.sort.asc) {
    set("sort", sortText(state.sort));
  }
  if (state.pinned) set("pin", JSON.stringify(state.pinned));
  if (state.zoomNames && state.zoomNames.length) set("zoom", JSON.stringify(state.zoomNames));
  set("search", $("search").value);
  return q;
}
// Puts the current view in the URL: a new history entry when `push`, else in place.
function saveUrl(push) {
  const url = "?" + viewParams();
  if (url === location.search) return;
  push ? history.pushState(null, "", url) : history.replaceState(null, "", url);
}
// Sets the page's controls and view state from the URL.
async function applyUrl() {
  const q = new URLSearchParams(location.search);
  const json = (k) => { try { return JSON.parse(q.get(k)); } catch (_) { return null; } };
  $("selector").value = q.get("selector") || "";
  const asked = /service_name="([^"]*)"/.exec($("selector").value);
  const services = [...$("service").options].map((o) => o.value);
  $("service").value = asked && services.includes(asked[1]) ? asked[1] : "";
  fillTypes(await typesOf($("service").value), q.get("type"));
  $("range").value = RANGES.includes(q.get("range")) ? q.get("range") : "1h";
  if (q.get("from")) $("from").value = localTime(+q.get("from"));
  if (q.get("to")) $("to").value = localTime(+q.get("to"));
  $("custom-range").hidden = $("range").value !== "custom";
  $("aggregation").value = ["sum", "average", "latest"].includes(q.get("aggregation")) ? q.get("aggregation") : "";
  $("view").value = ["flame", "table"].includes(q.get("view")) ? q.get("view") : "all";
  $("diff-toggle").checked = q.get("diff") === "1";
  $("diff-form").hidden = !$("diff-toggle").checked;
  $("base-selector").value = q.get("base") || "";
  $("base-range").value = BASE_RANGES.includes(q.get("base_range")) ? q.get("base_range") : "previous";
  if (q.get("base_from")) $("base-from").value = localTime(+q.get("base_from"));
  if (q.get("base_to")) $("base-to").value = localTime(+q.get("base_to"));
  $("base-custom-range").hidden = $("base-range").value !== "custom";
  $("search").value = q.get("search") || "";
  state.sort = { key: "flat", asc: false };
  state.dsort = { key: "delta", asc: false };
  if ($("diff-toggle").checked) state.dsort = sortOf(q.get("sort"), state.dsort);
  else state.sort = sortOf(q.get("sort"), state.sort);
  const pin = json("pin");
  const labels = Object.fromEntries(Object.entries(pin?.labels || {}).filter(([, v]) => typeof v === "string"));
  state.pinned = pin && Number.isFinite(pin.from) && Number.isFinite(pin.to) ? { from: pin.from, to: pin.to, labels } : null;
  const zoom = json("zoom");
  state.zoomNames = Array.isArray(zoom) ? zoom.map(String) : null;
  showPanels();
}
function showPanels() {
  const v = $("view").value;
  $("flame-panel").hidden = v === "table";
  $("table-panel").hidden = v === "flame";
}
window.addEventListener("popstate", () => {
  document.body.dataset.state = "loading";
  applyUrl().then(() => run({ push: false, keep: true })).catch(fail);
});

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
  const extra = Object.entries(p.labels).map(([k, v]) => `${k}="${quoted(v)}"`).join(",");
  return sel.replace(/\}$/, (sel.endsWith("{}") ? "" : ",") + extra + "}");
}
// The base's range in a diff for the selection's range `r`.
function baseRange(r) {
  const v = $("base-range").value;
  if (v === "custom") {
    const f = Date.parse($("base-from").value), t = Date.parse($("base-to").value);
    if (isNaN(f) || isNaN(t) || f >= t) throw new Error("base range: pick a start before the end");
    return { from: f, to: t };
  }
  // All of time has no time before it: the base is all of time too.
  if (r.from == null || r.to == null) return { from: r.from, to: r.to };
  const shift = { same: 0, previous: r.to - r.from, "1d": 86400e3 }[v] || 0;
  return { from: r.from - shift, to: r.to - shift };
}
// How far the base lies before the selection (0 when either is all of time).
function baseShift(r, b) {
  return r.from != null && b.from != null ? r.from - b.from : 0;
}
function aggregationParam() {
  return $("aggregation").value || undefined;
}
const AGGREGATED = { sum: "summed", average: "averaged", latest: "latest profile" };
// The two sides of a diff: the selection above is compared with the base.
function diffSides(sel, r) {
  const b = baseRange(state.range), shift = baseShift(state.range, b);
  const baseSel = $("base-selector").value.trim() ? fullSelector($("base-selector").value) : sel;
  const baseR = state.pinned ? { from: r.from - shift, to: r.to - shift } : b;
  return { base: { selector: pinnedSelector(baseSel), range: baseR }, compare: { selector: pinnedSelector(sel), range: r } };
}
async function loadProfile(gen) {
  document.body.dataset.state = "loading";
  const sel = fullSelector($("selector").value);
  const unit = unitOf(sel);
  const r = state.pinned || state.range;
  const s = pinnedSelector(sel);
  const aggregation = aggregationParam();
  const top = (selector, range) => api("/api/v1/query", { selector, format: "top", node_fraction: 0, aggregation, ...rangeParams(range) });
  if ($("diff-toggle").checked) {
    const { base, compare } = diffSides(sel, r);
    const [{ body: diff, headers }, baseTop, compareTop] = await Promise.all([
      api("/api/v1/diff", {
        base: base.selector, compare: compare.selector, aggregation,
        base_from: base.range.from ?? undefined, base_to: base.range.to ?? undefined,
        compare_from: compare.range.from ?? undefined, compare_to: compare.range.to ?? undefined,
      }, true),
      top(base.selector, base.range),
      top(compare.selector, compare.range),
    ]);
    if (gen !== state.gen) return;
    view.mode = "diff";
    view.aggregation = headers.get("x-frostdb-aggregation");
    state.flame = { root: diff, base: diff.base, compare: diff.compare, unit };
    $("flame-title").textContent = `Diff: red grew, green shrank — base ${fmtValue(diff.base, unit)} → compare ${fmtValue(diff.compare, unit)}` +
      ` (${fmtDelta(diff.compare - diff.base, unit)}, ${fmtRel(diff.base, diff.compare)}; ${AGGREGATED[view.aggregation] || view.aggregation})` +
      (state.pinned ? ` — at ${fmtTime(state.pinned.from)}` : "");
    state.delta = deltaRows(baseTop, compareTop);
    $("table-title").textContent = "Change by function (self)";
    $("top").hidden = true;
    $("delta").hidden = false;
    drawDelta();
  } else {
    const [{ body: flame, headers }, t] = await Promise.all([
      api("/api/v1/query", { selector: s, format: "flamegraph", aggregation, ...rangeParams(r) }, true),
      top(s, r),
    ]);
    if (gen !== state.gen) return;
    view.mode = "merge";
    view.aggregation = headers.get("x-frostdb-aggregation");
    state.flame = flame;
    $("flame-title").textContent = `Flame graph — ${flame.profile_type} — total ${fmtValue(flame.root.total, unit)}` +
      ` (${AGGREGATED[view.aggregation] || view.aggregation})` + (state.pinned ? ` — at ${fmtTime(state.pinned.from)}` : "");
    let running = 0;
    state.top = t.rows.map((row) => {
      running += row.flat;
      return { ...row, name: row.name + (row.inline ? " " + row.inline : ""), total: t.total,
        flat_pct: row.flat / (t.total || 1), cum_pct: row.cum / (t.total || 1), sum_pct: (100 * running) / (t.total || 1),
        flatText: fmtValue(row.flat, unit), cumText: fmtValue(row.cum, unit) };
    });
    $("table-title").textContent = "Top functions";
    $("delta").hidden = true;
    $("top").hidden = false;
    drawTop();
  }
  state.zoom = zoomPath(state.flame.root || state.flame, state.zoomNames);
  drawFlame();
  status(state.flame && (view.total || 0) === 0 ? "No samples for this selector and range." : "");
  document.body.dataset.state = "ready";
}
// Runs the view the controls describe: the graph, then the profile. `push` (default) adds
// a history entry; `keep` keeps the pinned point and zoom (a view from the URL).
async function run({ push = true, keep = false } = {}) {
  const gen = ++state.gen;
  document.body.dataset.state = "loading";
  status("");
  state.range = currentRange();
  if (!keep) {
    state.pinned = null;
    state.zoomNames = null;
  }
  saveUrl(push);
  showPanels();
  const sel = fullSelector($("selector").value);
  // query_range averages or sums; the latest profile is a merge's choice, not a graph's.
  const agg = ["sum", "average"].includes($("aggregation").value) ? $("aggregation").value : undefined;
  const result = await api("/api/v1/query_range", { selector: sel, aggregation: agg, ...rangeParams(state.range) });
  let base = null, shift = 0;
  if ($("diff-toggle").checked) {
    const b = baseRange(state.range);
    shift = baseShift(state.range, b);
    const baseSel = $("base-selector").value.trim() ? fullSelector($("base-selector").value) : sel;
    base = await api("/api/v1/query_range", { selector: baseSel, aggregation: agg, step: result.step_ms, ...rangeParams(b) });
  }
  if (gen !== state.gen) return;
  state.step = result.step_ms;
  drawGraph(result, unitOf(sel), base, shift);
  await loadProfile(gen);
  if (gen !== state.gen) return;
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
$("diff-toggle").addEventListener("change", () => {
  $("diff-form").hidden = !$("diff-toggle").checked;
  run().catch(fail);
});
$("aggregation").addEventListener("change", () => run({ keep: true }).catch(fail));
$("view").addEventListener("change", () => { showPanels(); saveUrl(true); drawFlame(); });
$("range").addEventListener("change", () => {
  $("custom-range").hidden = $("range").value !== "custom";
  if ($("range").value === "custom" && !$("from").value) {
    $("from").value = localTime(Math.floor(Date.now() / 1000) * 1000 - 3600e3);
    $("to").value = localTime(Math.floor(Date.now() / 1000) * 1000);
  }
});
$("base-range").addEventListener("change", () => {
  $("base-custom-range").hidden = $("base-range").value !== "custom";
  if ($("base-range").value === "custom" && !$("base-from").value) {
    let r = { from: Date.now() - 7200e3, to: Date.now() - 3600e3 };
    try { const c = currentRange(); if (c.from != null) r = { from: c.from - (c.to - c.from), to: c.from }; } catch (_) { /* keep the default */ }
    $("base-from").value = localTime(r.from);
    $("base-to").value = localTime(r.to);
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
  if (service) kept.unshift(`service_name="${quoted(service)}"`);
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
    loadRegressions().catch((e) => console.warn("regressions:", e));
    await run();
  } catch (e) {
    fail(e);
  }
});

// ---------- regressions across deploys ----------
// The comparisons of each service's newest version with the one before that found
// regressions (of the selected service, or all), each a link to the diff of the two.
async function loadRegressions() {
  const service = $("service").value;
  const found = await api("/api/v1/regressions", { service: service || undefined });
  const list = $("regressions");
  list.replaceChildren();
  const shown = (found.comparisons || []).filter((c) => c.regressions.length);
  $("regressions-panel").hidden = !shown.length;
  const pct = (x) => (x * 100).toFixed(1) + "%";
  for (const c of shown) {
    const sel = (v) => `{${found.service_label}="${quoted(c.service)}", ${c.version_label}="${quoted(v)}"}`;
    const q = new URLSearchParams();
    const tenant = new URLSearchParams(location.search).get("tenant");
    if (tenant) q.set("tenant", tenant);
    q.set("type", c.profile_type);
    q.set("selector", sel(c.after.version));
    q.set("range", "custom");
    q.set("from", c.after.from_ms);
    q.set("to", c.after.to_ms);
    q.set("aggregation", "average");
    q.set("diff", "1");
    q.set("base", sel(c.before.version));
    q.set("base_range", "custom");
    q.set("base_from", c.before.from_ms);
    q.set("base_to", c.before.to_ms);
    const item = document.createElement("li");
    const head = document.createElement("a");
    head.href = "?" + q;
    head.className = "regression";
    head.textContent = `${c.service} ${c.before.version} → ${c.after.version} (${c.profile_type.split(":").slice(0, 2).join(":")}, ` +
      `${c.before.profiles} and ${c.after.profiles} profiles): ${c.regressions.length} function${c.regressions.length === 1 ? "" : "s"} rose`;
    item.appendChild(head);
    const rows = document.createElement("ul");
    for (const r of c.regressions.slice(0, 5)) {
      const row = document.createElement("li");
      const link = document.createElement("a");
      const one = new URLSearchParams(q);
      one.set("search", "^" + r.function.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + "$");
      link.href = "?" + one;
      link.textContent = `${r.function}: self ${pct(r.self_before)} → ${pct(r.self_after)}, total ${pct(r.total_before)} → ${pct(r.total_after)} (p ${Math.min(r.p_self, r.p_total).toExponential(1)})`;
      row.appendChild(link);
      rows.appendChild(row);
    }
    item.appendChild(rows);
    list.appendChild(item);
  }
}
$("regressions").addEventListener("click", (e) => {
  const a = e.target.closest("a");
  if (!a) return;
  e.preventDefault();
  history.pushState(null, "", a.getAttribute("href"));
  document.body.dataset.state = "loading";
  applyUrl().then(() => run({ push: false, keep: true })).catch(fail);
});

async function init() {
  try {
    state.types = await api("/api/v1/profile_types");
    const services = await api("/api/v1/label/service_name/values");
    for (const name of services) {
      const o = document.createElement("option");
      o.value = o.textContent = name;
      $("service").appendChild(o);
    }
    await applyUrl();
    loadRegressions().catch((e) => console.warn("regressions:", e));
    if (!state.types.length) {
      status("No profiles stored yet: push some (see the README) and reload.");
      document.body.dataset.state = "empty";
      return;
    }
    await run({ push: false, keep: true });
  } catch (e) {
    fail(e);
  }
}
init();
