"""The service home's layout and the model registry: publish, upload, extend (one at a time per model), delete."""

import dataclasses
import io
import re
import subprocess
import sys
import threading
import time

import pytest

from earl_service.bundle.model_io import load_bundle
from earl_service.errors import BundleError, TripleFileError, UnknownModelError
from earl_service.service.home import ServiceHome
from earl_service.service.registry import ModelRegistry
from earl_service.service.sqlite_store import SqliteStore


@pytest.fixture
def registry(tmp_path):
    home = ServiceHome(tmp_path).create()
    store = SqliteStore(home.store_target("sqlite"))
    yield ModelRegistry(home, store)
    store.close()


def leftovers(home: ServiceHome) -> list[str]:
    """Staged files still lying in uploads/ (hidden names) and anything in models/ that is not a version of a model
    (lock files included: their holder removes them)."""
    staged = [p.name for p in home.uploads.iterdir() if p.name.startswith(".")]
    return staged + [home.relative(p) for p in home.models.rglob("*")
                     if not (p.is_dir() and not p.name.startswith(".") or re.fullmatch(r"v\d+\.safetensors", p.name))]


def test_home_layout(tmp_path):
    home = ServiceHome(str(tmp_path)).create()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "runs", "uploads"]
    assert home.version_path("m", 2) == tmp_path / "models" / "m" / "v2.safetensors"
    assert home.legacy_model_path("m") == tmp_path / "models" / "m.safetensors"
    assert home.relative(home.run_dir("j") / "metrics.json") == "runs/j/metrics.json"
    assert home.run_dir("j").parent == home.runs == tmp_path / "runs"
    for version in (1, 12):
        path = home.version_path("m", version)
        assert home.version_of("m", path) == home.version_of("m", home.relative(path)) == version
    for path in ("models/m.safetensors", "models/other/v2.safetensors", "models/m/v2.safetensors.tmp", "models/m/vx"):
        assert home.version_of("m", path) is None
    staged = home.staging_path("m.triples", ".tsv.gz")
    assert staged.parent == home.uploads and staged.name.startswith(".m.triples.") and staged.name.endswith(".tsv.gz")
    assert home.store_target("sqlite") == home.store_target("") == str(tmp_path / "earl.sqlite3")
    assert home.store_target("redis://h:6379/0") == "redis://h:6379/0"


def test_upload_publishes_a_verified_bundle(registry, codex_bundle):
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="mine.safetensors")
    assert record.path == f"models/{record.id}/v1.safetensors" and record.job_id is None
    assert record.sha256 == load_bundle(registry.bundle_path(record)).sha256
    assert registry.get(record.id) == record and leftovers(registry.home) == []


def test_refused_upload_names_the_client_file_and_leaves_nothing(registry):
    with pytest.raises(BundleError, match="mine.safetensors") as refused:
        registry.upload(io.BytesIO(b"not a bundle"), shown_name="mine.safetensors")
    assert str(registry.home.root) not in str(refused.value)
    assert registry.store.list_models() == [] and leftovers(registry.home) == []
    assert list((registry.home.root / "models").iterdir()) == []


def test_unknown_model_suggests_close_ids(registry, codex_bundle):
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    with pytest.raises(UnknownModelError) as missing:
        registry.get(record.id[:-1] + "x")
    assert missing.value.suggestions == [record.id] and "not found; did you mean" in str(missing.value)
    with pytest.raises(UnknownModelError):
        registry.delete("0" * 32)


def test_extend_keeps_id_and_creation_time(registry, codex_bundle, tmp_path):
    bundle = load_bundle(codex_bundle)
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    rel, tail = bundle.relations.names[0], bundle.entities.names[0]
    triples = tmp_path / "more.txt"
    triples.write_text(f"NEW\t{rel}\t{tail}\n")
    extended = registry.extend(record.id, triples, shown_name="more.txt")
    assert (extended.id, extended.created) == (record.id, record.created)
    assert extended.path == f"models/{record.id}/v2.safetensors"  # the next version; v1 stays
    assert extended.entities == record.entities + 1 and extended.sha256 != record.sha256
    assert registry.get(record.id) == extended and leftovers(registry.home) == []
    triples.write_text("NEW\tP_NONE\tX\n")
    with pytest.raises(TripleFileError, match=r"^more.txt, line 1: unknown relation"):
        registry.extend(record.id, triples, shown_name="more.txt")
    assert registry.get(record.id) == extended


