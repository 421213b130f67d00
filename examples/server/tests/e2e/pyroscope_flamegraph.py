"""frostdb's legacy render API drawn by Pyroscope's own flame graph component, in headless
Chromium (Debian's), driven by Playwright.

Usage: pyroscope_flamegraph.py RENDER_URL BUNDLE_DIR SCREENSHOT_DIR EXPECTED_FUNCTION [...]

RENDER_URL is a `GET /pyroscope/render?query=...` of a frostdb server; FROSTDB_TOKEN (sent as
`Authorization: Bearer ...`, or as is when it already names a scheme) and FROSTDB_TENANT
(sent as `X-Scope-OrgID`) are passed along when set. BUNDLE_DIR holds bundle.js and
bundle.css, built by `npm run build` in examples/server/tests/e2e/flamegraph (@pyroscope/flamegraph's
FlamegraphRenderer with React). The page is a file in a temporary folder with the bundle and
the answer inlined; it loads nothing else (any other request fails the run).

Checks, each EXPECTED_FUNCTION by its exact name:
- the page renders without a page error or console error, and says it is ready;
- the component's table lists the function (its row's name is visible, and the total the
  component computed for it equals the sum over its bars in the answer's levels);
- the flame graph canvas drew the function's widest bar where the answer's levels put it:
  hovering that point makes the component's tooltip name the function with the bar's total
  as its samples; the canvas there is painted in the colour the table shows for the function
  (the component colours both by package name); and when the bar is wide enough for a label
  (20 px), the canvas's fillText drew "NAME (" at the bar's left edge and dark text pixels
  are there;
- the total the component shows (the root bar's tooltip and label, and the table's `total`
  row) is the answer's numTicks.
Screenshots go to SCREENSHOT_DIR: pyroscope-flamegraph.png (the page as drawn) and
pyroscope-flamegraph-tooltip.png (hovering the first EXPECTED_FUNCTION). Exits non-zero
with a message on the first failure.
"""
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

PX_PER_LEVEL = 22  # @pyroscope/flamegraph's FlameGraphComponent/constants.ts
BAR_HEIGHT = PX_PER_LEVEL - 0.5
LABEL_THRESHOLD = 20
# The flame graph's tooltip (the table has one of its own).
TIP = "[data-testid=flamegraph-view] [data-testid=tooltip]"
COLLAPSE_THRESHOLD = 5

# Records what the page's canvases write with fillText (text and position, in the canvas's
# own coordinates before its devicePixelRatio scale), and when a canvas is resized (which
# clears it), so the last drawing's calls can be told from earlier ones.
CANVAS_SPY = """
(() => {
  window.FROSTDB_FILLTEXT = [];
  const fillText = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    const m = this.getTransform();
    window.FROSTDB_FILLTEXT.push({
      canvas: this.canvas.className, text: String(text),
      x: (m.a * x + m.e) / (m.a || 1), y: (m.d * y + m.f) / (m.d || 1),
      gen: this.canvas.__frostdbGen || 0,
    });
    return fillText.call(this, text, x, y, ...rest);
  };
  const desc = Object.getOwnPropertyDescriptor(HTMLCanvasElement.prototype, 'width');
  Object.defineProperty(HTMLCanvasElement.prototype, 'width', {
    get() { return desc.get.call(this); },
    set(v) { this.__frostdbGen = (this.__frostdbGen || 0) + 1; desc.set.call(this, v); },
    configurable: true,
  });
})();
"""


def die(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr, flush=True)
    sys.exit(1)


def fetch(url: str) -> dict:
    headers = {"Accept": "application/json"}
    token = os.environ.get("FROSTDB_TOKEN")
    if token:
        headers["Authorization"] = token if " " in token else f"Bearer {token}"
    tenant = os.environ.get("FROSTDB_TENANT")
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read()
    except urllib.error.HTTPError as e:
        die(f"GET {url}: HTTP {e.code}: {e.read()[:500]!r}")
    except urllib.error.URLError as e:
        die(f"GET {url}: {e.reason}")
    try:
        return json.loads(body)
    except ValueError as e:
        die(f"GET {url}: not JSON ({e}): {body[:200]!r}")


