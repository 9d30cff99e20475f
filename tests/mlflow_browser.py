"""Look at MLflow runs as a person would: the real MLflow UI, in headless Chromium.

A test that only queries the tracking API proves the runs were logged; it does not prove that the
UI a person opens shows them. This harness starts the real `mlflow server` on a throwaway port,
opens one of its pages (usually the run-comparison page) in headless Chromium, waits until every
expected string is in the page's visible text, and saves a screenshot for a human to look at:

    with start_mlflow_server("sqlite:////abs/mlflow.db", tmp_path / "artifacts") as base_url:
        text = open_page(compare_runs_url(base_url, experiment_id, [run_a, run_b]),
                         expect=["smoke-lr-a", "smoke-lr-b", "train.lr"],
                         screenshot=REPO_ROOT / "test-artifacts" / "compare.png")

No new dependency: Chromium is driven over the Chrome DevTools Protocol (CDP) through
`--remote-debugging-pipe` (null-terminated JSON on file descriptors 3 and 4, what Playwright
uses), not a websocket, so neither a websocket client nor a debugging port is needed. Chromium is
the system package that pipeline.report.screenshot already uses (find_chromium, same flags).

The MLflow UI is a single-page React app that fetches runs after the page has loaded, so the
Chromium command line (--dump-dom/--screenshot with a virtual-time budget) would be a guess at
how long to wait; polling document.body.innerText over CDP waits exactly as long as needed and
says precisely what was missing when it gives up.
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.core.atomic import atomic_path
from pipeline.report.screenshot import MAX_HEIGHT, _FLAGS as CHROMIUM_FLAGS, _NOISE as CHROMIUM_NOISE, find_chromium

# Environment for the server. Job execution (on by default in MLflow 3.x) starts a job runner
# and ~7 huey consumer processes and leaves a temp dir in /dev/shm per start; the UI pages we
# look at need none of it, and on a 2-core machine it slows the start a lot. Telemetry off: the
# server would otherwise try (and fail, offline) to send usage data.
SERVER_ENV = {
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "PYTHONUNBUFFERED": "1",
}
SERVER_START_TIMEOUT = 120.0  # s; ~6 s is typical on a 2-core machine
KILL_GRACE = 10.0  # s between SIGTERM and SIGKILL of a process group

# Text of the page as a person sees it: innerText skips hidden elements, scripts and styles.
_PAGE_TEXT_JS = "document.body ? document.body.innerText : ''"

# The compare page shows metrics in react-virtualized grids (a 300 px window onto a names grid and
# a values grid, ~17 of a run's 100+ metrics in the DOM at a time), so innerText holds only the
# rows scrolled into view, as a person sees before scrolling. This scrolls each grid through its
# whole height, as a person would, and returns every row once, "name<TAB>value<TAB>value...":
# cells of a section's grids that share a `top` are one row, ordered by `left`. Scroll positions
# are put back afterwards so the screenshot shows the page as it loaded.
GRID_ROWS_HEADING = "[rows of the virtualized grids, scrolled through]"

# Turns on every "Show diff only" switch of the compare page (parameters, metrics, tags): what a
# person does to see what sets two runs apart.
SHOW_DIFF_ONLY_JS = r"""(async () => {
  const switches = [...document.querySelectorAll('[role=switch]')].filter(s =>
    (s.closest('label, div') || s).parentElement.innerText.includes('Show diff only'));
  for (const s of switches) if (s.getAttribute('aria-checked') !== 'true') s.click();
  await new Promise(r => setTimeout(r, 300));
  return switches.length;
})()"""
_VIRTUAL_GRID_ROWS_JS = r"""(async () => {
  const frame = () => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const sections = new Map();
  for (const g of document.querySelectorAll('.ReactVirtualized__Grid')) {
    const key = g.closest('.du-bois-light-collapse-item') || g.parentElement.parentElement;
    if (!sections.has(key)) sections.set(key, []);
    sections.get(key).push(g);
  }
  const lines = [];
  for (const grids of sections.values()) {
    const rows = new Map();
    const height = Math.max(...grids.map(g => g.scrollHeight));
    const step = Math.max(1, Math.min(...grids.map(g => g.clientHeight)));
    const saved = grids.map(g => g.scrollTop);
    for (let y = 0; ; y = Math.min(y + step, height)) {
      for (const g of grids) { g.scrollTop = y; g.dispatchEvent(new Event('scroll')); }
      await frame();
      for (const g of grids) {
        const inner = g.querySelector('.ReactVirtualized__Grid__innerScrollContainer');
        for (const cell of inner ? inner.children : []) {
          const top = parseFloat(cell.style.top), left = cell.getBoundingClientRect().left;
          if (!rows.has(top)) rows.set(top, new Map());
          rows.get(top).set(left, cell.innerText.trim());
        }
      }
      if (y >= height) break;
    }
    // Back to where they were, each grid, twice: the grids of a section sync their scrolling, and
    // a single pass can leave one of them where the other last was.
    for (let pass = 0; pass < 2; pass++) {
      grids.forEach((g, i) => { g.scrollTop = saved[i]; g.dispatchEvent(new Event('scroll')); });
      await frame();
    }
    for (const top of [...rows.keys()].sort((a, b) => a - b)) {
      const cells = rows.get(top);
      lines.push([...cells.keys()].sort((a, b) => a - b).map(k => cells.get(k)).join('\t'));
    }
  }
  return lines.join('\n');
})()"""


# --------------------------------------------------------------------------------------------
# processes


def _free_port() -> int:
    """A loopback port nobody listens on now (bind to port 0 and let the kernel choose). The port
    is released before the server binds it; a race with another process is possible but rare, and
    then the server exits at once and start_mlflow_server reports its error."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE) -> None:
    """End the process group that `proc` leads (started with start_new_session=True): SIGTERM,
    then SIGKILL whatever is left after `grace` seconds. The group, not just `proc`, because both
    the MLflow CLI (which runs uvicorn as a child) and Chromium (zygote, renderer, GPU helpers)
    leave children behind if only the leader dies."""
    pgid = proc.pid  # a session leader's pgid is its pid, even after it has exited
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader, or it stays a zombie that keeps the group "alive"
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


