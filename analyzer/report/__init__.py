"""report stage: the analysis as JSON (``kvpool.report/3``), Markdown and self-contained HTML.

Public API::

    from analyzer.report import ReportDocument, render_html, render_markdown, write_reports
    doc = ReportDocument.of(result)         # result: analyzer.advisor.run_analysis(...)
    paths = write_reports(doc, "out/")      # {"html": .../report.html, "md": ..., "json": ...}

Every renderer reads the same document: the typed view
(:class:`~analyzer.report.plan_views.ReportView`) of a :class:`ReportDocument`, whose schema
:mod:`analyzer.report.document` alone defines, made fresh or from a ``report.json`` loaded
back (:meth:`ReportDocument.load`), so the three outputs carry the same content.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.errors import OutputError
from analyzer.outputs import atomic_path, atomic_paths, report_dir
from analyzer.quoting import json_text
from analyzer.report.charts import all_charts
from analyzer.report.document import ReportDocument, report_json
from analyzer.report.html_page import render_html_doc
from analyzer.report.markdown_page import render_markdown_doc
from analyzer.report.plan_views import ReportView
from analyzer.report.schema import SCHEMA

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
# Headless Chromium: no GPU, network chatter or first-run setup. Shared by the PDF printer
# and the browser tests. The sandbox stays on unless it cannot work: Chromium refuses to
# start sandboxed as root (containers, CI), so only there is --no-sandbox added, or when
# KVPOOL_CHROMIUM_NO_SANDBOX=1 says the host lacks the user namespaces it needs.
CHROMIUM_FLAGS = (
    *(
        ("--no-sandbox",)
        if os.geteuid() == 0 or os.environ.get("KVPOOL_CHROMIUM_NO_SANDBOX") == "1"
        else ()
    ),
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


if TYPE_CHECKING:
    from analyzer.advisor.pipeline import AnalysisResult

    # a fresh document (or the analysis it is made of, or its typed view), or a
    # report.json loaded back
    Document = ReportDocument | ReportView | AnalysisResult | dict[str, Any]


def _doc(document: Document) -> ReportView:
    """The document's typed view, with keys in the order report.json reads back in:
    every renderer sees the same figures in the same order whether it is given a fresh
    document or a reloaded file (a malformed dict is an InputError naming the field)."""
    if isinstance(document, ReportView):
        return document
    if isinstance(document, ReportDocument):
        return document.report
    if isinstance(document, dict):
        loaded = json.loads(json.dumps(document, sort_keys=True))
        return ReportDocument.from_json(loaded, "the report document").report
    return ReportDocument.of(document).report


def render_json(document: Document) -> str:
    """Deterministic JSON text: sorted keys, floats already rounded, no timestamps."""
    text = json_text(_doc(document).to_json(), sort_keys=True, indent=2, ensure_ascii=False)
    return text + "\n"


def render_markdown(document: Document) -> str:

    return render_markdown_doc(_doc(document))


def render_html(document: Document) -> str:

    doc = _doc(document)
    return render_html_doc(doc, all_charts(doc))


def find_chromium() -> str | None:
    for c in CHROMIUM_CANDIDATES:
        if Path(c).is_file():
            return c
    return shutil.which("chromium")


def write_pdf(html_path: Path, pdf_path: Path) -> bool:
    """Print the HTML to PDF with headless Chromium; False when Chromium is absent."""
    exe = find_chromium()
    if exe is None:
        return False
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            exe,
            "--headless",
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            "--no-pdf-header-footer",
            f"--print-to-pdf={pdf_path}",
            html_path.resolve().as_uri(),
        ]
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise OutputError(f"Chromium could not print {html_path} to PDF: {exc}") from exc
    return pdf_path.is_file() and pdf_path.stat().st_size > 0


def write_deploy(document: Document, out: Path) -> bool:
    """Write the document's deployment bundle to ``out/deploy/`` (launch scripts
    executable). The folder is built beside the old one and swapped in, so a failed
    write never leaves a mix of two analyses' files."""
    staged = _stage_deploy(_doc(document), out)
    if staged is None:
        return False
    _swap_in(staged, out / "deploy")
    return True


