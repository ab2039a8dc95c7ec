"""The explore stage's searches (analyzer.advisor.explore) on a log whose load decides
the size: what each flip replays, and that it replays what its row says."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from analyzer.advisor import Thresholds, run_analysis
from analyzer.advisor.replay import LocalReplayer, Services
from analyzer.advisor.size import SizeQuestion, SizeSearch

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

    def size(self, part, trace, questions, sampling_rate):
        out = super().size(part, trace, questions, sampling_rate)
        self.asked += [Asked(q, s) for q, s in zip(questions, out, strict=True)]
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
