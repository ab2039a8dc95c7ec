"""The report's views of what to do: product settings, sensitivity, pilot gates and
commands, the deployment bundle, assumptions, money, plans, economics, the
side-by-side alternatives and tenant isolation, and :class:`ReportView`, the whole
document. Renderers, the summary and the dashboard read these attributes, never keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from analyzer.advisor.figures import (
    DeployOption,
    Verdict,
)
from analyzer.advisor.plan import PlanStatus
from analyzer.replay.config import Scenario
from analyzer.report.schema import (
    ABSENT,
    MISSING,
    REST,
    SCHEMA,
    NotApplicable,
    ReportFormatError,
    View,
    json_kind,
    load_object,
)
from analyzer.report.views import (
    BandwidthView,
    CostView,
    EngineEventsView,
    InputFileView,
    MeasuredVsProjectedView,
    ModelsView,
    ReplayView,
    ReuseView,
    RunOptionsView,
    ScenarioView,
    SizingView,
    TraceView,
    TtftSecondsView,
    UncertaintyView,
    VerdictView,
)

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, slots=True)
class SettingView(View):
    option: str
    value: str
    why: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ProductSettingsView(View):
    """``settings[]``: one product's settings and its launch snippet."""

    product: str
    mode: DeployOption
    settings: tuple[SettingView, ...]
    snippet: str
    snippet_lang: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class ProductCheckedView(View):
    product: str
    version: str
    pages: str
    options: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class FlipRowView(View):
    """``sensitivity.rows[]``: one perturbed input and the verdict it gives."""

    dimension: str
    value: str
    verdict: Verdict
    flips: bool
    note: str | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class SensitivityView(View):
    rows: tuple[FlipRowView, ...]
    summary: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CriterionView(View):
    metric: str
    op: str
    threshold: float
    text: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class GateView(View):
    """``gates.plan[]``: one pilot gate (``analyzer.advisor.gates.gate_from_json`` reads it
    for ``kvpool validate``)."""

    id: str
    name: str
    run: str
    results_role: str
    criteria: tuple[CriterionView, ...]
    projected: Mapping[str, float]
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class GatesView(View):
    plan: tuple[GateView, ...]


@dataclass(frozen=True, slots=True)
class PilotCommandView(View):
    tool: str
    purpose: str
    note: str
    command: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PilotView(View):
    commands: tuple[PilotCommandView, ...]


@dataclass(frozen=True, slots=True)
class DeployFileView(View):
    """``deploy.files[]``: one file of the deployment bundle (path under deploy/)."""

    path: str
    kind: str
    role: str
    option: DeployOption
    stack: str
    text: str
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PerProcessView(View):
    """``deploy.per_process[]``: one product setting's size per process, in bytes."""

    option: DeployOption
    stack: str
    setting: str
    per: str
    bytes_each: int
    units: int
    units_per_node: int
    total: str
    total_bytes: int
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class DeployView(View):
    files: tuple[DeployFileView, ...]
    per_process: tuple[PerProcessView, ...]


@dataclass(frozen=True, slots=True)
class AssumptionView(View):
    what: str
    value: str
    source: str


