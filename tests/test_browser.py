"""report.html in Debian's chromium: no errors, no requests, no injected markup runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from variantlab.report import write_report
from variantlab.report.sample import sample_run

CHROMIUM = Path("/usr/bin/chromium")
EVIL = "<img src=x onerror=alert(1)>"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]

# .ci/run installs chromium and sets VARIANTLAB_REQUIRE_BROWSER=1: there a missing browser
# fails the test instead of skipping it
REQUIRED = os.environ.get("VARIANTLAB_REQUIRE_BROWSER", "") not in ("", "0")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists() and not REQUIRED,
                       reason="needs Debian's chromium at /usr/bin/chromium "
                              "(./scripts/setup --browser installs it)"),
]


def test_report_html_in_chromium(tmp_path):
    from playwright import sync_api
    run = sample_run(((EVIL, {}, 1.05), ("post_norm", {"residual.kind": "post_norm"}, 2.0),
                      ("batch", {"norm.kind": "batch"}, 1.2)))
    files = write_report([run], tmp_path)
    url = files.html.resolve().as_uri()
    requests, console_errors, page_errors, dialogs = [], [], [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error"
                    else None)
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.goto(url, wait_until="load")
            page.wait_for_timeout(300)
            tables = page.locator("table").count()
            svgs = page.locator("figure svg").count()
            svg_text = page.locator("figure svg").first.text_content()
            injected = page.locator("img").count()
            cell = page.locator("table.variants tbody tr").first.locator("td").first.inner_text()
            reading = page.locator("ul.reading").inner_text()
            title = page.title()
        finally:
            browser.close()
    assert requests == [url], f"only the page itself may be requested, got {requests}"
    assert console_errors == [] and page_errors == []
    assert dialogs == [], "a script ran"
    assert injected == 0, "the variant name became an element"
    assert cell == EVIL + " (baseline)"
    assert EVIL in reading and "post_norm" in reading
    assert tables >= 5  # variants, four summary sections (+ warnings, failures)
    assert svgs == 5 and "layer index" in svg_text
    assert title == "variantlab report: sample"
