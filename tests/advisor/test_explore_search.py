"""The explore stage's searches (analyzer.advisor.explore) on a log whose load decides
the size: what each flip replays, and that it replays what its row says."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from analyzer.advisor import Thresholds, run_analysis
from analyzer.advisor.explore import SIDE_INSTANCES_MULTIPLE
from analyzer.advisor.replay import LocalReplayer, Services
from analyzer.advisor.size import SizeQuestion, SizeSearch, start_after

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_logs", ROOT / "tests" / "fixtures" / "advisor" / "make_logs.py"
)
make_logs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_logs)


@dataclass(frozen=True, slots=True)
class Asked:
    question: SizeQuestion
    search: SizeSearch


class Recording(LocalReplayer):
    """A replayer that keeps every search it was asked, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[Asked] = []

    def size(self, searches):
        out = super().size(searches)
        for sr, s in zip(searches, out, strict=True):
            q = sr.question  # as it started: after its baseline, where that one ended
            if sr.after is not None:
                q = start_after(q, searches[sr.after].question, out[sr.after])
            self.asked.append(Asked(q, s))
        return out


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """A log 4 instances of which serve at x1 but one does not at x2."""
    d = tmp_path_factory.mktemp("explore-logs")
    log = make_logs.high_reuse(d / "busy.jsonl", n=200, gap_s=0.04)
    opts = replace(
        make_logs.pooled_options(),
        sensitivity_replays=True,
        thresholds=Thresholds(min_requests=100),  # cost first: each plan is its search's
    )
    rec = Recording()
    r = run_analysis([str(log)], opts, services=Services(rec))
    return r, rec.asked


def test_the_load_flip_replays_twice_the_plans_load(busy):
    r, asked = busy
    plan_scale = r.plans[0].load.time_scale
    twice = [a for a in asked if a.question.time_scale == pytest.approx(plan_scale / 2)]
    assert {a.question.spec.name for a in twice} == {p.option for p in r.plans}
    for a in twice:
        plan = next(p for p in r.plans if p.option == a.question.spec.name)
        assert plan.instances is not None and a.search.instances is not None
        assert a.search.instances >= plan.instances
    # on this log twice the load needs more of some option than the plan
    assert any(
        a.search.instances > next(p.instances for p in r.plans if p.option == a.question.spec.name)
        for a in twice
    )
    row = next(f for f in r.flips if f.dimension == "load")
    assert f"{2 * r.plans[0].load.peak_rps:.3g} requests/s" in row.label


def test_each_search_starts_where_the_answer_probably_is(busy):
    """The plan's options start one below the baseline's answer; the load flip's
    searches replay no count below the plan's answer (more load never needs fewer);
    the looser SLO's none above it."""
    r, asked = busy
    plan_scale, slo = r.plans[0].load.time_scale, r.plans[0].ttft_slo_s
    own = [a for a in asked if a.question.time_scale == plan_scale and a.question.ttft_slo_s == slo]
    base = next(a for a in own if a.question.spec.name == "local")
    assert base.search.instances is not None
    for a in own[1:4]:
        assert a.question.start == max(1, base.search.instances - 1) and a.question.near
    answers = {a.question.spec.name: a.search.instances for a in own[:4]}
    for a in asked:
        q, found = a.question, answers[a.question.spec.name]
        assert found is not None
        if q.time_scale == pytest.approx(plan_scale / 2) or q.ttft_slo_s < slo:
            assert q.fails_to == found - 1
            assert all(p.instances >= found for p in a.search.probes)
        elif q.ttft_slo_s > slo:
            assert q.passes_at == found
            assert all(p.instances <= found for p in a.search.probes)


def test_side_by_side_rows_search_within_the_cap_only(busy):
    """The plan looks above the cap for the size that would meet the SLO; a row for
    another GPU or model does not (each count above it costs more than the last)."""
    r, asked = busy
    here = (r.plans[0].gpu, r.plans[0].model)
    side = [a for a in asked if (a.question.cfg.gpu, a.question.cfg.model) != here]
    own = [a for a in asked if (a.question.cfg.gpu, a.question.cfg.model) == here]
    assert side and own
    assert all(a.question.beyond is None for a in side)
    assert all(a.question.beyond is not None and a.question.beyond > a.question.cap for a in own)
    verdict = next(f for f in r.fleets if f.option == (r.decision.scenario or "local"))
    assert verdict.instances is not None
    for a in side:
        assert all(p.instances <= a.question.cap for p in a.search.probes)
        # no further than SIDE_INSTANCES_MULTIPLE x the verdict's instances: no alternative
        assert a.question.cap <= SIDE_INSTANCES_MULTIPLE * verdict.instances
    rows = [o for c in r.side_by_side[1:] for o in dict(c.options).values()]
    assert rows and all(o.cap_gpus is not None for o in rows)
