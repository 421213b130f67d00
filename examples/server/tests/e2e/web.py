"""The web page end to end in headless Chromium (Debian's), driven by Playwright.

Usage: web.py SERVER_URL EXPECTED_FUNCTION SCREENSHOT_DIR
Opens the page, lets it run its query, and checks what a user sees: the flame graph shows
EXPECTED_FUNCTION, search highlights it, clicking zooms into it, hovering shows self/total,
the top table sorts, the selector completes label names and values, clicking the metrics
graph pins that profile, the diff view renders, and the service picker narrows the selector
and the profile types (the server holds services goapp and other with CPU profiles, and
locky with a mutex profile). Then a diff opened from its URL (service heapy: four heap
profiles of one program, 3 s apart, its memory growing in the last two): both sides drawn in the metrics graph, a delta table
whose base and compare sides total what /api/v1/query totals for them, both shares in the
flame graph's tooltip, the same view after a reload, and back and forward through the views.
Screenshots go to SCREENSHOT_DIR.
"""
import json
import os
import sys
import urllib.parse
import urllib.request

from playwright.sync_api import sync_playwright


def main() -> None:
    url, expected, shots = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(shots, exist_ok=True)
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # All time: the profiles keep the times they were taken, days ago.
        page.goto(url + "/?range=all")
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)

        # The flame graph shows the expected function.
        names = page.evaluate("window.frostdbView.names")
        assert any(expected in n for n in names), f"{expected} not in flame graph: {names}"
        assert page.evaluate("window.frostdbView.total") > 0
        page.screenshot(path=os.path.join(shots, "flamegraph.png"), full_page=True)

        # Search highlights matching frames.
        page.fill("#search", expected.replace(".", r"\."))
        info = page.text_content("#flame-info")
        assert "matching" in info and not info.startswith("0 "), info

        # Hover shows self and total; click zooms.
        page.fill("#search", "")
        frame = page.evaluate(
            f"window.frostdbView.frames.find(f => f.name.includes({expected!r}))"
        )
        box = page.locator("#flame").bounding_box()
        x, y = box["x"] + frame["cx"], box["y"] + frame["cy"]
        page.mouse.move(x, y)
        tip = page.text_content("#tooltip")
        assert expected in tip and "self:" in tip and "total:" in tip, tip
        page.mouse.click(x, y)
        info = page.text_content("#flame-info")
        assert "zoomed into" in info and expected in info, info
        page.screenshot(path=os.path.join(shots, "zoomed.png"), full_page=True)
        page.click("#reset-zoom")

        # The top table has rows and sorts by name when its header is clicked.
        assert page.locator("#top tbody tr").count() > 0
        page.click("#top th[data-key=name]")
        col = page.eval_on_selector_all(
            "#top tbody tr td:last-child", "tds => tds.map(t => t.textContent)"
        )
        want = page.evaluate("c => [...c].sort((x, y) => x.localeCompare(y))", col)
        assert col == want, col[:5]

        # Label autocompletion: names, then values.
        page.fill("#selector", "")
        page.click("#selector")
        page.keyboard.type("{serv")
        page.wait_for_selector("#suggestions li")
        suggestions = page.eval_on_selector_all("#suggestions li", "l => l.map(x => x.textContent)")
        assert "service_name" in suggestions, suggestions
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        page.wait_for_selector("#suggestions li")
        values = page.eval_on_selector_all("#suggestions li", "l => l.map(x => x.textContent)")
        assert len(values) >= 1, values
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        page.keyboard.type("}")
        selector = page.input_value("#selector")
        assert selector.startswith('{service_name="') and selector.endswith('"}'), selector
        page.click("#run")
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)

        # Clicking a point of the metrics graph pins that profile.
        points = page.evaluate("window.frostdbView.points")
        assert points, "the metrics graph drew no points"
        gbox = page.locator("#graph").bounding_box()
        page.mouse.click(gbox["x"] + points[0]["x"], gbox["y"] + points[0]["y"])
        page.wait_for_function("document.querySelector('#flame-title').textContent.includes(' at ')")
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)

        # The diff view.
        page.check("#diff-toggle")
        page.select_option("#base-range", "same")
        page.click("#run")
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)
        assert page.evaluate("window.frostdbView.mode") == "diff"
        assert page.text_content("#flame-title").startswith("Diff")
        page.screenshot(path=os.path.join(shots, "diff.png"), full_page=True)

        # The service picker lists the stored services; picking one puts it in the selector
        # and offers only the types it has, opening on CPU time where it has it.
        page.uncheck("#diff-toggle")
        services = page.eval_on_selector_all("#service option", "o => o.map(x => x.value)")
        assert "locky" in services and "goapp" in services, services
        page.select_option("#service", "locky")
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)
        assert 'service_name="locky"' in page.input_value("#selector")
        types = page.eval_on_selector_all("#profile-type option", "o => o.map(x => x.value)")
        assert types and all(t.startswith("mutex:") for t in types), types
        assert page.evaluate("window.frostdbView.total") > 0
        page.select_option("#service", "goapp")
        page.wait_for_selector("body[data-state=ready]", timeout=60_000)
        selector = page.input_value("#selector")
        assert 'service_name="goapp"' in selector and "locky" not in selector, selector
        assert page.input_value("#profile-type").startswith("process_cpu:")
        names = page.evaluate("window.frostdbView.names")
        assert any(expected in n for n in names), f"{expected} not in goapp's graph: {names}"
        page.screenshot(path=os.path.join(shots, "service.png"), full_page=True)

        check_diff_url(page, url, shots)

        assert not errors, errors
        browser.close()
    print("web e2e ok")


