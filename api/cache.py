"""An LRU cache of LinkPredictors keyed by (model id, sha256), so a replaced bundle is never served stale."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from earl_service.predict import LinkPredictor
from earl_service.worker.records import ModelRecord


class PredictorCache:
    """At most `size` predictors; loading runs outside the lock so one slow load does not block hits."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], LinkPredictor] = OrderedDict()
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
        predictor = LinkPredictor.from_bundle(load_bundle(path))
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
