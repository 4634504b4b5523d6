"""Request and response models. Training form fields are named like the `earl train` options."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from earl_service.config import ModelConfig, TrainConfig

_M, _T = ModelConfig(), TrainConfig()


class TrainForm(BaseModel):
    """Form fields of POST /jobs; bounds keep one request from asking for an absurd job.

    Unknown fields are refused by the route (`reject_unknown_fields`), not here: the form also carries the files.
    """

    model_config = ConfigDict(extra="ignore")

    model: Literal["earl", "rotate"] = _M.model
    dim: int = Field(_M.dim, ge=1, le=1024)
    reserved_ratio: float = Field(_M.reserved_ratio, ge=0.0, le=1.0)
    k: int = Field(_M.k, ge=1, le=100)
    layers: int = Field(_M.layers, ge=0, le=8)
    gamma: float = Field(_M.gamma, gt=0.0, le=1000.0)
    epsilon: float = Field(_M.epsilon, ge=0.0, le=1000.0)
    no_reserved: bool = False
    no_conrel: bool = False
    no_knn: bool = False
    no_conrel_knn: bool = False
    no_mulhop: bool = False
    steps: int = Field(_T.steps, ge=0, le=10_000_000)
    batch_size: int = Field(_T.batch_size, ge=1, le=65_536)
    negatives: int = Field(_T.negatives, ge=1, le=4096)
    lr: float = Field(_T.lr, gt=0.0, le=1.0)
    eval_every: int = Field(_T.eval_every, ge=0, le=10_000_000)
    patience: int = Field(_T.patience, ge=1, le=10_000)
    time_limit: float = Field(0.0, ge=0.0, le=7 * 24 * 60, description="minutes; 0: no limit")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    sampled: bool = False  # sampled (mini-batch) training for graphs whose full-graph encoding does not fit
    fanout: str = Field(",".join(map(str, _T.fanout)), pattern=r"^(\d+|all)(,(\d+|all)){0,7}$",
                        description="edges drawn per entity at hop 1, 2, ... ('all' or 0: every edge)")
    negative_chunk: int = Field(_T.negative_chunk, ge=0, le=65_536)
    nproc_per_node: int = Field(0, ge=0, le=64, description="> 0: the worker trains with this many DDP processes")


class JobCreated(BaseModel):
    id: str
    state: str
    triples: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="per uploaded split: triples kept and duplicates_dropped")


class JobOut(BaseModel):
    id: str
    state: str
    params: dict[str, Any]
    files: dict[str, str]
    created: float
    started: float | None
    finished: float | None
    progress: dict[str, Any]
    error: str | None
    model_id: str | None
    attempts: int
    worker: str | None
    heartbeat: float | None
    cancel_requested: bool


class ModelOut(BaseModel):
    id: str
    sha256: str
    bytes: int
    parameters: int
    precision: str
    entities: int
    relations: int
    created: float
    job_id: str | None


class ModelDetail(ModelOut):
    config: dict[str, Any]
    metrics: dict[str, Any]


class Prediction(BaseModel):
    entity: str
    score: float


class PredictionOut(BaseModel):
    model: str
    direction: Literal["tail", "head"]
    head: str | None
    relation: str
    relation_label: str | None
    tail: str | None
    k: int
    exclude_known: bool
    predictions: list[Prediction]


class NotFound(BaseModel):
    """`detail` of a 404 for an unknown model, entity or relation."""

    message: str
    kind: Literal["model", "job", "entity", "relation"]
    name: str
    suggestions: list[str]
