"""The worker: claim a queued job, train it, publish its bundle, record the outcome; repeat.

It reads uploads/<job id>/ and trains in runs/<job id>/ of the service home (home.py); the bundle is published as
models/<job id>/v1.safetensors (the model id is the job id). Torch uses `threads` (2 by default) intra-op threads, on
CUDA when present (`device="auto"`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from earl_service.compress.config import CompressConfig
from earl_service.compress.job import compress_settings
from earl_service.config import ModelConfig, ModelKind, TrainConfig
from earl_service.config.options import (
    FORM_OPTIONS,
    configs_from_options,
    data_cli_args,
    data_config_from_options,
    train_configs_from_options,
)
from earl_service.errors import DatasetError, EarlError
from earl_service.service.home import ServiceHome
from earl_service.service.housekeeping import remove, sweep_staging, sweep_unrecorded
from earl_service.service.records import Job, tenant_of
from earl_service.service.registry import ModelRegistry
from earl_service.service.store import JobStore

log = logging.getLogger(__name__)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs; `store` is 'sqlite' (HOME/earl.sqlite3), a path or a redis:// URL."""

    home: Path = Path("artifacts")
    store: str = "sqlite"
    worker_id: str = field(default_factory=default_worker_id)
    threads: int = 2
    device: str = "auto"
    poll_seconds: float = 1.0
    heartbeat_seconds: float = 1.0  # also how often progress and the cancel flag are exchanged with the store
    stale_after: float = 60.0  # a running job without heartbeat for this long is taken over
    max_attempts: int = 3
    max_jobs: int = 0  # stop after this many jobs (0: run until stopped)
    nproc_per_node: int = 0  # > 0: train through torchrun with this many DDP processes (a job's own value wins)
    compress_parallel: int = 1  # a compress job's candidates trained at once (CompressConfig.parallel)


def _given(params: dict[str, Any], cfg: WorkerConfig) -> dict[str, Any]:
    """The job's form fields (the option table's names) that hold a value (None: the recipe's, per model kind);
    where the job runs (device, threads) is the worker's choice, and nobody watches a progress bar."""
    values = {option.name: params[option.name] for option in FORM_OPTIONS if params.get(option.name) is not None}
    return {**values, "device": cfg.device, "threads": cfg.threads, "progress": False}


def configs_from_params(params: dict[str, Any], cfg: WorkerConfig) -> tuple[ModelConfig, TrainConfig]:
    """The job's params as the library's configs, its recipe (params["recipe"]; a job queued before recipes has
    none and every value) under the values it holds."""
    return configs_from_options(_given(params, cfg), recipe=params.get("recipe"))


def train_configs_from_params(params: dict[str, Any], cfg: WorkerConfig) -> dict[ModelKind, TrainConfig]:
    """A compress job's TrainConfig per model kind, as configs_from_params."""
    return train_configs_from_options(_given(params, cfg), recipe=params.get("recipe"))


class _Heartbeat(threading.Thread):
    """Sends the latest progress every `interval` seconds and reads back the cancel flag and ownership.

    A thread rather than the training callback, so heartbeats go on through validation and export; the callback
    (`report`) only leaves the progress here.
    """

    def __init__(self, store: JobStore, job: Job, worker: str, interval: float) -> None:
        super().__init__(name=f"heartbeat-{job.id[:8]}", daemon=True)
        self.store, self.job_id, self.worker, self.interval = store, job.id, worker, interval
        self.attempts = job.attempts
        self.progress: dict[str, Any] | None = None
        self.cancelled = job.cancel_requested
        self.lost = False  # another worker took the job over (we were presumed dead)
        self._done = threading.Event()
        self._resumed_from: int | None = None  # the step the checkpoint held; 0 for a fresh run
        self._last_log = 0.0

    def report(self, progress: dict[str, Any]) -> None:
        """train()'s on_progress: keep the progress for the next beat (with the step it resumed from), log it."""
        if self._resumed_from is None:
            self._resumed_from = progress["step"] - 1
            if self._resumed_from:
                log.info("job %s: resumed at step %d (attempt %d)", self.job_id, self._resumed_from, self.attempts)
        self.progress = {**progress, "resumed_from": self._resumed_from}
        now = time.monotonic()
        if now - self._last_log >= 1.0 or progress["step"] == progress["total"]:
            self._last_log = now
            log.debug("job %s: step %d/%d loss %.4f", self.job_id, progress["step"], progress["total"],
                      progress["loss"])

    def beat(self) -> None:
        try:
            job = self.store.heartbeat(self.job_id, self.worker, self.progress)
        except EarlError as exc:  # the store is briefly locked or unreachable: keep training, try again
            log.warning("heartbeat for job %s failed: %s", self.job_id, exc)
            return
        except Exception:  # a store that raised something else: a dead heartbeat thread would go unnoticed
            log.exception("heartbeat for job %s failed", self.job_id)
            return
        if job is None:
            self.lost = True
        else:
            self.cancelled = job.cancel_requested

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.beat()

    def stop(self) -> None:
        """End the thread, then send the final progress (and learn of a late cancel or takeover)."""
        self._done.set()
        self.join()
        self.beat()


