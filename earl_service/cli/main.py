"""The `earl` command: its parser and dispatch, `train`, `evaluate` and `worker`; the other verbs live beside it
(bundle: export, info, extend; answers: predict, score; compress; imports: import; keys) and plugins add `serve`."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from earl_service.cli.answers import add_answer_commands
from earl_service.cli.home import add_service_options
from earl_service.errors import ConfigError, EarlError

if TYPE_CHECKING:
    from earl_service.config import ModelConfig, TrainConfig

COMMANDS_GROUP = "earl.commands"  # entry points: callables that add a subcommand (`earl serve`, from api/serve.py)

TRAIN_MODULES = ("torch", "tqdm", "matplotlib", "ninja")  # the [train] extra: absent from an edge install
# Loggers whose INFO lines a user should see without -v: a header row skipped, the C++ kernel being compiled.
NOTICES = ("earl_service.data.readers", "earl_service.model.kernels")

LAUNCHER_OPTIONS = ("--nproc-per-node", "--nnodes", "--rdzv-endpoint", "--rdzv-backend", "--rdzv-id", "--node-rank")


def _add_launcher_options(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("distributed (torch.distributed DDP through torchrun)")
    d.add_argument("--nproc-per-node", type=int, default=0, metavar="N",
                   help="run N data-parallel processes on this machine (gloo on CPU, NCCL on CUDA; 0: no torchrun)")
    d.add_argument("--nnodes", default="1", help="machines taking part (torchrun's --nnodes; default: %(default)s)")
    d.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="rendezvous address shared by all machines (default: a free local port, one machine)")
    d.add_argument("--rdzv-backend", default="c10d", help="torchrun's rendezvous backend (default: %(default)s)")
    d.add_argument("--rdzv-id", default=None, help="job id shared by all machines")
    d.add_argument("--node-rank", type=int, default=None, help="this machine's rank (default: torchrun's choice)")


def _configs(a: argparse.Namespace) -> tuple[ModelConfig, TrainConfig, str | None]:
    """The run's configs and the recipe they were resolved with (the options given win over it)."""
    from earl_service.config.options import configs_from_options

    if getattr(a, "config", None):
        return _configs_from_file(a.config)
    return (*configs_from_options(vars(a), recipe=a.recipe), a.recipe)


def _configs_from_file(path: str) -> tuple[ModelConfig, TrainConfig, str | None]:
    """{"model": {...}, "train": {...}}, or a run's metrics.json (which holds them under "config"), and the
    recipe the file records (none applied: the file holds every setting)."""
    from earl_service.config import ModelConfig, TrainConfig

    try:
        values = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    recipe = values.get("recipe") if isinstance(values, dict) else None
    if isinstance(values, dict):
        values = values.get("config", values)
    if not isinstance(values, dict) or not all(isinstance(values.get(key), dict) for key in ("model", "train")):
        raise ConfigError(f"--config {path}: expected an object with 'model' and 'train' objects")
    return ModelConfig.from_dict(values["model"]), TrainConfig.from_dict(values["train"]), recipe


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

    from earl_service.train.distributed import torchrun_command

    cmd = torchrun_command(_without_launcher_options(a.argv), nproc_per_node=a.nproc_per_node, nnodes=a.nnodes,
                           rdzv_endpoint=a.rdzv_endpoint, rdzv_backend=a.rdzv_backend, rdzv_id=a.rdzv_id,
                           node_rank=a.node_rank)
    proc = subprocess.Popen(cmd)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda sig, _frame: proc.send_signal(sig))
    return proc.wait()


def _under_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ


def _progress_writer(path: str | None):
    """A progress callback that keeps PATH holding the latest progress as JSON (at most twice a second)."""
    if not path:
        return None
    import time

    from earl_service.atomic import write_json

    last = [0.0]

    def write(progress: dict) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.5 or progress["step"] == progress["total"]:
            last[0] = now
            write_json(Path(path), progress)

    return write


def _join_process_group(train_cfg: TrainConfig) -> TrainConfig:
    """Under torchrun: join the process group on this rank's device; only rank 0 shows progress."""
    from dataclasses import replace

    import torch

    from earl_service.train.distributed import init_process_group
    from earl_service.train.run import resolve_device

    device = resolve_device(train_cfg.device)
    if device.type == "cuda":  # one GPU per process
        device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    init_process_group(device)
    return replace(train_cfg, device=str(device), progress=train_cfg.progress and os.environ["RANK"] == "0")


def cmd_train(a: argparse.Namespace) -> int:
    import signal
    import threading

    if a.nproc_per_node and not _under_torchrun():
        return launch_torchrun(a)

    from earl_service.config.options import data_config_from_options
    from earl_service.data.dataset import load_dataset
    from earl_service.train.loop import train

    model_cfg, train_cfg, recipe = _configs(a)
    distributed = _under_torchrun()
    if distributed:
        train_cfg = _join_process_group(train_cfg)
    # SIGTERM (a stopping worker, torchrun passing one on) ends training at the next step with a checkpoint.
    stop = threading.Event()
    if distributed or a.progress_file:
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        dataset = load_dataset(a.data, data=data_config_from_options(vars(a)), labels=a.labels)
        metrics = train(dataset, model_cfg, train_cfg, a.out, resume=a.resume, final_eval=not a.no_final_eval,
                        protocol=a.protocol, should_stop=stop.is_set, on_progress=_progress_writer(a.progress_file),
                        command=["earl", *a.argv], recipe=recipe)
    finally:
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()
    if "rank" not in metrics:  # other ranks leave the report to rank 0
        print(json.dumps(_summary(metrics), indent=2))
    return 0


def _summary(metrics: dict) -> dict:
    """What `earl train` prints: size, speed and the final metrics of a run's metrics.json."""
    from earl_service.train.evaluate import SUMMARY_KEYS

    keys = ("trainable_parameters", "steps", "median_step_seconds", "peak_rss_mb", "bundle_bytes")
    summary = {k: metrics.get(k) for k in keys}
    for split in ("valid", "test"):
        if split in metrics:
            summary[split] = {k: metrics[split][k] for k in SUMMARY_KEYS}
    return summary


def cmd_evaluate(a: argparse.Namespace) -> int:
    from earl_service.config.options import data_config_from_options
    from earl_service.data.dataset import load_dataset
    from earl_service.train.run import load_run

    run = load_run(a.run_dir, load_dataset(a.data, data=data_config_from_options(vars(a))), device=a.device)
    print(json.dumps(run.evaluate(a.split, a.protocol, batch_size=a.batch_size, limit=a.limit,
                                  per_relation=a.per_relation), indent=2))
    return 0


def add_labels_option(p: argparse.ArgumentParser) -> None:
    """--no-labels: leave the label files beside the triples out of the bundle (`earl train`, `earl compress`)."""
    p.add_argument("--no-labels", dest="labels", action="store_false",
                   help="do not read entities.tsv / relations.tsv (or *.en.json) beside the triples: the bundle "
                        "then carries no labels (smaller)")


def add_train_command(sub) -> None:
    from earl_service.config.options import add_train_options

    p = sub.add_parser("train", help="train EARL (or the RotatE baseline) on a dataset folder")
    p.add_argument("data", help="folder with a train file and optional valid / test files (.txt, .tsv, .csv, .nt, "
                                ".nq, .ttl, .parquet, any of them .gz; read by content: docs/data.md)")
    p.add_argument("--out", required=True, help="run directory (checkpoints, metrics.json, curves.png)")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR's last checkpoint")
    p.add_argument("--protocol", choices=["seen", "all"], default="seen",
                   help="protocol of the final evaluation (default: %(default)s)")
    p.add_argument("--no-final-eval", action="store_true", help="skip the final valid/test evaluation")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="take every model and training setting from FILE ({'model': ..., 'train': ...} or a "
                        "run's metrics.json); the model/training options below and --recipe are then ignored")
    p.add_argument("--progress-file", default=None, metavar="FILE", help="keep FILE holding the latest progress (JSON)")
    add_labels_option(p)
    add_train_options(p)
    _add_launcher_options(p)
    p.set_defaults(func=cmd_train)


