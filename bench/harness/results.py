"""The one results writer: `bench/results/<name>.{json,md}` (+ `.png`), each stamped with machine, commit, command."""

from __future__ import annotations

import json
from pathlib import Path

from harness.machine import REPO, describe_machine, environment

RESULTS = REPO / "bench" / "results"


def write_results(name: str, data: dict, markdown: str, *, folder: Path | None = None) -> tuple[Path, Path]:
    """`data` with the environment as `<name>.json`, `markdown` with a machine/commit/command footer as `<name>.md`,
    in `folder` (default bench/results/)."""
    folder = folder or RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    env = environment()
    js = folder / f"{name}.json"
    md = folder / f"{name}.md"
    js.write_text(json.dumps({**env, **data}, indent=2, default=str) + "\n")
    footer = (f"\n\nMachine: {describe_machine(env['machine'])}; torch {env['torch']}; commit `{env['commit']}`; "
              f"{env['date']}; load average {env['load_average'][1]:.1f} (5 min).\nCommand: `{env['command']}`\n")
    md.write_text(markdown.rstrip() + footer)
    return js, md


def md_table(headers: list[str], rows: list[list]) -> str:
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.4g}"
        return "" if x is None else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the Agg backend (these machines have no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def widen_ylim(ax, span: float) -> None:
    """Make `ax`'s y-axis at least `span` tall, around its current centre.

    matplotlib fits the axis to the data, so two MRRs 0.0004 apart fill the plot and read as a cliff; a floor on
    the span keeps run-to-run noise looking like noise.
    """
    lo, hi = ax.get_ylim()
    if hi - lo < span:
        mid = (lo + hi) / 2
        ax.set_ylim(mid - span / 2, mid + span / 2)


def save_png(name: str, fig) -> str:
    """Write `fig` as bench/results/<name>.png and close it; returns the file name for the markdown."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    pyplot().close(fig)
    return f"{name}.png"
