"""Reading the inputs on a Ray cluster (``--ray [ADDRESS]``), with the output of one process.

The same pieces as ``--jobs`` (:func:`~analyzer.ingest.parallel.plan`: files, and byte
ranges of uncompressed JSON-lines logs, here at most ``PIECE_BYTES`` each so that a
large log spreads over a large cluster) become a Ray Dataset, one row per piece.
``map_batches`` runs :class:`PieceReader`, a pool of actors (one CPU each, as many as
the cluster has CPUs, at most one per piece), each holding one reader with its memos,
as a ``--jobs`` worker process does; the reader is the ``--jobs`` worker's own code
(:func:`analyzer.ingest.parallel.run_piece`). The driver adopts the pieces' rows in input
order with :func:`~analyzer.ingest.parallel.assemble`, so rows, hashes, order, skip
counts and notes are those of a one-process run.

What crosses the network: to the actors, the pieces (file path, byte range) and the
reading options (including the salt, which the hashes need); back to the driver, per
piece, the hashed rows (block and content hashes, token counts, timestamps, salted
pseudonyms of session, tenant and request ids unless ``--keep-names``), skip counts with
``file:line: reason`` examples, and 80-character previews only when they are asked for
(``--keep-previews``, ``--show-previews``). No prompt text and no token ids: so the
token-exact prefix lengths (``token_lcp_prev``), which need every request's tokens in
one tree, are not computed on Ray (a note says so; the block-level figures are exact).

The inputs are read by the actors from the same path as on the driver: on a cluster,
put them on storage every node mounts at the same path (NFS, a shared volume).

Ray is optional (the ``ray`` extra) and imported only when ``--ray`` is given
(:func:`import_ray`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, replace
from types import ModuleType
from typing import TypedDict

import pyarrow as pa

from analyzer.errors import InputError, KvpoolError, OutputError, UsageError
from analyzer.ingest.builder import TraceBuilder
from analyzer.ingest.options import IngestOptions, SkipSummary
from analyzer.ingest.parallel import (
    Piece,
    PieceFailed,
    PieceResult,
    WorkerSetup,
    assemble,
    init_worker,
    plan,
    run_piece,
    with_timing,
)
from analyzer.ingest.spool import SpoolFile
from analyzer.ingest.streams import SplitMisaligned
from analyzer.spill import new_dir, remove

INSTALL = "pip install 'kvpool-advisor[ray]'"
PIECE_BYTES = 64 << 20  # a byte range's largest size: enough pieces to spread the work
LOCAL = "local"  # --ray with no address: start a Ray instance on this machine
NOTE = (
    "token-exact prefix lengths not computed on Ray: they need every request's tokens in "
    "one tree, and only hashes and counts leave the workers; reuse figures use the "
    "block-level ceilings"
)


def import_ray() -> ModuleType:
    """The ``ray`` module, or a one-line usage error saying how to install it."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise UsageError(f"--ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


@contextlib.contextmanager
def connected(address: str) -> Iterator[ModuleType]:
    """Ray, connected to ``address`` (``local``: a new instance on this machine) for the
    duration; a connection already open in this process (a library caller's) is used
    as it is and left open."""
    ray = import_ray()
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its progress lines on stderr
    if ray.is_initialized():
        yield ray
        return
    _check_reachable(address)
    kwargs: dict[str, object] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address == LOCAL:
        kwargs["include_dashboard"] = False
    try:
        ray.init(address=address, **kwargs)  # "local" starts a new one, whatever runs here
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"cannot connect to the Ray cluster at {address}: {first}",
            hint="start one (ray start --head) and pass its address: auto, "
            "ray://HOST:10001 or HOST:6379; --ray alone starts one here",
        ) from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A ``HOST:PORT`` or ``ray://HOST:PORT`` address answered on its port: Ray itself
    retries an address where nothing listens for minutes before it gives up."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # auto, local: Ray finds (or starts) the instance itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot connect to the Ray cluster at {address}: nothing answers on "
            f"{hostport} ({getattr(exc, 'strerror', None) or exc})",
            hint="check the head's address and port (ray status on the head); "
            "ray:// takes the client port, 10001 by default",
        ) from None