def _stage_deploy(doc: ReportView, out: Path) -> Path | None:
    """The bundle written whole into ``out/.deploy.tmp`` (None: the analysis sized none);
    a failed write (a full disk, a signal) leaves no half-built folder beside it."""
    files = doc.deploy.files
    if not files:
        return None
    tmp = out / ".deploy.tmp"
    for d in (tmp, out / ".deploy.old"):
        if d.exists():
            shutil.rmtree(d)
    try:
        for f in files:
            rel = Path(f.path)
            # Paths come from analyzer.advisor.deploy; never let one leave deploy/.
            assert rel.parts[0] == "deploy" and ".." not in rel.parts and not rel.is_absolute()
            target = tmp.joinpath(*rel.parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f.text, encoding="utf-8")
            if f.kind == "bash":
                target.chmod(0o755)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def _swap_in(staged: Path, final: Path) -> None:
    """``staged`` renamed to ``final``, the old ``final`` removed after."""
    old = final.with_name(".deploy.old")
    if final.exists():
        final.rename(old)
    staged.rename(final)
    if old.exists():
        shutil.rmtree(old)


def deploy_zip(document: Document) -> bytes:
    """The deployment bundle as one zip (fixed timestamps: the same document gives the
    same bytes), for the dashboard's download."""

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for f in _doc(document).deploy.files:
            info = zipfile.ZipInfo(f.path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if f.kind == "bash" else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, f.text)
    return buf.getvalue()


def write_reports(
    document: Document, out_dir: str | Path, *, pdf: bool = False, force: bool = False
) -> dict[str, Path]:
    """Write report.json, report.md and report.html (and report.pdf with ``pdf``), and
    the deployment bundle in ``deploy/`` when the analysis sized one, as one unit.

    Everything is rendered first, then written beside its target (the reports as
    temporary files, the bundle as ``.deploy.tmp``); only when all of it is written are
    the bundle and then the reports renamed into place (analyzer/outputs.py). A full disk
    or a signal on the way leaves the folder as it was: never reports pointing at a
    bundle that is not there. The PDF is printed last, from report.html in place. An
    ``out_dir`` that already holds files is kept: the reports go to ``out_dir-2`` (the
    returned paths say where) unless ``force``. A folder made for this run is removed
    again if any of its writes fails.
    """

    doc = _doc(document)
    texts = {"json": render_json(doc), "md": render_markdown(doc), "html": render_html(doc)}
    existed = Path(out_dir).exists()
    out, _ = report_dir(out_dir, force=force)
    made = not existed or out != Path(out_dir)  # a folder of this run's own
    paths = {k: out / f"report.{k}" for k in texts}
    staged: Path | None = None
    try:
        with atomic_paths(list(paths.values()), force=force) as temps:
            for tmp, text in zip(temps, texts.values(), strict=True):
                tmp.write_text(text, encoding="utf-8")
            try:
                staged = _stage_deploy(doc, out)
            except OSError as exc:
                raise OutputError(f"cannot write {out / 'deploy'}: {exc.strerror or exc}") from exc
            if staged is not None:  # everything is written: the renames begin
                _swap_in(staged, out / "deploy")
                staged = None
                paths["deploy"] = out / "deploy"
        if pdf and find_chromium() is not None:  # printed from report.html in place
            with atomic_path(out / "report.pdf", force=force) as tmp_pdf:
                if not write_pdf(paths["html"], tmp_pdf):
                    raise OutputError(f"Chromium printed no PDF of {paths['html']}")
            paths["pdf"] = out / "report.pdf"
    except BaseException:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
        if made:  # a failed run leaves no folder of half its reports
            shutil.rmtree(out, ignore_errors=True)
        raise
    return paths


__all__ = [
    "CHROMIUM_FLAGS",
    "SCHEMA",
    "Report",
    "ReportDocument",
    "deploy_zip",
    "find_chromium",
    "render_html",
    "render_json",
    "render_markdown",
    "report_json",
    "write_deploy",
    "write_pdf",
    "write_reports",
]
