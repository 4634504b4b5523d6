"""Answering queries over rebuilt embeddings: the link predictor (`predictor`), its FAISS proxy index with the
exact-top-k certificate (`index`) and entity / relation lookup by id or label (`names`).

Numpy and FAISS, no torch at import (the device reader uses the predictor); a `Bundle` is imported lazily.
"""