class PieceRow(TypedDict):
    """A row :class:`PieceReader` returns: the piece's index, its encoded result
    (:func:`encode_result`) and its spooled rows (an Arrow IPC file's bytes)."""

    piece: int
    result: bytes
    rows: bytes


class PieceReader:
    """A Ray Data actor: reads, tokenizes and hashes the pieces it is given with the
    ``--jobs`` worker's code, and returns their rows as an Arrow IPC file's bytes."""

    def __init__(
        self, paths: list[str], fmts: list[str], opts: IngestOptions, cwd: str, pieces: list[Piece]
    ) -> None:
        if os.path.isdir(cwd):  # relative input paths and messages as on the driver
            os.chdir(cwd)
        init_worker(None, None)
        self._setup: WorkerSetup = (
            paths,
            fmts,
            opts,
            False,
            1,
        )  # no token tree; memos of one process
        self._pieces = pieces

    def __call__(self, batch: pa.Table) -> pa.Table:
        pieces, results, rows = [], [], []
        for i in batch.column("piece").to_pylist():
            res = self._read(self._pieces[i])
            data = b""
            if isinstance(res, PieceResult):
                data, res = _take_spool(res)
            pieces.append(i)
            results.append(encode_result(res))
            rows.append(data)
        return pa.table(
            {
                "piece": pa.array(pieces, pa.int64()),
                "result": pa.array(results, pa.large_binary()),
                "rows": pa.array(rows, pa.large_binary()),
            }
        )

    def _read(self, piece: Piece) -> PieceResult | PieceFailed:
        if not os.path.exists(piece.path):
            return PieceFailed(
                InputError,
                f"{piece.path}: not found on Ray node {socket.gethostname()}",
                "put the inputs on storage every node mounts at the same path",
            )
        return run_piece(piece, self._setup)


# A piece's result crosses the network as JSON (bytes fields in base64), never as a
# pickle: the driver decodes only these fields and these error kinds.
_KINDS: dict[str, type[KvpoolError]] = {
    k.__name__: k for k in (KvpoolError, UsageError, InputError, OutputError, SplitMisaligned)
}
_BYTES = ("iso", "lines", "id_hashes")
_SPOOL_BYTES = ("time", "prompt_tokens", "lcp_index")


def encode_result(res: PieceResult | PieceFailed) -> bytes:
    """A piece's result as JSON bytes (see :func:`decode_result`)."""
    if isinstance(res, PieceFailed):
        kind = res.kind.__name__ if res.kind.__name__ in _KINDS else "KvpoolError"
        doc: dict[str, object] = {
            "failed": {"kind": kind, "message": res.message, "hint": res.hint}
        }
    else:
        spool = asdict(res.spool)
        for k in _SPOOL_BYTES:
            spool[k] = base64.b64encode(spool[k]).decode()
        doc = {
            "spool": spool,
            **{k: base64.b64encode(getattr(res, k)).decode() for k in _BYTES},
            "lcp_dir": res.lcp_dir,
            "skipped": asdict(res.skipped),
            "previews": {str(h): list(v) for h, v in res.previews.items()},
            "stats": list(res.stats),
            "timed": res.timed,
        }
    return json.dumps(doc).encode()


