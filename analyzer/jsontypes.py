"""Names for JSON values of a shape known only at run time (a log record, an engine's
payload, a document kvpool writes), so that a signature says "JSON" rather than ``Any``.

``JSONValue`` is what ``json.loads`` can return; ``JSONObject`` a JSON object. A reader
narrows a value (``isinstance``) before it uses it as anything more specific.
"""

from __future__ import annotations

from typing import TypeAlias

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = JSONScalar | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]
