"""tokenize stage: render chat requests as the engine frames them and tokenize offline."""

from analyzer.tokenize.render import (
    TEMPLATES,
    TOOLS_POSITIONS,
    Part,
    Previews,
    PromptRenderer,
    RenderError,
)
from analyzer.tokenize.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "TEMPLATES",
    "TOOLS_POSITIONS",
    "Part",
    "Previews",
    "PromptRenderer",
    "RenderError",
    "Tokenizer",
    "load_tokenizer",
]
