"""The report's typed view (analyzer/report/document.py): a report.json read back gives
the object the renderers read, written out again it is the same document, and a
malformed or foreign file is a one-line error naming the file and the field.

The documents are real analyses of the bundled samples (their first lines, so the suite
stays fast): every sample, the TTFT objective, a log naming several models, one whose
responses carry cached_tokens, and one too small to decide. Hypothesis then varies them
the ways other documents differ: keys left out, figures null, numbers that are ints,
fields a later version adds."""

from __future__ import annotations

import copy
import json
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.advisor import AnalyzeOptions, run_analysis
from analyzer.advisor.figures import DeployOption, Objective, Thresholds, Verdict
from analyzer.errors import InputError
from analyzer.replay.config import Scenario
from analyzer.report import render_html, render_json, render_markdown
from analyzer.report.document import ReportDocument
from analyzer.report.plan_views import ReportView
from analyzer.report.schema import SCHEMA

ROOT = Path(__file__).resolve().parents[2]


def _head(tmp: Path, name: str, n: int, cached: bool = False) -> Path:
    with open(ROOT / "traces" / f"{name}.jsonl.zst", "rb") as fh:
        lines = zstandard.ZstdDecompressor().stream_reader(fh).read().decode().splitlines()
    out = []
    for line in lines[:n]:
        if cached:  # today's engine served a third of each prompt from its cache
            rec = json.loads(line)
            usage = rec["response"]["usage"]
            usage["prompt_tokens_details"] = {"cached_tokens": usage["prompt_tokens"] // 3}
            line = json.dumps(rec)
        out.append(line)
    p = tmp / f"{name}-{n}{'-cached' if cached else ''}.jsonl"
    p.write_text("\n".join(out) + "\n")
    return p


FAST = {"sensitivity_replays": False}


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict[str, ReportDocument]:
    tmp = tmp_path_factory.mktemp("report-docs")
    ttft = Thresholds(objective=Objective.TTFT)
    runs = {
        "chat": ([_head(tmp, "chat", 240)], AnalyzeOptions()),
        "chat-ttft": ([_head(tmp, "chat", 240)], AnalyzeOptions(thresholds=ttft, **FAST)),
        "mixed": ([_head(tmp, "mixed", 400)], AnalyzeOptions(**FAST)),
        "agent": ([_head(tmp, "agent", 120)], AnalyzeOptions(size_search=False, **FAST)),
        "cached": ([_head(tmp, "chat", 240, cached=True)], AnalyzeOptions(**FAST)),
        "tiny": ([_head(tmp, "chat", 20)], AnalyzeOptions()),
    }
    return {
        k: ReportDocument.of(run_analysis([str(p) for p in paths], o))
        for k, (paths, o) in runs.items()
    }


@pytest.mark.slow
def test_the_samples_cover_the_schema(documents):
    """The documents below exercise what the view reads: several models, a measured
    hit rate, no replay, both objectives."""
    assert (documents["mixed"].report.models.count or 0) > 1
    assert documents["cached"].report.measured_vs_projected is not None
    assert documents["tiny"].verdict == Verdict.INSUFFICIENT_DATA
    assert documents["tiny"].report.replay is None
    assert documents["chat-ttft"].report.verdict.objective == Objective.TTFT
    assert documents["chat"].report.verdict.objective == Objective.COST
    assert set(documents["chat"].report.scenarios) == set(Scenario) - {Scenario.NONE}
    assert set(documents["chat"].report.fleet) == set(documents["chat"].report.scenarios)


@pytest.mark.slow
def test_a_report_json_read_back_is_the_same_view_and_the_same_document(documents, tmp_path):
    for name, doc in documents.items():
        text = render_json(doc)
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        loaded = ReportDocument.load(path)
        assert loaded.report == doc.report, name
        d = json.loads(text)
        assert loaded.to_json() == d, name
        assert ReportView.from_json(d).to_json() == d, name
        assert render_json(loaded) == text, name
        # the renderers print the same rounded figures from either
        assert render_markdown(loaded) == render_markdown(doc), name
        assert render_markdown(d) == render_markdown(doc), name
    html = documents["chat"]
    assert render_html(json.loads(render_json(html))) == render_html(html)


def test_the_view_is_frozen_and_speaks_in_enums(documents):
    r = documents["chat"].report
    with pytest.raises(AttributeError):
        r.verdict.verdict = Verdict.DEPLOY_POOLED  # type: ignore[misc]
    assert isinstance(r.verdict.verdict, Verdict)
    assert all(isinstance(k, Scenario) for k in r.scenarios)
    assert all(isinstance(p.mode, DeployOption) for p in r.settings)
    assert all(isinstance(f.option, DeployOption) for f in r.deploy.files)
    assert r.summary == documents["chat"].summary and len(r.summary) == 3


# -- hypothesis: the same documents varied ---------------------------------------------------


def _paths(view: Any, where: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any, Any]]:
    """(path to a JSON value, the view field's metadata, the field's value) for every
    typed field (fields typed object (or Any) carry JSON as written, unchecked: left out)."""
    out = []
    if is_dataclass(view):
        hints = get_type_hints(type(view))
        for f in fields(view):
            if (
                f.metadata.get("rest")
                or f.metadata.get("missing")
                or hints[f.name] in (Any, object)
            ):
                continue
            v = getattr(view, f.name)
            if v is None and f.name in getattr(view, "missing", ()):
                continue
            out.append(((*where, f.name), f.metadata, v))
            out += _paths(v, (*where, f.name))
    elif isinstance(view, tuple):
        for i, v in enumerate(view[:3]):
            out += _paths(v, (*where, i))
    elif isinstance(view, dict):
        for k, v in list(view.items())[:3]:
            out += _paths(v, (*where, str(k)))
    return out


