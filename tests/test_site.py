"""The built site (_build/html) works offline in headless Chromium.

Run after the book build (tools/test.sh does). Without a build the tests skip, unless
COURSE_REQUIRE_SITE=1 (set by the test pass), where a missing build is a failure.
Chromium is started with every host except 127.0.0.1 unresolvable, so anything the
page tried to load from a CDN would be missing and the checks below would fail.
"""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if not (HTML / "index.html").exists():
    if os.environ.get("COURSE_REQUIRE_SITE") == "1":
        raise RuntimeError(f"the built site is missing: {HTML}/index.html (run bash tools/build.sh)")
    pytest.skip("the book is not built (bash tools/build.sh)", allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *a, **k: None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def render(url: str) -> str:
    """The DOM after scripts ran, from headless Chromium with no route to the internet."""
    if CHROMIUM is None:
        if os.environ.get("COURSE_REQUIRE_SITE") == "1":
            raise RuntimeError("chromium is not installed (bash tools/setup.sh --browser)")
        pytest.skip("chromium is not installed")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}",
               "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
               "--virtual-time-budget=15000", "--dump-dom", url]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def chapter_pages() -> list[Path]:
    return sorted((HTML / "chapters").glob("*.html"))


def test_math_is_typeset_on_the_index(server):
    dom = render(f"{server}/index.html")
    # MathJax 3 replaces $$...$$ with <mjx-container> elements once it has run.
    assert dom.count("<mjx-container") >= 2, "MathJax did not typeset the index page"


def test_math_is_typeset_in_a_chapter(server):
    pages = chapter_pages()
    assert pages, "no chapter was built"
    for page in pages:
        if "$" in page.read_text(encoding="utf-8") or "\\(" in page.read_text(encoding="utf-8"):
            dom = render(f"{server}/chapters/{page.name}")
            assert "<mjx-container" in dom, f"MathJax did not typeset {page.name}"
            return
    pytest.fail("no chapter page contains math")


def test_every_script_and_stylesheet_is_served_by_the_site():
    pattern = re.compile(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"')
    for page in [HTML / "index.html", *chapter_pages()]:
        for ref in pattern.findall(page.read_text(encoding="utf-8")):
            if not ref.split("?")[0].endswith((".js", ".css")):
                continue
            assert not re.match(r"^(https?:)?//", ref), f"{page.name} loads {ref} from another host"
            target = (page.parent / ref.split("?")[0]).resolve()
            assert target.exists(), f"{page.name} refers to {ref}, which is not in the built site"


def test_mathjax_and_widget_manager_are_vendored():
    static = HTML / "_static"
    assert (static / "mathjax" / "es5" / "tex-mml-chtml.js").stat().st_size > 100_000
    assert (static / "widgets" / "embed-amd.js").stat().st_size > 100_000
    assert (static / "widgets" / "require.js").exists()


def test_exercise_downloads_are_published_and_linked():
    linked = 0
    for page in chapter_pages():
        for ref in re.findall(r'href="([^"]*_downloads/[^"]+\.ipynb)"', page.read_text(encoding="utf-8")):
            target = (page.parent / ref).resolve()
            assert target.exists(), f"{page.name} links {ref}, which was not published"
            text = target.read_text(encoding="utf-8")
            assert "BEGIN SOLUTION" not in text and "hidden: true" not in text
            linked += 1
    assert linked >= 1, "no chapter links a student exercise notebook"


def test_bibliography_renders_the_cited_papers():
    html = (HTML / "bibliography.html").read_text(encoding="utf-8").lower()
    for title in ("attention is all you need", "neural machine translation by jointly learning"):
        assert title in html, f"the bibliography lacks {title!r}"


def test_every_chapter_shows_its_figures():
    # Plots are PNG outputs of the executed notebooks, copied by Sphinx into _images/.
    # (A non-interactive matplotlib backend in the kernels' environment would silently drop them.)
    for page in chapter_pages():
        images = re.findall(r'<img[^>]+src="([^"]+\.png)"', page.read_text(encoding="utf-8"))
        assert images, f"{page.name} shows no figure"
        for src in images:
            assert (page.parent / src).resolve().exists(), f"{page.name}: {src} is missing"
