"""Figures the model leaves undefined get a typed "not applicable" form, and the logs
that have them get every report.

A log whose median reusable prefix is short (a 20-word system prompt on one-shot API
calls, classification traffic, a tokenizer counting half the tokens) has no break-even
bandwidth: loading never beats recomputing there, and the cost model says so with an
infinity. `kvpool analyze` used to store it, JSON turned it into null and the report view
refused it, so the most common answer, `not-worth-it`, came as a traceback.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.advisor import AnalyzeOptions, run_analysis
from analyzer.advisor.figures import Undefined, lookup, show
from analyzer.report import render_html, render_json, render_markdown
from analyzer.report.document import ReportDocument
from analyzer.report.schema import NotApplicable

WORDS = [
    "order",
    "invoice",
    "refund",
    "shipping",
    "parcel",
    "account",
    "password",
    "billing",
    "address",
    "delivery",
    "warranty",
    "coupon",
    "receipt",
    "payment",
    "tracking",
    "return",
    "exchange",
    "balance",
    "subscription",
    "plan",
]
SYSTEM = (
    "You are a helpful support agent for an online shop. Answer briefly, politely and "
    "only about orders."
)  # 20 words


def _line(t: float, messages: list[dict]) -> str:
    return json.dumps({"timestamp": t, "request": {"model": "llama-3.1-8b", "messages": messages}})


def one_shot_log(path: Path, n: int = 240, system: str = SYSTEM) -> Path:
    """One-shot API calls: the same short system prompt, a different question each."""
    rng = random.Random(7)
    lines = [
        _line(
            1.7e9 + 0.5 * i,
            [
                {"role": "system", "content": system},
                {"role": "user", "content": " ".join(rng.choices(WORDS, k=12)) + f" #{i}"},
            ],
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def classification_log(path: Path, n: int = 240) -> Path:
    """Classification traffic: one instruction line, a short text to label each time."""
    rng = random.Random(11)
    lines = [
        _line(
            1.7e9 + 0.25 * i,
            [
                {
                    "role": "user",
                    "content": "Classify the sentiment as positive, negative or neutral: "
                    + " ".join(rng.choices(WORDS, k=8)),
                }
            ],
        )
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_a_short_prefix_gives_a_not_applicable_break_even_in_words(tmp_path):
    log = one_shot_log(tmp_path / "oneshot.jsonl")
    result = run_analysis([str(log)], AnalyzeOptions(size_search=False))
    assert result.verdict == "not-worth-it"
    doc = ReportDocument.of(result)
    bw = doc.report.bandwidth
    assert bw is not None
    assert bw.break_even_gbps == NotApplicable(
        Undefined.LOADING_NEVER_PAYS, Undefined.LOADING_NEVER_PAYS.words
    )
    # the prefix's own prefill may still save some time, less than placing its KV takes
    rate = bw.prefill_tokens_per_s
    assert isinstance(rate, NotApplicable) or rate > 0
    assert doc.report.uncertainty is not None
    assert isinstance(doc.report.uncertainty.break_even_gbps, NotApplicable)
    # the JSON says it in a form a reader of report.json can test for, and loads back
    text = render_json(doc)
    raw = json.loads(text)
    assert raw["bandwidth"]["break_even_gbps"] == {
        "not_applicable": "loading-never-pays",
        "reason": "loading never beats recomputing at these prefix lengths",
    }
    assert "null" not in json.dumps(raw["bandwidth"])
    again = ReportDocument.from_json(raw)
    assert again.report == doc.report
    assert render_json(again) == text
    # every renderer says it in words, never "inf"
    words = Undefined.LOADING_NEVER_PAYS.words
    md, html = render_markdown(doc), render_html(doc)
    for out in (md, html):
        assert words in out
        assert "inf GB/s" not in out and "nan" not in out.lower().split()
    reasons = " ".join(doc.report.verdict.reasons)
    assert "never pays" in reasons and "inf" not in reasons
    # the reason's figure is the document's own
    v = raw["verdict"]
    (i,) = [k for k, t in enumerate(v["reasons"]) if "never pays" in t]
    (fact,) = v["reason_facts"][i]
    assert fact["figure"] == "bandwidth.prefix_tokens"
    assert show(lookup(raw, fact["figure"]), fact["unit"]) in v["reasons"][i]
    assert "never beats recomputing" in doc.report.verdict.confidence_statement


@pytest.mark.slow
def test_the_terminal_summary_says_it_in_words(tmp_path):
    from rich.console import Console

    from analyzer.cli.analyze import print_summary

    log = one_shot_log(tmp_path / "oneshot.jsonl")
    doc = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(size_search=False)))
    console = Console(record=True, width=400, color_system=None)
    print_summary(console, doc.report, {})
    out = console.export_text()
    assert "Break-even bandwidth" in out
    assert Undefined.LOADING_NEVER_PAYS.words in out
    assert "inf" not in out.split()


@pytest.mark.slow
def test_a_view_refuses_a_null_where_a_figure_or_its_reason_belongs(tmp_path):
    log = one_shot_log(tmp_path / "oneshot.jsonl")
    raw = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(size_search=False))).to_json()
    raw["bandwidth"]["break_even_gbps"] = None
    with pytest.raises(Exception, match=r"bandwidth.break_even_gbps.*null"):
        ReportDocument.from_json(raw)
    raw["bandwidth"]["break_even_gbps"] = {"not_applicable": "no-such-reason", "reason": "x"}
    with pytest.raises(Exception, match=r"bandwidth.break_even_gbps.not_applicable"):
        ReportDocument.from_json(raw)


SYNTH_CHAT = (
    sys.executable,
    "-m",
    "analyzer.cli",
    "-q",
    "synth",
    "--profile",
    "chat",
    "-n",
    "300",
    "--seed",
    "3",
)


def _analyze(log: Path, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "analyzer.cli", "-q", "analyze", str(log), "-o", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "flags"),
    [
        ("one-shot", ()),  # with the SLO rate search, as a user runs it
        ("classification", ("--no-size-search",)),
        ("token-ratio", ("--no-size-search", "--token-ratio", "0.5")),
    ],
)
def test_short_prefix_logs_get_three_reports_and_a_bundle(tmp_path, case, flags):
    if case == "classification":
        log = classification_log(tmp_path / "log.jsonl")
    elif case == "token-ratio":
        # a 60-word system prompt, counted at half its tokens
        log = one_shot_log(tmp_path / "log.jsonl", system=" ".join([SYSTEM] * 3))
    else:
        log = one_shot_log(tmp_path / "log.jsonl")
    out = tmp_path / "report"
    out.mkdir()
    r = _analyze(log, out, *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    for name in ("report.json", "report.md", "report.html"):
        assert (out / name).stat().st_size > 0, name
    doc = ReportDocument.load(out / "report.json")
    assert doc.verdict == "not-worth-it"
    assert doc.report.deploy.files
    assert (out / "deploy" / "README.md").is_file()
    for f in doc.report.deploy.files:
        assert (out / f.path).read_text() == f.text
    assert isinstance(doc.report.bandwidth.break_even_gbps, NotApplicable)
    assert Undefined.LOADING_NEVER_PAYS.words in (out / "report.md").read_text()
    assert "never" in r.stdout


@pytest.mark.slow
def test_without_the_size_search_nothing_is_sized_and_the_summary_says_why(tmp_path):
    log = one_shot_log(tmp_path / "oneshot.jsonl")
    doc = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(size_search=False)))
    raw = doc.to_json()
    assert raw["plans"] == [] and raw["fleet"] == {}
    summary = " ".join(doc.summary)
    assert Undefined.SIZE_SEARCH_OFF.words in summary
    assert "not priced" not in summary  # a GPU price is there; no GPUs were counted
    assert ReportDocument.from_json(json.loads(render_json(doc))).report == doc.report


@pytest.mark.slow
def test_a_plan_without_a_size_says_why_in_every_cell(tmp_path):
    # A 1 ms p90 TTFT SLO: no request's own prefill is that fast, at any size.
    log = one_shot_log(tmp_path / "oneshot.jsonl")
    doc = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(ttft_slo_s=0.001, max_gpus=4)))
    raw = doc.to_json()
    assert raw["verdict"]["verdict"] == "cannot-meet-slo"
    reasons = {Undefined.SLO_NEVER_MET, Undefined.PREFILL_BOUND, Undefined.ABOVE_CAP}
    assert raw["fleet"] and raw["plans"]
    for name, f in raw["fleet"].items():
        for key in ("instances", "gpus", "nodes", "ttft_s", "hit_rate", "gpus_saved"):
            assert f[key]["not_applicable"] in reasons, (name, key)
            assert f[key]["reason"] == Undefined(f[key]["not_applicable"]).words
        for key in ("gpu_usd_month", "total_usd_month"):
            assert f["money"][key]["not_applicable"] in reasons, (name, key)
        assert f["net_usd_month"]["not_applicable"] in reasons
        want = "baseline" if name == "local" else f["net_usd_month"]["not_applicable"]
        assert f["payback_months"]["not_applicable"] == want
    for p in raw["plans"]:
        assert all(p[k]["not_applicable"] in reasons for k in ("instances", "gpus", "ttft_s"))
    md = render_markdown(doc)
    shorts = {Undefined(f["gpus"]["not_applicable"]).short for f in raw["fleet"].values()}
    for short in shorts:
        assert f"| {short} |" in md
    for code in {f["gpus"]["not_applicable"] for f in raw["fleet"].values()}:
        assert f"{Undefined(code).short}: {Undefined(code).words}." in md
    assert ReportDocument.from_json(json.loads(render_json(doc))).report == doc.report


@pytest.mark.slow
def test_a_log_of_one_timestamp_has_no_rate_and_its_pilot_sends_all_at_once(tmp_path):
    log = one_shot_log(tmp_path / "burst.jsonl", system=" ".join([SYSTEM] * 20))
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**x, "timestamp": 1.7e9}) + "\n" for x in rows))
    doc = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(size_search=False)))
    load = doc.report.economics.load
    assert load is not None
    for x in (load.mean_rps, load.peak_rps, load.peak_factor):
        assert x == NotApplicable(Undefined.NO_REQUEST_RATE, Undefined.NO_REQUEST_RATE.words)
    assert load.peak_window_s == 300
    cmds = {c.tool: c for c in doc.report.pilot.commands}
    assert "--request-rate inf " in cmds["vLLM bench serve"].command
    assert "--request-rate 0" not in render_markdown(doc)
    assert "share one timestamp" in cmds["AIPerf"].note
    assert Undefined.NO_REQUEST_RATE.words in render_markdown(doc)


@pytest.mark.slow
def test_a_log_that_reuses_nothing_has_no_median_prefix(tmp_path):
    rng = random.Random(3)
    log = tmp_path / "unique.jsonl"
    log.write_text(
        "".join(
            _line(1.7e9 + i, [{"role": "user", "content": " ".join(rng.choices(WORDS, k=30))}])
            + "\n"
            for i in range(220)
        )
    )
    doc = ReportDocument.of(run_analysis([str(log)], AnalyzeOptions(size_search=False)))
    rf = doc.report.reuse.figures
    assert rf.ceiling_hit_rate == 0  # every prompt differs within its first block
    assert rf.median_prefix_tokens == NotApplicable(Undefined.NO_REUSE, Undefined.NO_REUSE.words)
    assert Undefined.NO_REUSE.words in render_markdown(doc)
    assert doc.verdict == "not-worth-it" and doc.report.deploy.files
    assert ReportDocument.from_json(json.loads(render_json(doc))).report == doc.report


@pytest.mark.slow
def test_a_cluster_no_size_fits_gets_a_report_that_reads_back(tmp_path):
    """3,000 tokens of HBM per instance hold no running batch of an aggregated engine, so
    no option is sized within --max-gpus: the report names the replayed cluster's nodes
    (not null, which its typed view refuses) and says no deployment meets the SLO."""
    log = tmp_path / "log.jsonl"
    made = subprocess.run(
        [*SYNTH_CHAT, "-o", str(log)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    out = tmp_path / "report"
    r = _analyze(
        log,
        out,
        "--local-capacity-tokens=3000",
        "--gpus-per-node=1",
        "--router=round-robin",
        "--max-gpus=2",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = ReportDocument.load(out / "report.json")
    assert doc.verdict == "cannot-meet-slo"
    assert isinstance(doc.report.replay.cluster.nodes, int)
    assert "No deployment meets" in r.stdout
