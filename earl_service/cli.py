"""The `earl` command: train, evaluate (and, as they land, export, info, extend, worker, serve)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .compress_cli import add_compress_command
from .config import ABLATIONS, ModelConfig, TrainConfig
from .errors import EarlError

D_MODEL, D_TRAIN = ModelConfig(), TrainConfig()


def _add_train_options(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    m.add_argument("--model", choices=["earl", "rotate"], default=D_MODEL.model)
    m.add_argument("--dim", type=int, default=D_MODEL.dim, help="complex dimensions (2*dim reals per entity)")
    m.add_argument("--reserved-ratio", type=float, default=D_MODEL.reserved_ratio)
    m.add_argument("--k", type=int, default=D_MODEL.k, help="nearest reserved entities (kNResEnt)")
    m.add_argument("--layers", type=int, default=D_MODEL.layers, help="GNN layers")
    m.add_argument("--margin", "--gamma", dest="gamma", type=float, default=D_MODEL.gamma)
    m.add_argument("--epsilon", type=float, default=D_MODEL.epsilon)
    for name in ABLATIONS:
        m.add_argument(f"--{name.replace('_', '-')}", action="store_true", help="ablation switch")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=D_TRAIN.steps)
    t.add_argument("--batch-size", type=int, default=D_TRAIN.batch_size)
    t.add_argument("--negatives", type=int, default=D_TRAIN.negatives, help="per side (head and tail)")
    t.add_argument("--lr", type=float, default=D_TRAIN.lr)
    t.add_argument("--temperature", dest="adversarial_temperature", type=float, default=D_TRAIN.adversarial_temperature,
                   help="self-adversarial temperature alpha")
    t.add_argument("--eval-every", type=int, default=D_TRAIN.eval_every, help="steps between validations (0: never)")
    t.add_argument("--patience", type=int, default=D_TRAIN.patience)
    t.add_argument("--eval-batch-size", type=int, default=D_TRAIN.eval_batch_size)
    t.add_argument("--eval-max-triples", type=int, default=D_TRAIN.eval_max_triples,
                   help="validate on a fixed random subset of this many triples (0: all)")
    t.add_argument("--checkpoint-every", type=int, default=D_TRAIN.checkpoint_every)
    t.add_argument("--time-limit", dest="time_limit_minutes", type=float, default=0.0, metavar="MINUTES")
    t.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the encoder's dense maps (CPU)")
    t.add_argument("--device", default=D_TRAIN.device, help="auto | cpu | cuda")
    t.add_argument("--threads", type=int, default=D_TRAIN.threads, help="torch threads (0: torch default)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--no-progress", action="store_true")
    s = p.add_argument_group("sampled training (graphs whose full-graph encoding does not fit)")
    s.add_argument("--sampled", action="store_true",
                   help="encode each batch's entities and negatives through sampled neighbourhoods only")
    s.add_argument("--fanout", type=_fanout, default=D_TRAIN.fanout, metavar="N,N",
                   help="edges drawn per entity at hop 1, 2, ... (0 or 'all': every edge; default 10,10)")
    s.add_argument("--negative-chunk", type=int, default=D_TRAIN.negative_chunk, metavar="C",
                   help="this many positives share one draw of negatives (0: the whole batch)")
    d = p.add_argument_group("distributed (torch.distributed DDP through torchrun)")
    d.add_argument("--nproc-per-node", type=int, default=0, metavar="N",
                   help="run N data-parallel processes on this machine (gloo on CPU, NCCL on CUDA)")
    d.add_argument("--nnodes", default="1", help="machines taking part (torchrun's --nnodes)")
    d.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="rendezvous address shared by all machines (default: a free local port, one machine)")
    d.add_argument("--rdzv-backend", default="c10d")
    d.add_argument("--rdzv-id", default=None, help="job id shared by all machines")
    d.add_argument("--node-rank", type=int, default=None)


LAUNCHER_OPTIONS = ("--nproc-per-node", "--nnodes", "--rdzv-endpoint", "--rdzv-backend", "--rdzv-id", "--node-rank")


def _fanout(text: str) -> tuple[int, ...]:
    try:
        values = tuple(0 if x.strip() == "all" else int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 10,10, not {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("fan-outs must be >= 0 (0: every edge)")
    return values


def _configs(a: argparse.Namespace) -> tuple[ModelConfig, TrainConfig]:
    if getattr(a, "config", None):
        return _configs_from_file(a.config)
    model = ModelConfig(model=a.model, dim=a.dim, reserved_ratio=a.reserved_ratio, k=a.k, layers=a.layers,
                        gamma=a.gamma, epsilon=a.epsilon, seed=a.seed, **{n: getattr(a, n) for n in ABLATIONS})
    train = TrainConfig(steps=a.steps, batch_size=a.batch_size, negatives=a.negatives, lr=a.lr,
                        adversarial_temperature=a.adversarial_temperature, eval_every=a.eval_every,
                        patience=a.patience, eval_batch_size=a.eval_batch_size, eval_max_triples=a.eval_max_triples,
                        checkpoint_every=a.checkpoint_every, time_limit_minutes=a.time_limit_minutes, bf16=a.bf16,
                        device=a.device, threads=a.threads, seed=a.seed, progress=not a.no_progress,
                        sampled=a.sampled, fanout=a.fanout, negative_chunk=a.negative_chunk)
    return model, train


def _configs_from_file(path: str) -> tuple[ModelConfig, TrainConfig]:
    """{"model": {...}, "train": {...}}, or a run's metrics.json (which holds them under "config")."""
    try:
        values = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--config {path}: {exc}") from None
    values = values.get("config", values)
    if not isinstance(values, dict) or not isinstance(values.get("model"), dict) or not isinstance(values.get("train"), dict):
        raise ValueError(f"--config {path}: expected an object with 'model' and 'train' objects")  # noqa: TRY004
    return ModelConfig.from_dict(values["model"]), TrainConfig.from_dict(values["train"])


