"""The built site (_build/html) works offline in headless Chromium.

Run after the book build (tools/test.sh does). Without a build the tests skip, unless
COURSE_REQUIRE_SITE=1 (set by the test pass), where a missing build is a failure.
Chromium is started with every host except 127.0.0.1 unresolvable, so anything the
page tried to load from a CDN would be missing and the checks below would fail.

The browser tests drive Debian's Chromium with Playwright (no browser download) and see
what a reader's browser sees: every page of the site, each in a fresh profile (a first
visit), fails on an uncaught exception, a console error, a failed (4xx/5xx) request or a
request leaving 127.0.0.1. The browser is given only matplotlib's DejaVu fonts
(FONTCONFIG_FILE), so it is a machine without a Korean font on every host, and the Korean
text is checked in rendered pixels and in the fonts the browser says it drew each element with.
What a reader runs into is checked too: the sidebar buttons at 390, 1024 and 1280 px, code and
outputs that keep their lines, nothing cut off without a scroll cue, one search box, each page
once in the navigation, no test markers, alt text, plots sharp at the size they are shown (and in
shape), printed tables with Korean in line, Korean words kept whole in tables on a phone, a link on
every bibliography entry, glossary links that reach their sections in every chapter, and page
weight and first paint on slow 4G (served gzip-compressed, as GitHub Pages serves it). Every test
opens its pages through one helper (:func:`open_page`, :func:`opened`).
"""
from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import io
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if not (HTML / "index.html").exists():
    if os.environ.get("COURSE_REQUIRE_SITE") == "1":
        raise RuntimeError(f"the built site is missing: {HTML}/index.html (run bash tools/build.sh)")
    pytest.skip("the book is not built (bash tools/build.sh)", allow_module_level=True)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the browser's requests are checked, not printed
        pass


class GzipHandler(QuietHandler):
    """Serves text files gzip-compressed, as GitHub Pages does, so that what the browser
    downloads is what a reader's browser downloads from the published site."""

    compressed: dict[str, bytes] = {}
    TEXT = (".html", ".js", ".css", ".json", ".svg", ".txt", ".map", ".ipynb")

    def send_head(self):
        path = self.translate_path(self.path)
        if (not path.endswith(self.TEXT) or "gzip" not in self.headers.get("Accept-Encoding", "")
                or not os.path.isfile(path)):
            return super().send_head()
        if path not in self.compressed:
            with open(path, "rb") as f:
                self.compressed[path] = gzip.compress(f.read(), 6)
        body = self.compressed[path]
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


@pytest.fixture(scope="module")
def gzip_server():
    handler = functools.partial(GzipHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
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


def site_pages() -> list[str]:
    """Every HTML page of the site, both languages (not the copies Sphinx keeps under _static,
    _sources, ... of either)."""
    return sorted(p.relative_to(HTML).as_posix() for p in HTML.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(HTML).parts))


# ============================================================================ a reader's browser

HANGUL = "[\\uac00-\\ud7a3]"
# every Hangul block (syllables, jamo, compatibility jamo): the ranges of the site's Korean font
HANGUL_ANY = "[\\u1100-\\u11ff\\u3130-\\u318f\\ua960-\\ua97f\\uac00-\\ud7a3\\ud7b0-\\ud7ff]"
KOREAN_FONT = "Course Hangul"


def _require(what: str, missing: bool, how: str) -> None:
    if missing:
        if os.environ.get("COURSE_REQUIRE_SITE") == "1":
            raise RuntimeError(f"{what} is not installed ({how})")
        pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _require("chromium", CHROMIUM is None, "bash tools/setup.sh --browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    _require("playwright", sync_playwright is None, "requirements.txt")
    import matplotlib
    fonts = tmp_path_factory.mktemp("fonts")
    (fonts / "fonts.conf").write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
        f'  <dir>{Path(matplotlib.get_data_path()) / "fonts" / "ttf"}</dir>\n'
        f'  <cachedir>{fonts / "cache"}</cachedir>\n</fontconfig>\n', encoding="utf-8")
    env = {**os.environ, "FONTCONFIG_FILE": str(fonts / "fonts.conf")}
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM, env=env,
            args=["--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"])
        yield chromium
        chromium.close()


def open_page(browser, url: str, width: int = 1280, height: int = 900, before=None, timeout: float = 30_000):
    """``(context, page)``: ``url`` loaded in a fresh browser profile (a first visit) with a window
    ``width`` x ``height``, once its requests are done and its fonts have loaded. ``before(context, page)``
    runs before the page is requested (to listen, route or throttle). The caller closes the context."""
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        if before is not None:
            before(context, page)
        page.goto(url, wait_until="load", timeout=timeout)
        page.wait_for_load_state("networkidle", timeout=timeout)
        page.evaluate("document.fonts.ready.then(() => true)")
    except BaseException:
        context.close()
        raise
    return context, page


@contextlib.contextmanager
def opened(browser, url: str, **how):
    """:func:`open_page` for one test: the page, its profile closed afterwards."""
    context, page = open_page(browser, url, **how)
    try:
        yield page
    finally:
        context.close()