def test_concurrent_extensions_of_one_model_all_land(registry, codex_bundle, tmp_path):
    """Each extension reads, extends and replaces the bundle; without the per-model lock one would be lost."""
    bundle = load_bundle(codex_bundle)
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    rel, tail = bundle.relations.names[0], bundle.entities.names[0]
    files = []
    for i in range(4):
        files.append(tmp_path / f"more{i}.txt")
        files[-1].write_text(f"NEW{i}\t{rel}\t{tail}\n")
    threads = [threading.Thread(target=registry.extend, args=(record.id, f), kwargs={"shown_name": f.name})
               for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = load_bundle(registry.bundle_path(registry.get(record.id)))
    assert len(final.entities) == len(bundle.entities) + 4
    assert {f"NEW{i}" for i in range(4)} <= set(final.entities.names)


def test_delete_removes_record_and_file(registry, codex_bundle):
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    assert registry.delete(record.id) == record
    assert registry.store.get_model(record.id) is None and not registry.bundle_path(record).exists()


# ---------------------------------------------------------------- versions, verification, deletes, other processes


def extension(bundle, name: str, path):
    """A triple file adding entity `name` to `bundle`'s graph."""
    path.write_text(f"{name}\t{bundle.relations.names[0]}\t{bundle.entities.names[0]}\n")
    return path


def test_extends_add_versions_and_keep_the_earlier_ones(registry, codex_bundle, tmp_path):
    bundle = load_bundle(codex_bundle)
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    for i in range(2):
        latest = registry.extend(record.id, extension(bundle, f"NEW{i}", tmp_path / "more.txt"), shown_name="m")
    versions = registry.versions(record.id)
    assert [(v.number, v.latest) for v in versions] == [(1, False), (2, False), (3, True)]
    assert versions[0].path.read_bytes() == codex_bundle.read_bytes() and versions[0].sha256 == record.sha256
    assert versions[2].sha256 == latest.sha256 == load_bundle(registry.bundle_path(latest)).sha256
    assert "NEW0" in load_bundle(versions[1].path).entities.names and registry.version(record.id).number == 3
    with pytest.raises(UnknownModelError, match="version 4"):
        registry.version(record.id, 4)


def test_an_extension_that_cannot_be_served_is_refused_before_it_replaces_anything(registry, codex_bundle, tmp_path,
                                                                                 monkeypatch):
    """The extended bundle is verified like an upload (embeddings rebuilt) before it becomes a version."""
    import numpy as np
    import torch

    from earl_service.bundle.model_io import Bundle

    bundle = load_bundle(codex_bundle)
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    embed = Bundle.entity_embeddings

    def broken_when_extended(self):
        values = embed(self)
        return torch.full_like(values, np.nan) if len(self.entities) > len(bundle.entities) else values

    monkeypatch.setattr(Bundle, "entity_embeddings", broken_when_extended)
    with pytest.raises(BundleError, match="NaN") as refused:
        registry.extend(record.id, extension(bundle, "NEW", tmp_path / "more.txt"), shown_name="more.txt")
    assert "more.txt" in str(refused.value) and str(registry.home.root) not in str(refused.value)
    assert registry.get(record.id) == record and leftovers(registry.home) == []
    assert [v.number for v in registry.versions(record.id)] == [1]


def test_delete_removes_every_version_the_run_and_the_uploads(registry, codex_bundle, tmp_path):
    """What a model was made from goes with it; the job stays, no longer naming the model."""
    home, store = registry.home, registry.store
    job = store.create_job({}, {"train": f"uploads/{'j' * 32}/train.txt"}, job_id="j" * 32)
    (home.upload_dir(job.id)).mkdir()
    (home.upload_dir(job.id) / "train.txt").write_text("a\tr\tb\n")
    home.run_dir(job.id).mkdir()
    for name in ("checkpoint.pt", "best.pt", "bundle.safetensors"):
        (home.run_dir(job.id) / name).write_bytes(b"x")
    store.claim_job("w")
    staged = home.run_dir(job.id) / ".export.w.tmp"
    staged.write_bytes(codex_bundle.read_bytes())
    registry.publish(job.id, staged, job_id=job.id)
    store.finish_job(job.id, "w", "succeeded", model_id=job.id)
    registry.extend(job.id, extension(load_bundle(codex_bundle), "NEW", tmp_path / "more.txt"), shown_name="m")

    registry.delete(job.id)
    assert not home.run_dir(job.id).exists() and not home.upload_dir(job.id).exists()
    assert list(home.models.iterdir()) == [] and store.get_model(job.id) is None
    after = store.get_job(job.id)
    assert (after.state, after.model_id) == ("succeeded", None)


def test_a_delete_the_store_refuses_leaves_the_model_whole(registry, codex_bundle, tmp_path, monkeypatch):
    from earl_service.errors import StoreError

    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")

    def unreachable(model_id):
        raise StoreError("job store unreachable")

    monkeypatch.setattr(registry.store, "delete_model", unreachable)
    with pytest.raises(StoreError):
        registry.delete(record.id)
    assert registry.get(record.id) == record and load_bundle(registry.bundle_path(record)).sha256 == record.sha256
    assert leftovers(registry.home) == []


def test_a_bundle_from_before_versions_is_version_1(registry, codex_bundle, tmp_path):
    """A home written before versions (models/<id>.safetensors) is served as it is; its first extend is version 2."""
    home = registry.home
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    legacy = home.legacy_model_path(record.id)
    registry.bundle_path(record).rename(legacy)
    home.model_dir(record.id).rmdir()
    old = dataclasses.replace(record, path=home.relative(legacy))
    registry.store.add_model(old)
    assert registry.version(record.id).path == legacy and [v.number for v in registry.versions(record.id)] == [1]
    extended = registry.extend(record.id, extension(load_bundle(codex_bundle), "NEW", tmp_path / "m.txt"),
                               shown_name="m.txt")
    assert extended.path == f"models/{record.id}/v2.safetensors"
    assert [(v.number, v.path) for v in registry.versions(record.id)] == [
        (1, legacy), (2, home.version_path(record.id, 2))]
    registry.delete(record.id)
    assert list(home.models.iterdir()) == []


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_two_processes_extending_one_model_take_turns(registry, codex_bundle, tmp_path):
    """Each process reads the model, extends it and publishes; the file lock makes the second wait for the first,
    so neither extension is lost (a per-process lock could not see the other process)."""
    from conftest import REPO

    bundle = load_bundle(codex_bundle)
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="b")
    gate = tmp_path / "gate"
    gate.mkdir()
    files = [extension(bundle, f"NEW{i}", tmp_path / f"more{i}.txt") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(REPO / "tests" / "gated_writes.py"), str(gate), "extend",
                               str(registry.home.root), record.id, str(f)]) for f in files]
    try:
        assert wait_until(lambda: len(list(gate.glob("ready-*"))) == 2, 300), "the processes did not start"
        (gate / "start").touch()
        # Unlocked, both reach the gate with the same bundle read; locked, the second waits for the first.
        wait_until(lambda: len(list(gate.glob("entered-*"))) == 2, 5)
        (gate / "go").touch()
        assert [p.wait(timeout=300) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    final = load_bundle(registry.bundle_path(registry.get(record.id)))
    assert {"NEW0", "NEW1"} <= set(final.entities.names)
    assert [v.number for v in registry.versions(record.id)] == [1, 2, 3] and leftovers(registry.home) == []
