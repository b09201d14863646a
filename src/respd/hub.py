"""GGUF models pulled from the Hugging Face hub into respd's own cache.

`hf://owner/name[:QUANT|:FILE.gguf]` names a model in a hub repository; `pull` lists the
repository (with each file's LFS sha256), picks the GGUF, downloads it and any matching
`mmproj` projector, and verifies every byte against the hub's checksum before the file
appears at its final path. `huggingface_hub` does the listing, the URLs, the token and the
HTTP transfer (retries, `Range` requests); the partial file is respd's own, kept across runs
so that a pull that dies resumes where it stopped."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from respd import __version__

SCHEME = "hf://"
# Accepted before `owner/name` as well as the scheme: what a browser's address bar shows.
_HOST_PREFIXES = ("https://huggingface.co/", "huggingface.co/", "hf.co/")
# Without a quant, the first of these the repository has: 4-bit K-quants are the usual size
# and quality trade-off for local inference, 8-bit the safe fallback.
DEFAULT_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q8_0")
DEFAULT_CACHE = Path("~/.cache/respd/hub")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_QUANT_NAME = re.compile(r"[A-Za-z0-9_]+")
# A quant label in a file name: Q4_K_M, IQ4_XS, Q8_0, F16, BF16, F32.
_QUANT_LABEL = re.compile(r"I?Q\d(?:_[A-Za-z0-9]+)*|B?F16|F32", re.I)
_QUANT_IN_NAME = re.compile(rf"(?<![A-Za-z0-9])({_QUANT_LABEL.pattern})(?![A-Za-z0-9])", re.I)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_CHUNK = 1 << 20


class HubError(Exception):
    """A pull that cannot complete; the message says why and what to do."""


@dataclass(frozen=True)
class HubRef:
    """A model in a hub repository: a file named exactly, or a quant to pick, or neither."""

    repo: str
    file: str | None = None
    quant: str | None = None

    def __str__(self) -> str:
        tag = self.file or self.quant
        return SCHEME + self.repo + (f":{tag}" if tag else "")


@dataclass(frozen=True)
class PulledModel:
    """Local paths of a pulled model (the first part, for a split one) and its projector."""

    path: Path
    mmproj_path: Path | None
    repo: str
    file: str
    sha256: str


@dataclass(frozen=True)
class _Remote:
    """A file as the hub lists it: its size and the checksum its bytes must have."""

    name: str
    size: int
    sha256: str | None  # LFS files
    git_sha1: str | None  # files kept in git itself


def parse_ref(text: str) -> HubRef:
    """`hf://owner/name[:QUANT|:FILE.gguf]`, or the same without the scheme."""
    rest = text.strip()
    for prefix in (SCHEME, *_HOST_PREFIXES):
        if rest.startswith(prefix):
            rest = rest[len(prefix) :]
            break
    repo, sep, tag = rest.partition(":")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ValueError(
            f"not a hub model reference: {text!r}; expected hf://OWNER/NAME[:QUANT|:FILE.gguf], "
            "e.g. hf://bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M"
        )
    if not sep:
        return HubRef(repo)
    if tag.lower().endswith(".gguf"):
        if tag.startswith("/") or ".." in tag.split("/"):
            raise ValueError(f"not a file inside the repository: {tag!r}")
        return HubRef(repo, file=tag)
    if not _QUANT_NAME.fullmatch(tag):
        raise ValueError(
            f"not a quant name: {tag!r} in {text!r}; give a quant such as Q4_K_M or a file "
            "name ending in .gguf"
        )
    return HubRef(repo, quant=tag)


def _is_mmproj(name: str) -> bool:
    return Path(name).name.lower().startswith("mmproj")


def _split_part(name: str) -> tuple[int, int] | None:
    match = _SPLIT.search(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _models(files: list[str]) -> list[str]:
    """The repository's model GGUFs: projectors left out, a split model by its first part."""
    return sorted(
        f
        for f in files
        if f.lower().endswith(".gguf") and not _is_mmproj(f) and (_split_part(f) or (1, 1))[0] == 1
    )


def _quant_of(name: str) -> str | None:
    found = _QUANT_IN_NAME.findall(Path(name).name)
    return found[-1].upper() if found else None


