"""What a finished run leaves in its directory: metrics.json, history.json, curves.png and the bundle."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from earl_service.atomic import replacing, write_json
from earl_service.bundle.model_io import Bundle
from earl_service.train.state import History

METRICS = "metrics.json"
HISTORY = "history.json"
CURVES = "curves.png"
BUNDLE = "bundle.safetensors"  # the deployable artifact (fp32)


def write_run_outputs(out: Path, metrics: dict[str, Any], history: History, *, bundle: Bundle | None = None,
                      curves: bool = True) -> None:
    """The bundle first (its size goes into `metrics` and metrics.json), then metrics.json, history.json and,
    with `curves`, curves.png (matplotlib: ~0.5 s, which a compress slice of a few seconds does not spend)."""
    if bundle is not None:
        metrics["bundle_bytes"] = bundle.save(out / BUNDLE).stat().st_size
    write_json(out / METRICS, metrics)
    write_json(out / HISTORY, asdict(history))
    if curves:
        plot_curves(history, out / CURVES)


def plot_curves(history: History, path: Path) -> None:
    """Loss and valid MRR against step and wall-clock (2 x 2 panels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, (xs, xe, label) in enumerate(((history.steps, history.eval_steps, "step"),
                                            (history.seconds, history.eval_seconds, "wall-clock (s)"))):
        axes[0, col].plot(xs, history.losses, lw=0.8)
        axes[0, col].set(xlabel=label, ylabel="loss")
        axes[1, col].plot(xe, history.eval_mrr, marker="o", ms=3)
        axes[1, col].set(xlabel=label, ylabel="valid MRR (filtered)")
    fig.tight_layout()
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")  # the temporary name has no .png to infer it from
    plt.close(fig)


__all__ = ["BUNDLE", "CURVES", "HISTORY", "METRICS", "plot_curves", "write_run_outputs"]
