"""Request and response models. The job form is derived from the option tables, as `earl train` and `earl compress`
are."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from earl_service.bundle.precision import DEFAULT, Precision, describe
from earl_service.compress.options import compress_form_model
from earl_service.config.options import form_model
from earl_service.service.tenants import DEFAULT_TENANT

from .deps import ID_PATTERN

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # earl_service.service.tenants.NAME


class CompressForm(compress_form_model()):  # type: ignore[misc]  # a derived base is dynamic to mypy
    """The form fields of a compress job: POST /jobs with max_bytes searches models, dims and precisions for the
    most accurate bundle under that size within `time_limit` minutes (required then) instead of training one
    model. Derived from CompressConfig's fields (earl_service/compress/options.py), as `earl compress` is; read by
    earl_service.compress.job.compress_settings."""


class JobForm(form_model(), CompressForm):  # type: ignore[misc]  # a derived base is dynamic to mypy
    """Form fields of POST /jobs, a training job's or (with max_bytes) a compress job's: the option table's service
    options (earl_service/config/options.py, with its limits that keep one request from asking for an absurd
    job), plus how the service runs and exports the job, and the compress job's fields (CompressForm).

    Unknown fields are refused by the route (`reject_unknown_fields`), not here: the form also carries the files.
    """

    precision: str = Field(DEFAULT.name, max_length=40, description=(
        f"precision of the exported bundle: {describe()} (GET /precisions lists them)"))
    nproc_per_node: int = Field(0, ge=0, le=64, description="> 0: the worker trains with this many DDP processes")
    source_model: str | None = Field(None, pattern=ID_PATTERN, description=(
        "compress job over a registered model (imported, or a RotatE trained here) instead of uploaded triples: "
        "its sizes (fp32, fp16, int8, pq:M) are searched under max_bytes; time_limit (default 10 minutes), "
        "precisions and seed apply, and train + valid files, when given, score each size and fine-tune pq codebooks"))
    retrain_minutes: float = Field(0.0, ge=0, le=10**6, description=(
        "with source_model and train + valid files: also train models at max_bytes on those files for this many "
        "minutes (after time_limit's) and publish that model where it scores above every size of the source "
        "(earl compress --from --retrain-minutes; docs/import.md)"))

    @field_validator("precision")
    @classmethod
    def _registered(cls, value: str) -> str:
        """A registered precision, stored as its name (ValueError, a 422, naming the known ones)."""
        return Precision.parse(value).name


class PrecisionOut(BaseModel):
    """One registered precision (GET /precisions): what `precision` and `precisions` accept."""

    name: str  # as a bundle's metadata and a job's params hold it
    syntax: str  # as written, with its parameter: pq[:M]
    summary: str
    codes_tables: bool  # some tables are stored as codes and codebooks


class JobCreated(BaseModel):
    id: str
    state: str
    triples: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="per uploaded split: triples kept and duplicates_dropped")
    labels: dict[str, int] = Field(default_factory=dict, description="per uploaded label file: labels read (those "
                                                                      "for ids not in the graph are left out later)")


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
    owner: str = Field(DEFAULT_TENANT, description="the tenant that made it")
    stored: int = Field(0, description="bytes its versions' files take on the server (its tenant's quota counts them)")


class ModelDetail(ModelOut):
    config: dict[str, Any]
    metrics: dict[str, Any]
    version: int  # 1 when registered, one more with each extend


class ModelVersionOut(BaseModel):
    """One bundle a model has had; earlier versions stay downloadable (?version=N) until the model is deleted."""

    version: int
    sha256: str
    bytes: int
    created: float  # when this version was placed
    latest: bool


class Prediction(BaseModel):
    entity: str
    label: str | None  # the entity's label, None without one
    score: float


class QueryAnswer(BaseModel):
    """One query's answers (LinkPredictor.answer): head, relation and tail are ids, also where the query named
    them by label; *_label their labels."""

    direction: Literal["tail", "head"]
    head: str | None
    head_label: str | None
    relation: str
    relation_label: str | None
    tail: str | None
    tail_label: str | None
    k: int
    exclude_known: bool
    predictions: list[Prediction]


class PredictionOut(QueryAnswer):
    model: str


MAX_K = 1000  # answers per query, GET and POST /predict
MAX_BATCH_QUERIES = 100  # queries per POST /predict: bounds one request's work and response
MAX_NAME_CHARS = 1000  # an entity or relation name in a query (and in an uploaded file: api/uploads.py)
# The body of POST /predict that the largest valid batch needs: its names with every character written as a \uXXXX
# escape (6 bytes; Python's json.dumps writes any non-ASCII character so), plus the keys and numbers around them.
# A larger body is refused before it is read whole: 10 MiB of empty queries cost 5 s and +485 MiB to parse.
MAX_PREDICT_BODY_BYTES = MAX_BATCH_QUERIES * (2 * MAX_NAME_CHARS * 6 + 256) + 1024


class PredictQuery(BaseModel):
    """One query of a batch: exactly one of `head` (predict tails) or `tail` (predict heads)."""

    head: str | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)
    tail: str | None = Field(None, min_length=1, max_length=MAX_NAME_CHARS)
    relation: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    k: int = Field(10, ge=1, le=MAX_K)
    exclude_known: bool = True

    @model_validator(mode="after")
    def _one_anchor(self) -> PredictQuery:
        if (self.head is None) == (self.tail is None):
            raise ValueError("give exactly one of 'head' (to predict tails) or 'tail' (to predict heads)")
        return self


class PredictBatch(BaseModel):
    model: str = Field(pattern=ID_PATTERN)
    queries: list[PredictQuery] = Field(min_length=1, max_length=MAX_BATCH_QUERIES, description=(
        f"1 to {MAX_BATCH_QUERIES} queries; more is a 422 (split them over several requests)"))


class BatchPredictionOut(BaseModel):
    model: str
    results: list[QueryAnswer]  # one per query, in order


class ScoreOut(BaseModel):
    model: str
    head: str
    head_label: str | None
    relation: str
    relation_label: str | None
    tail: str
    tail_label: str | None
    distance: float  # RotatE: sum_i |h_i r_i - t_i|; an imported model: minus its library's score (docs/import.md)
    score: float  # RotatE: gamma - distance; an imported model: its library's score; as in /predict
    known: bool  # the triple is in the model's graph
    tail_rank: float  # filtered realistic rank of tail among all entities for (head, relation, ?)
    head_rank: float  # the same for head in (?, relation, tail)
    entities: int  # candidates ranked


class EntityMatch(BaseModel):
    id: str
    label: str | None
    score: float  # 1: exact; (0.5, 1): prefix, higher the more of the id or label the query covers; < 0.5: fuzzy


class EntityPage(BaseModel):
    """GET /models/{id}/entities: `total` entities match; `items` are the ranked ones from `offset`."""

    total: int
    items: list[EntityMatch]
    limit: int
    offset: int


class NotFound(BaseModel):
    """`detail` of a 404 for an unknown model, job, entity or relation, or a model without a compress report."""

    message: str
    kind: Literal["model", "job", "entity", "relation", "report", "key"]
    name: str
    suggestions: list[str]


class NotFoundResponse(BaseModel):
    """The body of every 404 a route documents: `detail` says what was not found and suggests close names."""

    detail: NotFound


class RelationItem(BaseModel):
    id: str
    label: str | None


class RelationPage(BaseModel):
    """A page of a model's relations (GET /models/{id}/relations), in vocabulary order."""

    total: int
    items: list[RelationItem]
    limit: int
    offset: int


class KeyCreate(BaseModel):
    """POST /keys: a key named `name` for `tenant`, with `scopes` (write includes read; admin includes both)."""

    name: str = Field(pattern=NAME_PATTERN)
    tenant: str = Field(pattern=NAME_PATTERN)
    scopes: list[Literal["read", "write", "admin"]] = Field(min_length=1, max_length=3)


class KeyOut(BaseModel):
    """A key as listed: never the key or its hash."""

    id: str
    name: str
    tenant: str
    scopes: list[str]
    created: float
    revoked: float | None


class KeyCreated(KeyOut):
    key: str = Field(description="the key itself: shown this once, only its salted hash is kept")


class AuditOut(BaseModel):
    """One write: who (`key` of `tenant`), what (`method` `path`, about `target`), when (`time`), how it ended."""

    time: float
    tenant: str
    key: str
    key_id: str | None
    method: str
    path: str
    target: str | None
    status: int