def _has_quant(name: str, quant: str) -> bool:
    # `_` separates tokens only before a real quant label (`model_q4_k_m`): K_M alone is
    # the tail of Q4_K_M, not a quant.
    label = _QUANT_LABEL.fullmatch(quant) is not None
    before = r"(?<![A-Za-z0-9])" if label else r"(?<![A-Za-z0-9_])"
    pattern = rf"{before}{re.escape(quant)}(?![A-Za-z0-9_])"
    return re.search(pattern, Path(name).name, re.I) is not None


def _available(models: list[str]) -> str:
    quants = sorted({q for m in models if (q := _quant_of(m))})
    listed = ", ".join(quants) if quants else "none named"
    return f"available quants: {listed}; files: {', '.join(models) or 'no GGUF files'}"


def pick_file(files: list[str], quant: str | None) -> str:
    """The model GGUF in `files` that `quant` names: an exact file name, or a quant label
    (case-insensitive, a whole token of the file name), or, without one, the first of
    `DEFAULT_QUANTS` the repository has, else its first model GGUF. A split model is named
    by its first part (`-00001-of-0000N.gguf`); `pull` fetches every part. Projectors
    (`mmproj*.gguf`) are never the model."""
    models = _models(files)
    if quant is not None and quant in files:
        if _is_mmproj(quant):
            raise ValueError(
                f"{quant} is a multimodal projector, not a model; {_available(models)}"
            )
        part = _split_part(quant)
        if part is not None and part[0] != 1:
            raise ValueError(f"{quant} is not the first part of its split model; name that one")
        return quant
    if quant is not None and quant.lower().endswith(".gguf"):
        raise ValueError(f"no file {quant!r} in the repository; {_available(models)}")
    if not models:
        raise ValueError(f"the repository has no model GGUF; {_available(models)}")
    if quant is not None:
        matches = [m for m in models if _has_quant(m, quant)]
        if not matches:
            raise ValueError(f"no GGUF for quant {quant!r}; {_available(models)}")
        return matches[0]
    for preferred in DEFAULT_QUANTS:
        for m in models:
            if _has_quant(m, preferred):
                return m
    return models[0]


def split_parts(files: list[str], model_file: str) -> list[str]:
    """Every part of `model_file`'s split model, in order (just `model_file` when whole);
    a part missing from `files` is an error, since llama.cpp needs them all."""
    part = _split_part(model_file)
    if part is None:
        return [model_file]
    stem = model_file[: _SPLIT.search(model_file).start()]  # type: ignore[union-attr]
    names = [f"{stem}-{i:05d}-of-{part[1]:05d}.gguf" for i in range(1, part[1] + 1)]
    missing = [n for n in names if n not in files]
    if missing:
        raise ValueError(f"split model {model_file} lacks parts: {', '.join(missing)}")
    return names


def matching_mmproj(files: list[str], model_file: str) -> str | None:
    """The repository's projector for `model_file`: an `mmproj*.gguf` beside it (same
    folder), preferring one whose precision label matches the model's (F16 with F16), then
    F16, then the first."""
    folder = str(Path(model_file).parent)
    projectors = sorted(
        f
        for f in files
        if f.lower().endswith(".gguf") and _is_mmproj(f) and str(Path(f).parent) == folder
    )
    if not projectors:
        return None
    model_quant = _quant_of(model_file)
    for wanted in (model_quant, "F16"):
        for p in projectors:
            if wanted and _quant_of(p) == wanted:
                return p
    return projectors[0]


def hub_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Where pulled files live: `cache_dir`, else `$RESPD_HUB_CACHE`, else
    `~/.cache/respd/hub` (read at call time, so a test or a wrapper may set the env late)."""
    chosen = cache_dir or os.environ.get("RESPD_HUB_CACHE") or DEFAULT_CACHE
    return Path(chosen).expanduser()


def hub_endpoint() -> str:
    """`$HF_ENDPOINT` (a mirror) read now: `huggingface_hub` reads it once, at import."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _repo_dir(root: Path, repo: str) -> Path:
    return root / repo.replace("/", "--")


def _meta_path(repo_dir: Path, name: str) -> Path:
    return repo_dir / ".meta" / (name + ".json")


