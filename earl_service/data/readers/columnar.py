"""Columnar triples (the `parquet` extra): Parquet files a row group at a time, Arrow tables and pandas DataFrames.

Columns are found by name (head/relation/tail, subject/predicate/object, ...: text.ROLES) or, failing that, taken
as the first three in DataConfig.columns' order; values that are not strings (integer ids) are written as text.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from earl_service.config import DataConfig
from earl_service.data.readers.report import Batch, ReadReport, row_error
from earl_service.data.readers.text import _ROLE_OF, blocks
from earl_service.errors import DatasetError, TripleFileError

PARQUET_MAGIC = b"PAR1"
_BATCH = 1 << 16


def pyarrow_module() -> Any:
    try:
        import pyarrow
    except ImportError:  # a DatasetError, as rdf.rdflib_module's
        raise DatasetError("reading Parquet, Arrow or pandas triples needs pyarrow: "
                           "pip install 'earl-service[parquet]'") from None
    return pyarrow


def choose_columns(names: Sequence[str], data: DataConfig, columns: Sequence[str] | None = None) -> list[str]:
    """The (head, relation, tail) column names: ``columns`` if given, else by role name, else the first three in
    ``data``'s order."""
    if columns is not None:
        missing = [c for c in columns if c not in names]
        if len(columns) != 3 or missing:
            problem = f"not found: {', '.join(map(str, missing))}" if missing else f"got {len(columns)}"
            raise ValueError(f"columns must name 3 of the table's columns ({', '.join(map(str, names))}); {problem}")
        return list(columns)
    by_role = {_ROLE_OF.get(str(n).strip().casefold()): n for n in names}
    if all(role in by_role for role in ("head", "relation", "tail")):
        return [by_role["head"], by_role["relation"], by_role["tail"]]
    if len(names) < 3:
        raise ValueError(f"needs 3 columns (head, relation, tail), found {len(names)}: {', '.join(map(str, names))}")
    return [names[i] for i in data.order]


def _texts(column: Any, pa: Any) -> list[Any]:
    """An Arrow column as Python strings (None where null); integer or other ids are cast to text."""
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        column = column.cast(pa.string())
    return column.to_pylist()


def record_batch_triples(batch: Any, columns: list[str], first_row: int, where: str) -> Batch:
    """One Arrow record batch as a Batch; a null or empty value raises ValueError naming its row (from 1)."""
    pa = pyarrow_module()
    parts = [_texts(batch.column(c), pa) for c in columns]  # head, relation, tail values
    for role, values in zip(("head", "relation", "tail"), parts, strict=True):
        bad = [values.index(v) for v in (None, "") if v in values]
        if bad:
            raise ValueError(f"{where} {first_row + min(bad)}: empty {role} value")
    flat: list[str] = [""] * (3 * len(parts[0]))
    for position, values in enumerate(parts):
        flat[position::3] = values
    return flat, np.ones(len(parts[0]), dtype=np.int64)


def _parquet_file(path: Path, max_bytes: int) -> Any:
    """pyarrow's ParquetFile, on the file itself or, for a gzipped one, on its bytes in memory."""
    pyarrow_module()
    import pyarrow.parquet as pq

    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    source: Any = io.BytesIO(b"".join(blocks(path, max_bytes))) if gz else str(path)
    return pq.ParquetFile(source)


def parquet_batches(path: Path, max_bytes: int, data: DataConfig, report: ReadReport) -> Iterator[Batch]:
    """A Parquet file's triples, one row group's batch at a time; errors name the row (from 1)."""
    report.format = "Parquet"
    try:
        parquet = _parquet_file(path, max_bytes)
        columns = choose_columns(parquet.schema_arrow.names, data)
        row = 1
        for batch in parquet.iter_batches(batch_size=_BATCH, columns=columns):
            yield record_batch_triples(batch, columns, row, "row")
            row += batch.num_rows
    except ValueError as exc:
        raise row_error(path, exc) from None
    except OSError as exc:  # pyarrow's ArrowInvalid is a ValueError; a truncated file raises OSError
        raise TripleFileError(path, None, f"not a readable Parquet file: {exc}") from None


def table_batches(table: Any, data: DataConfig, columns: Sequence[str] | None = None) -> Iterator[Batch]:
    """An Arrow table or a pandas DataFrame (converted to Arrow) as batches; ValueError naming a bad row."""
    pa = pyarrow_module()
    if not isinstance(table, pa.Table | pa.RecordBatch):
        table = pa.Table.from_pandas(table, preserve_index=False)
    chosen = choose_columns(table.schema.names, data, columns)
    row = 1
    for batch in (table.to_batches(max_chunksize=_BATCH) if isinstance(table, pa.Table) else [table]):
        yield record_batch_triples(batch, chosen, row, "row")
        row += batch.num_rows