class Visit:
    """One page loaded in a fresh browser profile, with everything that went wrong."""

    def __init__(self, browser, server: str, path: str):
        self.problems: list[str] = []
        self.context, self.page = open_page(browser, f"{server}/{path}", before=self._listen)
        page = self.page
        # The icon a browser shows in the tab: requested after the page, so asked for here.
        icon = page.evaluate("""() => { const link = document.querySelector('link[rel~="icon"]');
            return link ? link.href : new URL('/favicon.ico', location.href).href; }""")
        status = self.context.request.get(icon).status
        if status >= 400:
            self.problems.append(f"HTTP {status}: {icon} (the page's icon)")

    def _listen(self, context, page) -> None:
        context.route("**/*", self._route)
        page.on("pageerror", lambda e: self.problems.append(f"uncaught exception: {e}"))
        page.on("console", lambda m: m.type == "error" and self.problems.append(
            f"console error: {m.text} (at {m.location.get('url')})"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        page.on("requestfailed", lambda r: urlsplit(r.url).hostname == "127.0.0.1" and self.problems.append(
            f"request failed: {r.url} ({r.failure})"))

    def _route(self, route):
        url = route.request.url
        if urlsplit(url).hostname != "127.0.0.1":
            self.problems.append(f"request leaving the site: {url}")
            route.abort()
        else:
            route.continue_()

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def visit(browser, server):
    """visit(path): the page loaded once per test module, then shared by the tests."""
    visits: dict[str, Visit] = {}

    def get(path: str) -> Visit:
        if path not in visits:
            visits[path] = Visit(browser, server, path)
        return visits[path]

    yield get
    for v in visits.values():
        v.close()


@pytest.mark.parametrize("path", site_pages())
def test_page_loads_without_errors_in_the_browser(visit, path):
    problems = visit(path).problems
    assert not problems, f"{path}:\n  " + "\n  ".join(problems)


def _settled(page) -> None:
    """Wait until MathJax has typeset and the page's scripts have marked what scrolls."""
    page.evaluate("""async () => {
        if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
        await document.fonts.ready;
        for (let i = 0; i < 3; i++) await new Promise(done => requestAnimationFrame(done));
    }""")


@pytest.mark.parametrize("path", [f"chapters/{p.name}" for p in chapter_pages()])
def test_no_code_or_output_block_wraps_its_lines(visit, path):
    # A printed table or a log wrapped at the page width is garbled, and wrapped code loses its
    # indentation: every code cell and text output is drawn exactly as tall as its lines unwrapped.
    page = visit(path).page
    _settled(page)
    wrapped = page.evaluate("""() => Array.from(document.querySelectorAll('.bd-article pre'))
        .filter(pre => pre.clientWidth > 0)
        .filter(pre => {
            const h = pre.getBoundingClientRect().height;
            const saved = [pre.style.whiteSpace, pre.style.overflowWrap];
            pre.style.whiteSpace = 'pre';
            pre.style.overflowWrap = 'normal';
            const unwrapped = pre.getBoundingClientRect().height;
            [pre.style.whiteSpace, pre.style.overflowWrap] = saved;
            return h > unwrapped + 1;
        })
        .map(pre => pre.textContent.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), '').slice(0, 100))""")
    assert not wrapped, f"{path}: {len(wrapped)} code cells or outputs wrap their lines, e.g. {wrapped[:3]}"


# What is wider than its box: cut off (the box hides the rest, or the page itself scrolls
# sideways) or scrolling without the cue course.js adds. MathJax's copy of each formula for
# screen readers (mjx-assistive-mml, clipped to nothing on purpose) is left out while measuring.
_OVERFLOWS = """() => {
    const style = document.createElement('style');
    style.textContent = 'mjx-assistive-mml { display: none !important; }';
    document.head.append(style);
    const desc = el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string'
        ? '.' + el.className.trim().split(/\\s+/).join('.') : '') + ' "' + el.textContent.trim().slice(0, 50) + '"';
    const cut = [], uncued = [];
    if (document.documentElement.scrollWidth > innerWidth + 1)
        cut.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${innerWidth} px window`);
    for (const el of document.querySelectorAll('.bd-main *')) {
        if (el.clientWidth === 0 || el.scrollWidth <= el.clientWidth + 1) continue;
        if (el.parentElement.closest('mjx-container')) continue;   // MathJax's own boxes clip glyph parts
        const ox = getComputedStyle(el).overflowX;
        if (ox === 'auto' || ox === 'scroll') {
            if (!el.classList.contains('course-scroll')) uncued.push(desc(el));
        } else if (ox === 'hidden' || ox === 'clip') {
            cut.push(`${desc(el)}: ${el.scrollWidth - el.clientWidth} px hidden`);
        }
    }
    for (const el of document.querySelectorAll('.bd-article *')) {   // boxes that scroll down
        if (el.clientHeight === 0 || el.scrollHeight <= el.clientHeight + 1) continue;
        const oy = getComputedStyle(el).overflowY;
        if ((oy === 'auto' || oy === 'scroll') && !el.classList.contains('course-scroll')) uncued.push(desc(el));
    }
    style.remove();
    return {cut, uncued};
}"""


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("path", [f"chapters/{p.name}" for p in chapter_pages()])
def test_nothing_is_cut_off_and_what_scrolls_shows_it(browser, server, visit, path, width):
    with (contextlib.nullcontext(visit(path).page) if width == 1280 else
          opened(browser, f"{server}/{path}", width=width)) as page:
        _settled(page)
        found = page.evaluate(_OVERFLOWS)
    assert not found["cut"], f"{path} at {width} px cuts off content:\n  " + "\n  ".join(found["cut"][:6])
    assert not found["uncued"], f"{path} at {width} px scrolls sideways without a cue:\n  " + \
        "\n  ".join(found["uncued"][:6])


def _ink(png: bytes):
    """The dark pixels of a screenshot of text, cropped to their bounding box (so that two
    renderings compare glyph by glyph, whatever the line box around them)."""
    import numpy as np
    from PIL import Image
    gray = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.int16)
    ink = gray < np.median(gray) - 64
    if not ink.any():
        return ink
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    return ink[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def _differing(a, b) -> float:
    """The fraction of ink pixels that differ between two renderings (1.0 when their sizes do
    by more than a pixel of rounding)."""
    if a.size == 0 or b.size == 0 or abs(a.shape[0] - b.shape[0]) > 1 or abs(a.shape[1] - b.shape[1]) > 1:
        return 1.0
    h, w = min(a.shape[0], b.shape[0]), min(a.shape[1], b.shape[1])
    return float((a[:h, :w] != b[:h, :w]).mean())


def _ink_in(element, family: str | None):
    """The ink of one element's text drawn in the font stack ``family`` (None: as published)."""
    element.evaluate("""async (el, f) => { el.style.fontFamily = f === null ? '' : f;
        await document.fonts.ready;
        await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done))); }""", family)
    return _ink(element.screenshot())


def test_korean_text_is_drawn_with_glyphs_not_boxes(visit):
    # The first Korean word of a table in chapter 04 (the chatbot's prompts and answers), as
    # the page draws it once its fonts have loaded, against the same word in a font stack
    # that cannot draw Hangul (this browser has no Korean font: that is the empty boxes a
    # reader without one saw) and in the web font the site serves.
    page = visit("chapters/04_transformer_chatbot.html").page
    found = page.evaluate(f"""async () => {{
        const re = /{HANGUL}+/;
        const cell = Array.from(document.querySelectorAll('.bd-article td, .bd-article th'))
            .find(el => el.childElementCount === 0 && re.test(el.textContent));
        if (!cell) return null;
        const word = cell.textContent.match(re)[0], at = cell.textContent.indexOf(word);
        const span = document.createElement('span');
        span.id = 'korean-sample';
        span.textContent = word;
        const text = cell.firstChild;
        text.splitText(at).splitText(word.length);
        cell.replaceChild(span, text.nextSibling);
        const cs = getComputedStyle(span);
        span.dataset.family = cs.fontFamily;
        await document.fonts.load(`${{cs.fontStyle}} ${{cs.fontWeight}} ${{cs.fontSize}} ${{cs.fontFamily}}`, word);
        return word;
    }}""")
    assert found, "chapter 04 shows no Korean text in a table"
    sample = page.locator("#korean-sample")

    def shot(family: str | None):
        return _ink_in(sample, family)

    as_published = shot(None)
    family = sample.evaluate("el => el.dataset.family")
    tofu = shot('"DejaVu Sans", sans-serif')
    served = shot(f'"{KOREAN_FONT}", {family}')
    assert page.evaluate(f"document.fonts.check(\"16px '{KOREAN_FONT}'\", {found!r})"), f"{KOREAN_FONT} was not loaded"
    assert _differing(served, tofu) > 0.2, f"{KOREAN_FONT} draws Hangul as the boxes a font without it draws"
    assert _differing(as_published, tofu) > 0.2, f"the Korean text {found!r} is drawn as empty boxes"
    assert _differing(as_published, served) < 0.05, f"the Korean text {found!r} is not drawn with {KOREAN_FONT}"


# Marks every element with Hangul in its own text with the number of Hangul characters there, and
# returns those numbers in document order (the order of a query for [data-hangul]).
_MARK_HANGUL = f"""() => {{
    const re = new RegExp('{HANGUL_ANY}', 'g');
    const counts = [];
    for (const el of document.querySelectorAll('body *')) {{
        if (['SCRIPT', 'STYLE', 'TEMPLATE', 'NOSCRIPT'].includes(el.tagName)) continue;
        let k = 0;
        for (const t of el.childNodes) if (t.nodeType === 3) k += (t.textContent.match(re) || []).length;
        if (k) {{ el.dataset.hangul = k; counts.push(k); }}
    }}
    return counts;
}}"""


def hangul_drawn_without_a_web_font(page, cdp) -> tuple[int, list[str]]:
    """(elements with Hangul, those whose Hangul the browser drew in a font of the machine).
    The browser names the fonts it used for each element's text, with how many glyphs each drew
    (CSS.getPlatformFontsForNode, the same list as DevTools' "Rendered Fonts"). The machine has
    no Korean font here, so Hangul not drawn by a web font is drawn as empty boxes. An element
    laid out before its font arrived and never laid out again is caught too: the list is the
    current layout's. Elements without a layout (hidden) have no fonts and are skipped."""
    counts = page.evaluate(_MARK_HANGUL)
    if not counts:
        return 0, []
    root = cdp.send("DOM.getDocument", {"depth": 0})["root"]["nodeId"]
    nodes = cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": "[data-hangul]"})["nodeIds"]
    assert len(nodes) == len(counts), "the page changed between marking its Hangul and reading it"
    wrong = []
    for node, need in zip(nodes, counts):      # both in document order
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
        if not fonts:
            continue
        if sum(f["glyphCount"] for f in fonts if f["isCustomFont"]) < need:
            html = cdp.send("DOM.getOuterHTML", {"nodeId": node})["outerHTML"]
            wrong.append(f"{html[:120]} (drawn with {', '.join(f['familyName'] for f in fonts)})")
    return len(nodes), wrong


def pages_with_hangul() -> list[str]:
    """The English site's pages that show Hangul (the Korean site's pages have tests of their own:
    every one of them shows Hangul, and loading each six times would double this file's time)."""
    return [p for p in site_pages()
            if not p.startswith("ko/") and re.search(HANGUL_ANY, (HTML / p).read_text(encoding="utf-8"))]


@pytest.mark.parametrize("width", [1280, 390])
def test_every_korean_word_on_every_page_is_drawn_with_the_web_font(browser, server, width):
    # Every page that shows Hangul, loaded three times in fresh profiles at this width: every
    # element whose text has Hangul draws all of it with a web font (the issue: table cells,
    # bold text and a contents entry drawn in a font without Hangul, on some loads).
    pages = pages_with_hangul()
    assert pages, "no page shows Korean text"
    wrong, seen = [], 0
    for path in pages:
        for _ in range(3):
            with opened(browser, f"{server}/{path}", width=width) as page:
                cdp = page.context.new_cdp_session(page)
                cdp.send("DOM.enable")
                cdp.send("CSS.enable")
                n, bad = hangul_drawn_without_a_web_font(page, cdp)
                seen += n
                wrong += [f"{path}: {b}" for b in bad]
    assert seen, "no element with Korean text was found"
    assert not wrong, f"{len(wrong)} elements draw Hangul as boxes at {width} px, e.g.\n  " + "\n  ".join(wrong[:8])


# Which sidebars a reader sees: on screen, not hidden, not pushed out of the viewport.
_SIDEBARS_SHOWN = """() => {
    const shown = sel => {
        const el = document.querySelector(sel);
        if (!el) return false;
        const r = el.getBoundingClientRect(), cs = getComputedStyle(el);
        return r.width > 1 && r.height > 1 && r.right > 1 && r.left < innerWidth - 1
            && cs.visibility !== 'hidden' && cs.display !== 'none';
    };
    return {primary: shown('.bd-sidebar-primary'), secondary: shown('.bd-sidebar-secondary')};
}"""


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_sidebar_buttons_open_and_close_the_sidebars(browser, server, width):
    # The article header's buttons: the site navigation (primary) and the page's contents
    # (secondary). Each button a reader can see opens its sidebar when it is hidden, or hides
    # it when it is shown, and a second click (or Escape, for a sidebar opened over the page)
    # brings the page back. On a phone they are the only way to the contents.
    with opened(browser, f"{server}/chapters/03_transformer.html", width=width) as page:
        tried = []
        for side in ("primary", "secondary"):
            button = page.locator(f".bd-header-article button.{side}-toggle")
            if not button.count() or not button.first.is_visible():
                continue
            before = page.evaluate(_SIDEBARS_SHOWN)
            button.first.click()
            page.wait_for_timeout(400)
            after = page.evaluate(_SIDEBARS_SHOWN)
            assert after[side] != before[side], \
                f"at {width} px the {side} sidebar button does nothing (shown: {before[side]} before and after)"
            if page.evaluate("() => Array.from(document.querySelectorAll('dialog')).some(d => d.open)"):
                page.keyboard.press("Escape")
            else:
                button.first.click()
            page.wait_for_timeout(400)
            assert page.evaluate(_SIDEBARS_SHOWN) == before, f"at {width} px the {side} sidebar does not close again"
            tried.append(side)
        want = ["primary"] if width >= 1200 else ["primary", "secondary"]
        assert tried == want, f"at {width} px the buttons a reader can use are {tried}, not {want}"


def _article(page_html: str) -> str:
    return page_html[page_html.index("<article"):page_html.index("</article>")]


def test_pages_do_not_show_the_test_passs_markers():
    # "# NBVAL_CHECK_OUTPUT" tells the output check which cells to compare; a reader has no use for it.
    shown = {p.name: _article(p.read_text(encoding="utf-8")).count("NBVAL_") for p in chapter_pages()}
    shown = {name: n for name, n in shown.items() if n}
    assert not shown, f"code cells show nbval markers: {shown}"


def test_every_page_is_listed_once_in_the_navigation():
    # The site navigation of the first page: each page once, and no entry repeating its part's caption.
    nav = (HTML / "intro.html").read_text(encoding="utf-8")
    nav = nav[nav.index('bd-docs-nav"'):]
    nav = nav[:nav.index("</nav>")]
    captions = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r'<p[^>]*class="caption[^"]*"[^>]*>(.*?)</p>', nav, re.S)]
    entries = [re.sub(r"<[^>]+>", "", e).strip() for e in re.findall(r'<a class="reference internal"[^>]*>(.*?)</a>', nav, re.S)]
    assert entries and captions, "the index has no site navigation"
    repeated = sorted({e for e in entries if entries.count(e) > 1 or e in captions})
    assert not repeated, f"listed twice in the navigation: {repeated}"


