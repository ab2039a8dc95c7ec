"""The report's sections on what to do: GPUs and money, tenant isolation, the side-by-side
alternatives, sensitivity, the sized recommendation, product settings, the deployment
bundle, pilot gates and commands, and the assumptions with their sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analyzer.advisor.figures import Undefined, Verdict
from analyzer.advisor.words import count
from analyzer.report.cells import Section, Table, criterion_value, gb, gbps, ms, num, pct
from analyzer.report.plan_views import ReportView
from analyzer.report.schema import NotApplicable
from analyzer.report.summary import (
    OPTION_LABEL,
    economics_table,
    isolation_products_table,
    isolation_table,
    known,
    price_table,
    side_by_side_table,
    undefined_notes,
)


def economics_section(doc: ReportView) -> Section | None:
    et = economics_table(doc)
    econ = doc.economics
    if econ is None:
        return None
    load = econ.load
    mean_rps, peak_rps, window_s, factor = (
        (None, None, None, None)
        if load is None
        else (load.mean_rps, load.peak_rps, load.peak_window_s, load.peak_factor)
    )
    s = Section("economics", "GPUs and money")
    if not et:
        # Nothing was sized: say why, and what the load is, without a table of dashes.
        if isinstance(mean_rps, NotApplicable):
            s.paragraphs.append(f"The log has no load to size for: {mean_rps.reason}.")
        elif mean_rps is not None:
            s.paragraphs.append(
                f"The log's load: {num(mean_rps)} requests/s on average, {num(peak_rps)} "
                f"requests/s in its busiest {num(window_s)} s window."
            )
        if not doc.options.size_search:
            s.paragraphs.append(
                f"No option has GPUs, TTFT or money: {Undefined.SIZE_SEARCH_OFF.words}."
            )
        elif not s.paragraphs:
            return None
        pt = price_table(doc)
        if pt:
            s.tables.append(Table(*pt))
        return s
    if isinstance(mean_rps, NotApplicable):
        s.paragraphs.append(
            f"Each option's plan: {mean_rps.reason}, so the log is replayed as it is, every "
            "request at once."
        )
    else:
        s.paragraphs.append(
            f"Each option's plan: the fewest GPUs whose replay keeps p90 TTFT within the SLO "
            f"at the busiest load, {num(peak_rps)} requests/s in the busiest {num(window_s)} s "
            f"window ({num(factor)} x the log's mean of {num(mean_rps)} requests/s): the log "
            "replayed with its gaps shortened to that rate. Money is for exactly those GPUs, "
            "their nodes and what the option adds on them."
        )
    arr = doc.arrivals
    if arr and arr.get("coarse"):
        s.paragraphs.append(arrivals_words(arr))
    aggregated = doc.replay is not None and doc.replay.cluster.rest.get("serving") == "aggregated"
    if aggregated:
        s.paragraphs.append(
            "These are whole serving GPUs: the replay ran each instance's prefill and decode "
            "in one continuous batch (aggregated serving), so the GPUs saved are saved outright."
        )
    else:
        s.paragraphs.append(
            "Decode is not modelled: these are prefill GPUs, as in a disaggregated prefill "
            "pool (Mooncake, vLLM and SGLang prefill/decode disaggregation). In an aggregated "
            "deployment the saving is on prefill GPU time only: about "
            f"{pct(econ.aggregated_prefill_share)} of GPU time for chat workloads "
            "(Splitwise, ISCA'24; DistServe, OSDI'24), so multiply the GPUs saved by that share."
        )
    s.paragraphs.append(
        "Net value is the baseline's monthly cost minus the option's; the payback is the "
        f"pilot's cost (the {num(econ.pilot_hours)}-hour stability gate on the option's GPUs) "
        "over the net value."
    )
    s.tables.append(Table(*et))
    s.paragraphs += undefined_notes(doc, side_by_side=False)
    pt = price_table(doc)
    if pt:
        s.tables.append(Table(*pt))
    return s


def isolation_section(doc: ReportView) -> Section | None:
    iso = doc.isolation
    if iso is None:
        return None
    s = Section("isolation", "Tenant isolation")
    said = iso.sentence[:1].upper() + iso.sentence[1:] + "."
    tenants = count(iso.tenants, "tenant")
    if iso.policy == "shared":
        s.paragraphs.append(
            f"Every figure above is for a pool shared across the log's {tenants}: no "
            "request carries a cache salt, so any tenant's request can hit, and time, "
            f"another tenant's cached prompts (docs/security.md). {said} To keep tenants "
            "apart, the gateway sets cache_salt (vLLM, SGLang) or extra_key (older SGLang) "
            "per tenant on every request; kvpool analyze --isolation tenant measures "
            "everything so and writes the salted bundle."
        )
    else:
        unit = "tenant" if iso.policy == "tenant" else "end user within its tenant"
        s.paragraphs.append(
            f"Every figure above is measured with each block keyed by {unit}, as a cache "
            f"salt per {unit} keys it. {said} deploy/isolation/README.md says how the "
            "gateway sets the salt, which stacks key every tier by it at their versions (the "
            "others are left out of deploy/), and the pilot's isolation gate tests it."
        )
    ceilings = ", ".join(f"{p} {pct(iso.ceiling.get(p))}" for p in iso.policies)
    s.paragraphs.append(
        f"Prefix-hit ceiling (unlimited capacity), by policy: {ceilings}. Of the shared "
        f"log's hit tokens, {pct(iso.cross_tenant_hit_share)} were last held by another "
        "tenant's request; isolating takes away only the hits a tenant could not find in "
        "its own earlier requests (Hit rate lost, per option). Hits from another tenant is "
        "each option's own share at its size: the tokens of its replay's hits whose block "
        "another tenant's request last stored or refreshed (none under a salt)."
    )
    who = []
    if iso.requests_without_tenant:
        who.append(
            f"{count(iso.requests_without_tenant, 'request')} name no tenant: the model "
            "stands in for it"
        )
    if iso.keyed_by:
        k = iso.keyed_by
        who.append(
            f"keyed by user: {count(k.get('user', 0), 'request')} by its user, "
            f"{num(k.get('session', 0))} by its session (standing in for its owner), "
            f"{num(k.get('tenant', 0))} by its tenant alone"
        )
    if who:
        s.paragraphs.append("; ".join(who)[:1].upper() + "; ".join(who)[1:] + ".")
    table = isolation_table(doc)
    if table:
        s.tables.append(Table(*table))
    products = isolation_products_table(doc)
    if products and iso.products:
        refused = [p for p in iso.products if not p.holds]
        where = (
            "under --isolation tenant or user, the bundle writes the stacks that hold and a "
            "refusal in place of the others"
            if iso.policy == "shared"
            else "deploy/ writes the stacks that hold and an ISOLATION.md refusal in place "
            "of the others"
        )
        s.paragraphs.append(
            "A salt keeps tenants apart only where every tier keys its blocks by it: the "
            "last table says so for each stack of the bundle at the versions it targets "
            f"({where}; analyzer/advisor/salting.py keeps the sources)."
            + "".join(f" {p.refusal}" for p in refused if p.refusal)
        )
        s.tables.append(Table(*products))
    return s


def arrivals_words(arr: Mapping[str, Any]) -> str:
    """What the log's coarse or bursty arrivals are, and what they do to the plan."""
    text = (
        f"The log's {num(arr['requests'])} requests arrive at {num(arr['distinct_times'])} "
        f"distinct times (about {num(arr['mean_group'])} at each, at most "
        f"{num(arr['largest_group'])}), about {num(arr['step_s'])} s apart: its timestamps are "
        "coarse, or its requests come in bursts. The plans replay them as logged, each "
        "group arriving at once."
    )
    eff = arr.get("effect")
    if eff and eff.get("gpus") is not None and eff.get("gpus_spread") is not None:
        text += (
            f" Spread evenly over the time to the next timestamp, {OPTION_LABEL.get(eff['option'], eff['option'])} "
            f"would need {count(eff['gpus_spread'], 'GPU')} instead of {count(eff['gpus'], 'GPU')}: "
            "log finer timestamps to tell which it is."
        )
    return text


