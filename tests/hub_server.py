"""A loopback Hugging Face hub for tests, and a tiny GGUF writer to fill it with real files.

The server speaks the parts of the hub protocol huggingface_hub uses for downloads: HEAD/GET
``/{repo}/resolve/{rev}/{path}`` (with ``X-Repo-Commit``, ``ETag``, sizes and byte ranges), the tree listing
``/api/models/{repo}/tree/{rev}``, repo info ``/api/models/{repo}``, and errors tagged with ``X-Error-Code``.
Tests point ``HF_ENDPOINT`` (or ``endpoint=``) at it, so the real huggingface_hub code runs end to end.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

# ---- GGUF writer ------------------------------------------------------------------------------------------

_UINT32, _STRING, _ARRAY = 4, 8, 9


def _gguf_str(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv(key: str, value: object) -> bytes:
    if isinstance(value, str):
        return _gguf_str(key) + struct.pack("<I", _STRING) + _gguf_str(value)
    if isinstance(value, int):
        return _gguf_str(key) + struct.pack("<II", _UINT32, value)
    if isinstance(value, list):  # a list of strings (a vocabulary)
        body = b"".join(_gguf_str(v) for v in value)
        return _gguf_str(key) + struct.pack("<IIQ", _ARRAY, _STRING, len(value)) + body
    raise TypeError(value)


def make_gguf(
    *,
    arch: str = "llama",
    layers: int = 2,
    context_length: int = 256,
    file_type: int = 15,
    tensor_elements: int = 64,
    chat_template: str | None = None,
    seed: int = 0,
) -> bytes:
    """A valid GGUF v3 file: metadata plus ``layers`` F32 tensors of ``tensor_elements`` values each."""
    metadata: dict[str, object] = {
        "general.architecture": arch,
        "general.name": f"test-{arch}",
        "general.file_type": file_type,
        f"{arch}.block_count": layers,
        f"{arch}.context_length": context_length,
        "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b"],
    }
    if chat_template is not None:
        metadata["tokenizer.chat_template"] = chat_template
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, layers, len(metadata)))
    for k, v in metadata.items():
        out += _kv(k, v)
    nbytes = tensor_elements * 4
    for i in range(layers):
        out += _gguf_str(f"blk.{i}.weight") + struct.pack("<IQIQ", 1, tensor_elements, 0, i * nbytes)
    out += b"\0" * (-len(out) % 32)  # general.alignment defaults to 32
    # Distinct contents per seed, so two test files never share a blob (the etag is the content's sha256).
    pattern = hashlib.sha256(f"{seed}".encode()).digest()
    data = (pattern * (nbytes * layers // len(pattern) + 1))[: nbytes * layers]
    return bytes(out) + data


# ---- the server -------------------------------------------------------------------------------------------


@dataclass
class HubFile:
    content: bytes
    declared_size: int | None = None  # lie about the size in HEAD/tree (a "huge" file, for disk-space tests)
    served: bytes | None = None  # send these bytes instead of `content` (checksum-mismatch tests)
    stall_after: int | None = None  # send this many bytes, then hang until the server's `release` is set

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def size(self) -> int:
        return self.declared_size if self.declared_size is not None else len(self.content)


@dataclass
class Repo:
    files: dict[str, HubFile]
    token: str | None = None  # gated: requests must carry "Authorization: Bearer <token>"
    commit: str = field(default_factory=lambda: hashlib.sha1(b"commit").hexdigest())


class HubServer:
    """Run with ``with HubServer() as hub:``; ``hub.url`` is the endpoint, ``hub.requests`` the access log."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.release = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo_id: str, files: dict[str, bytes | HubFile], token: str | None = None) -> Repo:
        repo = Repo({k: v if isinstance(v, HubFile) else HubFile(v) for k, v in files.items()}, token)
        repo.commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = repo
        return repo

    def ranges(self, suffix: str) -> list[str | None]:
        """The Range headers of the GETs for files whose path ends with ``suffix``."""
        return [r for m, p, r in self.requests if m == "GET" and p.endswith(suffix)]

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                self._dispatch(head=True)

            def do_GET(self) -> None:
                self._dispatch(head=False)

            def _dispatch(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                server.requests.append((self.command, path, self.headers.get("Range")))
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/tree/([^/]+)(?:/.*)?)?", path)
                if m:
                    return self._api(m.group(1), m.group(2), head)
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    return self._resolve(m.group(1), m.group(2), m.group(3), head)
                self._error(404, "RepoNotFound", "not found")

            def _repo(self, repo_id: str) -> Repo | None:
                repo = server.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", "Repository not found")
                    return None
                if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                    self._error(401, "GatedRepo", "Access to this model is restricted")
                    return None
                return repo

            def _api(self, repo_id: str, rev: str | None, head: bool) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                if rev is not None and rev not in ("main", repo.commit):
                    return self._error(404, "RevisionNotFound", "Invalid rev id")
                entries = [
                    {
                        "type": "file",
                        "path": name,
                        "oid": hashlib.sha1(f.content).hexdigest(),
                        "size": f.size,
                        "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134},
                    }
                    for name, f in repo.files.items()
                ]
                siblings = [{"rfilename": e["path"]} for e in entries]
                body = {"id": repo_id, "sha": repo.commit, "siblings": siblings} if rev is None else entries
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                if not head:
                    self.wfile.write(raw)

            def _resolve(self, repo_id: str, rev: str, name: str, head: bool) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                if rev not in ("main", repo.commit):
                    return self._error(404, "RevisionNotFound", "Invalid rev id")
                f = repo.files.get(name)
                if f is None:
                    return self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
                body = f.served if f.served is not None else f.content
                start = 0
                rng = self.headers.get("Range")
                if rng and not head:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{f.sha256}"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(f.size if head else len(body) - start))
                self.end_headers()
                if head:
                    return
                chunk = body[start:]
                if f.stall_after is not None and start < f.stall_after:
                    self.wfile.write(chunk[: f.stall_after - start])
                    self.wfile.flush()
                    server.release.wait(60)
                    self.close_connection = True
                    return
                self.wfile.write(chunk)

            def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler
