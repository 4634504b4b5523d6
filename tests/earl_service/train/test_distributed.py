"""Data-parallel training: 2 gloo processes on 127.0.0.1 reach the parameters of one process with the same global
batch; rank 0 alone writes the run; the torchrun command line is built as documented."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import free_port, random_triples

from earl_service.cli.main import _without_launcher_options, main
from earl_service.train.distributed import Ranks, torchrun_command
from earl_service.train.loop import CHECKPOINT


def _write_tiny(folder):
    triples = np.unique(random_triples(40, 3, 300, seed=3), axis=0)
    np.random.default_rng(0).shuffle(triples)
    folder.mkdir()
    for name, part in (("train", triples[:250]), ("valid", triples[250:270]), ("test", triples[270:])):
        (folder / f"{name}.txt").write_text("".join(f"e{h}\tr{r}\te{t}\n" for h, r, t in part))
    return folder


# fp32 (not the default recipe's bf16 where native): one process and two shards then sum the same products.
TINY = ["--steps", "8", "--dim", "4", "--k", "3", "--reserved-ratio", "0.2", "--batch-size", "30", "--negatives", "8",
        "--eval-every", "2", "--patience", "1", "--eval-batch-size", "16", "--no-progress", "--threads", "1",
        "--compute", "fp32"]


@pytest.mark.parametrize("mode", [[], ["--sampled", "--fanout", "all", "--negative-chunk", "8"]],
                         ids=["full-graph", "sampled-all-neighbours"])
def test_two_gloo_processes_match_one_process(tmp_path, mode):
    data = _write_tiny(tmp_path / "data")
    args = ["train", str(data), *TINY, *mode]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "earl_service.cli.main", *args, "--out", str(tmp_path / "two"),
                           "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["steps"] >= 1  # rank 0 alone prints its summary
    one = torch.load(tmp_path / "one" / CHECKPOINT, weights_only=True)
    two = torch.load(tmp_path / "two" / CHECKPOINT, weights_only=True)
    # Same global batches, negatives and stop decision (early stopping is broadcast from rank 0).
    assert one["state"]["step"] == two["state"]["step"] and one["state"]["stopped"] == two["state"]["stopped"]
    np.testing.assert_allclose(one["history"]["losses"], two["history"]["losses"], rtol=1e-5)
    for name, value in one["model"].items():
        if value.dtype.is_floating_point:
            scale = value.abs().max().clamp(min=1e-12)
            assert (value - two["model"][name]).abs().max() / scale < 1e-5, name
    metrics = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and (tmp_path / "two" / "bundle.safetensors").exists()
    assert metrics["test"]["count"] == json.loads((tmp_path / "one" / "metrics.json").read_text())["test"]["count"]


def test_shards_cover_the_batch_and_weigh_it():
    for rows in (1, 7, 30):
        shards = [Ranks(rank, 3).shard(rows) for rank in range(3)]
        covered = [i for part, share in shards if share for i in range(part.start, part.stop)]
        assert covered == list(range(rows))
        assert sum(share for _, share in shards) == pytest.approx(1.0)


def test_torchrun_command_line():
    argv = ["-v", "train", "data", "--out", "run", "--nproc-per-node", "4", "--nnodes=2",
            "--rdzv-endpoint", "10.0.0.1:29400", "--steps", "5"]
    assert _without_launcher_options(argv) == ["-v", "train", "data", "--out", "run", "--steps", "5"]
    cmd = torchrun_command(["train", "data"], nproc_per_node=4, nnodes="2", rdzv_endpoint="10.0.0.1:29400")
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and "--rdzv-endpoint=10.0.0.1:29400" in cmd and "--standalone" not in cmd
    assert cmd[-4:] == ["-m", "earl_service.cli.main", "train", "data"]
    assert "--standalone" in torchrun_command(["train"], nproc_per_node=2)
    with pytest.raises(ValueError, match="rdzv-endpoint"):
        torchrun_command(["train"], nproc_per_node=2, nnodes="2")


def test_worker_runs_a_job_through_torchrun(tmp_path):
    """A job asking for nproc_per_node=2 trains in 2 gloo processes; progress and the bundle come back."""
    from earl_service.bundle.model_io import load_bundle
    from earl_service.service.records import new_id
    from earl_service.worker.loop import Worker, WorkerConfig

    worker = Worker(WorkerConfig(home=tmp_path, heartbeat_seconds=0.05, poll_seconds=0.05, threads=2))
    try:
        job_id = new_id()
        _write_tiny(tmp_path / "uploads" / job_id)
        params = {"dim": 4, "k": 3, "reserved_ratio": 0.2, "steps": 6, "batch_size": 32, "negatives": 4,
                  "eval_every": 3, "sampled": True, "fanout": "5,all", "nproc_per_node": 2}
        worker.store.create_job(params, {"train": f"uploads/{job_id}/train.txt"}, job_id=job_id)
        done = worker.run_once()
        assert (done.state, done.error) == ("succeeded", None)
        assert done.progress["step"] == done.progress["total"] == 6
        metrics = json.loads((tmp_path / "runs" / job_id / "metrics.json").read_text())
        assert metrics["world_size"] == 2 and metrics["config"]["train"]["fanout"] == [5, 0]
        assert metrics["config"]["train"]["threads"] == 1  # the worker's 2 threads shared by 2 processes
        assert len(load_bundle(worker.home.version_path(job_id, 1)).entities) == metrics["entities"] == 39
    finally:
        worker.store.close()