@pytest.mark.parametrize("width", [390, 1280])
def test_one_search_box(browser, server, width):
    with opened(browser, f"{server}/chapters/03_transformer.html", width=width) as page:
        boxes = page.evaluate("""() => Array.from(document.querySelectorAll(
                'input[type="search"], .search-button, .search-button-field, form.bd-search'))
            .filter(el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0
                && getComputedStyle(el).visibility !== 'hidden' && !el.closest('dialog:not([open])'); })
            .filter((el, _, all) => !all.some(other => other !== el && other.contains(el)))
            .map(el => el.outerHTML.slice(0, 80))""")
    assert len(boxes) == 1, f"at {width} px the page shows {len(boxes)} search boxes: {boxes}"


# DevTools' "Slow 4G" profile: 1.6 Mbit/s down, 750 kbit/s up, 150 ms round trip times 3.75
# (its allowance for the mobile network), at the 90 % of nominal throughput DevTools applies.
SLOW_4G = {"offline": False, "latency": 562.5, "downloadThroughput": 1.6e6 / 8 * 0.9,
           "uploadThroughput": 750e3 / 8 * 0.9}
PAGE_BUDGET_BYTES = 2_000_000      # transferred, gzip-compressed, per page load
FIRST_PAINT_BUDGET_S = 4.0         # first contentful paint on slow 4G