class Worker:
    """Claims and runs jobs until `stop()` (or max_jobs). `run_once()` handles at most one job."""

    def __init__(self, config: WorkerConfig, store: JobStore | None = None) -> None:
        self.config = config
        self.home = ServiceHome(config.home).create()
        self.store = store if store is not None else self.home.open_store(config.store)
        self.registry = ModelRegistry(self.home, self.store)
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ask the loop to end; a job in progress stops at its next step, is checkpointed and requeued."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Loop until stopped; returns the number of jobs handled."""
        import torch

        torch.set_num_threads(self.config.threads)
        log.info("worker %s: home %s, store %s", self.config.worker_id, self.home.root,
                 self.home.store_target(self.config.store))
        sweep_staging(self.home)  # what a killed worker or API left; by age, since others may be writing now
        try:
            sweep_unrecorded(self.home, self.store)  # versions placed but never recorded (skips those in flight)
        except EarlError as exc:  # the store is unreachable: the API's sweep, or the next start, does it
            log.warning("worker %s: no sweep of unrecorded models: %s", self.config.worker_id, exc)
        handled = 0
        while not self._stop.is_set():
            try:
                job = self.run_once()
            except EarlError as exc:  # the store is locked or unreachable: wait and retry
                log.warning("worker %s: %s", self.config.worker_id, exc)
                job = None
            except Exception:  # anything else from the store: the worker must outlive it too
                log.exception("worker %s: store call failed", self.config.worker_id)
                job = None
            if job is None:
                self._stop.wait(self.config.poll_seconds)
                continue
            handled += 1
            if self.config.max_jobs and handled >= self.config.max_jobs:
                break
        return handled

    def run_once(self) -> Job | None:
        """Claim one job and run it to its end; None when the queue is empty."""
        cfg = self.config
        job = self.store.claim_job(cfg.worker_id, stale_after=cfg.stale_after, max_attempts=cfg.max_attempts)
        if job is None:
            return None
        log.info("job %s: claimed (attempt %d)", job.id, job.attempts)
        return self._run(job)

    def _run(self, job: Job) -> Job:
        cfg = self.config
        beat = _Heartbeat(self.store, job, cfg.worker_id, cfg.heartbeat_seconds)
        beat.start()
        state, error, model_id = "failed", None, None
        try:
            model_id = self._work(job, beat)
            state = "succeeded" if model_id else "cancelled"
        except _Interrupted:
            state = "interrupted"
        except (EarlError, ValueError, FileNotFoundError) as exc:  # bad input: the message is for the user
            error = str(exc)
        except OSError as exc:  # disk full, unwritable home: the job fails, the worker lives on
            log.error("job %s: storage error: %s", job.id, exc)
            target = exc.filename2 or exc.filename  # os.replace(src, dst) fails for want of dst's folder
            where = f" ({self.home.relative(target)})" if isinstance(target, str) else ""
            error = f"storage error: cannot write the run or the bundle{where}: {exc.strerror or exc}"
        except Exception as exc:  # a bug or resource problem: keep the worker alive, record what happened
            log.exception("job %s failed", job.id)
            error = f"internal error: {type(exc).__name__}: {exc}"
        finally:
            beat.stop()
        if beat.lost:
            log.warning("job %s was taken over by another worker; dropping this attempt", job.id)
            return self.store.get_job(job.id) or job
        if state == "interrupted":
            log.info("job %s: worker stopping; checkpointed and requeued", job.id)
            return self.store.release_job(job.id, cfg.worker_id) or job
        if error:
            log.warning("job %s failed: %s", job.id, error)
        finished = self.store.finish_job(job.id, cfg.worker_id, state, error=error, model_id=model_id)
        if state == "cancelled":  # its uploads are of no more use: they go now, not after the retention days
            remove(self.home.upload_dir(job.id))
        return finished or job

    def _work(self, job: Job, beat: _Heartbeat) -> str | None:
        """A compress job over a registered model (source_model), one over uploads (max_bytes) or a training job,
        as its params ask; the model id, None if it was cancelled."""
        if job.params.get("source_model"):
            return self._compress(job, None, beat)
        search = compress_settings(job.params)  # ConfigError for a bad size or a compress field without max_bytes
        if "train" not in job.files:
            raise DatasetError("the job has no train file")
        return self._train(job, beat) if search is None else self._compress(job, search, beat)

    def _train(self, job: Job, beat: _Heartbeat) -> str | None:
        """Train and publish; returns the model id, or None if the job was cancelled."""
        from earl_service.data.dataset import load_dataset
        from earl_service.train.loop import CHECKPOINT, train

        uploads = self.home.upload_dir(job.id)
        run_dir = self.home.run_dir(job.id)
        model_cfg, train_cfg = configs_from_params(job.params, self.config)
        data = data_config_from_options(job.params)
        dataset = load_dataset(uploads, data=data)
        asked_to_stop = False

        def should_stop() -> bool:
            nonlocal asked_to_stop
            asked_to_stop = beat.cancelled or beat.lost or self._stop.is_set()
            return asked_to_stop

        resume = (run_dir / CHECKPOINT).exists()  # a previous attempt (dead or stopped worker) left one
        if resume:
            log.info("job %s: resuming from %s", job.id, run_dir / CHECKPOINT)
        nproc = int(job.params.get("nproc_per_node") or self.config.nproc_per_node)
        if nproc > 0:
            _train_torchrun(uploads, run_dir, model_cfg, train_cfg, nproc, resume=resume, beat=beat,
                            should_stop=should_stop, extra_args=data_cli_args(data), recipe=job.params.get("recipe"))
        else:
            train(dataset, model_cfg, train_cfg, run_dir, resume=resume, final_eval=True,
                  on_progress=beat.report, should_stop=should_stop, recipe=job.params.get("recipe"))
        # Our own flag, not metrics["stopped"]: a resumed run may carry its predecessor's stop reason.
        if beat.lost or (asked_to_stop and beat.cancelled):
            return None
        if asked_to_stop:
            raise _Interrupted
        self._publish(job, run_dir)
        return job.id

    def _compress(self, job: Job, search: CompressConfig | None, beat: _Heartbeat) -> str | None:
        """A compress job: the search in the run folder (`search` over the uploads, or None: the sizes of the
        registered model params["source_model"]), then its pick published with the report; returns the model id,
        or None if the job was cancelled. A stop for shutdown requeues it (_Interrupted)."""
        from earl_service.compress.job import compress_model, publish_pick, run_compress

        def forward(progress: dict[str, Any]) -> None:
            beat.progress = progress

        def should_stop() -> bool:
            return beat.cancelled or beat.lost or self._stop.is_set()

        if search is None:
            pick = compress_model(self.registry, job, on_progress=forward, should_stop=should_stop,
                                  train_configs=train_configs_from_params(job.params, self.config))
        else:
            search = replace(search, parallel=self.config.compress_parallel)
            pick = run_compress(self.home, job, search=search, train_configs=train_configs_from_params(
                job.params, self.config), on_progress=forward, should_stop=should_stop)
        if pick is None:
            if beat.cancelled or beat.lost:
                return None
            raise _Interrupted
        publish_pick(self.registry, job, pick, worker_id=self.config.worker_id)
        return job.id

    def _publish(self, job: Job, run_dir: Path) -> None:
        """Export the bundle inside the run directory, then publish it: models/ never holds a partial bundle."""
        from earl_service.bundle.model_io import export_bundle
        from earl_service.bundle.precision import DEFAULT

        staged = run_dir / f".export.{self.config.worker_id}.tmp"  # hidden .tmp: swept if a crash leaves it
        try:
            export_bundle(run_dir, staged, precision=job.params.get("precision", DEFAULT.name))
            self.registry.publish(job.id, staged, job_id=job.id, owner=tenant_of(job))
        finally:
            staged.unlink(missing_ok=True)


