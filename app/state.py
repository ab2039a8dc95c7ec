"""What the dashboard session remembers: the trace being looked at and how to show errors.

Pages call :func:`loaded_trace` to get the loaded trace (ingested once per file content
and ingest options, see :mod:`app.compute`) and :func:`guard` around analyzer calls so a
user's mistake becomes a message on the page instead of a traceback.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from analyzer.errors import KvpoolError
from analyzer.quoting import st_text
from app.command import ENV_INPUT, ENV_SCRATCH, max_upload_mb, start_fields

REPO = Path(__file__).resolve().parents[1]
SAMPLES_DIR = REPO / "traces"
# Preferred first sample: the mixed workload shows every page at its best.
PREFERRED_SAMPLES = ("mixed", "chat", "agent", "rag", "api")

SOURCE_KEY = "kvpool.source"
CALIBRATION_KEY = "kvpool.calibration"
INGEST_KEY = "kvpool.ingest"


@dataclass(frozen=True, slots=True)
class Source:
    """A trace the user picked: one or more files and how to name them on the page."""

    label: str
    paths: tuple[str, ...]
    kind: str  # "sample" | "upload" | "path" | "cli"


@dataclass(frozen=True, slots=True)
class IngestChoice:
    """The ingest options the load page exposes (the cache key of ingestion)."""

    block_size: int | None = None  # None: 16 for text logs, the trace's own for hashed ones
    strict: bool = False
    tenant_field: str | None = None  # None: the format's own (docs/formats.md)
    user_field: str | None = None

    def key(self) -> tuple[tuple[str, object], ...]:
        return (
            ("block_size", self.block_size),
            ("strict", self.strict),
            ("tenant_field", self.tenant_field),
            ("user_field", self.user_field),
        )


def bundled_samples() -> list[Path]:
    """Bundled sample traces, preferred ones first."""
    if not SAMPLES_DIR.is_dir():
        return []
    found = sorted(
        p for p in SAMPLES_DIR.iterdir() if p.name.endswith((".jsonl.zst", ".jsonl.gz", ".jsonl"))
    )
    rank = {name: i for i, name in enumerate(PREFERRED_SAMPLES)}
    return sorted(found, key=lambda p: (rank.get(p.name.split(".")[0], len(rank)), p.name))


def default_source() -> Source | None:
    """The trace to open first: ``kvpool dashboard INPUT``, else a bundled sample."""
    given = os.environ.get(ENV_INPUT)
    if given:
        return Source(label=Path(given).name, paths=(given,), kind="cli")
    samples = bundled_samples()
    if samples:
        return Source(label=samples[0].name, paths=(str(samples[0]),), kind="sample")
    return None


def source() -> Source | None:
    if SOURCE_KEY not in st.session_state:
        st.session_state[SOURCE_KEY] = default_source()
    return st.session_state[SOURCE_KEY]


def set_source(src: Source) -> None:
    """Switch to another trace; rerun so the sidebar and every page show the new one."""
    if st.session_state.get(SOURCE_KEY) != src:
        st.session_state[SOURCE_KEY] = src
        st.rerun()


def calibration() -> tuple[str, bytes] | None:
    """The calibration CSV (name, bytes) the replay should use, if the user chose one."""
    return st.session_state.get(CALIBRATION_KEY)


def set_calibration(value: tuple[str, bytes] | None) -> None:
    st.session_state[CALIBRATION_KEY] = value


def ingest_choice() -> IngestChoice:
    """The load page's ingest options; at first, the fields `kvpool dashboard` named."""
    if INGEST_KEY not in st.session_state:
        tenant, user = start_fields()
        return IngestChoice(tenant_field=tenant, user_field=user)
    return st.session_state[INGEST_KEY]


def set_ingest_choice(choice: IngestChoice) -> None:
    st.session_state[INGEST_KEY] = choice


class UploadTooLarge(KvpoolError):
    """An upload over ``KVPOOL_MAX_UPLOAD_MB``."""


_UPLOAD_DIR: Path | None = None


def scratch_dir() -> Path:
    """This server's temporary folder (uploads, calibration CSVs); one per process."""
    global _UPLOAD_DIR
    if _UPLOAD_DIR is None:
        import atexit
        import shutil

        # Made by kvpool dashboard, which removes it when the server stops; removed here
        # too, for a parent killed with SIGKILL (the server then gets SIGTERM) and for a
        # `streamlit run` by hand.
        given = os.environ.get(ENV_SCRATCH)
        if given and Path(given).is_dir():
            _UPLOAD_DIR = Path(given)
        else:
            from analyzer.spill import new_dir

            _UPLOAD_DIR = new_dir("dashboard")
        atexit.register(shutil.rmtree, _UPLOAD_DIR, ignore_errors=True)
    return _UPLOAD_DIR