@pytest.mark.parametrize("path", ["intro.html", *[f"chapters/{p.name}" for p in chapter_pages()]])
def test_page_weight_and_first_paint_on_slow_4g(browser, gzip_server, path):
    # Every request of a first visit, as the published site serves it (gzip), and the first
    # contentful paint with the network throttled to slow 4G.
    sizes: dict[str, int] = {}

    def slow_4g(context, page):
        page.on("response", lambda r: sizes.__setitem__(r.url, int(r.headers.get("content-length") or 0)))
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions", SLOW_4G)

    with opened(browser, f"{gzip_server}/{path}", width=390, height=844, before=slow_4g, timeout=120_000) as page:
        paint = page.evaluate("""() => { const p = performance.getEntriesByName('first-contentful-paint')[0];
                                         return p ? p.startTime / 1000 : null; }""")
    total = sum(sizes.values())
    heaviest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert total <= PAGE_BUDGET_BYTES, f"{path} transfers {total / 1e6:.2f} MB: heaviest {heaviest}"
    assert paint is not None and paint <= FIRST_PAINT_BUDGET_S, \
        f"{path}: first paint after {paint} s on slow 4G (budget {FIRST_PAINT_BUDGET_S} s); heaviest {heaviest}"


# A plot's PNG has at least this many pixels per CSS pixel of the size the page shows it at: sharp on
# a high-density screen (a phone's or a laptop's, devicePixelRatio 2) and when a reader zooms in.
SHARP_PIXELS_PER_CSS_PX = 1.9
# On a desktop (1280 px) a plot is shown at no less than this share of the size it asks for (its
# figure size at 100 px per inch): its 10-point labels at least 8 px high. A phone shrinks more; the
# pixel-doubled PNG keeps them sharp when the reader zooms.
DESKTOP_SHARE_OF_ASKED = 0.6

_PLOTS = """() => Array.from(document.querySelectorAll('.bd-article .cell_output img'))
    .filter(img => img.getBoundingClientRect().width > 0)
    .map(img => { const r = img.getBoundingClientRect();
        return {src: img.getAttribute('src').split('/').pop(), natural: [img.naturalWidth, img.naturalHeight],
                shown: [r.width, r.height],
                asked: parseFloat(img.style.width) || Number(img.getAttribute('width')) || img.naturalWidth}; })"""


def plots_as_shown(page) -> list[dict]:
    """Every plot the page shows: its PNG's size, the size it is drawn at, the width it asks for."""
    page.wait_for_function("""() => Array.from(document.querySelectorAll('.bd-article .cell_output img'))
        .every(img => img.complete)""")
    return page.evaluate(_PLOTS)


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("path", [f"chapters/{p.name}" for p in chapter_pages()])
def test_plots_are_sharp_at_the_size_the_page_shows_them(browser, server, visit, path, width):
    # Each plot, as the page draws it at this width: enough pixels for a high-density screen, and
    # its shape kept where the column is narrower than the plot.
    with (contextlib.nullcontext(visit(path).page) if width == 1280 else
          opened(browser, f"{server}/{path}", width=width)) as page:
        plots = plots_as_shown(page)
    assert plots, f"{path} shows no plot"
    blurred = [f"{p['src'][:12]}: {p['natural'][0]} px drawn {p['shown'][0]:.0f} px wide" for p in plots
               if p["natural"][0] < SHARP_PIXELS_PER_CSS_PX * p["shown"][0]]
    assert not blurred, f"{path} at {width} px: {len(blurred)} of {len(plots)} plots have fewer than " \
                        f"{SHARP_PIXELS_PER_CSS_PX} pixels per CSS pixel, e.g. {blurred[:3]}"
    if width == 1280:
        small = [f"{p['src'][:12]}: {p['shown'][0]:.0f} of {p['asked']} px" for p in plots
                 if p["shown"][0] < DESKTOP_SHARE_OF_ASKED * p["asked"]]
        assert not small, f"{path}: plots shrunk below {DESKTOP_SHARE_OF_ASKED:.0%} of their size, their " \
                          f"labels too small to read: {small}"
    squashed = [p["src"][:12] for p in plots
                if abs(p["shown"][1] / p["shown"][0] - p["natural"][1] / p["natural"][0]) > 0.02 * p["natural"][1] / p["natural"][0]]
    assert not squashed, f"{path} at {width} px draws plots out of shape: {squashed}"


