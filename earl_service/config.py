"""Configuration as frozen dataclasses: what the model is and how it is trained."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

ModelKind = Literal["earl", "rotate"]
ABLATIONS = ("no_reserved", "no_conrel", "no_knn", "no_conrel_knn", "no_mulhop")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture. `dim` counts complex dimensions: an entity is 2*dim reals, a relation dim phases."""

    model: ModelKind = "earl"
    dim: int = 150
    reserved_ratio: float = 0.1  # share of training entities with their own embedding row
    k: int = 10  # nearest reserved entities per entity (kNResEnt)
    knn_temperature: float = 0.2  # softmax(sim / 0.2) over the k similarities, fixed as in the reference
    layers: int = 2  # GNN layers (MulHop)
    gamma: float = 10.0  # RotatE margin
    epsilon: float = 2.0  # RotatE phase scaling: phase = r / ((gamma + epsilon) / dim) * pi
    # The paper's ablations (Tables 2 and 3).
    no_reserved: bool = False  # no reserved entities, hence no kNResEnt either
    no_conrel: bool = False
    no_knn: bool = False
    no_conrel_knn: bool = False  # fixed random GNN inputs instead of ConRel + kNResEnt
    no_mulhop: bool = False  # no GNN: the encoder output is the combined ConRel/kNResEnt representation
    seed: int = 0  # draws the reserved entities and the initial weights

    def __post_init__(self) -> None:
        if self.model not in ("earl", "rotate"):
            raise ValueError(f"model must be 'earl' or 'rotate', not {self.model!r}")
        if self.dim < 1 or self.layers < 0 or self.k < 1:
            raise ValueError("dim and k must be >= 1 and layers >= 0")
        if not 0.0 <= self.reserved_ratio <= 1.0:
            raise ValueError("reserved_ratio must lie in [0, 1]")

    @property
    def uses_reserved(self) -> bool:
        return not self.no_reserved and self.reserved_ratio > 0

    @property
    def uses_knn(self) -> bool:
        return self.uses_reserved and not (self.no_knn or self.no_conrel_knn)

    @property
    def uses_conrel(self) -> bool:
        return not (self.no_conrel or self.no_conrel_knn)

    @property
    def gnn_layers(self) -> int:
        return 0 if self.no_mulhop else self.layers

    @property
    def graph_options(self) -> dict[str, Any]:
        """`build_graph` keywords for this model: kNResEnt's k and temperature, and input-row grouping, which
        only the EARL encoder reads (RotatE never builds h0, so grouping would be wasted start-up work)."""
        return {"k": self.k, "temperature": self.knn_temperature, "compact": self.model == "earl"}

    @property
    def embedding_range(self) -> float:
        return (self.gamma + self.epsilon) / self.dim

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation. Defaults are the paper's (batch 1024, 256 negatives per side, Adam 1e-3, margin 10)."""

    steps: int = 100_000
    batch_size: int = 1024
    negatives: int = 256  # per side: this many head corruptions and this many tail corruptions
    lr: float = 1e-3
    adversarial_temperature: float = 1.0
    eval_every: int = 100  # steps between validations; 0 disables validation during training
    patience: int = 20  # validations without improvement before early stopping
    eval_batch_size: int = 256
    eval_max_triples: int = 0  # validate on a fixed random subset of this many valid triples (0: all)
    time_limit_minutes: float = 0.0  # 0: no limit
    checkpoint_every: int = 100  # steps between resumable checkpoints
    bf16: bool = False  # bfloat16 autocast for the encoder's dense maps on CPU
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads (0: leave torch's default)
    seed: int = 0
    progress: bool = True
    # Sampled (mini-batch) training: each batch encodes only its entities and negatives through sampled
    # neighbourhoods (earl_service/sampling.py) instead of the whole graph.
    sampled: bool = False
    fanout: tuple[int, ...] = (10, 10)  # edges drawn per entity at hop 0 (the batch), 1, ...; 0: all of them
    negative_chunk: int = 0  # sampled: this many positives share one draw of negatives (0: the whole batch)

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.negatives < 1 or self.steps < 0 or self.lr <= 0:
            raise ValueError("batch_size, negatives >= 1, steps >= 0 and lr > 0 are required")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        object.__setattr__(self, "fanout", tuple(int(x) for x in self.fanout))  # JSON gives a list
        if not self.fanout or any(x < 0 for x in self.fanout) or self.negative_chunk < 0:
            raise ValueError("fanout needs at least one value, each >= 0 (0: every edge); negative_chunk >= 0")

    def fanout_for(self, layers: int) -> list[int | None]:
        """One fan-out per GNN layer: extra values are ignored, missing ones repeat the last; 0 -> None (all)."""
        values = [self.fanout[min(i, len(self.fanout) - 1)] for i in range(layers)]
        return [x or None for x in values]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


__all__ = ["ABLATIONS", "ModelConfig", "TrainConfig"]