def _tail(log, lines: int = 30, noise=None) -> str:
    """The last `lines` lines of an open log file (binary), as text, without `noise` lines.
    pread, not seek+read: the child writes through the same open file description, so moving
    its offset would make the child overwrite the log."""
    fd = log.fileno()
    text = os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace").splitlines()
    if noise is not None:
        text = [ln for ln in text if not noise.search(ln)]
    return "\n".join(text[-lines:]) if text else "(empty)"


# --------------------------------------------------------------------------------------------
# the MLflow server


@contextlib.contextmanager
def start_mlflow_server(backend_store_uri: str, artifacts_dir: Path,
                        timeout: float = SERVER_START_TIMEOUT, port: int | None = None) -> Iterator[str]:
    """Run the real `mlflow server` (this venv's) on 127.0.0.1 and a free port; yield its base URL
    (http://127.0.0.1:PORT) once it answers /health; kill its whole process group on exit.

    `backend_store_uri`: the store the runs were logged to, e.g. sqlite:////abs/path/mlflow.db
    (use an absolute path). `artifacts_dir`: where the server's artifact proxy reads and writes
    (--artifacts-destination), so the server never creates ./mlartifacts in the repo; it is
    created if missing. Runs logged straight to the store keep their own artifact locations.

    One uvicorn worker: the UI makes a handful of requests and the machines may have 2 cores.
    Host-header/CORS security middleware stays on: its defaults allow 127.0.0.1 on any port,
    which is what the browser uses. `port`: this one rather than a free one (a server restarted
    where its clients expect it).

    Raises RuntimeError (with the tail of the server's output) if the server exits early or does
    not answer within `timeout` seconds."""
    artifacts_dir = Path(artifacts_dir).resolve()
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    mlflow_exe = Path(sys.executable).parent / "mlflow"
    if not os.access(mlflow_exe, os.X_OK):
        raise RuntimeError(f"no mlflow executable next to this Python ({mlflow_exe}); "
                           "run the tests with the project's venv (.venv/bin/python -m pytest)")
    port = port or _free_port()
    base_url = f"http://127.0.0.1:{port}"
    args = [str(mlflow_exe), "server",
            "--backend-store-uri", backend_store_uri,
            "--artifacts-destination", str(artifacts_dir),
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, **SERVER_ENV}
    env.pop("MLFLOW_TRACKING_URI", None)  # the server is told its store; don't let this confuse it
    # Output goes to a temp file, not a pipe: nobody reads a pipe while the tests run, and a full
    # pipe would block the server.
    with tempfile.TemporaryFile(prefix="mlflow-server-") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            _wait_for_server(proc, base_url, timeout, log, args)
            yield base_url
        finally:
            _kill_group(proc)


