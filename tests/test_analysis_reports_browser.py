"""The HTML reports of `compare --html` and `scaling --html`, opened in a real headless Chromium.

No console errors or uncaught exceptions; every plot loaded, and shown at a readable size (not shrunk below
half its pixels, at least 480 px wide in a 1280 px window, never wider than the window); the page no wider than the
window, a set's name of 205 characters included. Skips, saying why,
where no browser is installed (`make test` installs Debian's chromium when run as root).
"""

from __future__ import annotations

import browser
import pytest
from click.testing import CliRunner
from test_analysis_logs import _our_set

from mlbench.analysis.commands import compare, scaling

BINARY = browser.find()
pytestmark = [
    pytest.mark.skipif(BINARY is None, reason=f"no headless browser ({', '.join(browser.BINARIES)}) on PATH; "
                                              "install Debian's chromium (make system-deps, as root)"),
]
WINDOW = 1280


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """The two reports, written by the commands as a user runs them."""
    root = tmp_path_factory.mktemp("reports")
    a = _our_set(root, "sysA-" + "x" * 200, 8, 1.0, 16)  # a name with nowhere to break a line
    b = _our_set(root, "sysB", 16, 0.55, 16)
    out = {"compare": root / "compare.html", "scaling": root / "scaling.html"}
    for cmd, args in ((compare, [str(a), str(b), "--no-score"]), (scaling, [str(a), str(b)])):
        res = CliRunner().invoke(cmd, [*args, "--html", str(out[cmd.name])])
        assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    pytest.importorskip("websocket", reason="websocket-client (a dev dependency) is not installed")
    c = browser.Chromium(BINARY, tmp_path_factory.mktemp("profile"), width=WINDOW)
    yield c
    c.close()


@pytest.mark.parametrize("report,plots", [("compare", 2), ("scaling", 1)])
def test_report_opens_without_errors_and_shows_readable_plots(pages, chromium, report, plots):
    errors, images = chromium.open(pages[report])
    assert errors == [], errors
    # a 205-character name with no break in it made the tables, and the page, scroll sideways
    assert chromium.page_width() <= WINDOW, chromium.page_width()
    assert len(images) == plots, images
    for img in images:
        assert img["complete"] and img["naturalWidth"] > 0, f"plot not decoded: {img}"
        assert img["naturalWidth"] >= 480 and img["naturalHeight"] >= 300, f"plot rendered too small: {img}"
        assert 480 <= img["width"] <= WINDOW, f"plot displayed at an unreadable width: {img}"
        assert img["width"] >= 0.5 * img["naturalWidth"], f"plot shrunk below half its pixels: {img}"
        assert img["height"] == pytest.approx(img["width"] * img["naturalHeight"] / img["naturalWidth"], rel=0.02), \
            f"plot distorted: {img}"
