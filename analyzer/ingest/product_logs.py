"""Readers of what teams already keep: gateway and observability exports.

One reader per product, each mapping the product's own fields, as its documentation and
source define them, to a :class:`~analyzer.ingest.fields.Raw` request: the prompt (a
chat-completions body, rendered and tokenized like any OpenAI log), the arrival time,
the session, tenant and end user, the model, and the usage (output tokens, and the
engine's cached prompt tokens where the export carries them). docs/formats.md lists
every mapping with its public source; in short:

* ``litellm``: LiteLLM's ``StandardLoggingPayload`` (callback JSON or JSON lines) and
  ``LiteLLM_SpendLogs`` rows (CSV or the ``/spend/logs`` JSON);
* ``langfuse``: Langfuse's observations export (GENERATION rows) and traces export (JSON,
  JSON lines or CSV), a trace's session and user given to its observations;
* ``helicone``: Helicone's request export (``@helicone/export``, JSON, JSON lines, CSV);
* ``portkey``: Portkey's logs export (JSON lines) and its log objects;
* ``otel``: OpenTelemetry GenAI spans in OTLP/JSON (the collector's file exporter).

Each format's file may be JSON lines, a JSON document (an array, pretty-printed objects,
API pages: :mod:`analyzer.ingest.documents`) or CSV, told by its first bytes. A row that
is not a model call (an embedding, a Langfuse span, a failed call) is a counted skip
naming why.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Mapping

from analyzer.ingest.detect import Format
from analyzer.ingest.documents import (
    DocumentError,
    container,
    document_records,
    page_records,
)
from analyzer.ingest.fields import (
    TENANT_KEYS,
    FileContext,
    Raw,
    Record,
    RowError,
    as_int,
    as_str,
    maybe_json,
    take_cached,
    take_time,
    take_usage,
)
from analyzer.ingest.io import TruncatedInput
from analyzer.ingest.streams import csv_records, json_records, truncated
from analyzer.jsontypes import JSONObject, JSONValue

# -- record streams ----------------------------------------------------------------------


def records(path: str, fmt: str, on_bytes: Callable[[int], None] | None) -> Iterator[Record]:
    """The records of a product export, whatever its container; OTLP requests become
    one record per span."""
    kind = container(path)
    if kind == "csv":
        recs: Iterator[Record] = csv_records(path, on_bytes)
    elif kind == "jsonl":
        recs = _unpaged(json_records(path, on_bytes))
    else:
        recs = _documents(path, on_bytes)
    return _spans(recs) if fmt == Format.OTEL else recs


def _unpaged(recs: Iterator[Record]) -> Iterator[Record]:
    """JSON lines whose lines may be API pages (``{"data": [...]}``): their records."""
    for line, rec in recs:
        rows = page_records(rec)
        if rows is None:
            yield line, rec
            continue
        for row in rows:
            yield line, row if isinstance(row, dict) else RowError("record is not a JSON object")


def _documents(path: str, on_bytes: Callable[[int], None] | None) -> Iterator[Record]:
    n = 0
    try:
        for n, rec in document_records(path, on_bytes):
            if isinstance(rec, DocumentError):
                yield n, RowError(rec.reason, fatal=rec.fatal)
            elif isinstance(rec, dict):
                yield n, rec
            else:
                yield n, RowError("record is not a JSON object")
    except TruncatedInput:
        raise truncated(path, n + 1) from None


# -- shared mappings ---------------------------------------------------------------------


def _json(rec: JSONObject, key: str) -> object:
    """A field that holds JSON: an object as is, JSON text (CSV cells, SpendLogs'
    ``metadata``) parsed; a bad one names the field."""
    return maybe_json(rec.get(key), key)


def _dict(value: object) -> JSONObject:
    """An object of a JSON record, or an empty one for anything else."""
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[JSONValue]:
    """An array of a JSON record, or an empty one for anything else."""
    return value if isinstance(value, list) else []


def _first(*pairs: tuple[Mapping[str, object], str]) -> str | None:
    """The first present, non-empty value of ``(record, key)`` pairs, as a string."""
    for where, key in pairs:
        v = where.get(key)
        if v is not None and v != "":
            return as_str(v)
    return None


def _tenant_in(meta: Mapping[str, object]) -> str | None:
    """A tenant among free-form metadata or properties: the keys the OpenAI reader
    takes (``tenant``, ``tenant_id``, ``org``, ``organization``, ``team``), any case."""
    lower = {str(k).lower(): v for k, v in meta.items()}
    return _first(*((lower, k) for k in TENANT_KEYS))


def _body(value: object, field: str, tools: JSONValue = None) -> JSONObject | str:
    """A prompt as the products record it, as a chat-completions body (or raw text):
    a list of messages, an object with ``messages`` (or ``prompt``), or a string.
    Anthropic's separate ``system`` becomes the first message, as the server renders it."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        body: JSONObject = {"messages": value}
    elif isinstance(value, dict) and isinstance(value.get("messages"), list):
        body = dict(value)
    elif isinstance(value, dict) and isinstance(value.get("prompt"), str):
        return str(value["prompt"])
    elif value is None or value == {} or value == []:
        raise RowError("missing field", field)
    elif isinstance(value, dict) and "messages" not in value and "prompt" not in value:
        raise RowError("missing field", f"{field}.messages")
    else:
        raise RowError("mistyped field", field)
    system = body.get("system")
    messages = _list(body["messages"])  # a list, as each branch above makes sure
    if system is not None and not any(
        isinstance(m, dict) and m.get("role") == "system" for m in messages
    ):
        body["messages"] = [{"role": "system", "content": system}, *messages]
    if tools and not body.get("tools"):
        body["tools"] = tools
    return body