INUSE = "memory:inuse_space:bytes:space:bytes"
HEAPY = '{service_name="heapy"}'
# The heap profiles' times (ms): the compare side holds the 3rd and 4th, the base (the
# range before) the 1st and 2nd.
COMPARE = (1700000006000, 1700000012000)
BASE = (1700000000000, 1700000006000)


def query_total(url, start, end):
    """The total /api/v1/query answers for heapy's in-use memory in [start, end)."""
    q = urllib.parse.urlencode(
        {"selector": INUSE + HEAPY, "format": "top", "from": start, "to": end}
    )
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}") as r:
        assert r.headers["x-frostdb-aggregation"] == "average", dict(r.headers)
        return json.load(r)["total"]


def ready(page, condition="true"):
    page.wait_for_function(
        f"document.body.dataset.state === 'ready' && ({condition})", timeout=60_000
    )


def diff_view(page):
    """What the diff view shows: controls, titles, graph legend, delta table."""
    return {
        "url": page.evaluate("location.search"),
        "inputs": page.evaluate(
            """['profile-type', 'selector', 'range', 'from', 'to', 'aggregation', 'view',
                'base-selector', 'base-range'].map(id => document.getElementById(id).value)"""
        ),
        "diff": page.is_checked("#diff-toggle"),
        "title": page.text_content("#flame-title"),
        "legend": page.text_content("#graph-legend"),
        "series": page.evaluate("window.frostdbView.series"),
        "rows": page.eval_on_selector_all(
            "#delta tbody tr", "rows => rows.slice(0, 20).map(r => r.textContent)"
        ),
        "zoom": page.evaluate("window.frostdbView.zoom"),
    }