@dataclass(frozen=True, slots=True)
class LoadView(View):
    """``economics.load``: requests/s on average and in the busiest window (not
    applicable for a log whose requests share one timestamp)."""

    mean_rps: float | NotApplicable
    peak_rps: float | NotApplicable
    peak_window_s: float
    peak_factor: float | NotApplicable
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class MoneyView(View):
    """A plan's or a fleet's money per month: its GPUs (not applicable: no size, or no GPU price) and what
    the option adds."""

    gpu_usd_month: float | NotApplicable
    dram_gb: float
    dram_usd_month: float
    nvme_tb: float
    nvme_usd_month: float
    nic_nodes: int
    nic_usd_month: float
    store_usd_month: float
    added_usd_month: float
    total_usd_month: float | NotApplicable
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class FleetView(View):
    """``fleet[option]``: one option for the whole log, every model's plan of it summed
    (counts, money; TTFT of every model's requests together), and its money against the
    baseline's."""

    option: Scenario
    status: PlanStatus
    models: int
    instances: int | NotApplicable
    gpus: int | NotApplicable
    nodes: int | NotApplicable
    gpus_above_cap: int | None
    cap_gpus: int
    floor_p90_s: float | None
    ttft_s: TtftSecondsView | NotApplicable
    hit_rate: float | NotApplicable
    money: MoneyView
    gpus_saved: int | NotApplicable
    gpu_saving_usd_month: float | NotApplicable
    net_usd_month: float | NotApplicable
    pilot_usd: float | NotApplicable
    payback_months: float | NotApplicable
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PlanCapacityView(View):
    """``plans[].capacity``: what each tier holds, in tokens and GB (null: no such tier)."""

    bytes_per_token: int
    tokens: Mapping[str, int | None]
    gb: Mapping[str, float | None]
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PlanLoadView(View):
    """``plans[].load``: the load the plan serves; it is replayed at the busiest window's."""

    mean_rps: float | NotApplicable
    peak_rps: float | NotApplicable
    peak_window_s: float
    sizing_rate_multiple: float | NotApplicable
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PlanView(View):
    """``plans[]``: one option for one model, sized by replaying at size: the record
    every count, TTFT and amount of money of the report comes from."""

    option: Scenario
    model: str
    served_as: str
    gpu: str
    tp: int
    status: PlanStatus
    instances: int | NotApplicable
    gpus: int | NotApplicable
    nodes: int | NotApplicable
    instances_per_node: int
    gpus_per_node: int
    instances_above_cap: int | None
    gpus_above_cap: int | None
    cap_gpus: int
    router: str
    capacity: PlanCapacityView
    load: PlanLoadView
    ttft_slo_s: float
    ttft_s: TtftSecondsView | NotApplicable
    hit_rate: float | NotApplicable
    money: MoneyView
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class PriceView(View):
    """``economics.prices[]``: one price used, with its source and the date it was read."""

    what: str
    usd: float | None
    unit: str
    source: str | None = field(default=None, metadata=ABSENT)
    date: str | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class EconomicsView(View):
    """``economics``: the load, the prices used and the money's constants (each option's
    money is its fleet's, ``fleet[option]``)."""

    load: LoadView | None = field(default=None, metadata=ABSENT)
    prices: tuple[PriceView, ...] | None = field(default=None, metadata=ABSENT)
    aggregated_prefill_share: float | None = field(default=None, metadata=ABSENT)
    pilot_hours: float | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class SideOptionView(View):
    """``side_by_side[].options[name]``: one option re-priced on another model or GPU."""

    ttft_mean_s: float | NotApplicable | None = field(default=None, metadata=ABSENT)
    ttft_p90_s: float | NotApplicable | None = field(default=None, metadata=ABSENT)
    gpus_at_peak_load: int | NotApplicable | None = field(default=None, metadata=ABSENT)
    total_usd_month: float | NotApplicable | None = field(default=None, metadata=ABSENT)
    cap_gpus: int | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class SideBySideRowView(View):
    """``side_by_side[]``: the log priced on one model and GPU."""

    model: str
    tp: int
    gpu: str
    verdict: Verdict | None = field(default=None, metadata=ABSENT)
    options: Mapping[Scenario, SideOptionView] | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class IsolationPolicyView(View):
    """``isolation.options[name].policies[policy]``: one option under one policy, at
    the size that meets the SLO under it (None: not known)."""

    hit_rate: float | None
    ttft_mean_s: float | None
    ttft_p90_s: float | None
    gpus: int | None
    total_usd_month: float | None
    meets_slo: bool
    # of its hit tokens at size, the share another tenant's request last held
    cross_tenant_hit_share: float | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class IsolationOptionView(View):
    """``isolation.options[name]``: one option across the policies planned."""

    policies: Mapping[str, IsolationPolicyView]
    hits_lost_share: float | None
    isolating_usd_month: Mapping[str, float | None]
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class IsolationProductView(View):
    """``isolation.products[]``: whether one stack of the bundle keys every tier by the
    cache salt at the versions it targets (analyzer/advisor/salting.py)."""

    option: str
    stack: str
    holds: bool
    needs: str
    paths: tuple[str, ...]
    leaks: tuple[str, ...]
    refusal: str | None
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)


@dataclass(frozen=True, slots=True)
class IsolationView(View):
    """``isolation``: what keeping tenants apart costs (analyzer/advisor/isolation.py)."""

    policy: str
    described: str
    salt_fields: str
    policies: tuple[str, ...]
    tenants: int
    requests_without_tenant: int
    users_known: bool
    user_groups: int | None
    keyed_by: Mapping[str, int]
    shares_across_tenants: bool
    ceiling: Mapping[str, float]
    cross_tenant_hit_share: float
    options: Mapping[Scenario, IsolationOptionView]
    pool_option: str | None
    sentence: str
    material: bool
    recommended_option: str | None = field(default=None, metadata=ABSENT)
    products: tuple[IsolationProductView, ...] | None = field(default=None, metadata=ABSENT)
    rest: Mapping[str, object] = field(default_factory=dict, repr=False, metadata=REST)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)


@dataclass(frozen=True, slots=True)
class ReportView(View):
    """A ``kvpool.report/3`` document as typed, frozen objects (module docstring)."""

    schema: str
    kvpool_version: str
    summary: tuple[str, ...]
    inputs: tuple[InputFileView, ...]
    options: RunOptionsView
    trace: TraceView
    models: ModelsView
    warnings: tuple[str, ...]
    measured_vs_projected: MeasuredVsProjectedView | None
    verdict: VerdictView
    reuse: ReuseView
    bandwidth: BandwidthView | None
    cost: CostView | None
    uncertainty: UncertaintyView | None
    replay: ReplayView | None
    sizing: SizingView | None
    settings: tuple[ProductSettingsView, ...]
    products_checked: tuple[ProductCheckedView, ...]
    sensitivity: SensitivityView
    gates: GatesView
    pilot: PilotView
    deploy: DeployView
    assumptions: tuple[AssumptionView, ...]
    economics: EconomicsView | None
    side_by_side: tuple[SideBySideRowView, ...]
    plans: tuple[PlanView, ...]
    fleet: Mapping[Scenario, FleetView]
    arrivals: Mapping[str, object] | None
    engine_events: EngineEventsView | None = field(default=None, metadata=ABSENT)
    isolation: IsolationView | None = field(default=None, metadata=ABSENT)
    missing: frozenset[str] = field(default=frozenset(), repr=False, metadata=MISSING)

    @classmethod
    def from_json(cls, doc: object) -> ReportView:
        """The view of a document as ``json.loads`` gives it; :class:`ReportFormatError`
        names the first field that does not fit (the schema version first)."""
        if not isinstance(doc, dict):
            raise ReportFormatError("", f"expected a JSON object, got {json_kind(doc)}")
        if doc.get("schema") != SCHEMA:
            raise ReportFormatError(
                "schema", f"not a {SCHEMA} document (schema {doc.get('schema')!r})"
            )
        out: ReportView = load_object(cls, doc, "")
        return out

    @property
    def scenarios(self) -> Mapping[Scenario, ScenarioView]:
        """The replayed scenarios by name (empty without a replay)."""
        return {} if self.replay is None else self.replay.scenarios
