"""A run directory's checkpoints: checkpoint.pt (the last state, to resume from) and best.pt (the best weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from earl_service.atomic import replacing
from earl_service.errors import DatasetError

CHECKPOINT = "checkpoint.pt"  # last state, for --resume
BEST = "best.pt"  # best weights by valid MRR


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, values: dict[str, Any]) -> None: ...


def save(obj: Any, path: Path) -> None:
    """torch.save, atomically: a run killed mid-write keeps its previous file."""
    with replacing(path) as tmp:
        torch.save(obj, tmp)


def load_best(out: Path, model: torch.nn.Module) -> None:
    """Load OUT/best.pt into `model`, onto the device of its parameters."""
    device = next(model.parameters()).device
    model.load_state_dict(torch.load(out / BEST, map_location=device, weights_only=True))


def check_vocab(run_dir: Path, trained: dict[str, Any] | None, given: dict[str, Any]) -> None:
    """DatasetError unless the data's training entities and relations (`given`: Dataset.vocab_signature) are the
    ones the run in `run_dir` was trained on (`trained`, from its checkpoint), in the same order."""
    if trained is None or trained == given:
        return
    counts = (f"the run was trained on {trained['entities']:,} entities and {trained['relations']:,} relations, "
              f"this data has {given['entities']:,} training entities and {given['relations']:,} relations")
    if (trained["entities"], trained["relations"]) == (given["entities"], given["relations"]):
        counts = ("the counts agree but the names (or their order) differ; runs trained before entity ids were put "
                  "in name order (earl_service.data.triples.name_order) numbered them in file order: their "
                  "bundle.safetensors carries its own names and still serves and evaluates")
    raise DatasetError(f"this data does not match the run in {run_dir}: {counts}; use the data it was trained on "
                       "(the same train file)")


def portable_optimizer_state(state_dict: dict) -> dict:
    """An optimizer state_dict as an eager run can load it on any device: learning rates as floats, not
    capturable (a graphed run's groups hold rate tensors and the flag; train/graphed.make_capturable sets them
    again)."""
    for group in state_dict["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
        if "capturable" in group:
            group["capturable"] = False
    return state_dict


class Checkpointer:
    """Saves and restores one run's model, optimizer and loop state; only the writing rank (rank 0) writes.

    checkpoint.pt holds {"model", "optimizer", the loop state's own keys, "model_config", "train_config", "vocab"}.
    """

    def __init__(
        self, out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Stateful, *,
        configs: dict[str, Any], writes: bool = True,
    ) -> None:
        self.out, self.model, self.optimizer, self.state = out, model, optimizer, state
        self.configs = configs  # {"model_config", "train_config", "vocab"}: for load_run and restore's check
        self.writes = writes

    def can_resume(self) -> bool:
        return (self.out / CHECKPOINT).exists()

    def restore(self) -> None:
        # On the CPU first: the RNG states must be CPU tensors; the weights and the optimizer's moments follow
        # their parameters' device as they load.
        ckpt = torch.load(self.out / CHECKPOINT, map_location="cpu", weights_only=True)
        # Resuming on other entities would train each row as another entity.
        check_vocab(self.out, ckpt.get("vocab"), self.configs["vocab"])
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.state.load_state_dict(ckpt)

    def save(self) -> None:
        if self.writes:
            save({"model": self.model.state_dict(), "optimizer": portable_optimizer_state(self.optimizer.state_dict()),
                  **self.state.state_dict(), **self.configs}, self.out / CHECKPOINT)

    def has_best(self) -> bool:
        return (self.out / BEST).exists()

    def save_best(self) -> None:
        if self.writes:
            save(self.model.state_dict(), self.out / BEST)

    def load_best(self) -> None:
        load_best(self.out, self.model)


__all__ = ["BEST", "CHECKPOINT", "Checkpointer", "check_vocab", "load_best", "portable_optimizer_state", "save"]
