"""synth stage: realistic synthetic request logs with known structure.

Public API::

    from analyzer.synth import SynthConfig, generate
    stats = generate(SynthConfig(profile="chat", requests=1000, seed=1), "chat.jsonl.gz",
                     fmt="openai", truth_path="chat.truth.json")
"""

from analyzer.synth.config import ARRIVALS, FORMATS, PROFILES, SynthConfig, SynthStats
from analyzer.synth.generate import generate

__all__ = ["ARRIVALS", "FORMATS", "PROFILES", "SynthConfig", "SynthStats", "generate"]