def bars_of(render: dict) -> list:
    """The answer's bars, as the component decodes them: per level, 4 numbers a bar (offset
    from the previous bar's end, total, self, name index)."""
    fb = render["flamebearer"]
    if render["metadata"].get("format") != "single":
        die(f"only single flame graphs are checked, not {render['metadata'].get('format')!r}")
    bars = []
    for i, level in enumerate(fb["levels"]):
        if len(level) % 4:
            die(f"level {i} has {len(level)} numbers, not a multiple of 4")
        end = 0
        for j in range(0, len(level), 4):
            offset = end + level[j]
            total, self_, name = level[j + 1], level[j + 2], fb["names"][level[j + 3]]
            end = offset + total
            bars.append({"i": i, "j": j, "offset": offset, "total": total, "self": self_,
                         "name": name})
    return bars


def commas(n: int) -> str:
    return f"{n:,}"


def page_html(bundle_dir: str, render: dict) -> str:
    with open(os.path.join(bundle_dir, "bundle.js"), encoding="utf-8") as f:
        js = f.read()
    css_path = os.path.join(bundle_dir, "bundle.css")
    css = open(css_path, encoding="utf-8").read() if os.path.exists(css_path) else ""
    # ensure_ascii escapes U+2028/9; "</" can't close the script element once escaped.
    data = json.dumps(render, ensure_ascii=True).replace("</", "<\\/")
    js = js.replace("</script", "<\\/script")
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>frostdb render</title>"
        f"<style>body{{margin:16px;background:#fff}}</style><style>{css}</style></head>"
        f"<body><div id=root></div><script>window.FROSTDB_RENDER = {data};</script>"
        f"<script>{js}</script></body></html>"
    )


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # in order with the FAIL line on stderr
    if len(sys.argv) < 5:
        die(__doc__.split("\n\n")[1])
    url, bundle_dir, shots, expected = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    os.makedirs(shots, exist_ok=True)
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")

    render = fetch(url)
    fb = render.get("flamebearer") or die(f"no flamebearer in the answer: {str(render)[:300]}")
    num_ticks = fb["numTicks"]
    bars = bars_of(render)
    if num_ticks <= 0 or len(fb["names"]) <= 1:
        die(f"the answer is an empty flame graph (numTicks={num_ticks}, names={fb['names']})")
    if bars[0]["name"] != "total" or bars[0]["total"] != num_ticks:
        die(f"the root bar is {bars[0]}, not total with numTicks={num_ticks}")
    totals = {}
    for b in bars:
        totals[b["name"]] = totals.get(b["name"], 0) + b["total"]
    print(f"render: {len(fb['names'])} names, {len(fb['levels'])} levels, numTicks={num_ticks}, "
          f"units={render['metadata'].get('units')!r}, sampleRate={render['metadata'].get('sampleRate')}")

    with tempfile.TemporaryDirectory(prefix="frostdb-flamegraph-") as tmp, sync_playwright() as p:
        index = os.path.join(tmp, "index.html")
        with open(index, "w", encoding="utf-8") as f:
            f.write(page_html(bundle_dir, render))

        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        problems = []  # each with at most 3 lines of its stack

        def short(text: str) -> str:
            return "\n".join(str(text).splitlines()[:3])

        page.on("pageerror", lambda e: problems.append(f"page error: {short(e)}"))

        def on_console(msg):
            if msg.type == "error":
                problems.append(f"console error: {short(msg.text)}")
            elif msg.type == "warning" and "Multiple readback operations" not in msg.text:
                # (that one is this script's getImageData calls)
                print(f"  (console warning: {msg.text})")

        page.on("console", on_console)

        def route(r):
            if r.request.url.startswith(("file:", "data:")):
                r.continue_()
            else:
                problems.append(f"the page requested {r.request.url}")
                r.abort()

        page.route("**/*", route)
        page.add_init_script(CANVAS_SPY)
        page.goto("file://" + index)
        page.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=60_000)
        if page.evaluate("document.body.dataset.state") != "ready":
            die(f"the page failed: {page.evaluate('window.FROSTDB_ERROR')}")
        # The component redraws on resize (debounced by 50 ms): let that settle.
        page.wait_for_timeout(300)
        if problems:
            die("; ".join(problems))
        shot = os.path.join(shots, "pyroscope-flamegraph.png")
        page.screenshot(path=shot, full_page=True)
        print(f"ok   page rendered: table and flame graph; screenshot {shot}")

        # The table: one row per name, `data-row` = "single;NAME;SELF;TOTAL".
        rows = page.eval_on_selector_all(
            "[data-testid=table-view] tbody tr",
            """trs => trs.map(tr => ({
                 row: tr.getAttribute('data-row'),
                 shown: (tr.querySelector('.symbol-name') || {}).innerText,
                 color: getComputedStyle(tr.querySelector('.color-reference') || tr).backgroundColor,
                 visible: !!(tr.offsetWidth || tr.offsetHeight),
                 cells: [...tr.querySelectorAll('td')].map(td => td.innerText.trim()) }))""",
        )
        table = {}
        for r in rows:
            _kind, _, rest = (r["row"] or "").partition(";")
            name, self_, total = rest.rsplit(";", 2) if rest.count(";") >= 2 else (rest, 0, 0)
            table[name] = dict(r, self=int(self_), total=int(total))
        if len(table) != len(set(b["name"] for b in bars)):
            die(f"the table has {len(table)} rows, the answer {len(set(b['name'] for b in bars))} names")

        canvas = page.locator("canvas.flamegraph-canvas")
        if canvas.count() != 1:
            die(f"{canvas.count()} flame graph canvases on the page")
        geo = page.evaluate(
            """() => { const c = document.querySelector('canvas.flamegraph-canvas');
                 return { cw: c.clientWidth, ch: c.clientHeight, w: c.width, h: c.height,
                          gen: c.__frostdbGen || 0 }; }"""
        )
        width, scale = geo["cw"], geo["w"] / geo["cw"]
        if geo["ch"] < len(fb["levels"]) * PX_PER_LEVEL - 1:
            die(f"the canvas is {geo['ch']} px high for {len(fb['levels'])} levels")
        texts = [t for t in page.evaluate("window.FROSTDB_FILLTEXT")
                 if "flamegraph-canvas" in t["canvas"] and t["gen"] == geo["gen"]]

        def hover(bar):
            """Moves the mouse onto the middle of `bar` (or its visible part) and returns what
            the tooltip says, with where the bar is on the canvas."""
            x0 = bar["offset"] * width / num_ticks
            x1 = (bar["offset"] + bar["total"]) * width / num_ticks
            x, y = (x0 + x1) / 2, bar["i"] * PX_PER_LEVEL + BAR_HEIGHT / 2
            pos = page.evaluate(
                """([x, y]) => { const c = document.querySelector('canvas.flamegraph-canvas');
                     let r = c.getBoundingClientRect();
                     window.scrollBy(0, r.top + c.clientTop + y - innerHeight / 2);
                     r = c.getBoundingClientRect();
                     return { x: r.left + c.clientLeft + x, y: r.top + c.clientTop + y }; }""",
                [x, y],
            )
            # Off the canvas first (its mouseout hides and clears the tooltip), so what is read
            # below is what this hover showed.
            page.mouse.move(0, 0)
            page.wait_for_function(
                """(sel) => { const t = document.querySelector(sel);
                     return !t || t.style.visibility !== 'visible'; }""",
                arg=TIP,
                timeout=5_000,
            )
            page.mouse.move(pos["x"], pos["y"])
            tip = page.locator(TIP)
            try:
                page.wait_for_function(
                    """(sel) => { const t = document.querySelector(sel);
                         return t && t.style.visibility === 'visible' &&
                                t.querySelector('[data-testid=tooltip-function-name]'); }""",
                    arg=TIP,
                    timeout=5_000,
                )
            except Exception:
                why = problems + [page.evaluate("window.FROSTDB_ERROR || ''")]
                die(f"hovering {bar['name']!r} at canvas ({x:.1f}, {y:.1f}) shows no tooltip: "
                    + ("; ".join(w for w in why if w) or "no error reported"))
            if problems:
                die(f"hovering {bar['name']!r}: " + "; ".join(problems))
            name = tip.locator("[data-testid=tooltip-function-name]").inner_text()
            cells = tip.locator("[data-testid=tooltip-table] td").all_inner_texts()
            info = dict(zip(cells[0::2], cells[1::2]))
            # The bar's colour, under its label: 2 px above its bottom edge.
            pixel = page.evaluate(
                """([x, y, s]) => { const c = document.querySelector('canvas.flamegraph-canvas');
                     return [...c.getContext('2d').getImageData(Math.floor(x * s), Math.floor(y * s), 1, 1).data]; }""",
                [x, bar["i"] * PX_PER_LEVEL + BAR_HEIGHT - 2, scale],
            )
            return name, info, pixel, (x0, x1, x, y)

        def label_check(bar, x0, x1):
            """When the bar is wide enough for a label: fillText drew "NAME (" at its left
            edge on its row, and there are dark (text) pixels in the bar's first 40 px."""
            if (x1 - x0) - 0.5 < LABEL_THRESHOLD:
                return f"no label: bar {x1 - x0:.1f} px < {LABEL_THRESHOLD} px"
            row_y = bar["i"] * PX_PER_LEVEL + BAR_HEIGHT / 2 + 1
            drawn = [t for t in texts if abs(t["y"] - row_y) < 1.5 and abs(t["x"] - (round(x0) + 3)) < 1.5]
            if not any(t["text"].startswith(bar["name"] + " (") for t in drawn):
                die(f"the canvas wrote no label {bar['name']!r} at ({round(x0) + 3}, {row_y}): {drawn}")
            dark = page.evaluate(
                """([x, y, w, h, s]) => { const c = document.querySelector('canvas.flamegraph-canvas');
                     const d = c.getContext('2d').getImageData(Math.ceil(x * s), Math.ceil(y * s),
                       Math.max(1, Math.floor(w * s)), Math.floor(h * s)).data;
                     let n = 0; for (let k = 0; k < d.length; k += 4)
                       if (d[k + 3] > 200 && d[k] < 90 && d[k + 1] < 90 && d[k + 2] < 90) n++;
                     return n; }""",
                [x0 + 1, bar["i"] * PX_PER_LEVEL + 2, min(40, x1 - x0 - 2), BAR_HEIGHT - 4, scale],
            )
            if dark < 5:
                die(f"the label of {bar['name']!r} left no dark pixels in its bar ({dark})")
            label = next(t["text"] for t in drawn if t["text"].startswith(bar["name"] + " ("))
            return f"label {label!r} drawn ({dark} text pixels)"

        # The total: the root bar and the table's `total` row.
        name, info, pixel, (x0, x1, _, _) = hover(bars[0])
        if name != "total" or info.get("Samples:") != commas(num_ticks):
            die(f"the root bar's tooltip says {name!r} {info}, not total with {commas(num_ticks)} samples")
        if table.get("total", {}).get("total") != num_ticks:
            die(f"the table's total row is {table.get('total')}, not numTicks={num_ticks}")
        note = label_check(bars[0], x0, x1)
        print(f"ok   total: tooltip 'total' Samples {info['Samples:']} "
              f"({[v for k, v in info.items() if k != 'Samples:']}), table row total "
              f"{table['total']['total']} = numTicks; {note}")

        for k, fn in enumerate(expected):
            row = table.get(fn)
            if row is None:
                near = sorted(n for n in table if fn.lower() in n.lower() or n.lower() in fn.lower())
                die(f"{fn!r} is not in the table view ({len(table)} rows; similar: {near[:10]})")
            if row["shown"] != fn or not row["visible"]:
                die(f"the table's row for {fn!r} shows {row['shown']!r} (visible={row['visible']})")
            if row["total"] != totals.get(fn):
                die(f"the table's total for {fn!r} is {row['total']}, the answer's levels add up to {totals.get(fn)}")
            print(f"ok   table: {fn!r} row shown, total {row['total']} ({row['cells'][2] if len(row['cells']) > 2 else '?'}), self {row['self']}")

            bar = max((b for b in bars if b["name"] == fn), key=lambda b: b["total"])
            if bar["total"] * width / num_ticks <= COLLAPSE_THRESHOLD:
                die(f"{fn!r}'s widest bar is {bar['total'] * width / num_ticks:.1f} px: the component "
                    f"merges bars that narrow, so it can't be hovered; pick a larger function")
            name, info, pixel, (x0, x1, x, y) = hover(bar)
            if name != fn:
                die(f"hovering {fn!r}'s bar (level {bar['i']}, canvas x {x0:.0f}-{x1:.0f}) shows {name!r}")
            if info.get("Samples:") != commas(bar["total"]):
                die(f"the tooltip of {fn!r} says {info}, not {commas(bar['total'])} samples")
            want = [int(float(v)) for v in row["color"][row["color"].index("(") + 1:-1].split(",")[:3]]
            if pixel[3] < 250 or any(abs(a - b) > 3 for a, b in zip(pixel, want)):
                die(f"the canvas under {fn!r} at x {x:.0f} is rgba{tuple(pixel)}, not the colour "
                    f"the table shows for it, {row['color']}")
            note = label_check(bar, x0, x1)
            print(f"ok   flame graph: {fn!r} bar at level {bar['i']}, x {x0:.0f}-{x1:.0f} px: tooltip "
                  f"{name!r} Samples {info['Samples:']}, painted rgba{tuple(pixel)} = its table colour; {note}")
            if k == 0:
                page.screenshot(path=os.path.join(shots, "pyroscope-flamegraph-tooltip.png"))

        if problems:
            die("; ".join(problems))
        browser.close()
    print(f"pyroscope_flamegraph: {len(expected)} functions shown in the table and on the flame graph")


if __name__ == "__main__":
    main()