def _without_launcher_options(argv: list[str]) -> list[str]:
    """argv minus the torchrun options (so that the processes torchrun starts do not launch again)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCHER_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in LAUNCHER_OPTIONS)):
            out.append(arg)
    return out


def launch_torchrun(a: argparse.Namespace) -> int:
    """Re-run this `earl train` command under torchrun; SIGINT/SIGTERM are passed on (ranks checkpoint, exit)."""
    import signal
    import subprocess

    from .distributed import torchrun_command

    cmd = torchrun_command(_without_launcher_options(a.argv), nproc_per_node=a.nproc_per_node, nnodes=a.nnodes,
                           rdzv_endpoint=a.rdzv_endpoint, rdzv_backend=a.rdzv_backend, rdzv_id=a.rdzv_id,
                           node_rank=a.node_rank)
    proc = subprocess.Popen(cmd)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda sig, _frame: proc.send_signal(sig))
    return proc.wait()


def _under_torchrun() -> bool:
    import os

    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ


def _progress_writer(path: str | None):
    """A progress callback that keeps PATH holding the latest progress as JSON (at most twice a second)."""
    if not path:
        return None
    import time

    from .train import write_json_atomic

    last = [0.0]

    def write(progress: dict) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or progress["step"] == progress["total"]:
            last[0] = now
            write_json_atomic(Path(path), progress)

    return write


def cmd_train(a: argparse.Namespace) -> int:
    import os
    import signal
    import threading
    from dataclasses import replace

    if a.nproc_per_node and not _under_torchrun():
        return launch_torchrun(a)

    from .data import load_dataset, relation_labels
    from .train import resolve_device, train

    model_cfg, train_cfg = _configs(a)
    distributed = _under_torchrun()
    if distributed:
        import torch
        import torch.distributed as dist

        from .distributed import init_process_group

        device = resolve_device(train_cfg.device)
        if device.type == "cuda":  # one GPU per process
            device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
        train_cfg = replace(train_cfg, device=str(device), progress=train_cfg.progress and os.environ["RANK"] == "0")
        init_process_group(device)
    # SIGTERM (a stopping worker, torchrun passing one on) ends training at the next step with a checkpoint.
    stop = threading.Event()
    if distributed or a.progress_file:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        dataset = load_dataset(a.data)
        metrics = train(dataset, model_cfg, train_cfg, a.out, resume=a.resume, final_eval=not a.no_final_eval,
                        protocol=a.protocol, relation_labels=relation_labels(a.data), should_stop=stop.is_set,
                        on_progress=_progress_writer(a.progress_file))
    finally:
        if distributed:
            dist.destroy_process_group()
    if "rank" in metrics:  # not rank 0: rank 0 reports
        return 0
    keys = ("trainable_parameters", "steps", "median_step_seconds", "peak_rss_mb", "bundle_bytes")
    summary = {k: metrics.get(k) for k in keys}
    for split in ("valid", "test"):
        if split in metrics:
            summary[split] = {k: metrics[split][k] for k in ("mrr", "mr", "hits_at_1", "hits_at_3", "hits_at_10")}
    print(json.dumps(summary, indent=2))
    return 0


def cmd_evaluate(a: argparse.Namespace) -> int:
    from .data import load_dataset
    from .train import load_run

    run = load_run(a.run_dir, load_dataset(a.data), device=a.device)
    print(json.dumps(run.evaluate(a.split, a.protocol, batch_size=a.batch_size), indent=2))
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from .bundle import export_bundle

    path = export_bundle(a.run_dir, a.out, precision=a.precision, coding=a.coding)
    print(json.dumps({"path": str(path), "bytes": path.stat().st_size, "precision": a.precision}))
    return 0


def bundle_info(path: str) -> dict:
    from .bundle import load_bundle

    b = load_bundle(path)
    return {"path": str(path), "bytes": b.num_bytes, "precision": b.precision, "sha256": b.sha256,
            "trainable_parameters": b.trainable_parameters, "entities": len(b.entities),
            "relations": len(b.relations), "triples": len(b.triples), "model": b.config.model,
            "dim": b.config.dim, "weights_coding": b.coding, "metrics": b.metrics}


def cmd_info(a: argparse.Namespace) -> int:
    print(json.dumps(bundle_info(a.bundle), indent=2, default=str))
    return 0


def cmd_extend(a: argparse.Namespace) -> int:
    from .bundle import load_bundle

    before = load_bundle(a.bundle)
    after = before.extend(a.triples)
    path = after.save(a.out, precision=a.precision or before.precision, coding=a.coding)
    print(json.dumps({"path": str(path), "entities_added": len(after.entities) - len(before.entities),
                      "triples_added": int(len(after.triples) - len(before.triples)), "bytes": path.stat().st_size}))
    return 0


def _add_coding_option(p: argparse.ArgumentParser) -> None:
    from .bundle_format import CODINGS

    p.add_argument("--coding", choices=CODINGS, default=None,
                   help="weights as plain tensors, or byte planes + xz (lossless, ~15%% smaller); default: plain "
                        "for fp32, planes-xz for fp16/int8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="earl", description="Entity-agnostic knowledge-graph embeddings (EARL).")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train EARL (or the RotatE baseline) on a dataset folder")
    p.add_argument("data", help="folder with train.txt and optional valid.txt / test.txt")
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics.json, curves.png)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR's last checkpoint")
    p.add_argument("--protocol", choices=["seen", "all"], default="seen", help="protocol of the final evaluation")
    p.add_argument("--no-final-eval", action="store_true", help="skip the final valid/test evaluation")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="take every model and training setting from FILE ({'model': ..., 'train': ...} or a "
                        "run's metrics.json); the model/training options below are then ignored")
    p.add_argument("--progress-file", default=None, metavar="FILE", help="keep FILE holding the latest progress (JSON)")
    _add_train_options(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="filtered ranking of a trained run's best checkpoint")
    p.add_argument("run_dir")
    p.add_argument("data")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"])
    p.add_argument("--protocol", choices=["seen", "all"], default="seen")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("export", help="re-export a trained run's bundle (optionally at lower precision)")
    p.add_argument("run_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32")
    _add_coding_option(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", help="print a bundle's size, precision, counts and stored metrics as JSON")
    p.add_argument("bundle")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("extend", help="add triples (new entities allowed) to a bundle without retraining")
    p.add_argument("bundle")
    p.add_argument("--triples", required=True, help="triple file to add")
    p.add_argument("--out", required=True)
    p.add_argument("--precision", choices=["fp32", "fp16", "int8"], default=None)
    _add_coding_option(p)
    p.set_defaults(func=cmd_extend)

    add_compress_command(sub)
    add_worker_command(sub)
    add_serve_command(sub)
    return parser


# ---------------------------------------------------------------- service: `earl worker` and `earl serve`
# The command line is the service's edge: EARL_HOME / EARL_STORE give the defaults, as for the API.


def _add_service_options(p: argparse.ArgumentParser) -> None:
    import os

    p.add_argument("--home", default=os.environ.get("EARL_HOME", "artifacts"),
                   help="service home: uploads/, runs/, models/, earl.sqlite3 (default $EARL_HOME or ./artifacts)")
    p.add_argument("--store", default=os.environ.get("EARL_STORE", "sqlite"),
                   help="'sqlite' (HOME/earl.sqlite3), a SQLite path or a redis:// URL (default $EARL_STORE or sqlite)")


def add_worker_command(sub) -> None:
    """`earl worker`: train queued jobs until SIGINT/SIGTERM (the running job is checkpointed and requeued)."""
    p = sub.add_parser("worker", help="run training jobs from the service queue until stopped")
    _add_service_options(p)
    p.add_argument("--threads", type=int, default=2, help="torch threads per job")
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at an empty queue")
    p.add_argument("--stale-after", type=float, default=60.0,
                   help="take over a running job whose worker sent no heartbeat for this many seconds")
    p.add_argument("--max-attempts", type=int, default=3, help="give a job up after this many takeovers")
    p.add_argument("--max-jobs", type=int, default=0, help="exit after this many jobs (0: never)")
    p.add_argument("--id", dest="worker_id", default=None, help="worker name (default host-pid)")
    p.add_argument("--nproc-per-node", type=int, default=0, metavar="N",
                   help="train every job with N DDP processes through torchrun (a job's own nproc_per_node wins)")
    p.set_defaults(func=cmd_worker)


def cmd_worker(a: argparse.Namespace) -> int:
    import signal

    from .worker.loop import Worker, WorkerConfig, default_worker_id

    logging.getLogger("earl_service.worker").setLevel(logging.INFO)
    worker = Worker(WorkerConfig(home=Path(a.home), store=a.store, worker_id=a.worker_id or default_worker_id(),
                                 threads=a.threads, device=a.device, poll_seconds=a.poll, stale_after=a.stale_after,
                                 max_attempts=a.max_attempts, max_jobs=a.max_jobs,
                                 nproc_per_node=a.nproc_per_node))
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: worker.stop())
    worker.run()
    return 0


def add_serve_command(sub) -> None:
    """`earl serve`: the API (uvicorn) and one worker process for one machine, until SIGINT/SIGTERM."""
    p = sub.add_parser("serve", help="run the HTTP API and one training worker on this machine")
    _add_service_options(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--worker-threads", type=int, default=2, help="torch threads of the worker")
    p.add_argument("--no-worker", action="store_true", help="API only (workers run elsewhere)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (warning hides the per-request access log)")
    p.add_argument("--stop-timeout", type=float, default=60.0,
                   help="seconds the worker gets to checkpoint its job on shutdown before it is killed")
    p.set_defaults(func=cmd_serve)


def cmd_serve(a: argparse.Namespace) -> int:
    import signal
    import subprocess

    import uvicorn

    from api.main import create_app
    from api.settings import Settings

    settings = Settings(home=Path(a.home), store=a.store)  # the token and limits still come from EARL_*
    worker = None
    if not a.no_worker:
        worker = subprocess.Popen([sys.executable, "-m", "earl_service.cli", "worker", "--home", a.home,
                                   "--store", a.store, "--threads", str(a.worker_threads)])
    # uvicorn handles SIGINT/SIGTERM itself (drains requests, returns from run()), then re-raises the signal
    # into the handlers it found. Make those no-ops so that we get here, stop the worker, and exit 0.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    try:
        uvicorn.Server(uvicorn.Config(create_app(settings), host=a.host, port=a.port, log_level=a.log_level)).run()
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=a.stop_timeout)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # `earl train --nproc-per-node` re-runs the same command under torchrun
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (EarlError, ValueError, FileNotFoundError) as exc:
        print(f"earl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
