"""The chart libraries of `dvc plots show` / `dvc plots diff`, kept in the repository so the HTML
works with no network: DVC's own page loads vega, vega-lite and vega-embed from a CDN, and is
blank offline. The three minified UMD builds (and each package's licence) live in plots/vendor/;
this script writes the DVC HTML template (.dvc/plots/offline.html, set as `plots.html_template`
in .dvc/config) that inlines them. The template has no `{scripts}` placeholder, so DVC adds no
CDN tags.

    python -m tools.vendor_plot_js            # rewrite the template from plots/vendor/
    python -m tools.vendor_plot_js --check    # exit 1 if the template is not what plots/vendor/ gives
    python -m tools.vendor_plot_js --fetch    # npm pack the pinned versions into plots/vendor/, then rewrite
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "plots" / "vendor"
VERSIONS = VENDOR / "versions.json"
TEMPLATE = ROOT / ".dvc" / "plots" / "offline.html"

# In load order: vega-lite and vega-embed attach to the globals the previous ones define. The
# versions are the latest of each major that DVC's specs (vega-lite v5) are written for.
PACKAGES = (
    ("vega", "5.33.1", "build/vega.min.js"),
    ("vega-lite", "5.23.0", "build/vega-lite.min.js"),
    ("vega-embed", "6.29.0", "build/vega-embed.min.js"),
)
# vega's npm package ships no LICENSE file; vega-util 1.17.3 comes from the same repository (the vega
# monorepo) and carries its licence.
LICENSE_FROM = {"vega": ("vega-util", "1.17.3")}

# DVC fills its template with str.replace on these, over the whole text: a library that held one
# would be rewritten. `</script` would end the inline script early.
FORBIDDEN = ("{plot_divs}", "{scripts}", "{refresh_tag}", "</script")

PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {refresh_tag}
    <title>Training curves (dvc plots)</title>
    <!-- Written by `python -m tools.vendor_plot_js` from plots/vendor/ (BSD-3-Clause, licences there). -->
{inline}
    <style>
        body { font-family: sans-serif; }
        body > div { display: inline-block; vertical-align: top; margin: 12px; }
        /* a plot DVC had no data for (its columns absent from the run) is left out of the page */
        body > div:not(:has(canvas, svg)) { display: none; }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def vendored() -> list[tuple[str, str, Path]]:
    """(name, version, file) of each library, checked against plots/vendor/versions.json."""
    recorded = json.loads(VERSIONS.read_text())
    out = []
    for name, version, build in PACKAGES:
        entry = recorded[name]
        path = VENDOR / name / Path(build).name
        if entry["version"] != version:
            raise SystemExit(f"{VERSIONS}: {name} is {entry['version']}, this script pins {version}: run --fetch")
        if sha256(path) != entry["sha256"]:
            raise SystemExit(f"{path}: sha256 differs from {VERSIONS}: run --fetch to restore it")
        out.append((name, version, path))
    return out


def build_template() -> str:
    parts = []
    for name, version, path in vendored():
        js = path.read_text(encoding="utf-8")
        bad = [s for s in FORBIDDEN if s in js]
        if bad:
            raise SystemExit(f"{path}: contains {bad[0]!r}, which cannot be inlined in DVC's HTML template")
        parts.append(f"    <script>/* {name} {version} */\n{js}\n    </script>")
    return PAGE.replace("{inline}", "\n".join(parts))


def _npm_pack(spec: str, into: Path) -> Path:
    subprocess.run(["npm", "pack", "--silent", spec], cwd=into, check=True, stdout=subprocess.DEVNULL)
    (tgz,) = into.glob(f"{spec.split('@')[0]}-*.tgz")
    with tarfile.open(tgz) as tar:
        tar.extractall(into / spec, filter="data")
    tgz.unlink()
    return into / spec / "package"


def fetch() -> None:
    """npm pack each pinned package into a temporary directory, copy its build and licence."""
    record = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, version, build in PACKAGES:
            pkg = _npm_pack(f"{name}@{version}", Path(tmp))
            lic_pkg = pkg if name not in LICENSE_FROM else _npm_pack("@".join(LICENSE_FROM[name]), Path(tmp))
            dest = VENDOR / name
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pkg / build, dest / Path(build).name)
            shutil.copyfile(lic_pkg / "LICENSE", dest / "LICENSE")
            record[name] = {
                "version": version,
                "file": Path(build).name,
                "sha256": sha256(dest / Path(build).name),
                "license": "BSD-3-Clause",
                "license_file_from": "@".join(LICENSE_FROM.get(name, (name, version))),
            }
    VERSIONS.write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.vendor_plot_js", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if the template is stale")
    mode.add_argument("--fetch", action="store_true", help="npm pack the pinned versions into plots/vendor/ first")
    args = parser.parse_args(argv)
    if args.fetch:
        fetch()
    text = build_template()
    if args.check:
        if not TEMPLATE.is_file() or TEMPLATE.read_text(encoding="utf-8") != text:
            print(f"{TEMPLATE} is not what plots/vendor/ gives: run python -m tools.vendor_plot_js", file=sys.stderr)
            return 1
        return 0
    TEMPLATE.parent.mkdir(parents=True, exist_ok=True)
    TEMPLATE.write_text(text, encoding="utf-8")
    print(f"wrote {TEMPLATE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