def save_upload(name: str, data: bytes) -> Source:
    """Write an uploaded file where ingestion can read it; refuse it over the size limit.

    The file keeps its own name (its suffix tells gzip/zstd and CSV apart) inside a
    folder named by its content hash, so two uploads with the same name never collide.
    """
    limit_mb = max_upload_mb()
    if len(data) > limit_mb * 1_000_000:
        raise UploadTooLarge(
            f"{name} is {len(data) / 1e6:,.1f} MB, over the {limit_mb} MB upload limit",
            hint="convert it first (kvpool convert FILE -o trace.parquet) and open the "
            "Parquet file by path, or raise KVPOOL_MAX_UPLOAD_MB",
        )
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = scratch_dir() / "uploads" / digest
    folder.mkdir(parents=True, exist_ok=True)
    safe = Path(name).name or "upload"
    path = folder / safe
    if not path.exists():
        path.write_bytes(data)
    return Source(label=safe, paths=(str(path),), kind="upload")


# The analyzer's messages name command-line flags; on the dashboard the same setting is
# a control in the sidebar (or on a page), so a message says the control's name.
GUI_WORDS = {
    "--model": "Model",
    "--gpu": "GPU",
    "--tp": "Tensor parallel (GPUs per instance)",
    "--kv-dtype": "KV cache dtype",
    "--instances": "Instances",
    "--gpus-per-node": "GPUs per node",
    "--router": "Router",
    "--eviction": "Eviction policy",
    "--dram-scope": "Host DRAM cache",
    "--dram-tier": "Host DRAM link",
    "--dram-gbps": "DRAM bandwidth",
    "--pool-tier": "Pool network",
    "--pool-gbps": "Pool bandwidth per node",
    "--local-capacity-tokens": "HBM prefix cache per instance",
    "--pool-capacity-tokens": "Pool capacity",
    "--dram-capacity-tokens": "Host DRAM per node",
    "--ttft-slo": "TTFT SLO",
    "--warmup": "Warm-up",
    "--block-size": "Block size (Load a trace)",
    "--strict": "Strict (Load a trace)",
    "--calibration": "Calibration CSV (Cost model)",
    "--gpu-hour-usd": "GPU ($ per GPU-hour)",
    "--dram-gb-month-usd": "Host DRAM ($ per GB-month)",
    "--nvme-tb-month-usd": "NVMe ($ per TB-month)",
    "--nic-node-month-usd": "Pool NIC ($ per node-month)",
    "--store-month-usd": "Pool store operation ($ per month)",
    "--objective": "Decide on",
}
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def gui_words(text: str) -> str:
    """``text`` with each command-line flag the dashboard has a control for replaced by
    that control's name in quotes: "raise --tp" reads "raise 'Tensor parallel (GPUs per
    instance)'"."""
    return _FLAG.sub(
        lambda m: f"'{GUI_WORDS[m.group(0)]}'" if m.group(0) in GUI_WORDS else m.group(0), text
    )


@contextmanager
def guard() -> Iterator[None]:
    """Show a user's mistake (:class:`KvpoolError`) as an error box and stop the page,
    in the dashboard's words (:func:`gui_words`)."""
    try:
        yield
    except KvpoolError as exc:
        st.error(st_text(gui_words(exc.message)))  # names files and values: text only
        if exc.hint:
            st.caption(f"Hint: {st_text(gui_words(exc.hint))}")
        st.stop()


def loaded_trace():
    """The current trace (``app.compute.Current``), ingested or from the cache; stops the
    page when none is chosen."""
    from app import compute, workers

    src = source()
    if src is None:
        st.info("No trace loaded yet: open one on the **Load a trace** page.")
        st.stop()
    from app import controls

    isolation = (
        controls.current().isolation if controls.WHATIF_KEY in st.session_state else "shared"
    )
    cur = compute.ingest(src.paths, ingest_choice().key(), isolation)
    if cur.trace.n_requests >= workers.MIN_REQUESTS:
        workers.warm_up()  # the replay processes start while the user reads this page
    return cur


def require_content(trace, what: str) -> None:
    """Stop a page that needs prompt content when the trace is count-only."""
    if trace.count_only:
        st.warning(
            f"This trace is **count-only** (arrival times and lengths, no prompt content or "
            f"block hashes, as in the Azure and BurstGPT traces), so {what} cannot be "
            "measured from it. Load a log with prompts or hashed blocks to see this page."
        )
        st.stop()
