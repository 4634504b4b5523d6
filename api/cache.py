"""An LRU cache of LinkPredictors keyed by (model id, sha256), so a replaced bundle is never served stale."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

from earl_service.errors import BundleError
from earl_service.predict import LinkPredictor
from earl_service.worker.records import ModelRecord


class PredictorCache:
    """At most `size` predictors; loading runs outside the lock so one slow load does not block hits."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], LinkPredictor] = OrderedDict()
        self._failed: OrderedDict[tuple[str, str], tuple[tuple[int, int, int], str]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, record: ModelRecord, path: Path) -> LinkPredictor:
        """The predictor of `record`; on a miss its bundle at `path` is loaded (BundleError if unreadable)."""
        from earl_service.bundle import load_bundle

        key = (record.id, record.sha256)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        self._refuse_known_failure(key, path)
        try:
            predictor = LinkPredictor.from_bundle(load_bundle(path))
        except BundleError as exc:
            self._remember_failure(key, path, str(exc))
            raise
        with self._lock:
            self._items[key] = predictor
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return predictor

    def invalidate(self, model_id: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k[0] == model_id]:
                del self._items[key]
            for key in [k for k in self._failed if k[0] == model_id]:
                del self._failed[key]

    # A bundle that failed to load fails the same way until its file changes: re-reading it on every request
    # would cost a full load (seconds, memory) per request for the same error.

    def _refuse_known_failure(self, key: tuple[str, str], path: Path) -> None:
        """BundleError at once if `key`'s bundle failed to load before and its file is unchanged since."""
        with self._lock:
            known = self._failed.get(key)
        if known is not None and known[0] == _file_signature(path):
            raise BundleError(known[1])

    def _remember_failure(self, key: tuple[str, str], path: Path, reason: str) -> None:
        signature = _file_signature(path)
        if signature is None:  # no file to compare with later: nothing worth remembering
            return
        with self._lock:
            self._failed[key] = (signature, reason)
            while len(self._failed) > max(self.size, 16):
                self._failed.popitem(last=False)


def _file_signature(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
