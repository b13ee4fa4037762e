"""The docs site as a reader sees it: build it (``mkdocs build --strict``), serve it on loopback,
open every page in headless Chromium and fail on a broken link, a missing image or a console
error; a screenshot of each page lands in ``--screenshots`` to be looked at.

    python tools/docs_check.py --screenshots site-check      # make docs-check

Chromium is Debian's (``apt-get install chromium``) where it is installed, else Playwright's own
(``python -m playwright install chromium``); Playwright (the ``docs`` extra) drives it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def build(site_dir: str) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site_dir], cwd=REPO,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: mkdocs build --strict failed:\n{done.stdout}{done.stderr}")


@contextlib.contextmanager
def serve(site_dir: str) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1 (pages' links and the search index need a server)."""
    handler = functools.partial(_QuietHandler, directory=site_dir)
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a browser that dropped a connection
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def pages(site_dir: str) -> list[str]:
    """Every page of the site, as paths relative to its root ('', 'guides/courier/', ...)."""
    found = []
    for root, _, files in os.walk(site_dir):
        if "index.html" in files and "404" not in root:
            relative = os.path.relpath(root, site_dir)
            found.append("" if relative == "." else relative.replace(os.sep, "/") + "/")
    return sorted(found)


def reachable(url: str, cache: dict[str, bool]) -> bool:
    target = url.split("#", 1)[0]
    if target not in cache:
        try:
            with urllib.request.urlopen(target, timeout=10) as response:
                cache[target] = response.status == 200
        except (urllib.error.URLError, OSError):
            cache[target] = False
    return cache[target]


def check_page(page, url: str, shot: str | None, link_cache: dict[str, bool]) -> list[str]:
    """This page's problems: console errors, uncaught exceptions, failed requests, images that
    did not load, links to this site that lead nowhere or to an anchor the target lacks."""
    problems: list[str] = []
    root = urllib.parse.urljoin(url, "/")
    # Only this site's own requests are judged: the machine may be offline (GitHub's API for the
    # repository's stars is the theme's, and optional).
    page.on("console", lambda message: problems.append(f"console {message.type}: {message.text}")
            if message.type == "error" and message.location.get("url", root).startswith(root) else None)
    page.on("pageerror", lambda error: problems.append(f"uncaught exception: {error}"))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}")
            if request.url.startswith(root) else None)
    response = page.goto(url, wait_until="networkidle")
    if response is None or response.status != 200:
        problems.append(f"HTTP {response.status if response else 'no response'}")
    for source in page.eval_on_selector_all("img", "images => images.filter(i => !i.complete || i.naturalWidth === 0)"
                                                   ".map(i => i.getAttribute('src'))"):
        problems.append(f"image did not load: {source}")
    for href in page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)"):
        if not href.startswith(root):
            continue  # another site: not this check's to judge
        if not reachable(href, link_cache):
            problems.append(f"broken link: {href}")
        elif "#" in href and href.split("#", 1)[0] != url.split("#", 1)[0]:
            anchor = urllib.parse.unquote(href.split("#", 1)[1])
            if anchor and not _has_anchor(page.context, href.split("#", 1)[0], anchor, link_cache):
                problems.append(f"broken anchor: {href}")
    wide = page.evaluate("() => [...document.querySelectorAll('pre > code')]"
                         ".filter(c => c.scrollWidth > c.clientWidth + 1)"
                         ".map(c => c.textContent.split('\\n').reduce((a, b) => a.length > b.length ? a : b))")
    for line in wide:
        problems.append(f"code scrolls sideways at this width: {line.strip()[:100]}")
    if shot:
        page.screenshot(path=shot, full_page=True)
    return problems


def _has_anchor(context, url: str, anchor: str, cache: dict[str, bool]) -> bool:
    key = f"{url}#{anchor}"
    if key not in cache:
        other = context.new_page()
        try:
            other.goto(url, wait_until="domcontentloaded")
            cache[key] = other.evaluate("id => document.getElementById(id) !== null", anchor)
        finally:
            other.close()
    return cache[key]


def chromium(playwright):
    executable = next((path for path in SYSTEM_CHROMIUM if os.path.exists(path)), None)
    try:
        return playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
    except Exception as error:  # noqa: BLE001 - said in one line with the fix
        raise SystemExit(f"error: cannot start Chromium ({str(error).splitlines()[0]}): `apt-get install chromium`, "
                         f"or `python -m playwright install chromium`") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screenshots", help="a directory for a full-page PNG of every page")
    parser.add_argument("--width", type=int, default=1280, help="the browser window's width in pixels")
    args = parser.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("error: the docs check needs Playwright: pip install -e '.[docs]'") from None
    if args.screenshots:
        shutil.rmtree(args.screenshots, ignore_errors=True)
        os.makedirs(args.screenshots)
    failures = 0
    with tempfile.TemporaryDirectory() as site_dir:
        build(site_dir)
        with serve(site_dir) as root, sync_playwright() as playwright:
            browser = chromium(playwright)
            context = browser.new_context(viewport={"width": args.width, "height": 900})
            link_cache: dict[str, bool] = {}
            for path in pages(site_dir):
                page = context.new_page()
                name = (path.strip("/").replace("/", "-") or "index") + ".png"
                shot = os.path.join(args.screenshots, name) if args.screenshots else None
                problems = check_page(page, root + path, shot, link_cache)
                page.close()
                print(f"{'FAIL' if problems else 'ok  '} /{path}", flush=True)
                for problem in problems:
                    print(f"       {problem}")
                failures += bool(problems)
            browser.close()
    if failures:
        raise SystemExit(f"error: {failures} page(s) with problems")
    print("every page loaded without a broken link, a missing image or a console error")


if __name__ == "__main__":
    main()
