"""A run records where it came from (metrics.json and its bundle), and refuses to be evaluated on other data."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from earl_service.bundle.format import METADATA_LIMITS, read_safetensors
from earl_service.bundle.model_io import load_bundle
from earl_service.cli.main import main
from earl_service.errors import DatasetError
from earl_service.provenance import git_commit, provenance
from earl_service.train.loop import CHECKPOINT
from earl_service.train.run import load_run

TINY = ["--steps", "2", "--dim", "4", "--k", "2", "--batch-size", "16", "--negatives", "4", "--eval-every", "0",
        "--no-progress", "--no-final-eval", "--threads", "1"]


def graph(folder, relations=3, entities=12, prefix="e"):
    folder.mkdir()
    rows = [f"{prefix}{i % entities}\tr{i % relations}\t{prefix}{(i * 5 + 1) % entities}\n" for i in range(40)]
    (folder / "train.tsv").write_text("".join(rows))
    (folder / "valid.tsv").write_text("".join(rows[:5]))
    return folder


def trained(tmp_path, *extra):
    data = graph(tmp_path / "kg")
    assert main(["train", str(data), "--out", str(tmp_path / "run"), *TINY, *extra]) == 0
    return data, tmp_path / "run"


def test_metrics_and_bundle_record_versions_commit_data_and_command(tmp_path):
    data, run = trained(tmp_path)
    recorded = json.loads((run / "metrics.json").read_text())["provenance"]
    assert recorded["library_version"] == json.loads((run / "metrics.json").read_text())["version"]
    assert recorded["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert recorded["python"] == ".".join(map(str, sys.version_info[:3]))
    assert recorded["data"]["train"] == {"file": str(data / "train.tsv"),
                                         "sha256": hashlib.sha256((data / "train.tsv").read_bytes()).hexdigest()}
    assert set(recorded["data"]) == {"train", "valid"}
    assert "--steps" in recorded["command"]  # this process's command line (pytest's), as the CLI leaves it
    assert recorded["git_commit"] == git_commit()
    bundle = load_bundle(run / "bundle.safetensors")
    assert bundle.metrics["provenance"] == recorded
    meta, _, _ = read_safetensors(run / "bundle.safetensors")
    assert len(meta["metrics"].encode()) < METADATA_LIMITS["metrics"]


def test_provenance_stays_small_whatever_the_command_and_paths():
    huge = provenance({"train": {"file": "x" * 10_000, "sha256": "0" * 64}}, command=["earl"] + ["--a"] * 10_000)
    assert len(json.dumps(huge)) < 4000 and huge["command"].endswith("…")


def test_git_commit_of_a_checkout_and_of_no_checkout(tmp_path, monkeypatch):
    assert git_commit(tmp_path) is None  # not a repository
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "other.py").write_text("")

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    assert git_commit(repo / "pkg") is None  # inside a repository, but not a tracked part of it
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_commit(repo / "pkg") == head
    (repo / "pkg" / "other.py").write_text("changed")
    assert git_commit(repo / "pkg") == head + "-dirty"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no git at all
    assert git_commit(repo / "pkg") is None


def test_evaluate_on_other_data_says_so(tmp_path, capsys):
    _, run = trained(tmp_path)
    other = graph(tmp_path / "other", relations=4)
    assert main(["evaluate", str(run), str(other), "--split", "valid"]) == 2
    err = capsys.readouterr().err
    assert "this data does not match the run" in err and "entities and 3 relations, this data has" in err
    assert "training entities and 4 relations" in err
    assert "Traceback" not in err and "size mismatch" not in err
    renamed = graph(tmp_path / "renamed", prefix="x")  # the same counts, other names
    with pytest.raises(DatasetError, match="the counts agree but the names"):
        from earl_service.data.dataset import load_dataset

        load_run(run, load_dataset(renamed), device="cpu")


def test_evaluate_a_run_from_before_vocabularies_were_kept(tmp_path):
    """An older checkpoint has no vocabulary: a shape mismatch still becomes the same message, not a traceback."""
    from earl_service.data.dataset import load_dataset

    _, run = trained(tmp_path, "--model", "rotate")
    ckpt = torch.load(run / CHECKPOINT, weights_only=True)
    del ckpt["vocab"]
    torch.save(ckpt, run / CHECKPOINT)
    with pytest.raises(DatasetError, match="this data does not match the run"):
        load_run(run, load_dataset(graph(tmp_path / "bigger", entities=20)), device="cpu")
