"""`Client`: queue a training job on an EARL service, follow it, query its model and download the bundle."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from os import PathLike
from pathlib import Path
from typing import Any

import httpx

Progress = Callable[[dict[str, Any]], None]
FILES = ("train", "valid", "test", "entity_labels", "relation_labels")  # the upload fields of POST /jobs


class ServiceError(RuntimeError):
    """The service answered with an error status; the message is the reason it gave."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code


class JobFailed(RuntimeError):
    """A job ended failed or cancelled; `job` is its last state as the service reported it."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(f"job {job['id']} {job['state']}: {job.get('error')}")
        self.job = job


def _reason(response: httpx.Response) -> str:
    """The service's own words: FastAPI's `detail` (a string, a {"message": ...} object or a list), else the body."""
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        return response.text
    if isinstance(detail, dict):
        return str(detail.get("message", detail))
    return str(detail)


def _form_value(value: object) -> str:
    # FastAPI reads form booleans as true/false; str(True) would be "True".
    return str(value).lower() if isinstance(value, bool) else str(value)


class Client:
    """One EARL service at `base_url` (e.g. http://127.0.0.1:8000); `token` is sent as a Bearer token."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _json(self, response: httpx.Response) -> Any:
        if response.is_error:
            raise ServiceError(response.status_code, _reason(response))
        return response.json()

    def ready(self) -> bool:
        """True when /readyz answers 200 (store reachable, home writable); False while nothing listens yet."""
        try:
            return self.http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def wait_ready(self, timeout: float = 120.0, *, alive: Callable[[], bool] = lambda: True) -> None:
        """Poll /readyz until it answers 200; `alive` lets a caller that started the server give up when it died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError(f"the service at {self.http.base_url} stopped before it was ready")
            if self.ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"the service at {self.http.base_url} was not ready within {timeout:.0f} s")

    def submit_job(self, train: str | PathLike, *, valid: str | PathLike | None = None,
                   test: str | PathLike | None = None, entity_labels: str | PathLike | None = None,
                   relation_labels: str | PathLike | None = None,
                   params: Mapping[str, object] | None = None) -> str:
        """Upload triple files (and label files: TSV id<TAB>label or JSON) and queue a training job; `params` are
        `earl train`'s options by their form names (dim, steps, batch_size, ...). Returns the job id."""
        paths = dict(zip(FILES, (train, valid, test, entity_labels, relation_labels), strict=True))
        data = {name: _form_value(value) for name, value in (params or {}).items()}
        with ExitStack() as opened:  # open files, not their bytes: httpx streams them, a large upload never in memory
            files = {field: (Path(p).name, opened.enter_context(Path(p).open("rb")))
                     for field, p in paths.items() if p is not None}
            response = self.http.post("/jobs", data=data, files=files)
        return self._json(response)["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        """The job's state, progress (step, total, loss, valid MRR), error and, once trained, its model id."""
        return self._json(self.http.get(f"/jobs/{job_id}"))

    def wait(self, job_id: str, *, on_progress: Progress | None = None, poll_s: float = 2.0,
             timeout: float = 900.0) -> dict[str, Any]:
        """Poll the job until it ends, calling `on_progress(job)` after each poll; return it once it succeeded,
        raise JobFailed when it failed or was cancelled, TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_progress is not None:
                on_progress(job)
            if job["state"] == "succeeded":
                return job
            if job["state"] in ("failed", "cancelled"):
                raise JobFailed(job)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job['state']} after {timeout:.0f} s")
            time.sleep(poll_s)

    def model(self, model_id: str) -> dict[str, Any]:
        """The registered model: bytes, sha256, parameters, counts and the training metrics."""
        return self._json(self.http.get(f"/models/{model_id}"))

    def predict(self, model_id: str, relation: str, *, head: str | None = None, tail: str | None = None,
                k: int = 10) -> dict[str, Any]:
        """Top-k tails of (head, relation, ?) or heads of (?, relation, tail): give exactly one of head, tail."""
        anchors = {name: value for name, value in (("head", head), ("tail", tail)) if value is not None}
        params: dict[str, str | int] = {"model": model_id, "relation": relation, "k": k, **anchors}
        return self._json(self.http.get("/predict", params=params))

    def download(self, model_id: str, path: str | PathLike) -> str:
        """Write the model's bundle to `path`; return the sha256 the service vouches for (its ETag)."""
        with self.http.stream("GET", f"/models/{model_id}/bundle") as response:
            if response.is_error:
                response.read()
                raise ServiceError(response.status_code, _reason(response))
            with Path(path).open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
            return response.headers.get("etag", "").strip('"')
