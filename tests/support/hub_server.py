"""An imitation of the Hugging Face hub on 127.0.0.1, for `respd pull` tests.

It answers the routes `huggingface_hub` (2.x) calls: the model info listing with file
metadata (`/api/models/{repo}[/revision/{rev}]?blobs=true`), the tree listing, and
`/{repo}/resolve/{rev}/{file}` with HEAD and GET and the hub's headers: `ETag`, and for an
LFS file `X-Linked-Etag` (its sha256), `X-Linked-Size` and `X-Repo-Commit` on a redirect to
a CDN route that serves the bytes, a `Range` answered by 206. Every request is recorded. A
test can cut one GET short (then answer 503 until `heal`), to leave a partial download
behind, or serve altered bytes for a file."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.gguf.tokenizer import copy_tokenizer

N_EMBD = 64
N_HEAD = 4
N_FF = 64
CHUNK = 64 * 1024


def write_tiny_chat_model(path: Path, tokenizer_from: Path, *, seed: int) -> Path:
    """A one-block llama GGUF with SmolLM2's tokenizer and chat template: about 6 MB (the
    vocabulary's F16 rows), loads and generates (noise) in milliseconds. `seed` varies the
    bytes, so two quants of the imitation repo differ."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_string("general.name", f"respd-test-tiny-{seed}")
    w.add_context_length(2048)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(w, tokenizer_from)
    ones = np.ones(N_EMBD, dtype=np.float32)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD)).astype(np.float16))
    w.add_tensor("output_norm.weight", ones)
    w.add_tensor("blk.0.attn_norm.weight", ones)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{name}.weight", rand(N_EMBD, N_EMBD))
    w.add_tensor("blk.0.ffn_norm.weight", ones)
    w.add_tensor("blk.0.ffn_gate.weight", rand(N_FF, N_EMBD))
    w.add_tensor("blk.0.ffn_up.weight", rand(N_FF, N_EMBD))
    w.add_tensor("blk.0.ffn_down.weight", rand(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass
class HubFile:
    data: bytes
    lfs: bool = True

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


@dataclass(frozen=True)
class Seen:
    """One request as the imitation hub received it."""

    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class HubImitation:
    """Repositories (name → files), the requests seen, and the faults to inject."""

    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    cut: dict[str, int] = field(default_factory=dict)  # file → bytes sent before the cut
    broken: set[str] = field(default_factory=set)  # files that answer 503 (after a cut)
    corrupt: set[str] = field(default_factory=set)  # files served with one byte altered
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def commit(self, repo: str) -> str:
        digest = hashlib.sha1(repo.encode())
        for name, f in sorted(self.repos[repo].items()):
            digest.update(name.encode() + f.etag.encode())
        return digest.hexdigest()

    def cut_once(self, name: str, after: int) -> None:
        """The next GET of `name` stops after `after` bytes; later ones answer 503 until
        `heal`: the download fails, with part of the file on disk."""
        self.cut[name] = after

    def heal(self, name: str) -> None:
        self.cut.pop(name, None)
        self.broken.discard(name)

    def gets(self, name: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path.endswith("/" + name)]

    # -- routes ---------------------------------------------------------------------------

    def _record(self, request: Request) -> None:
        self.seen.append(
            Seen(
                request.method,
                request.url.path,
                request.headers.get("range"),
                request.headers.get("authorization"),
            )
        )

    def _missing(self, what: str) -> Response:
        code = "RepoNotFound" if what == "repo" else "EntryNotFound"
        return JSONResponse(
            {"error": f"{what} not found"}, status_code=404, headers={"X-Error-Code": code}
        )

    async def model_info(self, request: Request) -> Response:
        self._record(request)
        repo = f"{request.path_params['owner']}/{request.path_params['name']}"
        if repo not in self.repos:
            return self._missing("repo")
        blobs = request.query_params.get("blobs") in ("true", "True", "1")
        siblings = []
        for name, f in sorted(self.repos[repo].items()):
            entry: dict[str, object] = {"rfilename": name}
            if blobs:
                entry |= {"size": len(f.data), "blobId": f.git_sha1}
                if f.lfs:
                    entry["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": 134}
            siblings.append(entry)
        return JSONResponse(
            {
                "_id": repo,
                "id": repo,
                "modelId": repo,
                "author": repo.split("/")[0],
                "sha": self.commit(repo),
                "private": False,
                "gated": False,
                "disabled": False,
                "tags": ["gguf"],
                "siblings": siblings,
            }
        )

    async def tree(self, request: Request) -> Response:
        self._record(request)
        repo = f"{request.path_params['owner']}/{request.path_params['name']}"
        if repo not in self.repos:
            return self._missing("repo")
        entries = []
        for name, f in sorted(self.repos[repo].items()):
            entry: dict[str, object] = {
                "type": "file",
                "oid": f.git_sha1,
                "size": len(f.data),
                "path": name,
            }
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            entries.append(entry)
        return JSONResponse(entries)

    async def resolve(self, request: Request) -> Response:
        """A file by its repository path. An LFS file is a redirect to the CDN, as on the
        hub, with the file's checksum, size and commit on the redirect itself."""
        self._record(request)
        repo = f"{request.path_params['owner']}/{request.path_params['name']}"
        name = request.path_params["file"]
        f = self.repos.get(repo, {}).get(name)
        if f is None:
            return self._missing("repo" if repo not in self.repos else "entry")
        headers = {"ETag": f'"{f.etag}"', "X-Repo-Commit": self.commit(repo)}
        if not f.lfs:
            return self._serve(request, f, name, headers)
        headers |= {
            "X-Linked-Etag": f'"{f.sha256}"',
            "X-Linked-Size": str(len(f.data)),
            # Another host name for the same server, as the hub's CDN is another host: the
            # client follows it without the hub's token.
            "Location": f"http://localhost:{self.port}/cdn-lfs/{repo}/{name}",
        }
        return Response(status_code=302, headers=headers)

    async def cdn(self, request: Request) -> Response:
        self._record(request)
        repo = f"{request.path_params['owner']}/{request.path_params['name']}"
        name = request.path_params["file"]
        f = self.repos[repo][name]
        return self._serve(request, f, name, {"ETag": f'"{f.sha256}"'})

    def _serve(self, request: Request, f: HubFile, name: str, headers: dict[str, str]) -> Response:
        """The file's bytes, or the part a `Range` asks for (206), with the faults set."""
        if name in self.broken:
            return Response("unavailable", status_code=503)
        data = f.data
        if name in self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        headers = {**headers, "Accept-Ranges": "bytes"}
        status = 200
        if (spec := request.headers.get("range")) and spec.startswith("bytes="):
            first, _, last = spec.removeprefix("bytes=").partition("-")
            start, end = int(first or 0), int(last) if last else len(data) - 1
            if start >= len(data):
                return Response(status_code=416, headers={"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        headers["Content-Length"] = str(len(data))
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        cut = self.cut.pop(name, None)
        if cut is not None:
            self.broken.add(name)
        return StreamingResponse(
            self._body(data, cut), status_code=status, headers=headers, media_type=None
        )

    async def _body(self, data: bytes, cut: int | None) -> AsyncIterator[bytes]:
        limit = len(data) if cut is None else cut
        for offset in range(0, limit, CHUNK):
            yield data[offset : min(offset + CHUNK, limit)]
            await asyncio.sleep(0)
        if cut is not None:
            # Ending the body early with an error drops the connection mid-response.
            raise ConnectionAbortedError("cut short by the test")

    def app(self) -> Starlette:
        repo = "/{owner}/{name}"
        return Starlette(
            routes=[
                Route(f"/api/models{repo}", self.model_info),
                Route(f"/api/models{repo}/revision/{{rev}}", self.model_info),
                Route(f"/api/models{repo}/tree/{{rev}}", self.tree),
                Route(f"/cdn-lfs{repo}/{{file:path}}", self.cdn, methods=["GET", "HEAD"]),
                Route(
                    f"{repo}/resolve/{{rev}}/{{file:path}}", self.resolve, methods=["GET", "HEAD"]
                ),
            ]
        )


@contextlib.contextmanager
def serving_hub(hub: HubImitation) -> Iterator[HubImitation]:
    """Run `hub` on a free port of 127.0.0.1 in a thread of its own (the tests that use
    it are synchronous: subprocesses and blocking clients)."""
    server = uvicorn.Server(
        uvicorn.Config(hub.app(), host="127.0.0.1", port=0, lifespan="off", log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the imitation hub did not start")
        threading.Event().wait(0.01)
    hub.port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield hub
    finally:
        server.should_exit = True
        thread.join(timeout=10)