def _prompt(raw: Raw, value: object, field: str, tools: JSONValue = None) -> None:
    body = _body(value, field, tools)
    if isinstance(body, str):
        raw.text = body
    else:
        raw.body = body


def _failed(status: object, field: str) -> None:
    """A call that failed (an HTTP status of 400 or more): the engine did no prefill
    that a cache could have saved, so it is a counted skip."""
    try:
        code = int(str(status).strip())
    except ValueError:
        return
    if code >= 400:
        raise RowError("failed call", field)


def _response_usage(raw: Raw, response: object, where: str) -> None:
    """Usage, or else the output text, of an OpenAI-style response."""
    if not isinstance(response, dict):
        return
    take_usage(raw, response.get("usage"), f"{where}.usage")
    if raw.output_tokens is None:
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = _dict(choices[0].get("message"))
            text = msg.get("content", choices[0].get("text"))
            if isinstance(text, str):
                raw.output_text = text


# -- LiteLLM -----------------------------------------------------------------------------

# call_type values of model calls (litellm.types.utils.CallTypes): chat, Anthropic
# messages, responses and text completions, sync or async.
_LITELLM_CALLS = frozenset(
    {
        "completion",
        "acompletion",
        "text_completion",
        "atext_completion",
        "anthropic_messages",
        "responses",
        "aresponses",
        "generate_content",
        "agenerate_content",
    }
)


