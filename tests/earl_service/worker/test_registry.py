"""The service home's layout and the model registry: publish, upload, extend (one at a time per model), delete."""

import io
import threading

import pytest

from earl_service.bundle import load_bundle
from earl_service.errors import BundleError, TripleFileError, UnknownModelError
from earl_service.worker.home import ServiceHome
from earl_service.worker.registry import ModelRegistry
from earl_service.worker.sqlite_store import SqliteStore


@pytest.fixture
def registry(tmp_path):
    home = ServiceHome(tmp_path).create()
    store = SqliteStore(home.store_target("sqlite"))
    yield ModelRegistry(home, store)
    store.close()


def leftovers(home: ServiceHome) -> list[str]:
    """Staged files still lying in uploads/ (hidden names) and anything in models/ that is not a bundle."""
    staged = [p.name for p in home.uploads.iterdir() if p.name.startswith(".")]
    return staged + [p.name for p in (home.root / "models").iterdir() if p.suffix != ".safetensors"]


def test_home_layout(tmp_path):
    home = ServiceHome(str(tmp_path)).create()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "runs", "uploads"]
    assert home.model_path("m") == tmp_path / "models" / "m.safetensors"
    assert home.relative(home.run_dir("j") / "metrics.json") == "runs/j/metrics.json"
    staged = home.staging_path("m.triples", ".tsv.gz")
    assert staged.parent == home.uploads and staged.name.startswith(".m.triples.") and staged.name.endswith(".tsv.gz")
    assert home.store_target("sqlite") == home.store_target("") == str(tmp_path / "earl.sqlite3")
    assert home.store_target("redis://h:6379/0") == "redis://h:6379/0"


def test_upload_publishes_a_verified_bundle(registry, codex_bundle):
    record = registry.upload(io.BytesIO(codex_bundle.read_bytes()), shown_name="mine.safetensors")
    assert record.path == f"models/{record.id}.safetensors" and record.job_id is None
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
    assert (extended.id, extended.created, extended.path) == (record.id, record.created, record.path)
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