def test_every_plot_has_alt_text():
    # A screen reader (or a page whose image did not load) reads the alt text: it must say what
    # the image is, not be empty or the image's file path.
    bad = []
    for page in chapter_pages():
        for tag in re.findall(r"<img[^>]*>", _article(page.read_text(encoding="utf-8"))):
            alt = re.search(r'alt="([^"]*)"', tag)
            text = alt.group(1).strip() if alt else ""
            if not text or re.search(r"\.(png|jpe?g|svg|gif)$", text) or "/" in text.split()[0]:
                bad.append(f"{page.name}: {tag[:120]}")
    assert not bad, f"{len(bad)} images without alt text, e.g. {bad[:3]}"


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


def test_no_launch_links_to_services_where_a_chapter_does_not_run():
    # A chapter needs the course's repository (its first cell says so elsewhere): a Colab or Binder
    # button would open a notebook that stops at its first cell, so the pages offer none.
    for page in chapter_pages():
        html = page.read_text(encoding="utf-8")
        links = re.findall(r'href="(https?://[^"]*(?:colab\.research\.google\.com|mybinder\.org|/binder/)[^"]*)"', html)
        assert not links and "launch-buttons" not in html, f"{page.name} offers launch links: {links[:2]}"


def test_every_bibliography_entry_links_to_its_paper():
    # Each entry of the bibliography page carries a link to the paper (arXiv, DOI) or, for reports,
    # corpora and programs, to where they are published (see UNLINKED_REFERENCES in test_tooling).
    article = _article((HTML / "bibliography.html").read_text(encoding="utf-8"))
    entries = re.split(r'<div class="citation"', article)[1:]
    assert len(entries) >= 50, f"the bibliography shows {len(entries)} entries"
    unlinked = [re.sub(r"<[^>]+>", "", e)[:80].strip() for e in entries
                if not re.search(r'<a class="[^"]*\breference external\b[^"]*" href="https?://(?!127\.)', e)]
    assert not unlinked, f"{len(unlinked)} of {len(entries)} bibliography entries link to nothing, e.g. {unlinked[:3]}"


def test_the_glossary_links_every_chapter_at_its_sections():
    # The glossary covers all the chapters, and each term links to a section its chapter has.
    article = _article((HTML / "glossary.html").read_text(encoding="utf-8"))
    links = re.findall(r'href="(chapters/[^"#]+\.html)(?:#([^"]*))?"', article)
    linked = {page for page, _ in links}
    missing = [p.name for p in chapter_pages() if f"chapters/{p.name}" not in linked]
    assert not missing, f"the glossary has no term of {missing}"
    dead = sorted({f"{page}#{anchor}" for page, anchor in links
                   if anchor and f'id="{anchor}"' not in (HTML / page).read_text(encoding="utf-8")})
    assert not dead, f"glossary links to sections that do not exist: {dead}"


_TERM_LINK = re.compile(r'<a class="[^"]*\bglossary-term\b[^"]*" href="([^"#]*)#(term-[^"]+)"[^>]*>(.*?)</a>')


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_chapters_link_the_first_use_of_glossary_terms_to_their_entries(lang):
    # Every chapter links its first use of a term to the glossary's row for it, in both languages:
    # the English site the English words, the Korean site the Korean ones; never in a heading, in
    # code or in a cell's output; and each row's anchor exists on that language's glossary page.
    if lang == "ko":
        _korean_site()
    root = HTML if lang == "en" else KO
    glossary = (root / "glossary.html").read_text(encoding="utf-8")
    for page in chapter_pages():
        article = _article((root / "chapters" / page.name).read_text(encoding="utf-8"))
        links = _TERM_LINK.findall(article)
        assert len(links) >= 5, f"{lang}/{page.name}: only {len(links)} glossary terms are linked"
        assert {href for href, _, _ in links} == {"../glossary.html"}, f"{lang}/{page.name}: {links[:3]}"
        missing = sorted({a for _, a, _ in links if f'id="{a}"' not in glossary})
        assert not missing, f"{lang}/{page.name} links glossary rows that have no anchor: {missing}"
        words = [(a, re.sub(r"<[^>]+>", "", w).lower().rstrip("s")) for _, a, w in links]
        twice = sorted({w for w in words if words.count(w) > 1})
        assert not twice, f"{lang}/{page.name} links a term more than once: {twice}"
        for where in re.findall(r"<h[1-6][^>]*>.*?</h[1-6]>|<div class=\"cell_output.*?</div>\s*</div>|<pre.*?</pre>",
                                article, re.S):
            assert "glossary-term" not in where, f"{lang}/{page.name}: a glossary link in {where[:120]!r}"
    ch03 = _article((root / "chapters" / "03_transformer.html").read_text(encoding="utf-8"))
    word = {"en": "positional encoding", "ko": "포지셔널 인코딩"}[lang]
    linked = [re.sub(r"<[^>]+>", "", w) for _, a, w in _TERM_LINK.findall(ch03) if a == "term-positional-encoding"]
    assert [w.lower() for w in linked] == [word], f"{lang}: chapter 3 links positional encoding as {linked}"


_BROKEN_KOREAN_WORDS = f"""() => {{
    const re = /[^\\s\\-/]*{HANGUL}+[^\\s\\-/]*/g, broken = [];   // a word, or the part of one between hyphens
    for (const cell of document.querySelectorAll('.bd-article td, .bd-article th')) {{
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node; (node = walker.nextNode()); ) {{
            for (const m of node.data.matchAll(re)) {{
                const r = document.createRange();
                r.setStart(node, m.index);
                r.setEnd(node, m.index + m[0].length);
                const lines = new Set(Array.from(r.getClientRects()).filter(b => b.width > 0).map(b => Math.round(b.top)));
                if (lines.size > 1) broken.push(m[0]);
            }}
        }}
    }}
    return broken;
}}"""


def test_korean_words_are_not_broken_in_tables_on_a_phone(browser, server):
    # The glossary's Korean column on a 390 px screen: a Korean line breaks between words, never
    # between the syllables of one (word-break: keep-all), as in the chapters' results tables.
    with opened(browser, f"{server}/glossary.html", width=390) as page:
        broken = page.evaluate(_BROKEN_KOREAN_WORDS)
    assert not broken, f"{len(broken)} Korean words are broken across lines in tables, e.g. {broken[:5]}"