def side_by_side_section(doc: ReportView) -> Section | None:
    sb = side_by_side_table(doc)
    if not sb:
        return None
    s = Section("side-by-side", "Other GPUs and models on this log")
    s.paragraphs.append(
        "The verdict's option on your model and GPU and on catalog alternatives, each "
        "planned as yours is: the fewest GPUs (at the smallest tensor parallelism that "
        "holds the model) whose replay meets the SLO at the busiest load, its TTFT that "
        "replay's. Another GPU or model is a purchase, not a setting, so it is listed here "
        "and not among the flips."
    )
    s.tables.append(Table(*sb))
    s.paragraphs += undefined_notes(doc, money=False)
    return s


def sensitivity_section(doc: ReportView) -> Section | None:
    sens = doc.sensitivity
    if not sens.rows:
        return None
    s = Section("sensitivity", "Sensitivity: what would change the verdict")
    s.paragraphs += list(sens.summary)
    s.tables.append(
        Table(
            ["Input", "Value", "Verdict", "Flips?", "Note"],
            [
                [r.dimension, r.value, r.verdict, "yes" if r.flips else "no", r.note or ""]
                for r in sens.rows
            ],
        )
    )
    return s


def sizing_section(doc: ReportView) -> Section | None:
    sz = doc.sizing
    if sz is None:
        return None
    s = Section("sizing", "Sized recommendation")
    if doc.verdict.verdict == Verdict.NOT_WORTH_IT:
        s.paragraphs.append(
            "No pool or offload tier is recommended. The figures below are what one would "
            "need if the workload changed enough to flip the verdict (see the sensitivity "
            "table)."
        )
    plan = next(
        (
            p
            for p in doc.plans
            if p.option == doc.verdict.scenario and known(p.instances) is not None
        ),
        None,
    )
    if plan is not None:
        pt = known(plan.ttft_s)
        models = len({(p.model, p.served_as) for p in doc.plans})
        of = (
            ""
            if models < 2
            else f" of {plan.model}, the most requested of the log's "
            f"{models} models (each model's plan is in the models section and its folder "
            "of deploy/)"
        )
        s.paragraphs.append(
            f"The plan behind every figure{of}: {count(sz.instances, 'instance')} of {plan.tp} x "
            f"{plan.gpu} ({count(known(plan.gpus) or 0, 'GPU')}) on {count(sz.nodes, 'node')}, "
            f"{sz.instances_per_node} per node, replayed at the busiest load at "
            f"{ms(pt.mean if pt else None)} mean and {ms(pt.p90 if pt else None)} p90 TTFT."
        )
    rows = [
        [
            "Pool capacity",
            f"{num(sz.pool_capacity_tokens)} tokens" if sz.pool else "no pool",
            f"{num(sz.pool_capacity_gb)} GB ({num(sz.pool_capacity_gib)} GiB), knee at "
            f"{100 * sz.knee_fraction:.0f}% of the ceiling"
            if sz.pool
            else "",
        ],
        [
            "Host DRAM per node",
            f"{num(sz.dram_per_node_tokens)} tokens",
            f"{num(sz.dram_per_node_gb)} GB ({num(sz.dram_per_node_gib)} GiB): {sz.dram_reason}",
        ],
        *(
            [
                [
                    "Local NVMe per node",
                    f"{num(sz.nvme_per_node_tokens)} tokens",
                    f"{num(sz.nvme_per_node_tokens * sz.bytes_per_token / 1e9)} GB: the knee of "
                    "the hit-ratio curve, capped at the node's NVMe for KV",
                ]
            ]
            if sz.nvme_per_node_tokens
            else []
        ),
        [
            "HBM prefix cache per instance",
            f"{num(sz.hbm_cache_per_instance_tokens)} tokens",
            f"{num(sz.hbm_cache_per_instance_gb)} GB",
        ],
        ["Network per node", gbps(sz.network_per_node_gbps), f"e.g. {sz.nic}"],
        [
            "Block size / chunk",
            f"{sz.block_size_tokens} / {sz.chunk_size_tokens} tokens",
            sz.block_size_reason,
        ],
        ["Router", sz.router, sz.router_reason],
        ["Eviction", sz.eviction, sz.eviction_reason],
        [
            "Cluster",
            count(sz.instances, "instance"),
            f"{count(sz.nodes, 'node')}, {sz.instances_per_node} per node",
        ],
    ]
    s.tables.append(Table(["What", "Recommended", "Why"], rows))
    return s


