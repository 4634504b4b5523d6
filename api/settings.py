"""Service settings from EARL_* environment variables; the only place the service reads the environment."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from earl_service.bundle.format import BundleLimits
from earl_service.service.tenants import Quota


class Settings(BaseSettings):
    """EARL_HOME, EARL_STORE, EARL_API_TOKEN, EARL_PROTECT_READS, EARL_MAX_UPLOAD_MB, EARL_MAX_UNPACKED_MB,
    EARL_CACHE_MODELS, EARL_CACHE_MB; and the bounds on work: EARL_ALLOW_OPEN_WRITES, EARL_MAX_CONCURRENT_PREDICTS,
    EARL_PREDICT_QUEUE_SECONDS, EARL_MAX_JOB_DIM, EARL_MAX_BATCH_X_NEGATIVES, EARL_MAX_NPROC, EARL_MAX_JOB_MINUTES,
    EARL_MAX_QUEUED_JOBS, EARL_MAX_EVENT_STREAMS, EARL_MAX_UPLOAD_TRIPLES, EARL_MAX_BUNDLE_ENTITIES, EARL_MAX_BUNDLE_TRIPLES,
    EARL_MAX_BUNDLE_LABEL_MB (docs/api.md#settings); the front: EARL_MAX_HEADER_BYTES, EARL_MAX_HEADERS,
    EARL_HEADER_TIMEOUT_SECONDS, EARL_KEEP_ALIVE_SECONDS, EARL_TRUSTED_PROXIES, EARL_ALLOWED_HOSTS,
    EARL_ALLOWED_ORIGINS (docs/security.md#settings); tenants: EARL_OPEN_READS, EARL_TENANT_MAX_MODELS,
    EARL_TENANT_MAX_MB, EARL_TENANT_RATE, EARL_TENANT_BURST, EARL_AUDIT_KEEP (docs/security.md#keys-and-tenants)."""

    model_config = SettingsConfigDict(env_prefix="EARL_", extra="ignore")

    home: Path = Path("artifacts")  # uploads/, runs/, models/ and the SQLite store live here
    store: str = "sqlite"  # 'sqlite' (HOME/earl.sqlite3), a path, or redis://host:port/db
    api_token: SecretStr | None = None  # when set, every write endpoint needs 'Authorization: Bearer <token>'
    protect_reads: bool = False  # with a token: reads need it too (all but /healthz and /readyz)
    max_upload_mb: float = Field(100.0, gt=0)  # bound on a whole request body, enforced while it streams in
    # Bound on what a .gz triple upload may decompress to (a gzip bomb is refused at this size, not read to the end).
    max_unpacked_mb: float = Field(1024.0, gt=0)
    cache_models: int = Field(4, ge=1)  # LinkPredictors kept in memory (LRU)
    # ... and at most this many MB of them (LinkPredictor.resident_bytes): the least recently used go first.
    cache_mb: float = Field(2048.0, gt=0)
    # EARL_RUN_RETENTION_DAYS: runs/<job>/ and uploads/<job>/ of a job that ended (any way) go this many days later;
    # 0 keeps them. The job's record and its model stay (deleting a model removes them at once).
    run_retention_days: float = Field(30.0, ge=0)

    # Bounds on what one cheap request can make the server do (docs/reliability.md#limits).
    allow_open_writes: bool = False  # `earl serve` on a non-loopback host without a token refuses to start unless set
    max_concurrent_predicts: int = Field(8, ge=1)  # predictions computed at once; the others wait in line
    # Uploads (POST /jobs, POST /models, extends) checked and stored at once; the others wait on the event loop,
    # holding no thread: 60 at once in 40 threads grew the server by 109 MiB and held /healthz for 1 s.
    max_concurrent_uploads: int = Field(2, ge=1)
    predict_queue_seconds: float = Field(10.0, gt=0)  # a prediction waits this long for a slot, then 503
    max_job_dim: int = Field(512, ge=1)  # a job's dim
    max_batch_x_negatives: int = Field(2**20, ge=1)  # a job's batch_size * negatives (scores per step and side)
    max_nproc: int = Field(8, ge=0)  # a job's nproc_per_node
    max_job_minutes: float = Field(24 * 60.0, gt=0)  # a job's time_limit; a job without one gets this
    max_queued_jobs: int = Field(10, ge=1)  # unfinished (queued or running) jobs per client (token, else address)
    max_event_streams: int = Field(64, ge=1)  # GET /jobs/{id}/events open at once per API process (each polls)
    # Bound on the distinct triples of one uploaded file: the upload check keeps 8 bytes for each (16 while merging).
    max_upload_triples: int = Field(10_000_000, ge=1)
    # The largest bundle POST /models registers (names per vocabulary, triples): checked while it decompresses,
    # so a small file with a huge vocabulary is refused before its names are built (the 64x xz cap alone lets a
    # 100 MiB upload unpack to GiBs of names).
    max_bundle_entities: int = Field(2_000_000, ge=1)
    max_bundle_triples: int = Field(20_000_000, ge=1)
    # Decoded bytes of a bundle's entity (or relation) labels: 14,541 FB15k-237 labels take 0.24 MB.
    max_bundle_label_mb: float = Field(64.0, gt=0)

    # The front (docs/security.md): what one connection may send before its request reaches the app, and whom to
    # believe about a client's address. api/server.py gives them to uvicorn; api/front.py checks the header count.
    max_header_bytes: int = Field(64 * 1024, ge=4096)  # request line + headers (uvicorn's h11 buffer); past it 400
    max_headers: int = Field(100, ge=16)  # header fields in one request; past it 431
    header_timeout_seconds: float = Field(10.0, gt=0)  # a request's line and headers must arrive within this; 408
    keep_alive_seconds: int = Field(5, ge=1)  # an idle kept-alive connection is closed after this
    # Comma-separated addresses (or networks) of reverse proxies whose X-Forwarded-For names the client; empty:
    # none, the client is the connection's address (a local client could otherwise claim any address).
    trusted_proxies: str = ""
    # Comma-separated host names the server answers to besides localhost, 127.0.0.1, ::1 and the address a client
    # connected to (`earl serve --host` adds its name); '*': any (behind a proxy that checks Host itself).
    allowed_hosts: str = ""
    # Comma-separated origins (https://console.example.org) whose pages may write, besides the server's own.
    allowed_origins: str = ""

    # Keys and tenants (docs/security.md#keys-and-tenants). Once a key exists, reads need a key (or the token) too,
    # unless EARL_OPEN_READS: then anonymous clients read the default tenant's models and jobs, as before keys.
    open_reads: bool = False
    # Quotas of each tenant's keys without the admin scope (the token and admin keys are operators: unbound).
    tenant_max_models: int = Field(100, ge=1)  # registered models
    tenant_max_mb: float = Field(10 * 1024.0, gt=0)  # bundle files over every version of its models
    tenant_rate: float = Field(20.0, ge=0)  # requests per second per tenant and API process; 0: unbounded
    tenant_burst: int = Field(40, ge=1)  # requests at once above the rate
    audit_keep: int = Field(100_000, ge=100)  # the audit log's latest entries the store keeps

    @field_validator("api_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: object) -> object:
        return None if value in ("", None) else value

    @model_validator(mode="after")
    def _reads_need_a_token(self) -> Settings:
        if self.protect_reads and self.api_token is None:
            raise ValueError("EARL_PROTECT_READS=true needs EARL_API_TOKEN: without a token nothing can be read")
        return self

    @property
    def trusted_proxy_list(self) -> list[str]:
        return _listed(self.trusted_proxies)

    @property
    def allowed_host_list(self) -> list[str]:
        return [host.lower().strip("[]") for host in _listed(self.allowed_hosts)]

    @property
    def allowed_origin_list(self) -> list[str]:
        return _listed(self.allowed_origins)

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def max_unpacked_bytes(self) -> int:
        return int(self.max_unpacked_mb * 1024 * 1024)

    @property
    def tenant_quota(self) -> Quota:
        return Quota(max_models=self.tenant_max_models, max_bytes=int(self.tenant_max_mb * 2**20))

    @property
    def bundle_limits(self) -> BundleLimits:
        return BundleLimits(max_names=self.max_bundle_entities, max_triples=self.max_bundle_triples,
                            max_label_bytes=int(self.max_bundle_label_mb * 2**20),
                            origin="EARL_MAX_BUNDLE_ENTITIES / EARL_MAX_BUNDLE_TRIPLES / EARL_MAX_BUNDLE_LABEL_MB")


def _listed(text: str) -> list[str]:
    """A comma-separated setting as its items."""
    return [item.strip() for item in text.split(",") if item.strip()]
