"""Look at MLflow runs as a person would: the real MLflow UI, in headless Chromium.

A test that only queries the tracking API proves the runs were logged; it does not prove that the
UI a person opens shows them. With the real `mlflow server` (tools/servers.py),
open_page opens one of its pages (usually the run-comparison page) in headless Chromium through
Playwright, waits until every expected string is in the page's visible text, and saves a
screenshot for a human to look at:

    with start_mlflow_server("sqlite:////abs/mlflow.db", tmp_path / "artifacts") as base_url:
        text = open_page(compare_runs_url(base_url, experiment_id, [run_a, run_b]),
                         expect=["smoke-lr-a", "smoke-lr-b", "train.lr"],
                         screenshot=REPO_ROOT / "test-artifacts" / "compare.png")

The browser is the system's Chromium, found and started as tools/screenshot.py does it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from pipeline.core.atomic import atomic_path
from tools.screenshot import MAX_HEIGHT, chromium_page

# The compare page shows metrics in react-virtualized grids (a 300 px window onto a names grid and
# a values grid, ~17 of a run's 100+ metrics in the DOM at a time), so innerText holds only the
# rows scrolled into view, as a person sees before scrolling. With scroll_grids, open_page scrolls
# each grid through its whole height, as a person would, and adds every row once after this line,
# "name<TAB>value<TAB>value...": cells of a section's grids that share a `top` are one row,
# ordered by `left`. Scroll positions are put back afterwards so the screenshot shows the page as
# it loaded.
GRID_ROWS_HEADING = "[rows of the virtualized grids, scrolled through]"

# Turns on every "Show diff only" switch of the compare page (parameters, metrics, tags): what a
# person does to see what sets two runs apart. A function for page.evaluate (awaited).
SHOW_DIFF_ONLY_JS = r"""async () => {
  const switches = [...document.querySelectorAll('[role=switch]')].filter(s =>
    (s.closest('label, div') || s).parentElement.innerText.includes('Show diff only'));
  for (const s of switches) if (s.getAttribute('aria-checked') !== 'true') s.click();
  await new Promise(r => setTimeout(r, 300));
  return switches.length;
}"""

_GRID_ROWS_JS = r"""async () => {
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
}"""

# The page's text as a person sees it (innerText skips hidden elements, scripts and styles), and
# with scrollGrids the virtualized grids' rows after GRID_ROWS_HEADING.
_PAGE_TEXT_JS = (
    """async ([scrollGrids, heading]) => {
  const text = document.body ? document.body.innerText : '';
  const rows = scrollGrids ? await (%s)() : '';
  return rows ? `${text}\\n${heading}\\n${rows}` : text;
}"""
    % _GRID_ROWS_JS
)

# The predicate page.wait_for_function polls until every expected string is in the text. It must
# answer at once (a pending promise would count as "found"), and scrolling the grids through takes
# a few frames, so the text is read in the background and each poll looks at the last complete
# reading; it returns that text when nothing is missing.
_ALL_SHOWN_JS = (
    """([expect, scrollGrids, heading]) => {
  const read = window.__openPageRead ??= {busy: false, text: null};
  if (read.text !== null && expect.every(s => read.text.includes(s))) return read.text;
  if (!read.busy) {
    read.busy = true;
    (%s)([scrollGrids, heading]).then(t => { read.text = t; }).finally(() => { read.busy = false; });
  }
  return false;
}"""
    % _PAGE_TEXT_JS
)
_POLL_MS = 250


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
    scale = 10**digits
    rounded = math.floor(value * scale + 0.5) / scale  # Math.round: halves go up, not to even
    return str(int(rounded)) if rounded == int(rounded) else repr(rounded)


def js_number(value: float) -> str:
    """A metric value as the runs table (and the logged model page) shows it: JavaScript's
    String(value), unrounded, in Python. 1.0 -> "1", 0.7436999999999999 as is, 1e-05 ->
    "0.00001", 1e-07 -> "1e-7", 1e21 -> "1e+21" (ECMAScript's Number::toString on the shortest
    digits that read back as the same double, which are Python's repr's)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    exact = Decimal(repr(abs(value))).normalize()
    digits = "".join(map(str, exact.as_tuple().digits))
    k = len(digits)
    n = exact.as_tuple().exponent + k  # value = 0.<digits> x 10^n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{mantissa}e{'+' if e > 0 else '-'}{abs(e)}"


