"""An LRU cache of LinkPredictors keyed by (model id, sha256), so a replaced bundle is never served stale."""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path

from earl_service.errors import BundleError
from earl_service.serve.predictor import LinkPredictor
from earl_service.service.records import ModelRecord

Key = tuple[str, str]  # (model id, sha256)
Signature = tuple[int, int, int]  # (inode, size, mtime_ns) of a bundle file


class PredictorCache:
    """At most `size` predictors taking at most `max_bytes` (LinkPredictor.resident_bytes) together, least
    recently used evicted first; the one just loaded is kept even alone over the budget (it is being asked for).
    A missing one is loaded once, outside the lock, for all the requests that want it meanwhile (they wait for
    that load instead of each loading its own copy); hits never wait for a load.

    A bundle that failed to load fails the same way until its file changes: re-reading it on every request would
    cost a full load (seconds, memory) per request for the same error.
    """

    def __init__(self, size: int, max_bytes: int | None = None) -> None:
        self.size, self.max_bytes = size, max_bytes
        self._items: OrderedDict[Key, LinkPredictor] = OrderedDict()
        self._loading: dict[Key, Future[LinkPredictor]] = {}
        self._failed: OrderedDict[Key, tuple[Signature, str]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return sum(_bytes(p) for p in self._items.values())

    def get(self, record: ModelRecord, path: Path) -> LinkPredictor:
        """The predictor of `record`; on a miss its bundle at `path` is loaded (BundleError if unreadable)."""
        key = (record.id, record.sha256)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            loading, mine = self._loading.get(key), False
            if loading is None:
                loading, mine = Future(), True
                self._loading[key] = loading
        return self._load(key, path, loading) if mine else loading.result()

    def _load(self, key: Key, path: Path, loading: Future[LinkPredictor]) -> LinkPredictor:
        """Load for every request waiting on `loading`; a predictor is kept, an error is raised in each waiting
        request (and a BundleError remembered against the file, see the class doc)."""
        try:
            self._refuse_known_failure(key, path)
            try:
                predictor = load_predictor(path)
            except BundleError as exc:
                self._remember_failure(key, path, str(exc))
                raise
        except BaseException as exc:
            with self._lock:
                del self._loading[key]
            loading.set_exception(exc)
            raise
        with self._lock:
            del self._loading[key]
            self._items[key] = predictor
            held = sum(_bytes(p) for p in self._items.values())
            while len(self._items) > 1 and (len(self._items) > self.size
                                            or (self.max_bytes is not None and held > self.max_bytes)):
                held -= _bytes(self._items.popitem(last=False)[1])
        loading.set_result(predictor)
        return predictor

    def invalidate(self, model_id: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k[0] == model_id]:
                del self._items[key]
            for key in [k for k in self._failed if k[0] == model_id]:
                del self._failed[key]

    def _refuse_known_failure(self, key: Key, path: Path) -> None:
        """BundleError at once if `key`'s bundle failed to load before and its file is unchanged since."""
        with self._lock:
            known = self._failed.get(key)
        if known is not None and known[0] == _file_signature(path):
            raise BundleError(known[1])

    def _remember_failure(self, key: Key, path: Path, reason: str) -> None:
        signature = _file_signature(path)
        if signature is None:  # no file to compare with later: nothing worth remembering
            return
        with self._lock:
            self._failed[key] = (signature, reason)
            while len(self._failed) > max(self.size, 16):
                self._failed.popitem(last=False)


def _bytes(predictor: LinkPredictor) -> int:
    return int(getattr(predictor, "resident_bytes", 0))  # a test's stand-in may not say


def load_predictor(path: Path) -> LinkPredictor:
    """The bundle's predictor, its entity table left coded (load_bundle's keep_codes); the heap the load freed
    (the file's bytes, the graph, the names before packing) is handed back to the system (release_heap)."""
    from earl_service.bundle.model_io import load_bundle

    try:
        return LinkPredictor.from_bundle(load_bundle(path, keep_codes=True))
    finally:
        release_heap()


def release_heap() -> None:
    """glibc's malloc_trim(0): return free heap pages to the system. A load frees ~10^6 small objects; without it
    their pages stay in the process (64 MiB of RSS after the old 1M-entity load). A no-op without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc_trim(0)


def _file_signature(path: Path) -> Signature | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
