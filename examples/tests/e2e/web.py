"""The web page end to end in headless Chromium (Debian's), driven by Playwright.

Usage: web.py SERVER_URL EXPECTED_FUNCTION SCREENSHOT_DIR
Opens the page, lets it run its query, and checks what a user sees: the flame graph shows
EXPECTED_FUNCTION, search highlights it, clicking zooms into it, hovering shows self/total,
the top table sorts, the selector completes label names and values, clicking the metrics
graph pins that profile, the diff view renders, and the service picker narrows the selector
and the profile types (the server holds services goapp and other with CPU profiles, and
locky with a mutex profile). Screenshots go to SCREENSHOT_DIR.
"""
import os
import sys

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
        page.select_option("#compare-range", "same")
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

        assert not errors, errors
        browser.close()
    print("web e2e ok")


if __name__ == "__main__":
    main()