_COLUMN_OF = """(needle) => {
    // the x position of every ' -> ' in the output that contains the needle, one per line
    const pre = Array.from(document.querySelectorAll('.bd-article .cell_output pre'))
        .find(p => p.textContent.includes(needle));
    if (!pre) return null;
    const xs = [];
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode()); ) {
        for (let i = node.data.indexOf(' -> '); i >= 0; i = node.data.indexOf(' -> ', i + 1)) {
            const r = document.createRange();
            r.setStart(node, i + 1);
            r.setEnd(node, i + 3);
            xs.push(r.getBoundingClientRect().left);
        }
    }
    return xs;
}"""


def test_printed_tables_with_korean_line_up(visit):
    # Chapter 11 prints its three tasks as a two-column table whose first column holds Korean on one
    # line: the arrows between the columns stand in one column on the page. And in any output, two
    # Hangul syllables are exactly as wide as four Latin characters (the padding lib.viz.pad counts).
    page = visit("chapters/11_t5.html").page
    _settled(page)
    xs = page.evaluate(_COLUMN_OF, "'nsmc sentiment: ")     # the printed table, not the code shown above it
    assert xs and len(xs) == 3, f"chapter 11's task table was not found: {xs}"
    assert max(xs) - min(xs) < 1, f"the columns of chapter 11's printed table do not line up: arrows at {xs}"
    widths = page.evaluate("""() => {
        const pre = document.querySelector('.bd-article .cell_output pre');
        const measure = text => { const span = document.createElement('span'); span.textContent = text;
            pre.append(span); const w = span.getBoundingClientRect().width; span.remove(); return w; };
        return [measure('영화정말'), measure('abcdefgh')];
    }""")
    assert abs(widths[0] - widths[1]) < 0.5, f"four Hangul syllables are {widths[0]:.1f} px wide, eight Latin " \
                                             f"characters {widths[1]:.1f} px, in an output"


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


def test_exercise_sets_page_lists_every_set_with_its_download():
    masters = sorted(p for p in (ROOT / "exercises").glob("*/*.ipynb")
                     if not p.parent.name.startswith(("_", ".")))
    assert masters, "no exercise master notebook"
    html = (HTML / "exercise_sets.html").read_text(encoding="utf-8")
    article = html[html.index("<article"):html.index("</article>")]
    for master in masters:
        links = re.findall(rf'href="([^"]*_downloads/[^"]+/{re.escape(master.stem)}\.ipynb)"', article)
        assert links, f"the exercise sets page does not offer {master.stem}.ipynb"
        target = (HTML / links[0]).resolve()
        assert target.exists(), f"the exercise sets page links {links[0]}, which was not published"
        assert "BEGIN SOLUTION" not in target.read_text(encoding="utf-8"), f"{links[0]} holds the solutions"
        assert f'href="chapters/{master.parent.name}.html"' in article, f"{master.stem}: no link to its chapter"


