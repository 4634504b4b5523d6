"""A disk cache of what the device reader rebuilds from a bundle, mapped back with numpy in milliseconds.

A rebuild costs seconds on FB15k-237 (bench/results/rebuild.md) and indexing its known answers another 0.4 s; a
call that finds them here maps the tables in (np.load, mmap_mode="r") instead (bench/results/device_predict.md).

Key: the SHA-256 of the bundle's safetensors header. The header holds the metadata (config, labels and the
payload's own SHA-256) and the tensor table, so files with one header hold one bundle, whatever their paths, and
the key costs one small read however large the bundle. Replacing a bundle, or extending it (`earl extend`
rewrites it), gives a new payload, hence a new key; the entry the old file left is removed when the new one is
written. Trust: an entry records the file (device, inode, size, mtime) whose payload was verified; a file that
no longer matches has its payload hashed against its header again (as a load checks it) before the entry answers
for it, so a bundle damaged after its header is refused as an uncached load refuses it.
Damage: every file of an entry has its size and CRC-32 in the entry's manifest, checked on every read (~5 ms per
10 MB); an entry that fails a check, or that another cache format or library version wrote, is removed and
rebuilt, never answered from.
Writes: an entry is written into a hidden folder beside the others and renamed into place in one step, so a
reader sees a whole entry or none; of two processes writing one key, the first rename wins.
Bound: at most `max_entries` entries and `max_bytes` bytes; the least recently used go first.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import mmap
import os
import shutil
import struct
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.atomic import write_json
from earl_service.core.known import KnownAnswers
from earl_service.data.vocab import Vocab
from earl_service.device.model import EdgeModel
from earl_service.errors import EarlError
from earl_service.version import __version__

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # a new layout starts a new folder (v2/...): old entries are never misread
MANIFEST = "manifest.json"
STRINGS = "strings.json"
# The arrays of an entry: file stem -> dtype and number of dimensions (shapes are checked against each other).
ARRAYS = {"entity_embeddings": (np.float32, 2), "relation_embeddings": (np.float32, 2), "tail_keys": (np.int64, 1),
          "tail_answers": (np.int64, 1), "head_keys": (np.int64, 1), "head_answers": (np.int64, 1)}
HEADER_READ_LIMIT = 64 * 2**20  # a header past this is no bundle's (bundle.format.HEADER_LIMIT is 4 MiB)
STALE_TMP_SECONDS = 3600  # a hidden write folder this old was left by a process that died
# What reading a damaged entry raises: a missing or short file, bad JSON or npy, shapes that disagree.
_DAMAGE = (OSError, ValueError, KeyError, TypeError, EarlError)


@dataclass(frozen=True)
class CacheConfig:
    """Where the cache lives and how much it keeps (the least recently used entries go first)."""

    directory: Path
    max_entries: int = 8
    max_bytes: int = 2 * 2**30


def default_directory(environ: Mapping[str, str]) -> Path:
    """$EARL_CACHE_DIR, else $XDG_CACHE_HOME/earl, else ~/.cache/earl (the command line passes os.environ)."""
    if environ.get("EARL_CACHE_DIR"):
        return Path(environ["EARL_CACHE_DIR"]).expanduser()
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "earl"


@dataclass(frozen=True)
class BundleKey:
    """A bundle file as the cache knows it: its header's SHA-256 and the file it was read from."""

    digest: str
    path: str  # resolved
    stamp: tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
    header_len: int = field(compare=False)


def rebuild_name(use_scipy: bool | None) -> str:
    """Which rebuild reader.load(use_scipy=...) runs, "scipy" or "numpy", found without importing scipy. The two
    agree within float32 rounding only, which can swap a near tie: an entry is used only by the rebuild that wrote
    it, so a cached answer is always the one the same call would give uncached."""
    if use_scipy is None:
        use_scipy = importlib.util.find_spec("scipy") is not None
    return "scipy" if use_scipy else "numpy"


