"""ingest stage: read request logs and public traces into one canonical block trace.

Public API::

    from analyzer.ingest import IngestOptions, LoadedTrace, open_trace, detect_format
    loaded = open_trace(["log.jsonl.gz"], IngestOptions(block_size=16))
"""

from analyzer.ingest.detect import FORMATS, Format, detect_format
from analyzer.ingest.options import IngestOptions, LoadedTrace, SkipSummary
from analyzer.ingest.pipeline import open_trace, previews_path

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