def settings_section(doc: ReportView) -> Section | None:
    if not doc.settings:
        return None
    s = Section("settings", "Recommended settings")
    for p in doc.settings:
        s.tables.append(
            Table(
                [f"{p.product} ({p.mode})", "Value", "Why"],
                [[x.option, x.value, x.why] for x in p.settings],
            )
        )
        if p.snippet.strip():  # a product the verdict does not deploy has nothing to paste
            s.code.append((p.product, p.snippet_lang, p.snippet))
    s.tables.append(
        Table(
            ["Product", "Checked against", "Pages", "Options"],
            [[d.product, d.version, d.pages, d.options] for d in doc.products_checked],
        )
    )
    return s


def deploy_section(doc: ReportView) -> Section | None:
    files = doc.deploy.files
    if not files:
        return None
    s = Section("deploy", "Deployment bundle")
    s.paragraphs.append(
        "Written next to this report in deploy/: launch commands, config files and a "
        "Kubernetes form, per product, for the recommended option and the runner-up. "
        "Every size derives from the sizing above (deploy/README.md lists each "
        "product's size per process); every file names the versions it was checked against."
    )
    per_process = doc.deploy.per_process
    if per_process:
        s.tables.append(
            Table(
                ["Option", "Stack", "Setting", "Per", "Each", "Units (per node)", "Adds up to"],
                [
                    [
                        r.option,
                        r.stack,
                        r.setting,
                        r.per,
                        f"{gb(r.bytes_each)} ({r.bytes_each:,} B)",
                        f"{r.units} ({r.units_per_node})",
                        f"{r.total} {gb(r.total_bytes)}",
                    ]
                    for r in per_process
                ],
            )
        )
    s.links = [(f.path, f"{f.role}, {f.option}: {f.stack}") for f in files]
    return s