def _train_torchrun(uploads: Path, run_dir: Path, model_cfg: ModelConfig, train_cfg: TrainConfig, nproc: int, *,
                    resume: bool, beat: _Heartbeat, should_stop, extra_args: list[str], recipe: str | None) -> None:
    """`earl train --nproc-per-node N` in a subprocess: progress comes back through a file, a stop request goes
    out as SIGTERM (every rank checkpoints at its next step), the command's error message becomes the job's."""
    import json
    import signal
    import subprocess
    import sys
    from dataclasses import replace

    from earl_service.atomic import write_json

    run_dir.mkdir(parents=True, exist_ok=True)
    threads = max(1, train_cfg.threads // nproc) if train_cfg.threads else 0  # the worker's threads, shared
    config = run_dir / "job_config.json"
    write_json(config, {"model": model_cfg.to_dict(), "train": replace(train_cfg, threads=threads).to_dict(),
                        "recipe": recipe})  # recorded by the run; its values are already in "train"
    progress, log_path = run_dir / "progress.json", run_dir / "train.log"
    cmd = [sys.executable, "-m", "earl_service.cli.main", "train", str(uploads), "--out", str(run_dir), "--config",
           str(config), "--progress-file", str(progress), "--nproc-per-node", str(nproc),
           *(["--resume"] if resume else []), *extra_args]
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
        signalled = False
        while proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):  # not written yet, or caught mid-replace
                beat.progress = json.loads(progress.read_text())
            if not signalled and should_stop():
                proc.send_signal(signal.SIGTERM)
                signalled = True
            time.sleep(0.2)
    if proc.returncode != 0 and not signalled:  # after SIGTERM torchrun exits non-zero by design
        lines = log_path.read_text(errors="replace").splitlines()
        said = [line.split("earl: error: ", 1)[1] for line in lines if "earl: error: " in line]
        if said:
            raise EarlError(said[-1])
        raise RuntimeError(f"distributed training exited with status {proc.returncode}: {' | '.join(lines[-5:])}")


class _Interrupted(Exception):
    """Training stopped because the worker is shutting down (not cancelled): requeue the job."""


__all__ = ["Worker", "WorkerConfig", "configs_from_params", "train_configs_from_params"]