def parse_litellm(rec: JSONObject, ctx: FileContext) -> Raw:
    """LiteLLM's ``StandardLoggingPayload`` (what every logging callback receives;
    ``litellm/types/utils.py``) or a ``LiteLLM_SpendLogs`` row (``schema.prisma``)."""
    call = as_str(rec.get("call_type"))
    if call is not None and call not in _LITELLM_CALLS:
        raise RowError("not a chat or text completion call", "call_type")
    status = as_str(rec.get("status"))
    if status is not None and status.lower() == "failure":
        raise RowError("failed call", "status")
    raw = take_time(rec, ctx, ("startTime", "start_time"))
    meta = _dict(_json(rec, "metadata"))
    params = _dict(_json(rec, "model_parameters"))
    # SpendLogs keep the request as the proxy received it (tools included) when
    # store_prompts_in_spend_logs is on; the payload has the messages and the params.
    request = _json(rec, "proxy_server_request")
    if isinstance(request, dict) and (
        isinstance(request.get("messages"), list) or isinstance(request.get("prompt"), str)
    ):
        _prompt(raw, request, "proxy_server_request")
    else:
        messages = _json(rec, "messages")
        if messages is None or messages == {} or messages == []:
            raise RowError(
                "no prompt text (stored only with store_prompts_in_spend_logs)", "messages"
            )
        _prompt(raw, messages, "messages", params.get("tools") or params.get("functions"))
    raw.request_id = _first((rec, "id"), (rec, "request_id"))
    # trace_id is litellm_session_id when the caller sent one (else litellm_trace_id);
    # SpendLogs store the session in session_id.
    raw.session = _first((rec, "session_id"), (rec, "trace_id"), (meta, "session_id"))
    raw.tenant = _first(
        (meta, "user_api_key_team_id"),
        (rec, "team_id"),
        (meta, "user_api_key_org_id"),
        (rec, "organization_id"),
    )
    raw.user = _first(
        (rec, "end_user"),
        (meta, "user_api_key_end_user_id"),
        (meta, "user_api_key_user_id"),
        (rec, "user"),
    )
    raw.model = _first((rec, "model_group"), (rec, "model"))
    response = _json(rec, "response")
    _response_usage(raw, response, "response")
    if rec.get("completion_tokens") not in (None, ""):
        raw.output_tokens = as_int(rec["completion_tokens"], "completion_tokens")
    if raw.cached_tokens is None:  # the proxy's own copy of the provider's usage
        hidden = _dict(_json(rec, "hidden_params"))
        for where, name in ((meta, "metadata"), (hidden, "hidden_params")):
            usage = _dict(maybe_json(where.get("usage_object"), f"{name}.usage_object"))
            details = _dict(usage.get("prompt_tokens_details"))
            if details.get("cached_tokens") not in (None, ""):
                field = f"{name}.usage_object.prompt_tokens_details.cached_tokens"
                prompt = usage.get("prompt_tokens", rec.get("prompt_tokens"))
                take_cached(
                    raw,
                    as_int(details["cached_tokens"], field),
                    as_int(prompt, "prompt_tokens", required=False),
                    field,
                )
                break
    return raw


# -- Langfuse ----------------------------------------------------------------------------


def _is_langfuse_trace(rec: JSONObject) -> bool:
    """A row of the traces export (``BatchExportTracesRow``), not an observation."""
    return (
        "traceId" not in rec and "type" not in rec and ("sessionId" in rec or "bookmarked" in rec)
    )


def _langfuse_traces(ctx: FileContext) -> dict[str, tuple[str | None, str | None]]:
    """Trace id -> (session, user) from the traces rows of every Langfuse input of the
    run, read once, in whatever order the files were given."""
    traces = ctx.shared.langfuse_traces
    if traces is not None:
        return traces
    traces = {}
    inputs = ctx.shared.inputs or ((ctx.path, ctx.fmt),)
    for path, fmt in inputs:
        if fmt != Format.LANGFUSE:
            continue
        for _, rec in records(path, fmt, None):
            if (
                isinstance(rec, dict)
                and _is_langfuse_trace(rec)
                and rec.get("id") not in (None, "")
            ):
                traces[str(rec["id"])] = (
                    _first((rec, "sessionId")),
                    _first((rec, "userId")),
                )
    ctx.shared.langfuse_traces = traces
    return traces


