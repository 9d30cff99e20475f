"""Look at the stability report as a reader would: render an HTML file in headless Chromium to a PNG.

    python -m tools.screenshot                      # reports/stability.html -> reports/stability.png
    python -m tools.screenshot REPORT.html -o shot.png --height 900

Chromium is driven by Playwright, but it is the system's Chromium, not one Playwright downloads:
Debian's `chromium` (`./dev test` installs it when run as root on Debian), or any Chrome/Chromium
named by the CHROMIUM environment variable. tests/helpers/browser.py opens pages the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Iterator

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from pipeline.core.atomic import atomic_path
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPORTS_DIR

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MAX_HEIGHT = 20_000  # px; a taller page is cut here (a 1280 x 20000 PNG is already ~100 MB RGBA)

# In Playwright's launch error: its call log, which has the browser's exit and its output lines.
_EXIT = re.compile(r"<process did exit: exitCode=(\w+), signal=(\w+)>")
_OUTPUT = re.compile(r"^\s+- \[pid=\d+\]\[(?:err|out)\] ?(.*)$", re.M)
# Debian's chromium logs these on every start in a container without a session bus (and its
# wrapper script trips over a shell test); they would hide the real error.
_NOISE = re.compile(r"dbus/|/usr/bin/chromium: \d+: \[|^\s*$")


def find_chromium() -> str:
    """The Chromium to run: $CHROMIUM if set, else /usr/bin/chromium, else the first of
    chromium, chromium-browser, google-chrome on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        found = shutil.which(env)
        if not found:
            raise PipelineError(f"CHROMIUM={env!r} is not an executable file; point it at a Chrome/Chromium binary")
        return found
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    found = next(filter(None, map(shutil.which, CANDIDATES)), None)
    if found:
        return found
    raise PipelineError(
        "headless Chromium not found (looked for $CHROMIUM, /usr/bin/chromium and "
        f"{', '.join(CANDIDATES)} on PATH). Install Debian's package: "
        "`apt-get install --no-install-recommends chromium` (`./dev test` does this when run as root "
        "on Debian), or set CHROMIUM=/path/to/chrome."
    )


@contextlib.contextmanager
def chromium_page(width: int, height: int, timeout: float) -> Iterator[Page]:
    """A page of a fresh headless Chromium (find_chromium's) with a `width` x `height` viewport at
    one device pixel per CSS pixel; `timeout` seconds for the start and for each page action.
    Playwright gives the browser a throwaway profile and ends it, helpers included, on exit.

    Raises PipelineError saying how Chromium ended, with the last lines of its output, if it
    does not start."""
    executable = find_chromium()
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(executable_path=executable, timeout=timeout * 1000)
        except PlaywrightError as e:
            raise _launch_error(e, executable, timeout) from None
        try:
            page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
            page.set_default_timeout(timeout * 1000)
            yield page
        finally:
            browser.close()


def _launch_error(e: PlaywrightError, executable: str, timeout: float) -> PipelineError:
    """What went wrong when Playwright could not start Chromium, in a few lines: how it ended and
    the last of its output. Playwright's own message repeats the ~60-flag command line twice. The
    browser's exit and output are read from that message: Playwright's Error has no field for them
    (only message, name, stack)."""
    message = e.message
    ended = _EXIT.search(message)
    if ended and ended.group(1) != "null":
        what = f"exited with status {ended.group(1)} before Playwright could drive it"
    elif ended:
        what = f"was killed by signal {ended.group(2)} before Playwright could drive it"
    elif isinstance(e, PlaywrightTimeout):
        what = f"did not start within {timeout:g} s"
    else:
        what = f"could not be started ({message.splitlines()[0]})"
    output = [ln for ln in _OUTPUT.findall(message) if not _NOISE.search(ln)][-15:]
    said = "Its output (last lines):\n" + "\n".join(output) if output else "It printed nothing."
    return PipelineError(
        f"Chromium ({executable}) {what}. {said}\n"
        f"Check that `{executable} --headless --version` runs, or set "
        "CHROMIUM=/path/to/chrome to use another Chrome/Chromium."
    )


def screenshot(
    html_path: str | os.PathLike,
    png_path: str | os.PathLike,
    width: int = 1280,
    height: int | None = None,
    timeout: float = 90,
) -> Path:
    """Render the local HTML file `html_path` in headless Chromium, `width` px wide, to the PNG
    `png_path` (written atomically) once the page's `load` event has fired (embedded plots
    decoded). `height=None`: the whole page (at most MAX_HEIGHT px); otherwise the first `height`
    px, as a window that size shows it. Returns `png_path`.

    Raises PipelineError if Chromium is missing or fails, or if starting it or loading the page
    takes more than `timeout` seconds."""
    html_path, png_path = Path(html_path).resolve(), Path(png_path)
    if not html_path.is_file():
        raise PipelineError(f"no HTML file at {html_path}")
    if width < 1 or (height is not None and height < 1):
        raise PipelineError(f"screenshot size must be positive (width={width}, height={height})")
    # Whole page: a 100 px window, so the document is as tall as its content and not the
    # window's height; the full-page capture then takes all of it.
    with chromium_page(width, min(height or 100, MAX_HEIGHT), timeout) as page:
        try:
            page.goto(html_path.as_uri(), wait_until="load")
            clip = None
            if height is None:
                full = page.evaluate("Math.ceil(document.documentElement.scrollHeight)")
                if full > MAX_HEIGHT:
                    clip = {"x": 0, "y": 0, "width": width, "height": MAX_HEIGHT}
            data = page.screenshot(full_page=height is None, clip=clip, type="png")
        except PlaywrightError as e:
            raise PipelineError(f"screenshotting {html_path}: {e.message}") from None
    with atomic_path(png_path) as out:
        out.write_bytes(data)
    return png_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.screenshot",
        description="Screenshot an HTML report in headless Chromium, as a reader would see it. "
        "Default: the whole page of reports/stability.html, 1280 px wide, to "
        "reports/stability.png.",
        epilog="Needs Chromium: Debian's `chromium` package (`./dev test` installs it as root on "
        "Debian) or CHROMIUM=/path/to/chrome. Playwright drives it; it downloads no browser.",
    )
    parser.add_argument(
        "html",
        nargs="?",
        type=Path,
        default=REPORTS_DIR / "stability.html",
        help="the HTML file (default: %(default)s)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="the PNG to write (default: HTML with .png instead of .html)"
    )
    parser.add_argument("--width", type=int, default=1280, help="window width in px (default: %(default)s)")
    parser.add_argument(
        "--height",
        type=int,
        default=None,
        help=f"window height in px, e.g. 900 for the first screen (default: the whole page, at most {MAX_HEIGHT})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=90,
        help="seconds Chromium may take to start, and the page to load (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    out = args.output or args.html.with_suffix(".png")
    try:
        path = screenshot(args.html, out, width=args.width, height=args.height, timeout=args.timeout)
    except PipelineError as e:
        print(f"[screenshot] error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