def gates_section(doc: ReportView) -> Section | None:
    plan = doc.gates.plan
    if not plan:
        return None
    s = Section("gates", "Pilot gates")
    s.paragraphs.append(
        "Run the gates in order and stop at the first one missed. Check measured results "
        "with `kvpool validate RESULTS... --report report.json` (exit code 5 when a gate fails)."
    )
    if doc.verdict.verdict == Verdict.INSUFFICIENT_DATA:
        s.paragraphs.append(
            "Before any pilot: collect the data named in the verdict and run "
            "`kvpool analyze` again; the gates below have no projection yet."
        )
    if doc.verdict.verdict == Verdict.CANNOT_MEET_SLO:
        s.paragraphs.append(
            "No option meets the SLO, so there is no candidate deployment to pilot yet: the "
            "arrival and single-node baseline gates check the measurements this answer rests "
            "on (the load, the prefill speed); the main and stability gates apply once "
            "`kvpool analyze` is run again with an SLO or a GPU budget that can be met."
        )
    rows = []
    for g in plan:
        for k, c in enumerate(g.criteria):
            rows.append(
                [
                    g.name if k == 0 else "",
                    c.text,
                    f"{c.op} {criterion_value(c.metric, c.threshold)}",
                    criterion_value(c.metric, g.projected.get(c.metric)),
                    g.run if k == 0 else "",
                ]
            )
    s.tables.append(Table(["Gate", "Criterion", "Passes when", "Projected", "How to run"], rows))
    return s


def pilot_section(doc: ReportView) -> Section | None:
    cmds = doc.pilot.commands
    if not cmds:
        return None
    s = Section("pilot", "Pilot commands")
    s.paragraphs.append(
        "The log replayed against the pilot: export it once, then run the replayer "
        "that fits the stack; the file, rate and duration are filled in."
    )
    for c in cmds:
        s.code.append((f"{c.tool}: {c.purpose}", "bash", f"# {c.note}\n{c.command}"))
    return s


def assumptions_section(doc: ReportView) -> Section:
    s = Section("assumptions", "Assumptions and sources")
    s.tables.append(
        Table(["What", "Value", "Source"], [[a.what, a.value, a.source] for a in doc.assumptions])
    )
    s.tables.append(
        Table(
            ["Input", "Bytes", "sha256"],
            [[i.name, num(i.bytes), i.sha256] for i in doc.inputs],
        )
    )
    sk = doc.trace.skipped
    if sk.total:
        s.paragraphs.append(
            f"{sk.total} input rows were skipped: "
            + ", ".join(f"{n} {r}" for r, n in (sk.by_reason or {}).items())
            + ". Examples: "
            + "; ".join(sk.examples or ())
        )
    s.paragraphs.append(f"Report schema {doc.schema}, kvpool {doc.kvpool_version}.")
    return s