# Reads the MLflow runs table (an ag-grid) row by row, in the order shown: a list with one
# {column id: cell text} per row, by the grid's row-index (its DOM order can differ). Column ids
# are the UI's own: "attributes.`Run Name`", "metrics.`KEY`", "tags.`KEY`", "attributes.`Dataset`",
# "attributes.`Models`", ... The grid renders only the columns near the viewport (horizontal
# virtualisation): a column far to the right is missing from a row unless the viewport is wide.
RUNS_TABLE_ROWS_JS = r"""() => {
  const rows = {};
  for (const cell of document.querySelectorAll('[role=row][row-index] [role=gridcell][col-id]')) {
    const i = cell.closest('[role=row]').getAttribute('row-index');
    (rows[i] ??= {})[cell.getAttribute('col-id')] = cell.innerText.trim();
  }
  return Object.keys(rows).sort((a, b) => a - b).map(i => rows[i]);
}"""


def type_into_js(placeholder: str, text: str) -> str:
    """A function for page.evaluate (e.g. open_page's before_screenshot) that types `text` into
    the page's input whose placeholder is `placeholder` (e.g. "Search metrics" on the logged model
    page), as a person would: the value set the way React notices, then an input event."""
    return r"""async () => {
  const input = [...document.querySelectorAll('input')].find(i => i.placeholder === %s);
  const setValue = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
  setValue.call(input, %s);
  input.dispatchEvent(new Event('input', {bubbles: true}));
  await new Promise(r => setTimeout(r, 300));
}""" % (json.dumps(placeholder), json.dumps(text))


# An init script (open_page's/view_page's `init_script`) that keeps the "MLflow Assistant" side
# panel shut. MLflow 3.17 opens it (about 350 px, over the page's right side) on a browser's first
# visit, which every fresh test browser is; these two localStorage keys say it was opened once
# already and closed, so it stays a small floating button.
QUIET_ASSISTANT_JS = (
    "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
    "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
)


@dataclass(frozen=True)
class PageView:
    """What view_page saw. `text`: the visible text once every expected string was in it (with
    the grids' rows after GRID_ROWS_HEADING when they were scrolled through). `url`: the page's
    URL then, after the app's own redirects and rewrites (a single-page app changes its hash
    route as it loads). `text_after`: the visible text read again after `before_screenshot` ran
    (what the screenshot shows), None without it. `read`: what `read_js` returned, None without
    it."""

    text: str
    url: str
    text_after: str | None = None
    read: Any = None


def open_page(url: str, expect: Sequence[str], screenshot: Path, **options) -> str:
    """Open `url` in headless Chromium, wait until every string in `expect` is in the page's
    visible text (document.body.innerText), wait a little more so charts finish drawing, save a
    PNG screenshot at `screenshot` and return the visible text: view_page's text (it describes
    the options: width, height, timeout, settle, full_page, scroll_grids, before_screenshot,
    init_script)."""
    return view_page(url, expect, screenshot, **options).text