def parse_langfuse(rec: JSONObject, ctx: FileContext) -> Raw:
    """An observation of Langfuse's export (``worker/src/features/database-read-stream``:
    the observations and events streams); a GENERATION is a model call."""
    if _is_langfuse_trace(rec):
        raise RowError("Langfuse trace row (its session and user go to its observations)")
    kind = as_str(rec.get("type"))
    if kind is None:
        raise RowError("missing field", "type")
    if kind.upper() != "GENERATION":
        raise RowError("not a GENERATION observation", "type")
    raw = take_time(rec, ctx, ("startTime", "start_time"))
    _prompt(raw, _json(rec, "input"), "input")
    meta = _dict(_json(rec, "metadata"))
    raw.request_id = _first((rec, "id"))
    raw.session = _first((rec, "sessionId"))
    raw.user = _first((rec, "userId"))
    trace = _first((rec, "traceId"))
    if trace is not None and (raw.session is None or raw.user is None) and "sessionId" not in rec:
        session, user = _langfuse_traces(ctx).get(trace, (None, None))
        raw.session = raw.session or session
        raw.user = raw.user or user
    raw.tenant = _tenant_in(meta) or _first((meta, "user_api_key_team_id"))
    raw.model = _first((rec, "providedModelName"), (rec, "model"))
    usage = _dict(_json(rec, "usageDetails")) or _dict(_json(rec, "usage"))
    out = usage.get("output", rec.get("completionTokens"))
    if out not in (None, ""):
        raw.output_tokens = as_int(out, "usageDetails.output")
    # Langfuse's OpenAI integration records usage_details' input net of its input_*
    # details (input_cached_tokens, ...): the prompt is their sum.
    cached = usage.get("input_cached_tokens", usage.get("cache_read_input_tokens"))
    if cached not in (None, "") and usage.get("input") not in (None, ""):
        field = "usageDetails.input_cached_tokens"
        hits = as_int(cached, field)
        prompt = sum(
            as_int(v, f"usageDetails.{k}") or 0
            for k, v in usage.items()
            if (k == "input" or k.startswith("input_")) and v not in (None, "")
        )
        take_cached(raw, hits, prompt, field)
    return raw


# -- Helicone ----------------------------------------------------------------------------

HELICONE_SESSION = "Helicone-Session-Id"


def _helicone_json(rec: JSONObject, key: str) -> object:
    """A JSON cell of Helicone's export. Its CSV writer doubles the quotes of JSON cells
    once more than CSV quoting undoes (``convertToCSVRow``), so a cell that is not JSON
    as read is read again with ``""`` as ``"``."""
    value = rec.get(key)
    if isinstance(value, str) and '""' in value:
        try:
            return maybe_json(value, key)
        except RowError:
            return maybe_json(value.replace('""', '"'), key)
    return _json(rec, key)


def parse_helicone(rec: JSONObject, ctx: FileContext) -> Raw:
    """A request of Helicone's export (``HeliconeRequest``, what ``@helicone/export``
    writes; ``examples/export/typescript`` in Helicone's repository)."""
    if rec.get("response_status") not in (None, ""):
        _failed(rec["response_status"], "response_status")
    raw = take_time(rec, ctx, ("request_created_at",))
    _prompt(raw, _helicone_json(rec, "request_body"), "request_body")
    props = _dict(_helicone_json(rec, "request_properties"))
    lower = {str(k).lower(): v for k, v in props.items()}
    raw.request_id = _first((rec, "request_id"), (rec, "response_id"))
    raw.session = _first((lower, HELICONE_SESSION.lower()))
    raw.user = _first((rec, "request_user_id"))
    raw.tenant = _tenant_in(props)
    raw.model = _first((rec, "model"), (rec, "request_model"), (rec, "response_model"))
    _response_usage(raw, _json(rec, "response_body"), "response_body")
    if rec.get("completion_tokens") not in (None, ""):
        raw.output_tokens = as_int(rec["completion_tokens"], "completion_tokens")
    if raw.cached_tokens is None and rec.get("prompt_cache_read_tokens") not in (None, ""):
        take_cached(
            raw,
            as_int(rec["prompt_cache_read_tokens"], "prompt_cache_read_tokens"),
            as_int(rec.get("prompt_tokens"), "prompt_tokens", required=False),
            "prompt_cache_read_tokens",
        )
    return raw


# -- Portkey -----------------------------------------------------------------------------


def _portkey_part(rec: JSONObject, part: str) -> object:
    """``request.body`` / ``response.body``: a column of that dotted name (the logs
    export), or the body of a ``request`` / ``response`` object (a log object)."""
    if f"{part}.body" in rec:
        return _json(rec, f"{part}.body")
    return maybe_json(_dict(_json(rec, part)).get("body"), f"{part}.body")


