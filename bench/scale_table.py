"""Compress at scale, one table: what each `earl compress` search spent and delivered, by graph size.

Reads the report.json that each search wrote beside its pick (`earl compress ... --out DIR` -> DIR/report.json)
and, for each, the matched-bytes baselines that bench/compress.py measured for the same dataset, budget and
minutes (`--baselines` results files: RotatE and EARL each at the largest dim whose int8 bundle fits, trained
the whole time). One row per search: entities, training triples, budget, minutes, peak RSS, the pick's seconds
per step, where the seconds went (train / validate / plan / setup / fine-tune, shares of the search), the pick
and its test MRR, and the baselines' test MRR. A search with no baseline that fits says so ("does not fit").

`--untrained` also evaluates, for each search, the pick's model and dim with its initial (untrained) weights on
the same test triples as the pick (the whole split, or the subset the report names): the floor a search at
chance would sit on, which 1M-entity synthetic graphs need beside their small MRRs.

    python bench/scale_table.py runs/compress-1m-60/report.json --label synthetic-1m=data/synthetic-1m \
        --cores synthetic-1m=1 --untrained
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import md_table, write_results  # noqa: E402

PHASES = ("train", "validate", "plan", "setup", "fine_tune")


def _mrr(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else "does not fit"


def baseline_cells(baselines: list[dict], dataset: str, max_bytes: int, minutes: float) -> dict[str, object]:
    """RotatE int8 and EARL int8 test MRRs of the bench/compress.py row with this dataset, budget and minutes."""
    for row in baselines:
        if (row.get("dataset"), row.get("max_bytes"), row.get("minutes")) == (dataset, max_bytes, minutes):
            return {m: (row[m].get("test_mrr") if row[m].get("fits", True) else None)
                    for m in ("rotate_int8", "earl_int8") if m in row}
    return {}


def untrained_mrr(data: Path, report: dict) -> float:
    """Test MRR of the pick's model and dim at its initial weights, on the triples the pick was tested on."""
    import torch

    from earl_service.config import ModelConfig
    from earl_service.data.dataset import load_dataset
    from earl_service.train.run import Run

    pick, limit = report["pick"], (report.get("test") or {}).get("test_subset", 0)
    dataset = load_dataset(data, labels=False)
    run = Run.build(dataset, ModelConfig(model=pick["model"], dim=pick["dim"]), torch.device("cpu"))
    return float(run.evaluate("test", limit=limit)["mrr"])


def row(path: Path, label: str, data: Path | None, cores: str, baselines: list[dict], untrained: bool) -> dict:
    report = json.loads(path.read_text())
    pick, seconds, ds = report["pick"], report["seconds"], report["dataset"]
    search = seconds["search"]
    out = {"graph": label, "entities": ds["entities"], "train_triples": ds["train"], "max_bytes": report["max_bytes"],
           "minutes": report["time_limit_minutes"], "cores": cores, "peak_rss_mb": report.get("peak_rss_mb"),
           "search_seconds": search, "test_seconds": seconds.get("test"),
           "shares": {p: seconds.get(p, 0.0) / search for p in PHASES},
           "pick": f"{pick['model']} d{pick['dim']} {pick['precision']}", "pick_bytes": pick["bytes"],
           "step_seconds": pick["train_seconds"] / max(pick["steps"], 1), "steps": pick["steps"],
           "test_mrr": (report.get("test") or {}).get("mrr"),
           "test_subset": (report.get("test") or {}).get("test_subset", 0), "report": str(path)}
    out["baselines"] = baseline_cells(baselines, label, report["max_bytes"], report["time_limit_minutes"])
    if untrained and data is not None:
        out["untrained_test_mrr"] = untrained_mrr(data, report)
    return out


def markdown(rows: list[dict]) -> str:
    headers = ["graph", "entities", "train triples", "budget", "minutes", "cores", "peak RSS", "pick", "s/step",
               "train", "validate", "plan", "setup", "fine-tune", "search s", "test MRR", "untrained",
               "RotatE int8", "EARL int8"]
    cells = []
    for r in rows:
        shares = [f"{100 * r['shares'][p]:.0f}%" for p in PHASES]
        tested = f"{r['test_mrr']:.4f}" + (f" ({r['test_subset']} triples)" if r["test_subset"] else "")
        cells.append([r["graph"], f"{r['entities']:,}", f"{r['train_triples']:,}", f"{r['max_bytes'] / 1e6:g} MB",
                      f"{r['minutes']:g}", r["cores"], f"{r['peak_rss_mb']:,.0f} MB", r["pick"],
                      f"{r['step_seconds']:.3f}", *shares, f"{r['search_seconds']:.0f}", tested,
                      _mrr(r["untrained_test_mrr"]) if "untrained_test_mrr" in r else "",
                      *(_mrr(r["baselines"].get(m)) if m in r["baselines"] else "not run"
                        for m in ("rotate_int8", "earl_int8"))])
    return ("# Compress at scale\n\n" + md_table(headers, cells) + "\n\n"
            "Shares are of the search's own seconds (the pick's test evaluation is timed apart); s/step is the pick's "
            "training seconds over its steps. Baselines: bench/compress.py's matched-bytes rows for the same graph, "
            "budget and minutes (each trained the whole time at the largest dim whose int8 bundle fits); "
            "untrained: the pick's model and dim at its initial weights on the same test triples.\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", type=Path, nargs="+", help="report.json files written by earl compress")
    parser.add_argument("--label", action="append", default=[], metavar="NAME=DATA",
                        help="the graph's name and data folder of each report, in order (default: the report's "
                             "folder name, no data)")
    parser.add_argument("--cores", action="append", default=[], metavar="NAME=N", help="cores a graph's search had")
    parser.add_argument("--baselines", type=Path, action="append", default=[],
                        help="bench/compress.py results (repeatable)")
    parser.add_argument("--untrained", action="store_true", help="test MRR of each pick's model untrained")
    parser.add_argument("--name", default="compress_scale")
    a = parser.parse_args()
    labels = [item.split("=", 1) for item in a.label]
    cores = dict(item.split("=", 1) for item in a.cores)
    baselines = [r for path in a.baselines for r in json.loads(path.read_text()).get("rows", [])]
    rows = []
    for i, path in enumerate(a.reports):
        name, data = labels[i] if i < len(labels) else (path.parent.name, "")
        rows.append(row(path, name, Path(data) if data else None, cores.get(name, "?"), baselines, a.untrained))
    write_results(a.name, {"rows": rows}, markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