def _wait_for_server(proc: subprocess.Popen, base_url: str, timeout: float, log, args) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with status {proc.returncode} before answering "
                               f"{base_url}/health.\nCommand: {' '.join(args)}\n"
                               f"Its output (last lines):\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
                last_error = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as e:
            last_error = str(e)
        if time.monotonic() > deadline:
            raise RuntimeError(f"mlflow server did not answer {base_url}/health within {timeout:g} s "
                               f"(last error: {last_error}).\nCommand: {' '.join(args)}\n"
                               f"Its output (last lines):\n{_tail(log)}")
        time.sleep(0.2)


def compare_runs_url(base_url: str, experiment_id: str | int, run_ids: Sequence[str]) -> str:
    """The MLflow UI's run-comparison page for `run_ids` of experiment `experiment_id`.

    The UI (3.17) builds it as `#/compare-runs?runs=<JSON list>&experiments=<JSON list>` with
    JSON.stringify (no spaces, not percent-encoded): Routes.getCompareRunPageRoute in the JS
    bundle. `experiments` is a list with one id per run's experiment; the page only needs the
    distinct ids."""
    runs = json.dumps(list(run_ids), separators=(",", ":"))
    experiments = json.dumps([str(experiment_id)], separators=(",", ":"))
    return f"{base_url.rstrip('/')}/#/compare-runs?runs={runs}&experiments={experiments}"


def format_metric(value: float) -> str:
    """A metric value as the compare page (and the run page) shows it: the UI's
    Utils.formatMetric, in Python. 0 -> "0"; |x| < 0.001 -> 3-digit exponent ("1.235e-4");
    |x| < 10 -> rounded to 3 decimals ("0.812", "0.5"); < 100 -> 2 decimals; else 1 decimal.
    Trailing zeros are dropped, as JavaScript's Number.toString drops them. The page shows each
    metric's latest value (highest step). Tests compare the page with what they logged by this."""
    if value == 0:
        return "0"
    if abs(value) < 0.001:
        mantissa, exponent = f"{value:.3e}".split("e")
        return f"{mantissa}e{int(exponent)}"  # JS writes "1.235e-4", Python "1.235e-04"
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1
    scale = 10 ** digits
    rounded = math.floor(value * scale + 0.5) / scale  # Math.round: halves go up, not to even
    return str(int(rounded)) if rounded == int(rounded) else repr(rounded)


# --------------------------------------------------------------------------------------------
# Chromium over the DevTools protocol


class BrowserError(RuntimeError):
    """Chromium failed (did not start, died, or a DevTools command returned an error)."""


class _ProtocolError(BrowserError):
    """A DevTools command answered with an error (e.g. evaluating while the page navigates)."""