def _read_meta(repo_dir: Path, name: str) -> dict[str, Any] | None:
    try:
        meta = json.loads(_meta_path(repo_dir, name).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _write_meta(
    repo_dir: Path, remote: _Remote, digests: tuple[str, str], commit: str | None
) -> None:
    path = _meta_path(repo_dir, remote.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    sha256, git_sha1 = digests
    record = {"file": remote.name, "size": remote.size, "commit": commit}
    path.write_text(json.dumps({**record, "sha256": sha256, "git_sha1": git_sha1}))


def _digests(path: Path) -> tuple[str, str]:
    """The file's sha256, and its git blob id (sha1 over `blob SIZE\\0` and the bytes)."""
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha256.update(chunk)
            git.update(chunk)
    return sha256.hexdigest(), git.hexdigest()


@contextlib.contextmanager
def _exclusive(f: IO[bytes], name: str) -> Iterator[None]:
    """One writer per partial file: two pulls appending to it would interleave bytes."""
    if sys.platform == "win32":
        yield
        return
    import fcntl

    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        raise HubError(f"another pull of {name} is running; wait for it") from exc
    yield


def _progress_bar(shown: bool) -> Any:
    """huggingface_hub's tqdm bar, drawn to stderr when `shown` even where stderr is not a
    terminal (tqdm's default hides it there): a pull run by a script or a service logs its
    progress. HF_HUB_DISABLE_PROGRESS_BARS still hides it."""
    from huggingface_hub.utils import tqdm

    class Bar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not shown:
                kwargs["disable"] = True
            elif kwargs.get("disable") is None:
                kwargs["disable"] = False
                if not sys.stderr.isatty():
                    kwargs.setdefault("mininterval", 2.0)
            super().__init__(*args, **kwargs)

    return Bar


def _fetch(
    repo: str,
    commit: str | None,
    remote: _Remote,
    repo_dir: Path,
    *,
    endpoint: str,
    progress: bool,
    say: Callable[[str], None],
) -> tuple[Path, str]:
    """`remote` at its final path under `repo_dir`, downloaded (or resumed) and verified,
    unless a verified copy with the listed checksum is there already."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    if remote.name.startswith("/") or ".." in remote.name.split("/"):
        raise HubError(f"the hub listed a file outside the repository: {remote.name!r}")
    final = repo_dir / remote.name
    expected = remote.sha256 or remote.git_sha1
    if expected is None:
        raise HubError(
            f"the hub listed no checksum for {remote.name}; refusing a file that cannot be verified"
        )
    meta = _read_meta(repo_dir, remote.name)
    if meta and final.is_file() and meta.get("size") == final.stat().st_size == remote.size:
        known = meta.get("sha256") if remote.sha256 else meta.get("git_sha1")
        if known == expected:
            say(f"{remote.name}: cached at {final} (verified when pulled), no download")
            return final, str(meta["sha256"])

    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}.{expected[:16]}.incomplete")
    url = hf_hub_url(repo, remote.name, revision=commit, endpoint=endpoint)
    headers = build_hf_headers(library_name="respd", library_version=__version__)
    with partial.open("ab") as f, _exclusive(f, remote.name):
        start = f.tell()
        if start > remote.size:
            f.truncate(0)
            start = 0
        if start:
            say(f"{remote.name}: resuming at {start:,} of {remote.size:,} bytes")
        else:
            say(f"{remote.name}: downloading {remote.size:,} bytes from {endpoint}/{repo}")
        try:
            http_get(
                url,
                f,
                resume_size=start,
                headers=headers,
                expected_size=remote.size,
                displayed_filename=Path(remote.name).name,
                tqdm_class=_progress_bar(progress),
            )
        except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
            # The partial file stays: the next pull asks only for the bytes after it.
            raise HubError(
                f"{remote.name}: download interrupted after {f.tell():,} of {remote.size:,} "
                f"bytes ({exc}); pull again to resume"
            ) from exc
        # Checked and moved while the lock is held, so no second pull appends meanwhile.
        sha256, git_sha1 = _digests(partial)
        got = sha256 if remote.sha256 else git_sha1
        if got != expected:
            partial.unlink(missing_ok=True)
            raise HubError(
                f"{remote.name}: checksum mismatch (expected {expected}, got {got}); the "
                "download was deleted, nothing was cached: pull again, and if it fails the "
                "same way, the hub or a mirror between is serving altered bytes"
            )
        _write_meta(repo_dir, remote, (sha256, git_sha1), commit)
        os.replace(partial, final)
    say(f"{remote.name}: sha256 {sha256} verified")
    return final, sha256


def _listing(repo: str, endpoint: str) -> tuple[str | None, dict[str, _Remote]]:
    """The repository's commit and its files with their sizes and checksums."""
    import httpx2  # huggingface_hub's HTTP client
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=endpoint, library_name="respd", library_version=__version__)
    try:
        info = api.model_info(repo, files_metadata=True)
    except GatedRepoError as exc:
        raise HubError(
            f"{repo} is gated: accept its terms on the hub, then set HF_TOKEN to a token of "
            "that account"
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise HubError(
            f"no model repository {repo} at {endpoint} (or it is private: set HF_TOKEN)"
        ) from exc
    except HfHubHTTPError as exc:
        raise HubError(f"listing {repo} at {endpoint} failed: {exc}") from exc
    except (httpx2.HTTPError, OSError) as exc:
        raise HubError(
            f"cannot reach {endpoint} to list {repo}: {exc}; pull with --offline to use the cache"
        ) from exc
    remotes = {
        s.rfilename: _Remote(
            s.rfilename,
            s.lfs.size if s.lfs else (s.size or 0),
            s.lfs.sha256 if s.lfs else None,
            None if s.lfs else s.blob_id,
        )
        for s in info.siblings or []
    }
    return info.sha, remotes


def _from_cache(ref: HubRef, root: Path, say: Callable[[str], None]) -> PulledModel:
    """The model as an earlier pull left it, with no request to the hub."""
    repo_dir = _repo_dir(root, ref.repo)
    cached: dict[str, str] = {}
    for path in sorted((repo_dir / ".meta").rglob("*.gguf.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            meta = json.loads(path.read_text())
            if (repo_dir / meta["file"]).stat().st_size == meta["size"]:
                cached[meta["file"]] = meta["sha256"]
    if not cached:
        raise HubError(
            f"{ref.repo} is not in the cache at {root}, and offline mode is on (--offline or "
            "HF_HUB_OFFLINE): pull it once with network access"
        )
    try:
        model = pick_file(list(cached), ref.file or ref.quant)
        parts = split_parts(list(cached), model)
    except ValueError as exc:
        raise HubError(f"{ref} is not in the cache at {root} (offline): {exc}") from exc
    for part in parts:
        say(f"{part}: cached at {repo_dir / part} (offline)")
    mmproj = matching_mmproj(list(cached), model)
    return PulledModel(
        repo_dir / model,
        repo_dir / mmproj if mmproj else None,
        ref.repo,
        model,
        cached[model],
    )


def pull(
    ref: HubRef | str,
    *,
    cache_dir: str | Path | None = None,
    offline: bool = False,
    progress: bool = True,
) -> PulledModel:
    """Download `ref`'s GGUF (every part of a split one) and its matching projector into
    the cache, verified against the hub's checksums; a verified copy already there is
    used as is. Offline (`offline` or `HF_HUB_OFFLINE=1`), only the cache is read.
    Progress and what happened go to stderr when `progress` is true."""
    if isinstance(ref, str):
        ref = parse_ref(ref)
    root = hub_cache_dir(cache_dir)

    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    if offline or _offline_env():
        return _from_cache(ref, root, say)
    endpoint = hub_endpoint()
    commit, remotes = _listing(ref.repo, endpoint)
    names = list(remotes)
    try:
        model = pick_file(names, ref.file or ref.quant)
        parts = split_parts(names, model)
    except ValueError as exc:
        raise HubError(f"{ref.repo}: {exc}") from exc
    mmproj = matching_mmproj(names, model)
    repo_dir = _repo_dir(root, ref.repo)
    fetched = {
        name: _fetch(
            ref.repo, commit, remotes[name], repo_dir, endpoint=endpoint, progress=progress, say=say
        )
        for name in [*parts, *([mmproj] if mmproj else [])]
    }
    path, sha256 = fetched[model]
    return PulledModel(path, fetched[mmproj][0] if mmproj else None, ref.repo, model, sha256)


def resolve_model_files(
    text: str, *, cache_dir: str | Path | None = None, offline: bool = False
) -> tuple[Path, Path | None]:
    """A `--model` value as local files: `hf://…` is pulled (or found in the cache), its
    GGUF's path returned with the projector pulled beside it (if the repo has one);
    anything else is a path already, with no projector."""
    if not text.startswith(SCHEME):
        return Path(text).expanduser(), None
    pulled = pull(parse_ref(text), cache_dir=cache_dir, offline=offline)
    return pulled.path, pulled.mmproj_path


def resolve_model_ref(
    text: str, *, cache_dir: str | Path | None = None, offline: bool = False
) -> Path:
    """A `--model` value as a local path (see `resolve_model_files`)."""
    return resolve_model_files(text, cache_dir=cache_dir, offline=offline)[0]
