"""Look at the stability report as a reader would: render an HTML file in headless Chromium to a PNG.

    python -m pipeline.report.screenshot                      # reports/stability.html -> .png
    python -m pipeline.report.screenshot REPORT.html -o shot.png --height 900

Chromium is a system package, not a pip one: Debian's `chromium` (`./dev test` installs it when
run as root on Debian), or any Chrome/Chromium named by the CHROMIUM environment variable.

The Chromium command line has no full-page screenshot, so `height=None` takes two runs: the
first loads a copy of the page with a one-line script that writes the laid-out document height
into the DOM on `load` (after the embedded plots are decoded) and reads it back with --dump-dom;
the second screenshots the original file with the window exactly that tall. The copy carries a
<base href> to the original's folder, so relative links resolve the same way. Content that only
appears after `load` (fetched by scripts) is not measured; the reports embed everything.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.core.atomic import atomic_path
from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPORTS_DIR

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MAX_HEIGHT = 20_000  # px; a taller page is cut here (a 1280 x 20000 PNG is already ~100 MB RGBA)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Headless, no GPU, no profile state, and nothing that reaches the network on its own: without
# the background-networking/update/sync switches Chromium keeps retrying (refused) connections.
# --disable-dev-shm-usage: containers often have a 64 MB /dev/shm, too small for a tall page.
_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
    "--mute-audio",
)
_HEIGHT_ATTR = "data-screenshot-height"
_MEASURE_JS = (
    "<script>addEventListener('load',function(){var d=document.documentElement;"
    f"d.setAttribute('{_HEIGHT_ATTR}',Math.ceil(Math.max(d.scrollHeight,"
    "document.body?document.body.scrollHeight:0)))})</script>"
)
# Chromium logs these on every run in a container without a session bus; they hide the real error.
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
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise PipelineError(
        "headless Chromium not found (looked for $CHROMIUM, /usr/bin/chromium and "
        f"{', '.join(CANDIDATES)} on PATH). Install Debian's package: "
        "`apt-get install --no-install-recommends chromium` (`./dev test` does this when run as root "
        "on Debian), or set CHROMIUM=/path/to/chrome.")


def _run(args: list[str], timeout: float, what: str) -> subprocess.CompletedProcess:
    """Run Chromium in its own process group, so a timeout kills its helpers (zygote, renderer,
    GPU) too, not just the browser process."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise PipelineError(f"{what}: Chromium did not finish within {timeout:g} s.{_tail(err)}") from None
    result = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if result.returncode != 0:
        raise PipelineError(f"{what}: Chromium ({args[0]}) exited with status {result.returncode}.{_tail(err)}")
    return result


def _tail(stderr: bytes, lines: int = 15) -> str:
    text = [ln for ln in stderr.decode("utf-8", "replace").splitlines() if not _NOISE.search(ln)]
    return ("\nChromium's stderr (last lines):\n" + "\n".join(text[-lines:])) if text else " (no stderr)"


def _png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR, or None if `data` is not a PNG."""
    if len(data) < 24 or data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def page_height(html_path: Path, width: int, chromium: str, workdir: Path, timeout: float) -> int:
    """The laid-out height (px) of `html_path` at `width`, measured in Chromium after `load`."""
    src = html_path.read_text(encoding="utf-8", errors="replace")
    base = f'<base href="{html_path.parent.as_uri()}/">'
    # The script goes before </body> (or at the end): never before <!DOCTYPE>, which would put
    # the page in quirks mode and change its layout.
    at = src.lower().rfind("</body>")
    probe = src[:at] + _MEASURE_JS + src[at:] if at >= 0 else src + _MEASURE_JS
    if not re.search(r"<base\s", src, re.I):  # the page's own <base> must stay the one in force
        head = re.search(r"<head(\s[^>]*)?>", probe, re.I)
        probe = probe[:head.end()] + base + probe[head.end():] if head else base + probe
    probe_path = workdir / "probe.html"
    probe_path.write_text(probe, encoding="utf-8")
    # A short window, so scrollHeight is the content's height and not the viewport's.
    res = _run([chromium, *_FLAGS, f"--user-data-dir={workdir / 'profile-measure'}",
                f"--window-size={width},100", "--dump-dom", probe_path.as_uri()],
               timeout, f"measuring the page height of {html_path}")
    m = re.search(rf'<html[^>]*\s{_HEIGHT_ATTR}="(\d+)"'.encode(), res.stdout, re.I)
    if not m:
        raise PipelineError(f"measuring the page height of {html_path}: Chromium's DOM dump has no "
                            f"{_HEIGHT_ATTR} (did the page's load event fire?).{_tail(res.stderr)}")
    return int(m.group(1))


def screenshot(html_path: str | os.PathLike, png_path: str | os.PathLike, width: int = 1280,
               height: int | None = None, timeout: float = 90) -> Path:
    """Render the local HTML file `html_path` in headless Chromium, `width` px wide, to the PNG
    `png_path` (written atomically). `height=None`: the whole page (at most MAX_HEIGHT px);
    otherwise the first `height` px, as a window that size shows it. Returns `png_path`.

    Raises PipelineError if Chromium is missing, exits non-zero, runs past `timeout` seconds (per
    Chromium run) or writes no PNG of the expected size."""
    html_path, png_path = Path(html_path).resolve(), Path(png_path)
    if not html_path.is_file():
        raise PipelineError(f"no HTML file at {html_path}")
    if width < 1 or (height is not None and height < 1):
        raise PipelineError(f"screenshot size must be positive (width={width}, height={height})")
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="report-screenshot-") as tmp:
        workdir = Path(tmp)  # the profile dirs and Chromium's own PNG live here, removed after
        if height is None:
            height = page_height(html_path, width, chromium, workdir, timeout)
        height = max(1, min(int(height), MAX_HEIGHT))
        shot = workdir / "shot.png"
        res = _run([chromium, *_FLAGS, f"--user-data-dir={workdir / 'profile'}",
                    f"--window-size={width},{height}", f"--screenshot={shot}", html_path.as_uri()],
                   timeout, f"screenshotting {html_path}")
        data = shot.read_bytes() if shot.is_file() else b""
        size = _png_size(data)
        if size is None:
            raise PipelineError(f"screenshotting {html_path}: Chromium exited 0 but wrote no PNG "
                                f"({len(data)} bytes at {shot}).{_tail(res.stderr)}")
        if size != (width, height):
            raise PipelineError(f"screenshotting {html_path}: Chromium wrote a {size[0]}x{size[1]} PNG, "
                                f"expected {width}x{height}.{_tail(res.stderr)}")
        with atomic_path(png_path) as out:
            out.write_bytes(data)
    return png_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report.screenshot",
        description="Screenshot an HTML report in headless Chromium, as a reader would see it. "
                    "Default: the whole page of reports/stability.html, 1280 px wide, to "
                    "reports/stability.png.",
        epilog="Needs Chromium: Debian's `chromium` package (`./dev test` installs it as root on "
               "Debian) or CHROMIUM=/path/to/chrome.")
    parser.add_argument("html", nargs="?", type=Path, default=REPORTS_DIR / "stability.html",
                        help="the HTML file (default: %(default)s)")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="the PNG to write (default: HTML with .png instead of .html)")
    parser.add_argument("--width", type=int, default=1280, help="window width in px (default: %(default)s)")
    parser.add_argument("--height", type=int, default=None,
                        help=f"window height in px, e.g. 900 for the first screen "
                             f"(default: the whole page, at most {MAX_HEIGHT})")
    parser.add_argument("--timeout", type=float, default=90,
                        help="seconds each Chromium run may take (default: %(default)s)")
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