def _dotted(path: tuple[Any, ...]) -> str:
    """A path as the loader names it: ``gates.plan[0].criteria``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _at(doc: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    for p in path[:-1]:
        doc = doc[p]
    return doc, path[-1]


def _objects(doc: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(doc, dict):
        out.append(where)
        for k, v in doc.items():
            out += _objects(v, (*where, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _objects(v, (*where, i))
    return out


SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_varied_documents_round_trip(documents, data):
    doc = documents[data.draw(st.sampled_from(sorted(documents)))]
    d = doc.to_json()
    paths = _paths(doc.report)
    for _ in range(data.draw(st.integers(1, 6))):
        path, meta, view_value = data.draw(st.sampled_from(paths))
        try:
            parent, key = _at(d, path)
            value = parent[key]
        except (KeyError, IndexError, TypeError):  # under a key an earlier step removed
            continue
        move = data.draw(st.sampled_from(["drop", "null", "int", "extra"]))
        if move == "drop" and meta.get("absent"):
            del parent[key]
        elif move == "null" and meta.get("absent"):
            parent[key] = None
        elif move == "int" and isinstance(value, float) and value.is_integer():
            parent[key] = int(value)  # an int where a float is expected stays an int
        elif move == "extra" and isinstance(value, dict) and hasattr(view_value, "rest"):
            value[data.draw(st.sampled_from(["zz_new", "later_field"]))] = data.draw(
                st.none() | st.integers() | st.text(max_size=5) | st.lists(st.integers())
            )
    view = ReportView.from_json(d)
    assert view.to_json() == d
    assert ReportView.from_json(view.to_json()) == view
    assert json.dumps(view.to_json(), sort_keys=True) == json.dumps(d, sort_keys=True)


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_a_wrong_value_anywhere_is_named(documents, data):
    doc = documents[data.draw(st.sampled_from(["chat", "mixed", "cached"]))]
    d = doc.to_json()
    path, _, _ = data.draw(st.sampled_from(_paths(doc.report)))
    parent, key = _at(d, path)
    parent[key] = "x" if isinstance(parent[key], list) else [1]
    with pytest.raises(InputError) as e:
        ReportDocument.from_json(d, "my/report.json")
    first = str(e.value).splitlines()[0]
    assert first.startswith(f"my/report.json (field '{_dotted(path)}'): "), first


def test_a_foreign_or_broken_report_json_is_one_line_naming_file_and_field(documents, tmp_path):
    good = documents["chat"].to_json()
    cases: list[tuple[Any, str]] = [
        (
            {**good, "schema": "kvpool.report/1"},
            r"old\.json \(field 'schema'\): not a kvpool\.report/3",
        ),
        ([1, 2], r"old\.json: expected a JSON object, got a list"),
    ]
    no_verdict = copy.deepcopy(good)
    del no_verdict["verdict"]["verdict"]
    cases.append((no_verdict, r"\(field 'verdict\.verdict'\): missing"))
    bad_enum = copy.deepcopy(good)
    bad_enum["verdict"]["verdict"] = "maybe"
    cases.append((bad_enum, r"\(field 'verdict\.verdict'\): unknown verdict 'maybe'"))
    bad_scenario = copy.deepcopy(good)
    bad_scenario["replay"]["scenarios"]["warp"] = bad_scenario["replay"]["scenarios"]["local"]
    cases.append((bad_scenario, r"\(field 'replay\.scenarios\.warp'\): unknown scenario"))
    bad_option = copy.deepcopy(good)
    bad_option["settings"][0]["mode"] = "pool-everything"
    cases.append((bad_option, r"\(field 'settings\[0\]\.mode'\): unknown deploy option"))
    extra_top = {**good, "surprise": 1}
    cases.append((extra_top, r"\(field 'surprise'\): unknown field"))
    for doc, pattern in cases:
        p = tmp_path / "old.json"
        p.write_text(json.dumps(doc))
        with pytest.raises(InputError, match=pattern) as e:
            ReportDocument.load(p)
        assert "\n" not in str(e.value).split("\n  hint:")[0]
    p.write_text('{"schema": ')
    with pytest.raises(InputError, match=r"old\.json:1: invalid JSON"):
        ReportDocument.load(p)
    with pytest.raises(InputError, match="cannot read report"):
        ReportDocument.load(tmp_path / "absent.json")
    assert SCHEMA == "kvpool.report/3"
