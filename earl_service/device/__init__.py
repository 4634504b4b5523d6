"""The device reader: answers link prediction from a bundle with numpy and safetensors only (no torch).

`load(path)` rebuilds the embeddings (`reader`) into an `EdgeModel` (`model`); `cache` keeps what a rebuild made
on disk, so that a later call maps it back in milliseconds; `tables` writes the embeddings as npy, TSV or Parquet
for other tools. May import `core`, `data`, `bundle.format` / `bundle.codebooks` / `bundle.decode` and
`serve.predictor`, all torch-free; a test imports it with torch blocked.

The names below load on first use: a cache hit never imports the rebuild's modules (decode, xz, kNResEnt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from earl_service.device.model import EdgeModel
    from earl_service.device.reader import load

__all__ = ["EdgeModel", "load"]


def __getattr__(name: str) -> Any:
    if name == "EdgeModel":
        from earl_service.device import model

        return model.EdgeModel
    if name == "load":
        from earl_service.device import reader

        return reader.load
    raise AttributeError(f"module 'earl_service.device' has no attribute {name!r}")
