"""``kvpool record``: engines' KV-event streams -> a recording every command reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from analyzer.cli import options as o


def register(app: typer.Typer) -> None:
    """Add this command group to the ``kvpool`` app."""
    app.command("record")(record)


def record(
    *,
    kv_events: Annotated[
        list[str],
        typer.Option(
            "--kv-events",
            metavar="ENDPOINT",
            help="An engine's KV-event endpoint, tcp://HOST:PORT (vLLM/SGLang "
            "--kv-events-config; repeat for each engine or data-parallel rank: rank r "
            "publishes on PORT+r).",
        ),
    ],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Recording to write (.kvev; '-': stdout).")
    ],
    replay: Annotated[
        list[str] | None,
        typer.Option(
            "--replay",
            metavar="ENDPOINT",
            help="The engine's replay endpoint (its replay_endpoint), one per --kv-events "
            "in the same order: batches missed in a sequence gap are asked for there.",
        ),
    ] = None,
    topic: Annotated[
        str, typer.Option("--topic", help="The engines' topic ('' receives every topic).")
    ] = "",
    duration: Annotated[
        float | None,
        typer.Option("--duration", help="Stop after this many seconds (default: Ctrl-C)."),
    ] = None,
    max_events: Annotated[
        int | None,
        typer.Option(
            "--max-events", help="Stop after the batch that brings the events to this count."
        ),
    ] = None,
    salt_file: o.SaltFile = None,  # keys the pseudonyms of SGLang's session ids
    force: o.Force = False,
    keep_names: Annotated[
        bool,
        typer.Option("--keep-names", help="Write the endpoints' addresses into the recording."),
    ] = False,
) -> None:
    """Record engines' KV events (vLLM, SGLang, LMCache through vLLM) for convert/reuse/analyze.

    Stops at --duration, --max-events or Ctrl-C (SIGTERM, SIGHUP), each leaving a whole
    recording; a second Ctrl-C abandons it. docs/formats.md, "KV-event recordings".
    """
    import math
    import signal

    from rich.console import Console

    from analyzer.blocks import load_salt
    from analyzer.cli.stdio import is_stdio, output_file
    from analyzer.errors import UsageError
    from analyzer.ingest.kvfile import RecordingWriter
    from analyzer.ingest.kvrecord import RecordOptions, check_endpoint, record_events
    from analyzer.outputs import atomic_path, check_output
    from analyzer.progress import enabled

    endpoints = tuple(check_endpoint(e, "--kv-events") for e in kv_events)
    if not endpoints:
        raise UsageError("give at least one --kv-events endpoint")
    replays = tuple(check_endpoint(r, "--replay") for r in replay or ())
    if len(replays) > len(endpoints):
        raise UsageError(
            f"{len(replays)} --replay endpoints for {len(endpoints)} --kv-events",
            hint="one --replay per --kv-events, in the same order",
        )
    if len(set(endpoints)) < len(endpoints):
        raise UsageError("an endpoint is given twice in --kv-events")
    if duration is not None and not (math.isfinite(duration) and 0 < duration <= 30 * 86400):
        raise UsageError(f"--duration must be between 0 and 30 days in seconds, got {duration}")
    if max_events is not None and max_events < 1:
        raise UsageError(f"--max-events must be at least 1, got {max_events}")
    opts = RecordOptions(
        endpoints=endpoints,
        replay=replays + (None,) * (len(endpoints) - len(replays)),
        topic=topic,
        duration_s=duration,
        max_events=max_events,
        keep_names=keep_names,
    )
    if not is_stdio(out):
        check_output(out, force=force)  # before waiting for events, not after
    salt = load_salt(salt_file)
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    signals = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s]
    stopping: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if stopping:  # the second: give up the recording
            raise KeyboardInterrupt
        stopping.append(signum)

    live = enabled()
    status = console.status("recording: waiting for events") if live else None

    def tick(stats):  # type: ignore[no-untyped-def]
        if status is not None:
            status.update(stats.line())

    with output_file(out, what="recording") as target:
        kept = {s: signal.getsignal(s) for s in signals}
        for s in signals:
            if kept[s] != signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                signal.signal(s, on_signal)
        try:
            with atomic_path(target, force=force) as tmp, open(tmp, "wb") as fh:
                console.print(
                    f"recording from {len(endpoints)} endpoint(s); "
                    + ("Ctrl-C" if duration is None and max_events is None else "Ctrl-C also")
                    + " stops it with a whole recording",
                    markup=False,
                )
                if status is not None:
                    status.start()
                try:
                    stats = record_events(
                        opts, RecordingWriter(fh), salt, lambda: bool(stopping), tick
                    )
                finally:
                    if status is not None:
                        status.stop()
        finally:
            for s, h in kept.items():
                signal.signal(s, h)
    name = "<stdout>" if is_stdio(out) else str(out)
    console.print(f"wrote {name}: " + stats.line().removeprefix("recording: "), markup=False)
    console.print(f"  stopped: {stats.reason}", markup=False)
    for i, n in enumerate(stats.per_endpoint):
        if not n:
            console.print(
                f"[yellow]warning: no event batches from {endpoints[i]}: is the engine "
                "publishing there (--kv-events-config endpoint, topic)?[/]"
            )
    if stats.malformed:
        listed = ", ".join(f"{n:,} {r}" for r, n in sorted(stats.malformed.items()))
        console.print(f"  skipped: {listed}", markup=False)
