"""Regenerate the results index in bench/README.md from bench/results/*.json (no figure typed by hand).

    python bench/summary.py          # print the index
    python bench/summary.py --write  # replace the block between the markers in bench/README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, md_table

README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- results index: begin (python bench/summary.py --write) -->", "<!-- results index: end -->"


def index() -> str:
    rows = []
    for js in sorted(RESULTS.glob("*.json")):
        try:
            data = json.loads(js.read_text())
        except ValueError:
            continue
        load = data.get("load_average") or [None, None, None]
        title = ""
        md = js.with_suffix(".md")
        if md.exists():
            first = md.read_text().splitlines()[:1]
            title = first[0].lstrip("# ").strip() if first else ""
        rows.append([f"[{js.stem}](results/{md.name})", title, f"`{data.get('command', '')}`", data.get("date", ""),
                     (data.get("commit") or "")[:10], "" if load[1] is None else f"{load[1]:.1f}"])
    return md_table(["results", "what", "command", "date (UTC)", "commit", "load avg (5 min)"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    table = index()
    if not args.write:
        print(table)
        return
    text = README.read_text()
    if BEGIN not in text or END not in text:
        sys.exit(f"{README} lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


if __name__ == "__main__":
    main()
