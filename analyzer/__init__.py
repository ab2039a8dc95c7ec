"""kvpool: should we pool KV cache, and how? Answered from a team's own request logs.

Stages, lower never importing higher: ingest -> tokenize -> blocks -> reuse -> cost
-> replay -> advisor -> report; ``cli`` is the thin command layer on top.
"""

__version__ = "0.1.0"