def bundle_key(path: str | os.PathLike[str]) -> BundleKey | None:
    """The key of the bundle at `path`; None when it has no readable safetensors header (an uncached load then
    says what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            prefix = f.read(8)
            if len(prefix) < 8:
                return None
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(HEADER_READ_LIMIT, st.st_size - 8):
                return None
            digest = hashlib.sha256(prefix + f.read(header_len)).hexdigest()
    except OSError:
        return None
    return BundleKey(digest, os.path.realpath(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), header_len)


class TableCache:
    """Rebuilt EdgeModels on disk under `config.directory`/v1/<key>/ (module doc: key, checks, bound)."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.root = Path(config.directory) / f"v{CACHE_FORMAT}"

    def load(self, path: str | os.PathLike[str], *, use_scipy: bool | None = None) -> EdgeModel:
        """The bundle at `path` as an EdgeModel: from its entry when one is whole and this file's, else rebuilt
        (reader.load, which verifies the file) and stored."""
        key, rebuild = bundle_key(path), rebuild_name(use_scipy)
        if key is not None and (model := self.get(key, rebuild)) is not None:
            return model
        # Imported here: the rebuild's modules (decode, xz, kNResEnt) would add ~35 ms to a hit's ~150 ms.
        from earl_service.device import reader

        model = reader.load(path, use_scipy=use_scipy)
        if key is not None and bundle_key(path) == key:  # unchanged while it was read: the tables are this key's
            self.put(key, model, rebuild)
        return model

    def get(self, key: BundleKey, rebuild: str = "numpy") -> EdgeModel | None:
        """The entry of `key` rebuilt by `rebuild` (rebuild_name), checked; None when there is none, it is damaged
        (then removed) or the file's payload no longer matches its header."""
        folder = self.root / f"{key.digest}-{rebuild}"
        if not folder.is_dir():
            return None
        try:
            manifest = _manifest(folder, key.digest)
            model = _read_model(folder, manifest)
        except _DAMAGE as exc:
            log.warning("cache entry %s is damaged (%s); rebuilding it", folder, exc)
            remove_entry(folder)
            return None
        if tuple(manifest["source"]["stamp"]) != key.stamp:
            if not _payload_verified(key):
                return None  # the file changed after its header: the uncached load reports it
            _record_source(folder, manifest, key)
        _touch(folder / MANIFEST)
        return model

    def put(self, key: BundleKey, model: EdgeModel, rebuild: str = "numpy") -> Path | None:
        """Write `model`'s tables as the entry of `key` (replacing entries of the same file), then evict down to the
        bound; the folder, or None when it was not written (larger than the bound, or the disk refused)."""
        size = _size_of(model)
        if size > self.config.max_bytes:
            log.info("not caching %s: %d bytes, more than the cache's %d", key.path, size, self.config.max_bytes)
            return None
        folder = self.root / f"{key.digest}-{rebuild}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".tmp-{os.getpid()}-{time.time_ns()}"
            _write_entry(tmp, model, key)
            try:
                os.rename(tmp, folder)
            except OSError:  # another process wrote this key first: keep its entry
                remove_entry(tmp)
            _touch(folder / MANIFEST)
            self._evict(keep=folder, source=key.path)
        except OSError as exc:
            log.warning("could not write cache entry %s: %s", folder, exc)
            return None
        return folder

    def entries(self) -> list[tuple[Path, float, int]]:
        """(folder, last use as a timestamp, bytes) of every entry, least recently used first."""
        found = []
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            if folder.name.startswith("."):
                continue
            try:
                used = (folder / MANIFEST).stat().st_mtime
                size = sum(f.stat().st_size for f in folder.iterdir())
            except OSError:  # half removed by another process
                continue
            found.append((folder, used, size))
        return sorted(found, key=lambda e: e[1])

    def _evict(self, *, keep: Path, source: str) -> None:
        """Remove the entries of earlier contents of `source`, write folders left by dead processes, then the
        least recently used entries until the bound holds (never `keep`)."""
        for tmp in self.root.glob(".tmp-*"):
            with contextlib.suppress(OSError):  # another process may remove it first
                if time.time() - tmp.stat().st_mtime > STALE_TMP_SECONDS:
                    remove_entry(tmp)
        entries = [e for e in self.entries() if e[0] != keep]
        for entry in list(entries):
            if _source_path(entry[0]) == source:  # the file was replaced or extended since
                remove_entry(entry[0])
                entries.remove(entry)
        kept = (keep / MANIFEST).exists()
        total = sum(e[2] for e in entries) + (sum(f.stat().st_size for f in keep.iterdir()) if kept else 0)
        while entries and (len(entries) + kept > self.config.max_entries or total > self.config.max_bytes):
            folder, _, size = entries.pop(0)
            remove_entry(folder)
            total -= size


