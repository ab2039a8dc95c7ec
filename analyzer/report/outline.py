"""The report's one outline (:func:`sections`), which report.md and report.html both
render: verdict first, key figures, reuse (curve and sources), bandwidth (break-even),
scenarios, money, sensitivity, sized recommendation and settings, gate plan,
assumptions with sources, glossary. Tables are built once as rows and formatted by each
renderer (:mod:`analyzer.report.markdown_page`, :mod:`analyzer.report.html_page`), so
the two carry the same content; the HTML adds the charts as inline SVG. Everything
reads the document's typed view (:class:`analyzer.report.plan_views.ReportView`), never
its JSON keys.
"""

from __future__ import annotations

from analyzer.report.cells import Section, Table
from analyzer.report.log_sections import (
    bandwidth_section,
    engine_section,
    key_figures,
    measured_section,
    models_section,
    reuse_section,
    scenarios_section,
    summary_of,
    verdict_section,
)
from analyzer.report.plan_sections import (
    assumptions_section,
    deploy_section,
    economics_section,
    gates_section,
    isolation_section,
    pilot_section,
    sensitivity_section,
    settings_section,
    side_by_side_section,
    sizing_section,
)
from analyzer.report.plan_views import ReportView
from analyzer.report.summary import (
    glossary_rows,
)


def sections(doc: ReportView) -> list[Section]:
    out: list[Section] = [
        Section("summary", "Summary", paragraphs=[" ".join(summary_of(doc))]),
        verdict_section(doc),
        Section("figures", "Key figures", tables=[key_figures(doc)]),
        reuse_section(doc),
    ]
    for part in (
        models_section,
        engine_section,
        measured_section,
        bandwidth_section,
        scenarios_section,
        economics_section,
        isolation_section,
        side_by_side_section,
        sensitivity_section,
        sizing_section,
        settings_section,
        deploy_section,
        gates_section,
        pilot_section,
    ):
        section = part(doc)
        if section is not None:
            out.append(section)
    out.append(assumptions_section(doc))
    out.append(
        Section("glossary", "Glossary", tables=[Table(["Term", "Meaning"], glossary_rows())])
    )
    return out
