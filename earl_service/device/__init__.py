"""The device reader: answers link prediction from a bundle with numpy and safetensors only (no torch).

`load(path)` rebuilds the embeddings (`reader`); `tables` writes them as npy, TSV or Parquet for other tools.
May import `core`, `data`, `bundle.format` / `bundle.codebooks` / `bundle.decode` and `serve.predictor`, all
torch-free; a test imports it with torch blocked.
"""

from earl_service.device.reader import EdgeModel, load

__all__ = ["EdgeModel", "load"]