def add_evaluate_command(sub) -> None:
    from earl_service.config import TrainConfig
    from earl_service.config.options import add_data_options

    p = sub.add_parser("evaluate", help="filtered ranking of a trained run's best checkpoint")
    p.add_argument("run_dir")
    p.add_argument("data")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"], help="(default: %(default)s)")
    p.add_argument("--protocol", choices=["seen", "all"], default="seen", help="(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=TrainConfig.eval_batch_size, help="(default: %(default)s)")
    p.add_argument("--device", default=TrainConfig.device, help="auto | cpu | cuda | cuda:N (default: %(default)s)")
    p.add_argument("--per-relation", action="store_true", help="add MRR / Hits@k of each relation ('per_relation')")
    p.add_argument("--limit", type=int, default=0, metavar="N",
                   help="rank a fixed random subset of N triples (seed 0: the same N every time), not the whole split: "
                        "a pass over a million entities takes minutes (default: 0, all)")
    add_data_options(p)
    p.set_defaults(func=cmd_evaluate)


def _add_bundle_commands(sub) -> None:
    from earl_service.cli.bundle import add_bundle_commands

    add_bundle_commands(sub)


def _add_compress_command(sub) -> None:
    from earl_service.cli.compress import add_compress_command

    add_compress_command(sub)


def _add_import_command(sub) -> None:
    from earl_service.cli.imports import add_import_command

    add_import_command(sub)


def _add_keys_command(sub) -> None:
    from earl_service.cli.keys import add_keys_command

    add_keys_command(sub)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """`earl`'s parser with every command, or with only the group of `command` when it is a built-in one: the
    other groups' options import the config, precision and compress modules, a third of what an answer from the
    device reader's cache costs (bench/results/device_predict.md)."""
    parser = argparse.ArgumentParser(prog="earl", description="Entity-agnostic knowledge-graph embeddings (EARL).")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    groups = _command_groups()
    if command in groups:
        groups[command](sub)
        return parser
    for add_group in dict.fromkeys(groups.values()):
        add_group(sub)
    if not add_plugin_commands(sub):
        parser.epilog = ("`earl serve` (the HTTP API) is added when the package is installed with its entry points: "
                         "pip install 'earl-service[serve]', or pip install -e '.[serve]' in a checkout")
    return parser


def _command_groups() -> dict[str, Callable[[argparse._SubParsersAction], None]]:
    """Each built-in command and the function that adds its group (in `earl --help`'s order)."""
    return {"train": add_train_command, "evaluate": add_evaluate_command, "export": _add_bundle_commands,
            "info": _add_bundle_commands, "extend": _add_bundle_commands, "predict": add_answer_commands,
            "score": add_answer_commands, "compress": _add_compress_command, "import": _add_import_command,
            "keys": _add_keys_command, "worker": add_worker_command}


def _command_of(argv: list[str]) -> str | None:
    """The command word of `earl ARGV` (the first argument not an option: the top level's only option is -v)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def add_plugin_commands(sub) -> list[str]:
    """Subcommands that installed packages add through the entry point group 'earl.commands' (pyproject.toml):
    `earl serve` comes from api/serve.py, so the library never imports the web app. A command whose module cannot
    be imported is left out. Returns the names added."""
    from importlib.metadata import entry_points

    added = []
    for entry in entry_points(group=COMMANDS_GROUP):
        try:
            add_command = entry.load()
        except ImportError as exc:
            logging.getLogger(__name__).debug("earl %s left out: %s", entry.name, exc)
            continue
        add_command(sub)
        added.append(entry.name)
    return added


# ---------------------------------------------------------------- service: `earl worker` (api/serve.py: `earl serve`)
# The command line is the service's edge: EARL_HOME / EARL_STORE give the defaults, as for the API.


def add_worker_command(sub) -> None:
    """`earl worker`: train queued jobs until SIGINT/SIGTERM (the running job is checkpointed and requeued)."""
    p = sub.add_parser("worker", help="run training jobs from the service queue until stopped")
    add_service_options(p)
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
    p.add_argument("--compress-parallel", type=int, default=1, metavar="N",
                   help="compress jobs: candidates a rung trains at once, each in its own process, as `earl "
                        "compress --parallel` (default: 1)")
    p.set_defaults(func=cmd_worker)


def cmd_worker(a: argparse.Namespace) -> int:
    import signal

    from earl_service.worker.loop import Worker, WorkerConfig, default_worker_id

    logging.getLogger("earl_service.worker").setLevel(logging.INFO)
    worker = Worker(WorkerConfig(home=Path(a.home), store=a.store, worker_id=a.worker_id or default_worker_id(),
                                 threads=a.threads, device=a.device, poll_seconds=a.poll, stale_after=a.stale_after,
                                 max_attempts=a.max_attempts, max_jobs=a.max_jobs,
                                 nproc_per_node=a.nproc_per_node, compress_parallel=a.compress_parallel))
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: worker.stop())
    worker.run()
    return 0


def _configure_kernels(environ: dict[str, str]) -> None:
    """EARL_NO_EXTENSION, EARL_EXTENSION_WAIT_S and EARL_KERNEL_MARCH into the kernel's settings (torch loads only
    if one is set)."""
    if environ.get("EARL_NO_EXTENSION") or "EARL_EXTENSION_WAIT_S" in environ or environ.get("EARL_KERNEL_MARCH"):
        from earl_service.model import kernels as kernels

        kernels.configure(enabled=not environ.get("EARL_NO_EXTENSION"),
                          build_wait_s=float(environ.get("EARL_EXTENSION_WAIT_S", kernels.DEFAULT_BUILD_WAIT_S)),
                          march=environ.get("EARL_KERNEL_MARCH") or "native")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command_of(argv)).parse_args(argv)
    args.argv = argv  # `earl train --nproc-per-node` re-runs the same command under torchrun
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    for name in NOTICES:
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        _configure_kernels(dict(os.environ))
        return args.func(args)
    except (EarlError, ValueError, FileNotFoundError) as exc:
        print(f"earl: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if exc.name not in TRAIN_MODULES:
            raise
        print(f"earl: error: `earl {args.command}` needs {exc.name}, which the edge install leaves out: "
              "pip install 'earl-service[train]' (torch first: docs/answers.md#edge-install)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