class _DevTools:
    """A minimal synchronous CDP client over --remote-debugging-pipe: Chromium reads commands
    from its fd 3 and writes responses and events to its fd 4, each a JSON object followed by
    a NUL byte. Events that arrive while waiting for a response are kept in `events`."""

    def __init__(self, to_browser: int, from_browser: int, stderr_log):
        self._out, self._in, self._log = to_browser, from_browser, stderr_log
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _fail(self, what: str) -> BrowserError:
        return BrowserError(f"{what}\nChromium's stderr (last lines):\n"
                            f"{_tail(self._log, 20, CHROMIUM_NOISE)}")

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail("Chromium sent no DevTools message in time")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 20)
                if not chunk:
                    raise self._fail("Chromium closed the DevTools pipe (did it crash or exit?)")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        """Send one command and return its result; raise BrowserError on a protocol error."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._out, data):]
        except BrokenPipeError:
            raise self._fail(f"Chromium closed the DevTools pipe before {method}") from None
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise _ProtocolError(f"DevTools {method} failed: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def pump(self, seconds: float) -> None:
        """Collect events for `seconds` (a sleep that keeps the pipe drained)."""
        deadline = time.monotonic() + seconds
        with contextlib.suppress(BrowserError):
            while time.monotonic() < deadline:
                self.events.append(self._read_message(deadline))


# argv: READ_FD WRITE_FD PROGRAM ARGS...; exec PROGRAM with READ_FD as fd 3 and WRITE_FD as fd 4.
_EXEC_WITH_FDS_3_4 = ("import os, sys; r, w = int(sys.argv[1]), int(sys.argv[2]); "
                      "os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w); "
                      "os.execv(sys.argv[3], sys.argv[3:])")


@contextlib.contextmanager
def _chromium(width: int, height: int) -> Iterator[_DevTools]:
    """Headless Chromium with a DevTools pipe, in its own process group (killed on exit) and a
    throwaway profile. The pipe's fds are moved to 3 and 4 by a tiny Python trampoline that then
    execs Chromium: subprocess cannot renumber fds in the child without preexec_fn (unsafe with
    threads), and dash, Debian's /bin/sh, only takes single-digit fds in redirections."""
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="mlflow-browser-") as tmp, \
            tempfile.TemporaryFile(prefix="chromium-stderr-") as log:
        cmd_r, cmd_w = os.pipe()  # we write commands -> Chromium's fd 3
        evt_r, evt_w = os.pipe()  # Chromium's fd 4 -> we read replies/events
        # The child's ends must not already be fd 3 or 4 (they are, in a fresh process), or the
        # renumbering below would close what it just set up: move them to 10 and above.
        cmd_r, evt_w = (_fd_at_least(fd, 10) for fd in (cmd_r, evt_w))
        args = [chromium, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={tmp}/profile",
                f"--window-size={width},{height}", "about:blank"]
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _EXEC_WITH_FDS_3_4,
                                     str(cmd_r), str(evt_w), *args], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, pass_fds=(cmd_r, evt_w),
                                    start_new_session=True)
        except BaseException:
            os.close(cmd_w)
            os.close(evt_r)
            raise
        finally:
            os.close(cmd_r)  # the child's copies are its own; ours would hide EOF
            os.close(evt_w)
        try:
            yield _DevTools(cmd_w, evt_r, log)
        finally:
            with contextlib.suppress(OSError):
                os.close(cmd_w)
            _kill_group(proc, grace=3.0)
            os.close(evt_r)


