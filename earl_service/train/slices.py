"""Training continued in slices, each judged on its own, where each slice holds the rate, decays it over its
last part (to be validated), and the next slice goes on from where that decay began (the held state), not from
the decayed weights: the warm-up-stable-decay schedule, whose decay can branch off a run and the run go on
without it (Hägele et al., "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations", 2024).

Measured against what compress's rungs do (each slice decays over its whole length and the next warms up again
from its end) and against one schedule over the same seconds, under the default recipe: RotatE d255 on
FB15k-237, 300 + 660 s on one core, test MRR 0.2320 held (decay over each slice's last 20%) against 0.3079
restarting and 0.3121 under one cosine schedule (bench/results/schedule_restart_fb15k-237_rotate-d255_r16.md).
At the recipe's peak rate (1e-2) RotatE's loss stays flat (~1.16) while the rate is held and falls only in the
decay, so a hold wastes its seconds there; compress keeps its restarts but at its last rung, which goes on along
one schedule over the survivor's whole training (0.3162 against 0.3133 restarting, side by side:
bench/results/schedule_restart_fb15k-237_rotate-d255_r17.md). `python bench/schedule_restart.py` re-runs them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from earl_service.atomic import replacing
from earl_service.config import ModelConfig, TrainConfig
from earl_service.data.dataset import Dataset
from earl_service.train.checkpoint import CHECKPOINT
from earl_service.train.loop import train

HELD = "held.pt"  # the state where the last slice's decay began (a copy of checkpoint.pt then)
HELD_AT = "held.json"  # its training seconds and steps


def train_slice(dataset: Dataset, model: ModelConfig, config: TrainConfig, out: str | os.PathLike, *,
                trained: float, seconds: float, schedule: tuple[float, float], decay_share: float,
                **train_args: Any) -> dict[str, Any]:
    """Train the run in `out` (continuing its checkpoint, `trained` seconds in) for about `seconds` more, its rate
    held over `schedule` (start, length: seconds of its training) and decaying over the schedule's last
    `decay_share`; the state where the decay begins is kept (HELD) when it falls inside these seconds. Returns
    train()'s metrics of the last call."""
    start, length = schedule
    config = replace(config, schedule_minutes=max(length, 1e-3) / 60, schedule_start_minutes=start / 60,
                     decay_share=decay_share)
    folder, end = Path(out), trained + seconds
    hold_until = start + (1.0 - decay_share) * length
    if config.lr_schedule != "constant" and trained < hold_until < end:
        # train() counts its time limit from the checkpoint's elapsed time; 0 would mean no limit at all.
        held = train(dataset, model, replace(config, time_limit_minutes=max(hold_until, 1e-3) / 60), folder,
                     resume=True, **{**train_args, "final_eval": False})
        if held["stopped"] == "cancelled":
            return held
        keep_held(folder, held)
    return train(dataset, model, replace(config, time_limit_minutes=max(end, 1e-3) / 60), folder, resume=True,
                 **train_args)


def keep_held(out: Path, metrics: dict[str, Any]) -> None:
    """Keep `out`'s current checkpoint as the state the next slice goes on from."""
    with replacing(out / HELD) as tmp:
        shutil.copyfile(out / CHECKPOINT, tmp)
    with replacing(out / HELD_AT) as tmp:
        tmp.write_text(json.dumps({"train_seconds": metrics["train_seconds"], "steps": metrics["steps"]}))


def rewind(out: str | os.PathLike, trained: float) -> dict[str, Any] | None:
    """Put the held state back as `out`'s checkpoint, to go on from where the last slice's decay began, once the
    run is known to have trained past it (`trained` seconds: the caller's record of its finished slices, so that
    a slice killed during its decay resumes the decay rather than going back). Returns the held state's
    {"train_seconds", "steps"}, or None where nothing is rewound."""
    folder = Path(out)
    if not (folder / HELD).exists() or not (folder / HELD_AT).exists():
        return None
    at = json.loads((folder / HELD_AT).read_text())
    if trained < at["train_seconds"]:
        return None
    with replacing(folder / CHECKPOINT) as tmp:
        shutil.copyfile(folder / HELD, tmp)
    (folder / HELD_AT).unlink()
    (folder / HELD).unlink()
    return at


__all__ = ["HELD", "HELD_AT", "keep_held", "rewind", "train_slice"]
