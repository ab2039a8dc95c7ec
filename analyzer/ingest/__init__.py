"""ingest stage: read request logs and public traces into one canonical block trace.

Public API::

    from analyzer.ingest import IngestOptions, LoadedTrace, open_trace, detect_format
    loaded = open_trace(["log.jsonl.gz"], IngestOptions(block_size=16))

The modules, in the order a row meets them (each imports only those above it):

    options      IngestOptions, LoadedTrace, SkipSummary
    io           files and byte ranges, decompressed, line by line
    detect       which format a file is
    fields       Raw (one request as read), RowError, FileContext, field helpers
    streams      the records of a JSON-lines, CSV or Parquet file (or a byte range)
    readers      parsers of logs and public traces; product_logs: of product exports
    registry     the one registry: each format's record stream and parser
    vector       clean public traces read in columns
    spool        the rows in input order, sort keys in memory, the rest on disk
    builder      TraceBuilder: rows parsed, tokenized, hashed and spooled; finish()
    parallel     --jobs: pieces read by worker processes, adopted in input order
    cluster      --ray: the same pieces read by Ray actors
    canonical    canonical Parquet read back, merged, coarsened
    kvwire, kvfile, kvrebuild, kvevents   KV-event recordings -> the canonical trace
    load         open_trace: options checked, inputs read by whichever of the above
    convert      convert_trace: the same, streamed to a canonical file
    kvrecord     kvpool record: the engines' events to a recording
    export       the canonical trace written as a Mooncake or Bailian trace
"""

from analyzer.ingest.canonical import previews_path
from analyzer.ingest.detect import FORMATS, Format, detect_format
from analyzer.ingest.load import open_trace
from analyzer.ingest.options import IngestOptions, LoadedTrace, SkipSummary

__all__ = [
    "FORMATS",
    "Format",
    "IngestOptions",
    "LoadedTrace",
    "SkipSummary",
    "detect_format",
    "open_trace",
    "previews_path",
]