def parse_portkey(rec: JSONObject, ctx: FileContext) -> Raw:
    """A row of Portkey's logs export, or a log object (``request``, ``response``,
    ``metadata``)."""
    if rec.get("is_success") not in (None, "") and str(rec["is_success"]).strip().lower() in (
        "0",
        "false",
    ):
        raise RowError("failed call", "is_success")
    status = rec.get("response_status_code", _dict(rec.get("response")).get("status"))
    if status not in (None, ""):
        _failed(status, "response_status_code")
    raw = take_time(rec, ctx, ("created_at",))
    _prompt(raw, _portkey_part(rec, "request"), "request.body")
    meta = _dict(_json(rec, "metadata"))
    raw.request_id = _first((rec, "id"), (rec, "request_id"), (rec, "log_id"))
    raw.session = _first(
        (meta, "session_id"), (meta, "sessionId"), (rec, "trace_id"), (meta, "traceId")
    )
    raw.user = _first((meta, "_user"))
    raw.tenant = _tenant_in(meta)
    body = raw.body or {}
    raw.model = _first((rec, "ai_model"), (body, "model"))
    _response_usage(raw, _portkey_part(rec, "response"), "response.body")
    if rec.get("res_units") not in (None, ""):
        raw.output_tokens = as_int(rec["res_units"], "res_units")
    if raw.user is None and isinstance(user := body.get("user"), str):
        raw.user = user  # Portkey copies the body's user to _user itself
    return raw


# -- OpenTelemetry GenAI spans (OTLP/JSON) -----------------------------------------------


def _otlp_value(v: JSONValue) -> JSONValue:
    """An OTLP ``AnyValue`` in its JSON form as a Python value (int64 values come as
    strings; ids and bytes as hex and base64)."""
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        given = v["intValue"]
        try:
            return int(given) if isinstance(given, str | int | float) else given
        except (ValueError, OverflowError):
            return given
    if "doubleValue" in v:
        return v["doubleValue"]
    if "boolValue" in v:
        return v["boolValue"]
    if "arrayValue" in v:
        return [_otlp_value(x) for x in _list(_dict(v["arrayValue"]).get("values"))]
    if "kvlistValue" in v:
        return _otlp_attrs(_dict(v["kvlistValue"]).get("values"))
    if "bytesValue" in v:
        try:
            return base64.b64decode(str(v["bytesValue"])).decode("utf-8", "replace")
        except ValueError:
            return None
    return None


def _otlp_attrs(kvs: object) -> JSONObject:
    out: JSONObject = {}
    for kv in kvs if isinstance(kvs, list) else ():
        if isinstance(kv, dict) and isinstance(kv.get("key"), str):
            out[kv["key"]] = _otlp_value(kv.get("value"))
    return out


def _spans(recs: Iterator[Record]) -> Iterator[Record]:
    """Each span of each OTLP ``ExportTraceServiceRequest`` (``resourceSpans`` ->
    ``scopeSpans`` -> ``spans``) as one record: its attributes and events decoded, the
    resource's attributes beside them; a bare span record is taken as it is."""
    for line, rec in recs:
        if isinstance(rec, RowError):
            yield line, rec
            continue
        if "resourceSpans" not in rec:
            yield line, _span(rec, {})
            continue
        resources = rec.get("resourceSpans")
        if not isinstance(resources, list):
            yield line, RowError("mistyped field", "resourceSpans")
            continue
        for item in resources:
            rs = _dict(item)
            resource = _otlp_attrs(_dict(rs.get("resource")).get("attributes"))
            scopes = rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans")
            if scopes and not isinstance(scopes, list):
                yield line, RowError("mistyped field", "scopeSpans")
            for ss in _list(scopes):
                spans = _dict(ss).get("spans")
                if spans and not isinstance(spans, list):
                    yield line, RowError("mistyped field", "spans")
                for span in _list(spans):
                    if isinstance(span, dict):
                        yield line, _span(span, resource)
                    else:
                        yield line, RowError("mistyped field", "spans")


def _span(span: JSONObject, resource: JSONObject) -> JSONObject:
    out = dict(span)
    if isinstance(span.get("attributes"), list):
        out["attributes"] = _otlp_attrs(span["attributes"])
    events: list[JSONValue] = []
    for ev in _list(span.get("events")):
        if isinstance(ev, dict):
            attrs = ev.get("attributes")
            events.append(
                {
                    **ev,
                    "attributes": _otlp_attrs(attrs) if isinstance(attrs, list) else _dict(attrs),
                }
            )
    out["events"] = events
    out["resource"] = resource
    return out