def decode_result(blob: bytes) -> PieceResult | PieceFailed:
    """The result :func:`encode_result` wrote, rebuilt field by field."""
    doc = json.loads(blob)
    if "failed" in doc:
        f = doc["failed"]
        return PieceFailed(_KINDS.get(f["kind"], KvpoolError), f["message"], f["hint"])
    spool = doc["spool"]
    for k in _SPOOL_BYTES:
        spool[k] = base64.b64decode(spool[k])
    spool["batch_rows"] = tuple(spool["batch_rows"])
    # Previews keeps int block hashes as keys (JSON made them strings)
    previews: dict[int, tuple[str, str]] = {
        int(h): (v[0], v[1]) for h, v in doc["previews"].items()
    }
    res = PieceResult(
        spool=SpoolFile(**spool),
        iso=base64.b64decode(doc["iso"]),
        lines=base64.b64decode(doc["lines"]),
        id_hashes=base64.b64decode(doc["id_hashes"]),
        lcp_dir=doc["lcp_dir"],
        skipped=SkipSummary(**doc["skipped"]),
        previews=previews,
        stats=tuple(doc["stats"]),
        timed=doc["timed"],
    )
    return res


def _take_spool(res: PieceResult) -> tuple[bytes, PieceResult]:
    """The piece's spooled rows as bytes (its temporary folder on this node removed)."""

    d = res.spool.directory
    data = b""
    if d:
        with open(os.path.join(d, "rows.arrow"), "rb") as f:
            data = f.read()
        remove(d)
    return data, replace(res, spool=replace(res.spool, directory=""))


def _put_spool(data: bytes, res: PieceResult) -> PieceResult:
    """A piece's rows written back to a temporary spool folder on the driver."""
    if not data:
        return res

    d = str(new_dir("rows"))
    try:
        with open(os.path.join(d, "rows.arrow"), "wb") as f:
            f.write(data)
    except OSError as exc:  # a full temporary disk, in one line (as RowSpool says it)
        remove(d)
        raise OutputError(
            f"cannot write the temporary row spool in {tempfile.gettempdir()}: "
            f"{exc.strerror or exc}",
            hint="free space there, or point TMPDIR at a larger disk",
        ) from None
    return replace(res, spool=replace(res.spool, directory=d))


def read_ray(b: TraceBuilder, address: str) -> None:
    """Read ``b``'s inputs on the Ray cluster at ``address`` into ``b``, as
    :func:`~analyzer.ingest.parallel.read_parallel` does over local processes."""
    with connected(address) as ray:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        pieces, split_timing = with_timing(b, plan(b.paths, b.fmts, cpus, PIECE_BYTES))
        if b.lcp is not None:
            b.lcp = None
            b.notes.append(NOTE)
        work = [i for i, p in enumerate(pieces) if not p.in_parent]
        results: Iterator[PieceRow] = iter(())
        if work:
            wopts = replace(
                b.opts, block_size=b.block_size, salt=b.salt, exact=False, ray_address=None
            )
            ctx = ray.data.DataContext.get_current()
            ctx.execution_options.preserve_order = True
            ctx.enable_progress_bars = False
            items = [{"piece": i} for i in work]
            ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
                PieceReader,
                fn_constructor_args=(b.paths, b.fmts, wopts, os.getcwd(), pieces),
                compute=ray.data.ActorPoolStrategy(size=min(cpus, len(work))),
                batch_size=1,
                batch_format="pyarrow",
                num_cpus=1,
            )
            results = iter(ds.iter_rows())
        early: dict[int, tuple[bytes, bytes]] = {}

        def fetch(i: int, piece: Piece) -> PieceResult | PieceFailed:
            while i not in early:
                try:
                    row = next(results)
                except StopIteration:
                    raise InputError(
                        f"the Ray cluster returned no result for {piece.path}"
                    ) from None
                except KvpoolError:
                    raise
                except Exception as exc:  # a Ray task or actor failure
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    raise InputError(
                        f"a Ray worker reading {piece.path} failed: {type(exc).__name__} {first}",
                        hint="see the Ray logs of the cluster; retry with --jobs instead",
                    ) from None
                early[int(row["piece"])] = (row["result"], row["rows"])
            blob, data = early.pop(i)
            res = decode_result(blob)
            if isinstance(res, PieceResult):
                res = _put_spool(data, res)
                if b.advance is not None:
                    span = piece.span
                    b.advance(span.end - span.start if span else os.path.getsize(piece.path))
            return res

        assemble(b, pieces, split_timing, fetch)