def test_publish_command_puts_every_file_of_the_site_on_gh_pages(tmp_path):
    # tools/publish.sh, run from a scratch clone of its own script (ghp-import writes the
    # gh-pages branch of the repository it runs in, never this one's), pushing to a local
    # bare repository that stands for GitHub.
    work, remote = tmp_path / "work", tmp_path / "site.git"
    (work / "tools").mkdir(parents=True)
    shutil.copy2(ROOT / "tools" / "publish.sh", work / "tools" / "publish.sh")
    (work / ".venv").symlink_to(ROOT / ".venv")
    (work / "_build").symlink_to(ROOT / "_build")

    def git(*args, cwd=work):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout

    git("init", "-q", "-b", "main")
    git("-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "--allow-empty", "-m", "course")
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    out = subprocess.run(["bash", "tools/publish.sh", "--remote", str(remote)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr

    published = set(git("--git-dir", str(remote), "ls-tree", "-r", "--name-only", "gh-pages").splitlines())
    built = {p.relative_to(HTML).as_posix() for p in HTML.rglob("*") if p.is_file()}
    assert built - published == set(), f"not published: {sorted(built - published)[:10]}"
    assert ".nojekyll" in published, "without .nojekyll GitHub Pages would not serve _static/"
    assert all(p in published for p in site_pages())
    index = git("--git-dir", str(remote), "show", "gh-pages:index.html")
    assert index == (HTML / "index.html").read_text(encoding="utf-8")


def test_no_page_shows_the_build_machines_paths():
    # Outputs are published as the build printed them; a path of the machine that built the
    # book (its checkout, a PosixPath repr) tells a reader nothing and leaks the build host.
    for rel in site_pages():
        text = (HTML / rel).read_text(encoding="utf-8")
        for leak in (str(ROOT), "PosixPath('/", "WindowsPath("):
            at = text.find(leak)
            assert at < 0, f"{rel} shows {text[max(0, at - 40):at + 100]!r}"


# ============================================================================ attention explorer, search

def _shown(page, root: str) -> list[float]:
    return page.eval_on_selector_all(f"#{root} .attnx-key .attnx-w", "els => els.map(e => Number(e.textContent))")


def test_attention_explorer_of_chapter_04_shows_the_exported_weights(visit):
    # lib.viz.attention_explorer's output as the executed chapter stored it: hovering a token
    # shows the weights the notebook exported (the JSON in the page), per kind, layer and head.
    import json

    import numpy as np

    v = visit("chapters/04_transformer_chatbot.html")
    page = v.page
    roots = page.eval_on_selector_all(".bd-article .attnx", "els => els.map(e => [e.id, e.dataset.ready])")
    assert roots, "chapter 04 has no attention explorer"
    assert all(ready == "true" for _, ready in roots), f"an explorer's script did not run: {roots}"
    root = roots[0][0]
    data = json.loads(page.text_content(f"#{root}-data"))
    kinds = [k["name"] for k in data["kinds"]]
    assert set(kinds) == {"encoder_self", "decoder_self", "cross"}, kinds
    seen = []
    for kind in ("cross", "decoder_self", "encoder_self"):
        k = data["kinds"][kinds.index(kind)]
        w = np.array(k["weights"])                 # (layers, heads, queries, keys)
        layer, q = w.shape[0] - 1, w.shape[2] - 1
        page.select_option(f"#{root} .attnx-kind", str(kinds.index(kind)))
        page.select_option(f"#{root} .attnx-layer", str(layer))
        for head in (0, w.shape[1] - 1):
            page.select_option(f"#{root} .attnx-head", str(head))
            page.hover(f"#{root} .attnx-query >> nth={q}")
            shown = _shown(page, root)
            np.testing.assert_allclose(shown, w[layer, head, q], atol=6e-4,
                                       err_msg=f"{kind}, layer {layer + 1}, head {head + 1}, query {q + 1}")
            seen.append(shown)
        page.select_option(f"#{root} .attnx-head", "mean")
        np.testing.assert_allclose(_shown(page, root), w[layer, :, q].mean(0), atol=6e-4)
        tokens = page.eval_on_selector_all(f"#{root} .attnx-query .attnx-text", "els => els.map(e => e.textContent)")
        assert tokens == k["queries"]
    assert len({tuple(s) for s in seen}) > 1, "the displayed weights did not change between heads and kinds"
    # its Korean tokens are drawn in the site's Korean web font, not as boxes
    hangul = page.locator(f"#{root} .attnx-text", has_text=re.compile(HANGUL)).first
    tofu, published = _ink_in(hangul, '"DejaVu Sans", sans-serif'), _ink_in(hangul, None)
    assert _differing(published, tofu) > 0.2, f"the explorer draws {hangul.text_content()!r} as empty boxes"
    assert not v.problems, "\n".join(v.problems)


# math delimiters and TeX commands (not any backslash: a code snippet may show a newline escape or a regex)
RAW_LATEX = re.compile(r"\\[()\[\]]|\$\$|\\(?:frac|sqrt|text|mathrm|operatorname|top|sum|prod|cdot|times|left|right|"
                       r"begin|end|alpha|beta|gamma|theta|lambda|mu|sigma|ell|log|exp|max|min|in|le|ge|quad|qquad)(?![A-Za-z])")


def test_search_snippets_show_typeset_formulas_not_latex(browser, server):
    # A word of pages full of formulas: the snippets under the results must not show LaTeX source.
    v = Visit(browser, server, "search.html?q=softmax")
    try:
        page = v.page
        page.wait_for_function("""() => {
            const items = Array.from(document.querySelectorAll('#search-results li'));
            return items.length > 0 && items.every(li => li.querySelector('p.context'))
                && !document.querySelector('#search-results .search-math:not(:has(mjx-container))');
        }""", timeout=60_000)
        snippets = page.eval_on_selector_all("#search-results p.context", "els => els.map(e => e.innerText)")
        raw = [s for s in snippets if RAW_LATEX.search(s)]
        assert not raw, f"{len(raw)} of {len(snippets)} search snippets show LaTeX source, e.g. {raw[0][:200]!r}"
        assert page.locator("#search-results p.context mjx-container").count() > 0, \
            "no snippet shows a typeset formula (does no page mention softmax next to one?)"
        assert not v.problems, "\n".join(v.problems)
    finally:
        v.close()


# ============================================================================ the Korean edition

KO = HTML / "ko"


def _korean_site() -> None:
    if not (KO / "index.html").exists():
        if os.environ.get("COURSE_REQUIRE_SITE") == "1":
            raise RuntimeError(f"the Korean site is missing: {KO}/index.html (bash tools/build.sh)")
        pytest.skip("the Korean site is not built (python tools/i18n.py build)")


@pytest.mark.parametrize("path", ["ko/intro.html", "ko/glossary.html", "ko/exercise_sets.html"])
def test_korean_pages_draw_hangul_with_the_web_font_bold_and_table_headers_too(browser, server, path):
    # A translated page in a browser without any Korean font: every element with Hangul (bold
    # part titles, the glossary's table headers, the navigation's captions) drawn with the web font.
    _korean_site()
    with opened(browser, f"{server}/{path}") as page:
        cdp = page.context.new_cdp_session(page)
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        n, wrong = hangul_drawn_without_a_web_font(page, cdp)
        kinds = page.evaluate("""() => Array.from(document.querySelectorAll('[data-hangul]'))
            .map(el => (el.closest('th, strong') || el).tagName.toLowerCase())""")
        # every syllable the page shows, drawn in the web font: one the subset lacks is drawn by this
        # machine's fonts, which have no Hangul (an empty box, or nothing), as "DejaVu Sans" draws it
        lacking = page.evaluate(f"""async () => {{
            const chars = [...new Set(document.body.innerText.match(/{HANGUL}/g) || [])];
            const canvas = document.createElement('canvas');
            canvas.width = canvas.height = 48;
            const ctx = canvas.getContext('2d', {{willReadFrequently: true}});
            const pixels = (font, c) => {{ ctx.clearRect(0, 0, 48, 48); ctx.font = font; ctx.fillText(c, 2, 38);
                                          const d = ctx.getImageData(0, 0, 48, 48).data;
                                          return d.some((v, i) => i % 4 === 3 && v > 0) ? d.join(',') : ''; }};
            const lacking = [];
            for (const weight of ['', 'bold ']) {{
                const font = weight + "36px '{KOREAN_FONT}'";
                await document.fonts.load(font, chars.join(''));
                for (const c of chars) {{
                    const drawn = pixels(font, c);
                    if ((!drawn || drawn === pixels(weight + "36px 'DejaVu Sans'", c)) && !lacking.includes(c)) lacking.push(c);
                }}
            }}
            return lacking;
        }}""")
        sample = page.locator(".bd-article strong, .bd-article th").filter(has_text=re.compile(HANGUL)).first
        tofu, published = _ink_in(sample, '"DejaVu Sans", sans-serif'), _ink_in(sample, None)
    assert n > 20, f"{path} shows only {n} elements with Hangul: is it translated?"
    assert not lacking, f"{path}: the Korean web font lacks {len(lacking)} syllables the page shows: {lacking[:20]}"
    assert not wrong, f"{path}: {len(wrong)} elements draw Hangul as boxes, e.g.\n  " + "\n  ".join(wrong[:6])
    assert {"strong", "th"} & set(kinds), f"{path}: no bold text or table header with Hangul was checked"
    assert _differing(published, tofu) > 0.2, f"{path}: {sample.text_content()!r} is drawn as empty boxes"


@pytest.mark.parametrize("path", ["ko/intro.html", "ko/chapters/03_transformer.html"])
def test_korean_pages_opened_from_disk_draw_every_hangul_with_the_web_font(browser, path):
    # The site is also read from a folder (file://, no server): the fonts must load there too,
    # including the navigation's (the site title, the search box, the sidebar's captions).
    _korean_site()
    with opened(browser, (HTML / path).as_uri(), timeout=90_000) as page:
        cdp = page.context.new_cdp_session(page)
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        n, wrong = hangul_drawn_without_a_web_font(page, cdp)
    assert n > 20, f"{path} over file:// shows only {n} elements with Hangul"
    assert not wrong, f"{path} over file://: {len(wrong)} elements draw Hangul as boxes, e.g.\n  " + "\n  ".join(wrong[:6])


def test_the_korean_navigation_has_no_english_titles():
    # Every entry and part caption of the Korean site's navigation is in Korean (a title _toc.yml
    # gives an entry, such as "Overview" for Part III's page, included); model names may stay Latin.
    _korean_site()
    page = (KO / "intro.html").read_text(encoding="utf-8")
    nav = re.search(r'<nav class="[^"]*\bbd-docs-nav\b.*?</nav>', page, re.S)
    assert nav, "no navigation on the Korean index"
    entries = [re.sub(r"<[^>]+>", "", e).strip()
               for e in re.findall(r'<a class="reference internal"[^>]*>(.*?)</a>|<span class="caption-text">(.*?)</span>',
                                   nav.group(0), re.S) for e in e if e]
    english = [e for e in entries if not re.search(HANGUL, e) and not re.search(r"Transformer|XLNet", e)]
    assert len(entries) > 15, entries
    assert not english, f"the Korean navigation shows English titles: {english}"


def test_the_korean_site_s_buttons_and_tooltips_are_in_korean():
    # The themes' words on a Korean chapter (tooltips, skip link, colour modes, previous/next, the
    # author line) come from locales/ko/LC_MESSAGES/sphinx.po and booktheme.po (the run box's words:
    # test_site_run_box.py).
    _korean_site()
    page = (KO / "chapters" / "06_transfer_elmo.html").read_text(encoding="utf-8")
    for english in ("Toggle primary sidebar", "Toggle secondary sidebar", "Skip to main content", "Back to top",
                    "System Settings", "previous page", "next page", ">Contents<",
                    "The course authors", "Link to this heading", 'aria-label="Main"', 'aria-label="Page"'):
        assert english not in page, f"the Korean chapter page still says {english!r}"
    toggle = (KO / "_static" / "togglebutton.js").read_text(encoding="utf-8")
    assert "Toggle hidden content" not in toggle and "숨긴 내용 보이기/감추기" in toggle
    for korean in ("왼쪽 사이드바 열기/닫기", "본문으로 건너뛰기", "이전 페이지", "지은이:"):
        assert korean in page, f"the Korean chapter page lacks {korean!r}"


def test_the_korean_font_covers_every_hangul_of_the_korean_pages():
    # The subset is cut from the Korean site's own pages: every syllable they show is in it.
    _korean_site()
    from fontTools.ttLib import TTFont
    sys_path = str(ROOT / "book" / "_ext")
    import sys
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    import course_site
    shown = set()
    for page in KO.rglob("*.html"):
        if "_static" not in page.parts:
            shown |= course_site.hangul_in(page.read_text(encoding="utf-8"))
    for weight in (400, 700):
        cmap = TTFont(str(KO / course_site.hangul_font_path(weight))).getBestCmap()
        missing = sorted(c for c in shown if ord(c) not in cmap)
        assert not missing, f"the {weight} Korean font lacks {len(missing)} syllables the Korean pages show: {missing[:20]}"


def test_math_is_typeset_on_the_korean_index(server):
    _korean_site()
    dom = render(f"{server}/ko/intro.html")
    assert dom.count("<mjx-container") >= 2, "MathJax did not typeset the Korean index page"
    assert "어텐션" in dom


@pytest.mark.parametrize("how", ["http", "file"])
def test_the_language_switch_goes_to_the_same_page_and_back(browser, server, how):
    # From a chapter (one folder down) to its Korean page and back, by the switcher a reader sees;
    # over http and from file:// (the links are relative, so the site works from any folder).
    _korean_site()
    base = server if how == "http" else HTML.as_uri()
    with opened(browser, f"{base}/chapters/03_transformer.html") as page:
        seen = []
        for want in ("/ko/chapters/03_transformer.html", "/chapters/03_transformer.html"):
            page.locator(".course-language-switch").first.click()
            page.wait_for_load_state("load")
            seen.append(page.url)
            assert page.url.endswith(want) and (want == "/chapters/03_transformer.html") == ("/ko/" not in page.url), \
                f"the switcher went to {page.url}, not to ...{want}"
            assert page.title(), f"{page.url} did not load"
        assert page.evaluate("document.documentElement.lang") == "en"
    with opened(browser, f"{base}/ko/glossary.html") as page:
        assert page.evaluate("document.documentElement.lang") == "ko"
        page.locator(".course-language-switch").first.click()
        page.wait_for_load_state("load")
        assert page.url.endswith("/glossary.html") and "/ko/" not in page.url, page.url


def test_a_pending_korean_page_says_it_is_shown_in_english():
    _korean_site()
    # a page still on the pending list (the first chapter on it), and one that is translated
    listed = [line.strip() for line in (ROOT / "locales" / "ko" / "PENDING").read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")]
    chapter = next((name for name in listed if name.startswith("chapters/")), None)
    if chapter is None:
        pytest.skip("every chapter is translated: no pending page to show the note")
    pending = _article((KO / f"{chapter}.html").read_text(encoding="utf-8"))
    translated = _article((KO / "intro.html").read_text(encoding="utf-8"))
    assert "course-translation-pending" in pending and "번역되지 않았습니다" in pending
    assert "course-translation-pending" not in translated


def test_each_site_offers_the_student_notebooks_in_its_language():
    # the exercise sets page and a chapter: the English site's downloads are the English student notebooks,
    # the Korean site's the Korean ones (tools/exercises.py build writes them from locales/ko/exercises/)
    _korean_site()
    for site, korean in ((HTML, False), (KO, True)):
        for page in ("exercise_sets.html", "chapters/03_transformer.html"):
            article = _article((site / page).read_text(encoding="utf-8"))
            links = re.findall(r'href="([^"]*_downloads/[^"]+\.ipynb)"', article)
            notebooks = [link for link in links if "03_transformer" not in link]   # not the chapter's own
            assert notebooks, f"{site / page} links no student notebook"
            for link in notebooks:
                text = ((site / page).parent / link).resolve().read_text(encoding="utf-8")
                assert ("연습 문제" in text) is korean, \
                    f"{site / page} links {link}, {'an English' if korean else 'a Korean'} student notebook"


@pytest.mark.parametrize("word", ["어텐션", "트랜스포머"])
def test_korean_search_finds_a_korean_word(browser, server, word):
    # The Korean site's own search page and index: a word the pages write with particles (어텐션은,
    # 트랜스포머의) is found, in the translated pages.
    _korean_site()
    with opened(browser, f"{server}/ko/search.html?q={word}") as page:
        page.wait_for_function("() => document.querySelectorAll('#search-results li').length > 0", timeout=60_000)
        found = page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.getAttribute('href'))")
    # the index page (not only the glossary, whose Korean column the English site has too)
    assert any(href.split("?")[0].split("#")[0] == "intro.html" for href in found), \
        f"searching {word!r} on the Korean site finds {found[:8]}, not the Korean index page"
