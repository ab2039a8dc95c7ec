"""The model a deployment serves, as launch scripts, pilot commands and settings name it.

vLLM (``vllm serve MODEL``) and SGLang (``--model-path MODEL``) take a Hugging Face
repository id or a local model folder, never a ``config.json`` (vLLM's
``ModelConfig.model``, ``vllm/config/model.py``: "Name or path of the Hugging Face model
to use"). A catalog model is
served by its repository id, checked against Hugging Face's rules for one; a model given
as ``--model path/config.json`` (or its folder) is served from that folder, which must
exist. Reports never carry a path (docs/security.md), so the folder is named by its name
only and every command passes ``"$MODEL"``: the launch scripts stop with a message
until ``MODEL`` holds the folder's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.errors import UsageError
from analyzer.quoting import comment, has_control, shell

if TYPE_CHECKING:
    from analyzer.cost.model_spec import ModelSpec


def is_repo_id(text: str) -> bool:
    """Whether ``text`` is a Hugging Face repository id (``huggingface_hub``'s own check:
    an optional namespace and a name of letters, digits, '-', '_' and '.', without
    '--' or '..', at most 96 characters)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined]

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class ServedModel:
    """Exactly one of ``repo`` (a Hugging Face repository id) or ``folder`` (the name of
    a local model folder, whose path the user gives as ``MODEL``)."""

    repo: str = ""
    folder: str = ""

    def __post_init__(self) -> None:
        assert bool(self.repo) != bool(self.folder), self
        assert not self.repo or is_repo_id(self.repo), self.repo

    @property
    def name(self) -> str:
        """How reports name it: the repository id, or the folder's name."""
        return self.repo or self.folder

    @property
    def arg(self) -> str:
        """The model as one shell word of a command line."""
        return shell(self.repo) if self.repo else '"$MODEL"'

    @property
    def k8s_arg(self) -> str:
        """The model in a Kubernetes container's command (``$(MODEL)``: its env)."""
        return self.repo or "$(MODEL)"

    @property
    def setup(self) -> str:
        """What the user sets before running a command that names the model (one line,
        for a comment), or "" for a repository id."""
        if self.repo:
            return ""
        return comment(
            f"MODEL: set it to the path of the model folder {self.folder!r} (its "
            "config.json, tokenizer and weights); reports carry no paths"
        )

    def to_json(self) -> dict[str, object]:
        return {"repo": self.repo} if self.repo else {"folder": self.folder}


def model_folder(flag: str) -> Path | None:
    """The folder a ``--model`` flag names (a ``config.json`` or a model folder), or None
    for a catalog name."""
    p = Path(flag)
    if flag.lower().endswith(".json") or p.is_file():
        return p.resolve().parent
    if p.is_dir():
        return p.resolve()
    return None


def model_label(flag: str) -> str:
    """A ``--model`` flag as outputs name it: a catalog name as given, a config by its
    folder's name (never its path)."""
    folder = model_folder(flag)
    return flag if folder is None else (folder.name or "model")


def served_model(spec: ModelSpec, flag: str) -> ServedModel:
    """The model the engines serve for ``--model flag`` (``spec``: its
    :class:`~analyzer.cost.catalog.ModelSpec`); a usage error when it is neither a
    repository id nor an existing folder."""
    folder = model_folder(flag)
    if folder is not None:
        if not folder.is_dir():
            raise UsageError(f"--model {flag}: the model folder does not exist")
        if has_control(folder.name):
            raise UsageError(
                f"--model {flag!r}: the model folder's name holds a control character",
                hint="rename the folder; launch scripts and reports name it",
            )
        return ServedModel(folder=folder.name or "model")
    repo = spec.hf_repo or flag
    if not is_repo_id(repo):
        raise UsageError(
            f"model {repo!r} is neither a Hugging Face repository id nor a model folder",
            hint="pass --model a catalog name, a config.json or a model folder",
        )
    return ServedModel(repo=repo)
