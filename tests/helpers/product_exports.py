"""The same requests as each gateway or observability product exports them.

A converter from kvpool's OpenAI chat-completions log (what ``kvpool synth`` writes) to
the export of each product kvpool reads, written from the products' documented schemas
(docs/formats.md cites them): LiteLLM's StandardLoggingPayload and SpendLogs rows,
Langfuse's observations (events form, and observations with a separate traces export),
Helicone's request export, Portkey's logs export and OpenTelemetry GenAI spans in
OTLP/JSON. Each request keeps its prompt, model, time, session, tenant and usage; the
user, which the OpenAI form of the log does not carry, is derived from the session.
"""

from __future__ import annotations

import csv
import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def read_openai(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fields(row: dict[str, Any]) -> dict[str, Any]:
    """What a request says, read as kvpool's OpenAI reader reads it."""
    body = row["request"]
    meta = body.get("metadata") or {}
    session = body.get("prompt_cache_key") or body.get("user") or meta.get("session_id")
    return {
        "id": row["request_id"],
        "t": float(row["timestamp"]),
        "model": body["model"],
        "messages": body["messages"],
        "tools": body.get("tools"),
        "session": session,
        "tenant": meta.get("tenant"),
        "user": f"user-of-{session}" if session else None,
        "response": row.get("response"),
        "usage": (row.get("response") or {}).get("usage") or {},
    }


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- LiteLLM ------------------------------------------------------------------------------


def litellm_payload(row: dict[str, Any]) -> dict[str, Any]:
    """A StandardLoggingPayload (litellm/types/utils.py; docs.litellm.ai logging_spec)."""
    f = fields(row)
    u = f["usage"]
    params: dict[str, Any] = {"temperature": 0.2}
    if f["tools"]:
        params["tools"] = f["tools"]
    return {
        "id": f["id"],
        "trace_id": f["session"] or str(uuid.uuid5(uuid.NAMESPACE_URL, f["id"])),
        "call_type": "acompletion",
        "stream": False,
        "response_cost": 0.0001,
        "status": "success",
        "custom_llm_provider": "hosted_vllm",
        "total_tokens": u.get("total_tokens", 0),
        "prompt_tokens": u.get("prompt_tokens", 0),
        "completion_tokens": u.get("completion_tokens", 0),
        "startTime": f["t"],
        "endTime": f["t"] + 1.5,
        "completionStartTime": f["t"] + 0.3,
        "response_time": 1.5,
        "model": f"hosted_vllm/{f['model']}",
        "model_id": "deployment-1",
        "model_group": f["model"],
        "api_base": "http://vllm:8000/v1",
        "metadata": {
            "user_api_key_hash": "hashed-key",
            "user_api_key_alias": None,
            "user_api_key_team_id": f["tenant"],
            "user_api_key_user_id": "service-account",
            "user_api_key_team_alias": None,
            "spend_logs_metadata": None,
            "requester_ip_address": "",
        },
        "cache_hit": None,
        "cache_key": None,
        "saved_cache_cost": 0.0,
        "request_tags": [],
        "end_user": f["user"],
        "requester_ip_address": "",
        "messages": f["messages"],
        "response": f["response"],
        "error_str": None,
        "model_parameters": params,
        "hidden_params": {"model_id": "deployment-1", "cache_key": None, "api_base": None},
    }


def litellm_spendlogs_row(row: dict[str, Any]) -> dict[str, Any]:
    """A LiteLLM_SpendLogs row (schema.prisma), prompts stored
    (store_prompts_in_spend_logs), as a psql CSV export writes it."""
    f = fields(row)
    u = f["usage"]
    body: dict[str, Any] = {"model": f["model"], "messages": f["messages"]}
    if f["tools"]:
        body["tools"] = f["tools"]
    return {
        "request_id": f["id"],
        "call_type": "acompletion",
        "api_key": "hashed-key",
        "spend": 0.0001,
        "total_tokens": u.get("total_tokens", 0),
        "prompt_tokens": u.get("prompt_tokens", 0),
        "completion_tokens": u.get("completion_tokens", 0),
        "startTime": iso(f["t"]).replace("T", " ").replace("Z", ""),
        "endTime": iso(f["t"] + 1.5).replace("T", " ").replace("Z", ""),
        "model": f"hosted_vllm/{f['model']}",
        "model_group": f["model"],
        "user": "service-account",
        "metadata": json.dumps({"user_api_key_team_id": f["tenant"]}),
        "team_id": f["tenant"] or "",
        "end_user": f["user"] or "",
        "messages": json.dumps(f["messages"]),
        "response": json.dumps(f["response"]),
        "session_id": f["session"] or "",
        "status": "success",
        "proxy_server_request": json.dumps(body),
    }


# -- Langfuse -----------------------------------------------------------------------------


def langfuse_observation(row: dict[str, Any], with_session: bool = True) -> dict[str, Any]:
    """A GENERATION of Langfuse's export: the events form (with sessionId, userId) or,
    ``with_session`` False, the older observations form (traceId only)."""
    f = fields(row)
    u = f["usage"]
    inp: Any = {"messages": f["messages"], "tools": f["tools"]} if f["tools"] else f["messages"]
    obs = {
        "id": f"obs-{f['id']}",
        "traceId": f"trace-{f['id']}",
        "type": "GENERATION",
        "name": "OpenAI-generation",
        "startTime": iso(f["t"]),
        "endTime": iso(f["t"] + 1.5),
        "completionStartTime": iso(f["t"] + 0.3),
        "providedModelName": f["model"],
        "modelParameters": {"temperature": 0.2},
        "input": inp,
        "output": (f["response"] or {}).get("choices", [{}])[0].get("message"),
        "metadata": {"tenant": f["tenant"]} if f["tenant"] else {},
        "usageDetails": {
            "input": u.get("prompt_tokens", 0),
            "output": u.get("completion_tokens", 0),
            "total": u.get("total_tokens", 0),
        },
        "costDetails": {"total": 0.0001},
        "level": "DEFAULT",
    }
    if with_session:
        obs["sessionId"] = f["session"]
        obs["userId"] = f["user"]
    return obs


def langfuse_trace(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the traces export (BatchExportTracesRow)."""
    f = fields(row)
    return {
        "bookmarked": False,
        "id": f"trace-{f['id']}",
        "timestamp": iso(f["t"]),
        "name": "chat",
        "userId": f["user"],
        "sessionId": f["session"],
        "input": f["messages"][-1],
        "output": None,
        "metadata": {},
        "tags": [],
    }


# -- Helicone -----------------------------------------------------------------------------


def helicone_request(row: dict[str, Any]) -> dict[str, Any]:
    """A HeliconeRequest as @helicone/export writes it (with --include-body)."""
    f = fields(row)
    u = f["usage"]
    body: dict[str, Any] = {"model": f["model"], "messages": f["messages"]}
    if f["tools"]:
        body["tools"] = f["tools"]
    props = {}
    if f["session"]:
        props["Helicone-Session-Id"] = f["session"]
        props["Helicone-Session-Path"] = "/chat"
    if f["tenant"]:
        props["Tenant"] = f["tenant"]
    return {
        "response_id": f"resp-{f['id']}",
        "response_created_at": iso(f["t"] + 1.5),
        "response_status": 200,
        "response_model": f["model"],
        "request_id": f["id"],
        "request_created_at": iso(f["t"]),
        "request_body": body,
        "response_body": f["response"],
        "request_path": "/v1/chat/completions",
        "request_user_id": f["user"],
        "request_properties": props,
        "request_model": f["model"],
        "model": f["model"],
        "provider": "CUSTOM",
        "delay_ms": 1500,
        "total_tokens": u.get("total_tokens"),
        "prompt_tokens": u.get("prompt_tokens"),
        "completion_tokens": u.get("completion_tokens"),
        "cost": 0.0001,
    }


def helicone_csv(req: dict[str, Any]) -> dict[str, Any]:
    """A request as @helicone/export's CSV writes it: object cells are JSON whose quotes
    it doubles once more before quoting the cell (``convertToCSVRow``)."""
    return {
        k: json.dumps(v).replace('"', '""') if isinstance(v, dict | list) else v
        for k, v in req.items()
    }


HELICONE_CSV = (
    "response_id",
    "response_created_at",
    "response_status",
    "request_created_at",
    "request_body",
    "request_properties",
    "request_user_id",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "latency",
    "cost",
)


# -- Portkey ------------------------------------------------------------------------------


def portkey_log(row: dict[str, Any]) -> dict[str, Any]:
    """A row of Portkey's logs export (product/observability/logs-export)."""
    f = fields(row)
    u = f["usage"]
    body: dict[str, Any] = {"model": f["model"], "messages": f["messages"]}
    if f["tools"]:
        body["tools"] = f["tools"]
    meta = {}
    if f["session"]:
        meta["session_id"] = f["session"]
        meta["_user"] = f["user"]
    if f["tenant"]:
        meta["tenant"] = f["tenant"]
    return {
        "id": f["id"],
        "created_at": iso(f["t"]),
        "request.body": body,
        "response.body": f["response"],
        "is_success": 1,
        "ai_org": "openai",
        "ai_model": f["model"],
        "req_units": u.get("prompt_tokens"),
        "res_units": u.get("completion_tokens"),
        "total_units": u.get("total_tokens"),
        "cost": 0.01,
        "response_status_code": 200,
        "response_time": 1500,
        "trace_id": f"trace-{f['id']}",
        "metadata": meta,
    }


# -- OpenTelemetry ------------------------------------------------------------------------


def _any(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def _kv(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any(v)} for k, v in attrs.items() if v is not None]


def semconv_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages as gen_ai.input.messages (the GenAI input-messages schema)."""
    out = []
    for m in messages:
        parts: list[dict[str, Any]] = []
        content = m.get("content")
        if m.get("role") == "tool":
            parts.append(
                {"type": "tool_call_response", "id": m.get("tool_call_id"), "response": content}
            )
        elif isinstance(content, str):
            parts.append({"type": "text", "content": content})
        elif isinstance(content, list):
            parts += [{"type": "text", "content": p.get("text", "")} for p in content]
        for c in m.get("tool_calls") or []:
            fn = c["function"]
            parts.append(
                {
                    "type": "tool_call",
                    "id": c.get("id"),
                    "name": fn["name"],
                    "arguments": fn["arguments"],
                }
            )
        out.append({"role": m["role"], "parts": parts})
    return out


def otel_span(row: dict[str, Any]) -> dict[str, Any]:
    """A CLIENT span of the GenAI semantic conventions (gen-ai-spans.md), content
    captured on attributes as JSON strings."""
    f = fields(row)
    u = f["usage"]
    start = round(f["t"] * 1e6) * 1000
    tools = None
    if f["tools"]:
        tools = [{"type": t.get("type", "function"), **t["function"]} for t in f["tools"]]
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": f["model"],
        "gen_ai.response.model": f["model"],
        "gen_ai.conversation.id": f["session"],
        "user.id": f["user"],
        "tenant.id": f["tenant"],
        "gen_ai.usage.input_tokens": u.get("prompt_tokens"),
        "gen_ai.usage.output_tokens": u.get("completion_tokens"),
        "gen_ai.input.messages": json.dumps(semconv_messages(f["messages"])),
        "gen_ai.tool.definitions": json.dumps(tools) if tools else None,
    }
    return {
        "traceId": uuid.uuid5(uuid.NAMESPACE_URL, "t" + f["id"]).hex,
        "spanId": uuid.uuid5(uuid.NAMESPACE_URL, "s" + f["id"]).hex[:16],
        "name": f"chat {f['model']}",
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 1_500_000_000),
        "attributes": _kv(attrs),
        "status": {},
    }


def otlp_request(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """An ExportTraceServiceRequest, as the collector's file exporter writes a line."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _kv({"service.name": "chat-app"})},
                "scopeSpans": [
                    {"scope": {"name": "opentelemetry.instrumentation.openai_v2"}, "spans": spans}
                ],
            }
        ]
    }