def view_page(
    url: str,
    expect: Sequence[str],
    screenshot: Path,
    timeout: float = 60,
    width: int = 1600,
    height: int = 1200,
    settle: float = 1.0,
    full_page: bool = True,
    scroll_grids: bool = False,
    before_screenshot: str | None = None,
    init_script: str | None = None,
    read_js: str | None = None,
) -> PageView:
    """open_page, returning a PageView: the visible text, the URL the page ended on, the text
    after `before_screenshot` and what `read_js` returned.

    `full_page`: the whole page in the picture. The MLflow UI scrolls an inner panel, not the
    document, so Playwright's full-page capture alone would stop at the fold: the viewport is
    first made taller (never shorter than `height`, at most MAX_HEIGHT) until nothing is
    scrolled out of sight. False: exactly the first `width` x `height` px.

    `scroll_grids`: the page's virtualized grids (the compare page's Metrics) hold only the rows in
    view; scroll each through, as a person would, and append all their rows to the text after a
    line GRID_ROWS_HEADING, one "name<TAB>value<TAB>value..." line per row.

    `before_screenshot`: a JavaScript function run (awaited) once the text is checked, before the
    picture, e.g. to switch the page to a view that shows the point of the test at a glance; the
    text is then read again (PageView.text_after).

    `init_script`: JavaScript run in the page before any of its own scripts, on every load (e.g.
    QUIET_ASSISTANT_JS, or localStorage the app reads as it starts).

    `read_js`: a JavaScript function run (awaited) after `before_screenshot`, for what innerText
    does not tell (e.g. which cell is in which row and column); its result, as JSON turns it into
    Python, is PageView.read.

    Raises AssertionError naming the missing strings, with the start of the text seen and any
    JavaScript exceptions, if they do not all appear within `timeout` seconds; the screenshot is
    saved anyway, to see why. Playwright's Error if the navigation itself fails."""
    screenshot = Path(screenshot)
    with chromium_page(width, height, timeout) as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)[:300]))
        if init_script:
            page.context.add_init_script(init_script)
        page.goto(url)
        args = [list(expect), scroll_grids, GRID_ROWS_HEADING]
        try:
            page.wait_for_function(_ALL_SHOWN_JS, arg=args, polling=_POLL_MS, timeout=timeout * 1000)
            page.wait_for_timeout(settle * 1000)
        except PlaywrightTimeout:
            pass  # what is missing is worked out below, from the text as it is now
        text = page.evaluate(_PAGE_TEXT_JS, args[1:])
        final_url = page.url
        missing = [s for s in expect if s not in text]
        text_after = read = None
        if before_screenshot and not missing:
            page.evaluate(before_screenshot)
            page.wait_for_timeout(settle * 1000)
            text_after = page.evaluate(_PAGE_TEXT_JS, args[1:])
        if read_js and not missing:
            read = page.evaluate(read_js)
        if full_page:
            _fit_viewport(page, width, height, settle)
        with atomic_path(screenshot) as out:
            out.write_bytes(page.screenshot(full_page=full_page, type="png"))
        if missing:
            raise AssertionError(
                f"after {timeout:g} s the page {url} does not show {missing!r} "
                f"(screenshot: {screenshot}).\n"
                + (f"JavaScript exceptions: {errors[:5]!r}\n" if errors else "")
                + f"Visible text (first 2000 chars):\n{text[:2000]}"
            )
        return PageView(text, final_url, text_after, read)


# How tall the viewport must be for nothing to be scrolled out of sight: the document's own height,
# or the viewport plus the most that any visible scrolling element (overflow auto/scroll) hides.
# Invisible ones are skipped: resize sensors (e.g. the UI's "contract-trigger" divs) overflow on
# purpose, by a fixed amount at any size, and would make the viewport grow every round.
_NEEDED_HEIGHT_JS = """() => {
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
}"""


def _fit_viewport(page: Page, width: int, height: int, settle: float) -> None:
    """Grow the viewport until the page needs no more height (a few rounds: content laid out to
    the viewport's height, e.g. 100vh panels, changes as the viewport grows)."""
    current = height
    for _ in range(4):
        needed = min(MAX_HEIGHT, max(height, int(page.evaluate(_NEEDED_HEIGHT_JS) or 0)))
        if needed <= current:
            return
        current = needed
        page.set_viewport_size({"width": width, "height": current})
        page.wait_for_timeout(max(settle, 0.5) * 1000)  # let the page lay out (and charts redraw)