# Operations that are model calls (gen_ai.operation.name); embeddings, tool and agent
# spans are not.
_OTEL_CALLS = frozenset({"chat", "text_completion", "generate_content", "completion"})
_OTEL_DETAILS_EVENT = "gen_ai.client.inference.operation.details"
# v1.36.0 and earlier: one event per input message.
_OTEL_MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def _semconv_message(msg: object, field: str) -> JSONObject:
    """A message of ``gen_ai.input.messages`` (``{role, parts: [...]}``, the GenAI
    input-messages JSON schema) as an OpenAI chat message."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise RowError("mistyped field", field)
    parts = msg.get("parts")
    if not isinstance(parts, list):
        raise RowError("mistyped field", f"{field}.parts")
    out: JSONObject = {"role": msg["role"]}
    texts: list[JSONObject] = []
    calls: list[JSONValue] = []
    for p in parts:
        if not isinstance(p, dict):
            raise RowError("mistyped field", f"{field}.parts")
        kind = p.get("type")
        if kind == "text":
            texts.append({"type": "text", "text": str(p.get("content", ""))})
        elif kind == "tool_call":
            args = p.get("arguments")
            calls.append(
                {
                    "id": p.get("id"),
                    "type": "function",
                    "function": {
                        "name": p.get("name"),
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        elif kind == "tool_call_response":
            out["tool_call_id"] = p.get("id")
            result = p.get("response", p.get("result"))
            texts.append(
                {"type": "text", "text": result if isinstance(result, str) else json.dumps(result)}
            )
        elif kind in ("uri", "blob") and p.get("modality") == "image":
            url = (
                p.get("uri") or f"data:{p.get('mime_type', 'image')};base64,{p.get('content', '')}"
            )
            texts.append({"type": "image_url", "image_url": {"url": url}})
        else:  # reasoning, files, audio: counted as their JSON text, as other parts are
            texts.append({"type": "text", "text": json.dumps(p, ensure_ascii=False)})
    if len(texts) == 1 and texts[0]["type"] == "text":
        out["content"] = texts[0]["text"]
    elif texts:
        content: list[JSONValue] = [*texts]
        out["content"] = content
    else:
        out["content"] = None if calls else ""
    if calls:
        out["tool_calls"] = calls
    return out


def _semconv_json(value: JSONValue, field: str) -> JSONValue:
    """An attribute recorded as JSON text (spans may) or structured (events must)."""
    if isinstance(value, str):
        try:
            parsed: JSONValue = json.loads(value)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise RowError("malformed JSON", field) from exc
        return parsed
    return value


def _otel_messages(attrs: JSONObject, events: list[JSONObject]) -> list[JSONValue]:
    """The input messages of a span, from its attributes, its operation-details event,
    or (older conventions) its per-message events."""
    source = attrs
    if "gen_ai.input.messages" not in attrs:
        for ev in events:
            if ev.get("name") == _OTEL_DETAILS_EVENT:
                details = _dict(ev.get("attributes"))
                source = {**details, **{k: v for k, v in attrs.items() if k not in details}}
                break
    messages: list[JSONValue] = []
    system = source.get("gen_ai.system_instructions")
    if system is not None:
        parts = _semconv_json(system, "gen_ai.system_instructions")
        if isinstance(parts, str):
            parts = [{"type": "text", "content": parts}]
        messages.append(
            _semconv_message({"role": "system", "parts": parts}, "gen_ai.system_instructions")
        )
    given = source.get("gen_ai.input.messages")
    if given is not None:
        listed = _semconv_json(given, "gen_ai.input.messages")
        if not isinstance(listed, list):
            raise RowError("mistyped field", "gen_ai.input.messages")
        messages += [
            _semconv_message(m, f"gen_ai.input.messages[{i}]") for i, m in enumerate(listed)
        ]
        return messages
    for ev in events:
        role = _OTEL_MESSAGE_EVENTS.get(str(ev.get("name")))
        if role is None:
            continue
        a = _dict(ev.get("attributes"))
        msg: JSONObject = {"role": a.get("role", role), "content": a.get("content")}
        calls = _semconv_json(a["tool_calls"], "tool_calls") if "tool_calls" in a else None
        if calls:
            msg["tool_calls"] = calls
        if role == "tool" and a.get("id") is not None:
            msg["tool_call_id"] = a["id"]
        messages.append(msg)
    if not messages:
        raise RowError("no input messages (content capture is off)", "gen_ai.input.messages")
    return messages


def _otel_tools(value: JSONValue) -> list[JSONValue] | None:
    """``gen_ai.tool.definitions`` (``{type, name, description, parameters}``) in the
    chat-completions form (``{type, function: {...}}``) the prompt is rendered from."""
    if value is None:
        return None
    tools = _semconv_json(value, "gen_ai.tool.definitions")
    if not isinstance(tools, list):
        raise RowError("mistyped field", "gen_ai.tool.definitions")
    out: list[JSONValue] = []
    for t in tools:
        if not isinstance(t, dict):
            raise RowError("mistyped field", "gen_ai.tool.definitions")
        if isinstance(t.get("function"), dict):
            out.append(t)
        else:
            out.append(
                {
                    "type": t.get("type", "function"),
                    "function": {k: v for k, v in t.items() if k != "type"},
                }
            )
    return out


def parse_otel(rec: JSONObject, ctx: FileContext) -> Raw:
    """An OpenTelemetry span of a GenAI model call (semantic conventions, ``docs/gen-ai``:
    ``gen-ai-spans.md``, ``gen-ai-events.md``, the ``gen_ai`` attribute registry)."""
    attrs = _dict(rec.get("attributes"))
    resource = _dict(rec.get("resource"))
    events = [e for e in _list(rec.get("events")) if isinstance(e, dict)]
    op = attrs.get("gen_ai.operation.name")
    if op is None and not any(k.startswith("gen_ai.") for k in attrs):
        raise RowError("not a GenAI span", "gen_ai.operation.name")
    if op is not None and str(op) not in _OTEL_CALLS:
        raise RowError(
            "not a GenAI inference span (embeddings, tool or agent)", "gen_ai.operation.name"
        )
    status = _dict(rec.get("status")).get("code")
    if attrs.get("error.type") not in (None, "") or status in (2, "2", "STATUS_CODE_ERROR"):
        raise RowError("failed call", "error.type")
    raw = take_time(rec, ctx, ("startTimeUnixNano",))
    tools = _otel_tools(attrs.get("gen_ai.tool.definitions"))
    messages = _otel_messages(attrs, events)
    body: JSONObject = {"messages": messages, **({"tools": tools} if tools else {})}
    raw.body = body
    both = {**resource, **attrs}
    raw.request_id = _first((rec, "spanId"))
    raw.session = _first((both, "gen_ai.conversation.id"), (both, "session.id"))
    raw.user = _first((both, "user.id"), (both, "enduser.id"))
    raw.tenant = _first((both, "tenant.id"), (both, "tenant"))
    raw.model = _first((attrs, "gen_ai.request.model"), (attrs, "gen_ai.response.model"))
    if attrs.get("gen_ai.usage.output_tokens") is not None:
        raw.output_tokens = as_int(
            attrs["gen_ai.usage.output_tokens"], "gen_ai.usage.output_tokens"
        )
    if attrs.get("gen_ai.usage.cache_read.input_tokens") is not None:
        field = "gen_ai.usage.cache_read.input_tokens"
        take_cached(
            raw,
            as_int(attrs[field], field),
            as_int(
                attrs.get("gen_ai.usage.input_tokens"), "gen_ai.usage.input_tokens", required=False
            ),
            field,
        )
    return raw


PARSERS: dict[str, Callable[[JSONObject, FileContext], Raw]] = {
    Format.LITELLM: parse_litellm,
    Format.LANGFUSE: parse_langfuse,
    Format.HELICONE: parse_helicone,
    Format.PORTKEY: parse_portkey,
    Format.OTEL: parse_otel,
}