# -- writers ------------------------------------------------------------------------------


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_csv(
    path: Path, records: list[dict[str, Any]], columns: Iterable[str] | None = None
) -> Path:
    cols = list(columns or records[0])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in records:
            w.writerow(
                [
                    ""
                    if r.get(c) is None
                    else json.dumps(r[c])
                    if isinstance(r.get(c), dict | list)
                    else r[c]
                    for c in cols
                ]
            )
    return path


def write_exports(rows: list[dict[str, Any]], d: Path) -> dict[str, list[Path]]:
    """Every product's export of ``rows`` under ``d``, by name: the files one run reads."""
    d.mkdir(parents=True, exist_ok=True)
    langfuse_old = [langfuse_observation(r, with_session=False) for r in rows]
    traces = [langfuse_trace(r) for r in rows]
    helicone = [helicone_request(r) for r in rows]
    spans = [otel_span(r) for r in rows]
    otlp = [otlp_request(spans[i : i + 7]) for i in range(0, len(spans), 7)]
    (d / "helicone.json").write_text(
        "[\n" + ",\n".join(json.dumps(h, indent=2) for h in helicone) + "\n]\n"
    )
    (d / "langfuse-observations.json").write_text(
        json.dumps([langfuse_observation(r) for r in rows])
    )
    return {
        "litellm-payload": [write_jsonl(d / "litellm.jsonl", (litellm_payload(r) for r in rows))],
        "litellm-spendlogs": [
            write_csv(d / "spendlogs.csv", [litellm_spendlogs_row(r) for r in rows])
        ],
        "langfuse-events-json": [d / "langfuse-observations.json"],
        "langfuse-observations-and-traces-csv": [
            write_csv(d / "langfuse-observations.csv", langfuse_old),
            write_jsonl(d / "langfuse-traces.jsonl", traces),
        ],
        "helicone-json": [d / "helicone.json"],
        "helicone-csv": [
            write_csv(d / "helicone.csv", [helicone_csv(h) for h in helicone], HELICONE_CSV)
        ],
        "portkey": [write_jsonl(d / "portkey.jsonl", (portkey_log(r) for r in rows))],
        "otel": [write_jsonl(d / "otel.jsonl", otlp)],
    }