def _fd_at_least(fd: int, low: int) -> int:
    """A duplicate of `fd` numbered `low` or higher (close-on-exec; pass_fds clears that in the
    child); `fd` itself is closed."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, low)
    os.close(fd)
    return new


def _missing(text: str, expect: Sequence[str]) -> list[str]:
    return [s for s in expect if s not in text]


def open_page(url: str, expect: Sequence[str], screenshot: Path, timeout: float = 60,
              width: int = 1600, height: int = 1200, settle: float = 1.0,
              full_page: bool = True, scroll_grids: bool = False, before_screenshot: str | None = None) -> str:
    """Open `url` in headless Chromium (a `width` x `height` viewport), wait until every string in
    `expect` is in the page's visible text (document.body.innerText, polled), wait `settle`
    seconds more so charts finish drawing, save a PNG screenshot at `screenshot` and return the
    visible text.

    `full_page`: before the screenshot, make the viewport taller (never shorter than `height`,
    at most MAX_HEIGHT) until nothing is scrolled out of sight, so the picture shows the whole
    page. The MLflow UI scrolls an inner panel, not the document, so Chromium's own
    full-page capture (captureBeyondViewport) would not see below the fold. False: exactly the
    first `width` x `height` px, as a window that size shows it.

    `scroll_grids`: the page's virtualized grids (the compare page's Metrics) hold only the rows in
    view; scroll each through, as a person would, and append all their rows to the text after a
    line GRID_ROWS_HEADING, one "name<TAB>value<TAB>value..." line per row.

    `before_screenshot`: JavaScript run (awaited) once the text is checked, before the picture,
    e.g. to switch the page to a view that shows the point of the test at a glance.

    Raises AssertionError naming the missing strings, with the start of the text seen and any
    JavaScript exceptions, if they do not all appear within `timeout` seconds; the screenshot is
    saved anyway, to see why. BrowserError if Chromium fails or the navigation itself fails."""
    screenshot = Path(screenshot)
    with _chromium(width, height) as cdp:
        target = cdp.send("Target.createTarget", {"url": "about:blank"}, timeout=60)["targetId"]
        session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Page.enable", "Runtime.enable"):
            cdp.send(method, session=session)
        # Viewport exactly width x height at 1 device px per CSS px, whatever the window is.
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                 session=session)
        nav = cdp.send("Page.navigate", {"url": url}, session=session, timeout=timeout)
        if nav.get("errorText"):
            raise BrowserError(f"Chromium could not load {url}: {nav['errorText']}")

        def evaluate(expression: str) -> str:
            try:
                res = cdp.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                    "awaitPromise": True}, session=session, timeout=timeout)
            except _ProtocolError:  # the page is between documents; try again on the next poll
                return ""
            return str(res.get("result", {}).get("value", ""))

        def page_text() -> str:
            text = evaluate(_PAGE_TEXT_JS)
            if scroll_grids:
                rows = evaluate(_VIRTUAL_GRID_ROWS_JS)
                if rows:
                    text += f"\n{GRID_ROWS_HEADING}\n{rows}"
            return text

        deadline = time.monotonic() + timeout
        text = page_text()
        while _missing(text, expect) and time.monotonic() < deadline:
            cdp.pump(0.25)
            text = page_text()
        missing = _missing(text, expect)
        if not missing and settle > 0:
            cdp.pump(settle)
            text = page_text()
            missing = _missing(text, expect)
        if before_screenshot and not missing:
            evaluate(before_screenshot)
            cdp.pump(settle)
        if full_page:
            _fit_viewport(cdp, session, width, height, settle)
        shot = cdp.send("Page.captureScreenshot", {"format": "png"}, session=session)
        with atomic_path(screenshot) as out:
            out.write_bytes(base64.b64decode(shot["data"]))
        if missing:
            errors = [_describe_exception(e) for e in cdp.events
                      if e.get("method") == "Runtime.exceptionThrown"]
            raise AssertionError(
                f"after {timeout:g} s the page {url} does not show {missing!r} "
                f"(screenshot: {screenshot}).\n"
                + (f"JavaScript exceptions: {errors[:5]!r}\n" if errors else "")
                + f"Visible text (first 2000 chars):\n{text[:2000]}")
        return text


# How tall the viewport must be for nothing to be scrolled out of sight: the document's own height,
# or the viewport plus the most that any visible scrolling element (overflow auto/scroll) hides.
# Invisible ones are skipped: resize sensors (e.g. the UI's "contract-trigger" divs) overflow on
# purpose, by a fixed amount at any size, and would make the viewport grow every round.
_NEEDED_HEIGHT_JS = """(() => {
  let hidden = 0;
  for (const e of document.querySelectorAll('*')) {
    if (e.scrollHeight <= e.clientHeight + 1) continue;
    const style = getComputedStyle(e);
    if (!(/auto|scroll/.test(style.overflowY) && style.visibility === 'visible')) continue;
    const h = e.scrollHeight - e.clientHeight, before = e.dataset.fitHidden;
    e.dataset.fitHidden = h;
    // A box of fixed height (the compare page's parameter table) hides as much in a taller
    // window as in a short one: growing for it would only add blank page, up to MAX_HEIGHT.
    if (before !== undefined && h >= Number(before) - 1) continue;
    hidden = Math.max(hidden, h);
  }
  return Math.ceil(Math.max(document.documentElement.scrollHeight, innerHeight + hidden));
})()"""


def _fit_viewport(cdp: _DevTools, session: str, width: int, height: int, settle: float) -> None:
    """Grow the viewport until the page needs no more height (a few rounds: content laid out to
    the viewport's height, e.g. 100vh panels, changes as the viewport grows)."""
    current = height
    for _ in range(4):
        res = cdp.send("Runtime.evaluate", {"expression": _NEEDED_HEIGHT_JS, "returnByValue": True},
                       session=session)
        needed = min(MAX_HEIGHT, max(height, int(res.get("result", {}).get("value") or 0)))
        if needed <= current:
            return
        current = needed
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": width, "height": current, "deviceScaleFactor": 1, "mobile": False},
                 session=session)
        cdp.pump(max(settle, 0.5))  # let the page lay out (and charts redraw) at the new size


def _describe_exception(event: dict) -> str:
    details = event.get("params", {}).get("exceptionDetails", {})
    exc = details.get("exception", {})
    return str(exc.get("description") or details.get("text") or details)[:300]