def check_diff_url(page, url, shots):
    """A diff opened from its URL is the diff a user can trust, and stays in the URL."""
    q = urllib.parse.urlencode(
        {"type": INUSE, "selector": HEAPY, "range": "custom", "from": COMPARE[0],
         "to": COMPARE[1], "diff": "1", "base_range": "previous"}
    )
    page.goto(f"{url}/?{q}")
    ready(page)
    assert page.evaluate("window.frostdbView.mode") == "diff"
    assert page.is_checked("#diff-toggle") and page.is_visible("#diff-form")
    assert page.evaluate("window.frostdbView.aggregation") == "average"

    # Both sides over time: the compare side in colour, the base dashed in grey, moved onto
    # the same axis; each with its two profiles.
    series = page.evaluate("window.frostdbView.series")
    points = {s["side"]: s["points"] for s in series}
    assert points == {"compare": 2, "base": 2}, series
    legend = page.text_content("#graph-legend")
    assert "base:" in legend and "compare:" in legend and "later" in legend, legend
    colours = page.evaluate(
        """() => {
            const c = document.getElementById('graph');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            const near = (i, [r, g, b]) => Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 12;
            let base = 0, compare = 0;
            for (let i = 0; i < d.length; i += 4) {
                if (near(i, [0x8a, 0x96, 0xa3])) base++;
                if (near(i, [0x2f, 0x6f, 0xde])) compare++;
            }
            return { base, compare };
        }"""
    )
    assert colours["base"] > 20 and colours["compare"] > 20, colours

    # The delta table: per function, base, compare, delta and delta%, where the sides total
    # what /api/v1/query totals for them (averaged, as the query does).
    assert page.is_hidden("#top") and page.is_visible("#delta")
    base_total, compare_total = query_total(url, *BASE), query_total(url, *COMPARE)
    assert base_total != compare_total, (base_total, compare_total)
    delta = page.evaluate("window.frostdbView.delta")
    assert len(delta) >= 3, delta
    assert sum(r["base"] for r in delta) == base_total, (base_total, delta[:3])
    assert sum(r["compare"] for r in delta) == compare_total, (compare_total, delta[:3])
    assert all(r["delta"] == r["compare"] - r["base"] for r in delta)
    assert any(r["base"] > 0 and r["compare"] > 0 and r["delta"] != 0 for r in delta)
    cells = page.eval_on_selector_all(
        "#delta tbody tr:first-child td", "tds => tds.map(t => t.textContent)"
    )
    assert len(cells) == 5 and cells[2][0] in "+−±" and cells[3][-1] in "%w", cells
    deltas = [r["delta"] for r in delta]
    assert deltas == sorted(deltas, reverse=True), "sorted by delta, largest growth first"
    page.click("#delta th[data-key=delta]")
    deltas = [r["delta"] for r in page.evaluate("window.frostdbView.delta")]
    assert deltas == sorted(deltas), "a click sorts the other way"
    assert "sort=delta" in page.evaluate("location.search")
    title = page.text_content("#flame-title")
    shown = [page.evaluate("v => fmtValue(v, 'bytes')", v) for v in (base_total, compare_total)]
    assert f"base {shown[0]} → compare {shown[1]}" in title, (title, shown)
    assert "averaged" in title, title

    # Hovering a node: both sides' values and shares, and the change.
    frames = page.evaluate("window.frostdbView.frames")
    box = page.locator("#flame").bounding_box()
    for i, f in enumerate(frames[:2]):
        page.mouse.move(box["x"] + f["cx"], box["y"] + f["cy"])
        tip = page.text_content("#tooltip")
        lines = tip.split("\n")
        assert lines[0] == f["name"], tip
        assert lines[1].startswith("base: ") and "%)" in lines[1], tip
        assert lines[2].startswith("compare: ") and "%)" in lines[2], tip
        assert lines[3].startswith("change: ") and "pp" in lines[3], tip
        if i == 0:
            # The root: each side all of itself.
            assert "(100.00%)" in lines[1] and "(100.00%)" in lines[2], tip
    page.screenshot(path=os.path.join(shots, "diff-url.png"), full_page=True)

    # Zoom into a frame: the URL says so; a reload shows the same view.
    child = frames[1]
    page.mouse.click(box["x"] + child["cx"], box["y"] + child["cy"])
    assert page.evaluate("window.frostdbView.zoom") == [child["name"]]
    before = diff_view(page)
    assert "zoom=" in before["url"] and "diff=1" in before["url"], before["url"]
    page.reload()
    ready(page)
    after = diff_view(page)
    assert after == before, (before, after)

    # Back and forward: the merge view of the same selection, then the diff again.
    page.uncheck("#diff-toggle")
    ready(page, "window.frostdbView.mode === 'merge'")
    assert "diff=1" not in page.evaluate("location.search")
    assert page.is_visible("#top") and page.is_hidden("#delta")
    merged_total = page.evaluate("window.frostdbView.total")
    assert merged_total == compare_total, (merged_total, compare_total)
    page.go_back()
    ready(page, "window.frostdbView.mode === 'diff'")
    assert diff_view(page) == before
    page.go_forward()
    ready(page, "window.frostdbView.mode === 'merge'")
    assert not page.is_checked("#diff-toggle")


if __name__ == "__main__":
    main()
