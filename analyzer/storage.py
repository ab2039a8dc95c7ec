"""Object storage as inputs and outputs: ``s3://``, ``gs://``, ``az://`` and ``hf://``.

Through ``pyarrow.fs`` (docs/formats.md, "Object storage"): pyarrow is already a
dependency, and its S3, GCS and Azure filesystems are compiled into the wheels with the
providers' own credential chains (AWS: ``AWS_ACCESS_KEY_ID``/``AWS_PROFILE``,
``~/.aws/credentials`` and ``config``, web identity, instance roles, and
``AWS_ENDPOINT_URL`` for an S3-compatible server; GCS: ``GOOGLE_APPLICATION_CREDENTIALS``
or the metadata server; Azure: ``DefaultAzureCredential``, or an account key / SAS token
from ``AZURE_STORAGE_ACCOUNT_KEY`` / ``AZURE_STORAGE_SAS_TOKEN``). ``hf://`` is the
Hugging Face Hub's fsspec filesystem (``huggingface_hub``, which the tokenizers already
bring), which pyarrow wraps.

**Inputs** are streamed, 8 MiB at a time (bounded memory), into a private copy (0600 in
a 0700 folder, as stdin and pipes are, analyzer/cli/stdio.py) that the readers then read
as a local file: their byte-range splits (``--jobs``), Parquet footers and the bulk
readers' passes need a seekable file, and compressed objects stay compressed on disk and
are inflated in bounded steps by the same code as local files. Messages name the URL as
given, without credentials (:func:`public`); reports name inputs ``input-N`` unless
``--keep-names``. The copy is deleted when the command ends.

**Outputs** are written whole or not at all: the file (or report folder, or dataset
folder) is first written locally as every output is (analyzer/outputs.py), then uploaded
to a temporary key beside the target (``.NAME.kvpool-tmp-XXXX``) and only then moved
onto the target (S3: a server-side copy, atomic for readers of the key; the temporary
key is deleted). A failed or interrupted upload leaves the old object, or none, and
deletes its temporary key.

Errors are one line naming the URL without credentials: no such bucket, no such key,
access denied (with the credential sources when none were found), unreachable endpoint.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from analyzer.errors import InputError, KvpoolError, Location, OutputError, UsageError
from analyzer.spill import new_dir, remove

if TYPE_CHECKING:  # pyarrow is imported when a URL is opened, not at start-up
    from pyarrow.fs import FileInfo, FileSystem

# URL schemes read and written through pyarrow.fs (gcs:// is gs://; abfs[s]:// is Azure's
# own form, container@account.dfs.core.windows.net).
SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "hf")
COPY_BYTES = 8 << 20  # one read of an object while it is copied

# The objects this run reads (``public`` URLs): no output may replace one. The local
# files' twin is analyzer/outputs.py's, whose reset_inputs clears both.
_INPUT_URLS: set[str] = set()


def note_input_url(url: str) -> None:
    """Record that this run reads the object at ``url``."""
    _INPUT_URLS.add(url)


def is_input_url(url: str) -> bool:
    """Whether this run reads the object at ``url``: no output may then replace it."""
    return url in _INPUT_URLS


def reset_input_urls() -> None:
    _INPUT_URLS.clear()


def is_url(value: object) -> bool:
    """Whether ``value`` names an object-storage URL (``s3://bucket/key`` ...)."""
    scheme, sep, _ = str(value).partition("://")
    return bool(sep) and scheme.lower() in SCHEMES


def public(url: str) -> str:
    """``url`` as messages show it: no ``user:secret@`` and no query (pyarrow takes
    ``?access_key=...&secret_key=...``), so no credential is ever printed."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        if ":" in user or parts.scheme.lower() not in ("abfs", "abfss"):
            netloc = host  # abfs's container@account is a name, not a credential
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True, slots=True)
class Remote:
    """An object-storage URL opened: its filesystem and the path within it."""

    url: str  # as given
    fs: FileSystem
    path: str  # bucket/key

    @property
    def shown(self) -> str:
        return public(self.url)

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]


def _azure(url: str) -> tuple[FileSystem, str]:
    """``az://CONTAINER/PATH`` (adlfs's form) on the account ``AZURE_STORAGE_ACCOUNT_NAME``
    (or ``AZURE_STORAGE_ACCOUNT``, the az CLI's name)."""
    import pyarrow.fs as pafs

    parts = urlsplit(url)
    container, path = parts.netloc, parts.path.lstrip("/")
    if "@" in container:  # az://container@account.dfs.core.windows.net/path
        fs, inner = pafs.FileSystem.from_uri("abfss://" + url.split("://", 1)[1])
        return fs, str(inner)
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or os.environ.get(
        "AZURE_STORAGE_ACCOUNT"
    )
    if not account:
        raise UsageError(
            f"{public(url)}: no Azure storage account named",
            hint="set AZURE_STORAGE_ACCOUNT_NAME, or write "
            "az://CONTAINER@ACCOUNT.dfs.core.windows.net/PATH",
        )
    kw: dict[str, str] = {}
    key = os.environ.get("AZURE_STORAGE_ACCOUNT_KEY") or os.environ.get("AZURE_STORAGE_KEY")
    if key:
        kw["account_key"] = key
    elif sas := os.environ.get("AZURE_STORAGE_SAS_TOKEN"):
        kw["sas_token"] = sas
    return pafs.AzureFileSystem(account, **kw), f"{container}/{path}".rstrip("/")


def open_url(url: str) -> Remote:
    """The filesystem of ``url``; a URL pyarrow cannot open is a one-line error."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    scheme = url.split("://", 1)[0].lower()
    try:
        if scheme == "az":
            fs, path = _azure(url)
        else:
            fs, path = pafs.FileSystem.from_uri(
                "gs://" + url.split("://", 1)[1] if scheme == "gcs" else url
            )
    except KvpoolError:
        raise
    except (OSError, ValueError, pa.ArrowException, ImportError) as exc:
        raise UsageError(
            f"{public(url)}: cannot open this URL ({_reason(exc, url)})",
            hint="object storage URLs: s3://BUCKET/KEY, gs://BUCKET/KEY, az://CONTAINER/PATH, "
            "hf://datasets/OWNER/NAME/PATH",
        ) from None
    path = path.rstrip("/")
    if not path or (scheme != "hf" and "/" not in path and not path.strip()):
        raise UsageError(f"{public(url)}: no bucket named in the URL")
    return Remote(url, fs, path)


def _credentials_found(scheme: str) -> bool:
    """Whether any of the usual credential sources of ``scheme`` is set (an instance
    role or metadata server cannot be seen from here: then this says True)."""
    env = os.environ
    if scheme == "s3":
        home = Path(env.get("HOME", "~")).expanduser()
        return bool(
            env.get("AWS_ACCESS_KEY_ID")
            or env.get("AWS_PROFILE")
            or env.get("AWS_WEB_IDENTITY_TOKEN_FILE")
            or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
            or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
            or Path(env.get("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials")).is_file()
            or Path(env.get("AWS_CONFIG_FILE", home / ".aws" / "config")).is_file()
            or env.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true"
        )
    return True


_CREDENTIAL_HINT = {
    "s3": "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or run `aws configure`",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS or run on a machine with a service account",
    "gcs": "set GOOGLE_APPLICATION_CREDENTIALS or run on a machine with a service account",
    "az": "set AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or log in with `az login`",
}


def _reason(exc: BaseException, url: str) -> str:
    """A short reason for a storage error, free of request ids and credentials."""
    text = str(exc)
    upper = text.upper()
    if isinstance(exc, FileNotFoundError) or "NO_SUCH_KEY" in upper or "NOT FOUND" in upper:
        return "no such key"
    if "NO_SUCH_BUCKET" in upper or "BUCKET DOES NOT EXIST" in upper:
        return "no such bucket"
    if any(
        s in upper
        for s in (
            "ACCESS_DENIED",
            "ACCESSDENIED",
            "INVALID_ACCESS_KEY_ID",
            "SIGNATURE_DOES_NOT_MATCH",
            "FORBIDDEN",
            "HTTP STATUS 403",
            "PERMISSION",
            "UNAUTHORIZED",
        )
    ):
        scheme = url.split("://", 1)[0].lower()
        if not _credentials_found(scheme):
            return "access denied: no credentials found"
        return "access denied"
    if "NETWORK_CONNECTION" in upper or "COULD NOT CONNECT" in upper or "RESOLVE" in upper:
        return "cannot reach the storage endpoint"
    first = text.splitlines()[0] if text else type(exc).__name__
    for marker in (" (Request ID", "; Details", " Detail:"):
        first = first.split(marker, 1)[0]
    return first[:200]


def _fail(exc: BaseException, remote: Remote, *, output: bool = False) -> KvpoolError:
    reason = _reason(exc, remote.url)
    if reason == "no such key" and not _bucket_exists(remote):
        reason = "no such bucket"
    scheme = remote.url.split("://", 1)[0].lower()
    hint = _CREDENTIAL_HINT.get(scheme) if reason.startswith("access denied") else None
    if output:
        return OutputError(f"cannot write {remote.shown}: {reason}", hint=hint)
    return InputError(reason, Location(remote.shown), hint=hint)


def _bucket_exists(remote: Remote) -> bool:
    import pyarrow.fs as pafs

    try:
        info = remote.fs.get_file_info(remote.bucket)
    except OSError:
        return True  # cannot tell: say what the first error said
    return bool(info.type != pafs.FileType.NotFound)


def _info(remote: Remote, *, output: bool = False) -> FileInfo:
    try:
        return remote.fs.get_file_info(remote.path)
    except OSError as exc:
        raise _fail(exc, remote, output=output) from None


def _dataset_members(remote: Remote) -> list[FileInfo]:
    """The Parquet files of a partitioned canonical dataset under a prefix."""
    import pyarrow.fs as pafs

    try:
        infos = remote.fs.get_file_info(pafs.FileSelector(remote.path, recursive=True))
    except OSError as exc:
        raise _fail(exc, remote) from None
    return [
        i
        for i in infos
        if i.type == pafs.FileType.File
        and i.path.endswith(".parquet")
        and i.path[len(remote.path) + 1 :].startswith("window_start_s=")
    ]


def fetch(url: str, folder: Path, name: str, on_bytes: Callable[[int], None] | None = None) -> Path:
    """``url`` copied into ``folder/name`` (an object: a file; a dataset prefix: a folder of
    its ``window_start_s=*/*.parquet``), streamed ``COPY_BYTES`` at a time; returns the
    local path. Missing objects, buckets and permissions are one-line InputErrors."""
    import pyarrow.fs as pafs

    remote = open_url(url)
    note_input_url(public(url))
    info = _info(remote)
    target = folder / name
    if info.type == pafs.FileType.File:
        if info.size == 0:
            raise InputError("file is empty", Location(remote.shown))
        _copy_object(remote, remote.path, target, on_bytes)
        return target
    if info.type == pafs.FileType.Directory:
        members = _dataset_members(remote)
        if not members:
            raise InputError(
                "is a folder, not an object (nor a canonical dataset: no "
                "window_start_s=*/*.parquet in it)",
                Location(remote.shown),
            )
        target.mkdir(mode=0o700)
        for m in members:
            rel = m.path[len(remote.path) + 1 :]
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            _copy_object(remote, m.path, dest, on_bytes)
        return target
    reason = "no such key" if _bucket_exists(remote) else "no such bucket"
    raise InputError(reason, Location(remote.shown))


def _copy_object(
    remote: Remote, path: str, dest: Path, on_bytes: Callable[[int], None] | None
) -> None:
    try:
        with remote.fs.open_input_stream(path) as src, open(dest, "xb") as out:
            dest.chmod(0o600)
            while chunk := src.read(COPY_BYTES):
                out.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
    except OSError as exc:
        if isinstance(exc, FileExistsError):
            raise
        with contextlib.suppress(OSError):
            dest.unlink()
        raise _fail(exc, Remote(remote.url, remote.fs, path)) from None


# -- outputs ----------------------------------------------------------------------------


def check_writable(url: str) -> Remote:
    """Before a long run: the target's bucket exists and its key is not a folder."""
    import pyarrow.fs as pafs

    remote = open_url(url)
    if is_input_url(remote.shown):
        raise OutputError(
            f"{remote.shown} is also an input of this run; refusing to overwrite it",
            hint="choose another output path",
        )
    info = _info(remote, output=True)
    if not _bucket_exists(remote):
        raise OutputError(f"cannot write {remote.shown}: no such bucket")
    if info.type == pafs.FileType.Directory:
        raise OutputError(f"{remote.shown} is a folder, not an object")
    return remote


def _tmp_key(path: str) -> str:
    head, _, name = path.rpartition("/")
    return f"{head}/.{name}.kvpool-tmp-{secrets.token_hex(6)}"


def upload(local: Path, url: str) -> None:
    """The local file ``local`` put at ``url`` whole or not at all (module docstring)."""
    remote = check_writable(url)
    tmp = _tmp_key(remote.path)
    try:
        _put(remote, local, tmp)
        remote.fs.move(tmp, remote.path)
    except OSError as exc:
        raise _fail(exc, remote, output=True) from None
    finally:
        _delete_quietly(remote, tmp)


def _put(remote: Remote, local: Path, key: str) -> None:
    """``local`` uploaded to the temporary ``key``. pyarrow's streams have no abort: a
    stream closed (or collected) after a failure completes its upload with what it had,
    so it is closed here, at once, and the caller deletes the temporary key after."""
    stream = remote.fs.open_output_stream(key)
    try:
        with open(local, "rb") as f:
            while chunk := f.read(COPY_BYTES):
                stream.write(chunk)
    finally:
        stream.close()


def _delete_quietly(remote: Remote, key: str) -> None:
    import pyarrow.fs as pafs

    with contextlib.suppress(OSError):
        if remote.fs.get_file_info(key).type == pafs.FileType.File:
            remote.fs.delete_file(key)


def _objects_under(remote: Remote) -> list[str]:
    import pyarrow.fs as pafs

    try:
        infos = remote.fs.get_file_info(pafs.FileSelector(remote.path, allow_not_found=True))
    except OSError as exc:
        raise _fail(exc, remote, output=True) from None
    return [i.path for i in infos]


def free_prefix(url: str, *, force: bool) -> tuple[str, str | None]:
    """Where a folder of reports goes under ``url`` (``analyze -o s3://b/reports``): the
    prefix itself when it holds nothing (or with ``force``), else the first free
    ``PREFIX-2``, ``-3``, ... with a note, as for a local folder (analyzer/outputs.py)."""
    remote = open_url(url.rstrip("/"))
    if not _bucket_exists(remote):
        raise OutputError(f"cannot write reports to {remote.shown}: no such bucket")
    if force or not _objects_under(remote):
        return url.rstrip("/"), None
    for i in range(2, 10_000):
        alt = f"{url.rstrip('/')}-{i}"
        if not _objects_under(open_url(alt)):
            return alt, f"{remote.shown} already holds files; wrote to {public(alt)} instead"
    raise OutputError(f"no free prefix next to {remote.shown}")


def upload_dir(local: Path, url: str, *, replace_dataset: bool = False) -> None:
    """Every file under the local folder ``local`` put under the prefix ``url``: all are
    uploaded to temporary keys first and moved into place only once every upload has
    completed. ``replace_dataset``: objects of an earlier dataset under the prefix that
    the new one does not have are deleted after the move (a canonical dataset is
    replaced whole); any other object under the prefix is refused first."""
    import pyarrow.fs as pafs

    remote = open_url(url.rstrip("/"))
    if not _bucket_exists(remote):
        raise OutputError(f"cannot write {remote.shown}: no such bucket")
    files = sorted(p for p in local.rglob("*") if p.is_file())
    keys = [f"{remote.path}/{p.relative_to(local).as_posix()}" for p in files]
    old: list[str] = []
    if replace_dataset:
        try:
            infos = remote.fs.get_file_info(
                pafs.FileSelector(remote.path, recursive=True, allow_not_found=True)
            )
        except OSError as exc:
            raise _fail(exc, remote, output=True) from None
        old = [i.path for i in infos if i.type == pafs.FileType.File]
        foreign = [p for p in old if not p[len(remote.path) + 1 :].startswith("window_start_s=")]
        if foreign:
            raise OutputError(
                f"{remote.shown} holds other objects; not replacing it with a dataset",
                hint="choose a prefix that holds nothing yet",
            )
    temps = [_tmp_key(k) for k in keys]
    moved: list[str] = []
    try:
        for p, t in zip(files, temps, strict=True):
            _put(remote, p, t)
        for t, k in zip(temps, keys, strict=True):
            remote.fs.move(t, k)
            moved.append(k)
        for k in sorted(set(old) - set(keys)):
            remote.fs.delete_file(k)
    except OSError as exc:
        raise _fail(exc, remote, output=True) from None
    finally:
        for t in temps:
            _delete_quietly(remote, t)


@contextlib.contextmanager
def staged_output(url: str, *, reports: bool = False) -> Iterator[Path]:
    """A private local path to write instead of ``url``; uploaded whole when the block
    ends without an error (a file, or a folder's files: a canonical dataset replacing an
    earlier one, or with ``reports`` a folder of reports), else dropped. The local copy
    is a spill folder (:mod:`analyzer.spill`): a trace with tenant names or a synthetic
    log is as private as a stdout copy, and a SIGKILLed upload's is swept."""
    if not reports:
        check_writable(url)
    where = new_dir("upload")
    try:
        local = where / Path(urlsplit(url).path.rstrip("/")).name
        yield local
        if local.is_dir():
            upload_dir(local, url, replace_dataset=not reports)
        elif local.is_file():
            upload(local, url)
    finally:
        remove(where)
