"""The one registry of readers: for each format, the stream its files' records come in
(:func:`records`) and the parser that turns a record into a :class:`Raw` request
(:data:`PARSERS`), whether the format is a log, a public trace
(:mod:`analyzer.ingest.readers`) or a product's export (:mod:`analyzer.ingest.product_logs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from analyzer.ingest import product_logs, readers
from analyzer.ingest.detect import PRODUCT_FORMATS, Format
from analyzer.ingest.fields import FileContext, Raw, Record
from analyzer.ingest.io import Span
from analyzer.ingest.streams import (
    SPLITTABLE,
    SPLITTABLE_CSV,
    csv_records,
    json_records,
    parquet_records,
)
from analyzer.jsontypes import JSONObject

PARSERS: dict[str, Callable[[JSONObject, FileContext], Raw]] = {
    **readers.PARSERS,
    **product_logs.PARSERS,
}


def records(
    path: str, fmt: str, on_bytes: Callable[[int], None] | None, span: Span | None = None
) -> Iterator[Record]:
    """The records of ``path`` (of ``span`` only: JSON-lines and CSV formats,
    uncompressed)."""
    if span is not None:
        assert fmt in SPLITTABLE or fmt in SPLITTABLE_CSV
        if fmt in SPLITTABLE_CSV:
            return csv_records(path, on_bytes, span)
        return json_records(path, on_bytes, span)
    if fmt in PRODUCT_FORMATS:
        return product_logs.records(path, fmt, on_bytes)
    if fmt.endswith("parquet"):
        return parquet_records(path, on_bytes)
    if fmt.endswith("csv") or fmt in (Format.AZURE, Format.BURSTGPT):
        return csv_records(path, on_bytes)
    return json_records(path, on_bytes)
