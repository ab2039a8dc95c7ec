"""Chat logs written for the ingest tests, and the check that parallel reads agree."""

from __future__ import annotations

import json
import random
from pathlib import Path

FIX = Path(__file__).parents[1] / "fixtures" / "ingest"


SALT = b"fixed test salt"


def chat_log(path: Path, n: int, seed: int = 0, timed: bool = True, bad: bool = True) -> Path:
    """Multi-turn chat requests, some out of order, with bad lines sprinkled in."""
    rnd = random.Random(seed)
    words = ["cache", "token", "prefix", "model", "block", "hash", "user", "answer", "data"]
    sessions: list[list[dict]] = []
    lines = []
    for i in range(n):
        if not sessions or rnd.random() < 0.3:
            sessions.append([{"role": "system", "content": "You help. " * rnd.randint(1, 40)}])
        msgs = rnd.choice(sessions)
        msgs.append({"role": "user", "content": " ".join(rnd.choices(words, k=rnd.randint(3, 60)))})
        rec: dict = {
            "id": f"r{i}",
            "request": {"messages": list(msgs), "user": f"u{len(sessions)}"},
        }
        if timed:
            rec["timestamp"] = 1_700_000_000 + i + rnd.choice([0, 0, 0, -3])
        lines.append(json.dumps(rec))
        msgs.append({"role": "assistant", "content": " ".join(rnd.choices(words, k=9))})
        if bad and rnd.random() < 0.05:
            lines.append(rnd.choice(["{not json", "", '{"id": "x", "request": {}}', "[1, 2]"]))
    path.write_text("\n".join(lines) + "\n")
    return path


def same(one, many) -> None:
    assert many.table.equals(one.table)
    assert many.table.schema.metadata == one.table.schema.metadata
    assert str(many.skipped) == str(one.skipped)
    assert (many.reordered, many.untimed_files, many.mixed_unit_files, many.notes) == (
        one.reordered,
        one.untimed_files,
        one.mixed_unit_files,
        one.notes,
    )
    # Previews (a human aid, only written with --keep-previews) name, for a block where
    # two messages start, whichever one the memo let the process read first; both are
    # the text of that block.
    assert set(many.previews) == set(one.previews)
