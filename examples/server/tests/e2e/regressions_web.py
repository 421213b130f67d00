"""The web page's list of regressions across deploys, in headless Chromium (Debian's),
driven by Playwright.

Usage: regressions_web.py SERVER_URL TENANT SERVICE FUNCTION BEFORE AFTER SCREENSHOT_DIR
Opens the page for TENANT, waits for the list of regressions, checks it names SERVICE's
versions BEFORE → AFTER and FUNCTION with its shares, then follows FUNCTION's link: the page
shows the diff of the two versions (each side selecting its version, over its own range),
FUNCTION in the diff flame graph, and the link's view stays in the URL.
"""
import os
import sys

from playwright.sync_api import sync_playwright


def main() -> None:
    url, tenant, service, function, before, after, shots = sys.argv[1:8]
    os.makedirs(shots, exist_ok=True)
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/?tenant={tenant}&range=all")
        page.wait_for_selector("#regressions-panel:not([hidden])", timeout=60_000)
        text = page.text_content("#regressions")
        assert f"{service} {before} → {after}" in text, text
        assert f"{function}: self" in text, text
        page.screenshot(path=os.path.join(shots, "regressions.png"), full_page=True)

        page.click(f"#regressions a:text-matches('^{function}: self')")
        page.wait_for_function(
            "window.frostdbView && window.frostdbView.mode === 'diff' && document.body.dataset.state === 'ready'",
            timeout=60_000,
        )
        assert page.is_checked("#diff-toggle")
        selector = page.input_value("#selector")
        base = page.input_value("#base-selector")
        assert f'version="{after}"' in selector and service in selector, selector
        assert f'version="{before}"' in base and service in base, base
        assert page.input_value("#base-range") == "custom"
        names = page.evaluate("window.frostdbView.names")
        assert any(function in n for n in names), f"{function} not in the diff: {names}"
        search = page.evaluate("location.search")
        assert "diff=1" in search and "base_from=" in search, search
        page.screenshot(path=os.path.join(shots, "regression-diff.png"), full_page=True)
        assert not errors, errors
        browser.close()
    print("ok")


if __name__ == "__main__":
    main()