def remove_entry(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _touch(path: Path) -> None:
    """Mark an entry used now (its manifest's mtime orders eviction); a read-only cache still answers. The time is
    given, not left to the file system, whose clock may tick once in several milliseconds."""
    now = time.time_ns()
    with contextlib.suppress(OSError):
        os.utime(path, ns=(now, now))


def _crc(path: Path) -> int:
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return zlib.crc32(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return zlib.crc32(m)


def _size_of(model: EdgeModel) -> int:
    pairs = model.known.pairs()
    arrays = (model.entity_embeddings, model.relation_embeddings, *pairs["tail"], *pairs["head"])
    return sum(a.nbytes for a in arrays) + sum(len(n) for n in model.entities.names) + (1 << 16)


def _write_entry(folder: Path, model: EdgeModel, key: BundleKey) -> None:
    """Every file of the entry, then the manifest naming each file's size and CRC-32."""
    folder.mkdir()
    pairs = model.known.pairs()
    arrays = {"entity_embeddings": model.entity_embeddings, "relation_embeddings": model.relation_embeddings,
              "tail_keys": pairs["tail"][0], "tail_answers": pairs["tail"][1],
              "head_keys": pairs["head"][0], "head_answers": pairs["head"][1]}
    for stem, array in arrays.items():
        np.save(folder / f"{stem}.npy", np.ascontiguousarray(array, dtype=ARRAYS[stem][0]), allow_pickle=False)
    strings = {"entities": list(model.entities.names), "relations": list(model.relations.names),
               "entity_labels": model.entity_labels, "relation_labels": model.relation_labels}
    (folder / STRINGS).write_text(json.dumps(strings, ensure_ascii=False), encoding="utf-8")
    files = {p.name: {"bytes": p.stat().st_size, "crc32": _crc(p)} for p in sorted(folder.iterdir())}
    manifest = {"cache_format": CACHE_FORMAT, "earl_service": __version__, "key": key.digest,
                "source": {"path": key.path, "stamp": list(key.stamp)}, "config": model.config,
                "num_relations": model.known.num_relations, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def _manifest(folder: Path, digest: str) -> dict[str, Any]:
    """The entry's manifest, refused (ValueError) when another format or version wrote it, or a file is not the
    size and CRC-32 it records."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    if (manifest.get("cache_format"), manifest.get("earl_service"), manifest.get("key")) != (
            CACHE_FORMAT, __version__, digest):
        raise ValueError("written by another cache format or library version")
    expected = {f"{stem}.npy" for stem in ARRAYS} | {STRINGS}
    if set(manifest["files"]) != expected:
        raise ValueError(f"it lists {sorted(manifest['files'])}, not {sorted(expected)}")
    for name, recorded in manifest["files"].items():
        path = folder / name
        if path.stat().st_size != recorded["bytes"]:
            raise ValueError(f"{name} holds {path.stat().st_size} bytes, {recorded['bytes']} were written")
        if _crc(path) != recorded["crc32"]:
            raise ValueError(f"{name} does not match its CRC-32")
    return manifest


def _read_model(folder: Path, manifest: dict[str, Any]) -> EdgeModel:
    """The EdgeModel of a checked entry: arrays mapped read-only from disk, shapes held against each other."""
    arrays = {}
    for stem, (dtype, ndim) in ARRAYS.items():
        array = np.load(folder / f"{stem}.npy", mmap_mode="r", allow_pickle=False)
        if array.dtype != dtype or array.ndim != ndim:
            raise ValueError(f"{stem}.npy holds {array.dtype} of {array.ndim} dimensions")
        arrays[stem] = array
    strings = json.loads((folder / STRINGS).read_text(encoding="utf-8"))
    for side in ("tail", "head"):
        if arrays[f"{side}_keys"].shape != arrays[f"{side}_answers"].shape:
            raise ValueError(f"{side} keys and answers differ in length")
    known = KnownAnswers.from_pairs(int(manifest["num_relations"]), {
        "tail": (arrays["tail_keys"], arrays["tail_answers"]), "head": (arrays["head_keys"], arrays["head_answers"])})
    entities, relations = Vocab(strings["entities"]), Vocab(strings["relations"], kind="relation")
    if known.num_relations != len(relations):
        raise ValueError(f"{known.num_relations} relations indexed, {len(relations)} named")
    return EdgeModel(manifest["config"], entities, relations, arrays["entity_embeddings"],
                     arrays["relation_embeddings"], known, dict(strings["relation_labels"]),
                     dict(strings["entity_labels"]))


def _payload_verified(key: BundleKey) -> bool:
    """Whether the file's tensor payload still has the SHA-256 its header records (as read_safetensors checks)."""
    try:
        with open(key.path, "rb") as f:
            header = json.loads(f.read(8 + key.header_len)[8:])
            expected = header["__metadata__"]["payload_sha256"]
            return hashlib.file_digest(f, "sha256").hexdigest() == expected
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _record_source(folder: Path, manifest: dict[str, Any], key: BundleKey) -> None:
    """The entry now answers for this file as it is (a copy, a touch): record it so the next call skips the hash."""
    with contextlib.suppress(OSError):
        write_json(folder / MANIFEST, {**manifest, "source": {"path": key.path, "stamp": list(key.stamp)}})


def _source_path(folder: Path) -> str | None:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["source"]["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


__all__ = ["CacheConfig", "TableCache", "bundle_key", "default_directory"]
