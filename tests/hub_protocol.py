"""A small server that answers the Hugging Face hub's download protocol as the hub does.

For the error paths, whose answers a mirror such as olah does not reproduce. It serves
what ``snapshot_download`` asks for, with the hub's headers and error codes:

* ``GET /api/models/{repo}/revision/{rev}``: ``sha`` and ``siblings``;
* ``GET /api/models/{repo}/tree/{rev}?recursive=true``: the file listing;
* ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag``,
  ``Content-Length``; weights files (``LFS_SUFFIXES``) are a 302 to a second port
  addressed as ``localhost`` (another origin, like the hub's CDN) with
  ``X-Linked-Etag``/``X-Linked-Size``; ``Range`` gives 206 with ``Content-Range``.

Errors carry the hub's ``X-Error-Code``/``X-Error-Message`` headers and a JSON
``{"error": ...}`` body, which is all huggingface_hub reads:

* unknown repository: 401 ``RepoNotFound`` without a token, 404 with one;
* unknown revision: 404 ``RevisionNotFound`` "Invalid rev id: {rev}";
* missing file: 404 ``EntryNotFound``;
* gated repository: 401 ``GatedRepo`` without a token, 403 with a token not allowed.

Faults: ``withheld`` files are listed but answer 404 (a mirror missing a file); a
``Cut`` sends the full ``Content-Length`` header, part of the body, then drops the
connection, and with ``die=True`` stops the whole server first.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin")


def git_blob_sha(data: bytes) -> str:
    """The git blob id of ``data``: the hub's ETag of a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    gated: bool = False
    tokens: set[str] = field(default_factory=set)  # tokens let through the gate


@dataclass
class Cut:
    repo_id: str
    path: str
    after: int  # body bytes sent before the connection drops
    die: bool = False  # stop the server too: every retry is refused


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass  # the hub keeps its own request log

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    # -- answers ---------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, obj: object, status: int = 200, headers: dict | None = None) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", **(headers or {})}
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, status: int, code: str, message: str) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, "X-Request-Id": "test"}
        self._json({"error": message}, status, headers)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None

    def _lookup(self, repo_id: str, rev: str) -> tuple[Repo, str] | None:
        """The repository and commit, or None after answering the hub's error."""
        repo = self.server.hub.repos.get(repo_id)
        if repo is None:
            # anonymous callers get 401, so that private repositories do not leak
            status = 404 if self._token() else 401
            self._error(status, "RepoNotFound", "Repository not found")
            return None
        sha = repo.refs.get(rev) or (rev if rev in repo.commits else None)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, sha

    def _gate_open(self, repo_id: str, repo: Repo) -> bool:
        token = self._token()
        if not repo.gated or token in repo.tokens:
            return True
        if token is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and "
                "be authenticated to access it. Please log in.",
            )
        else:
            self._error(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized "
                f"list. Visit https://huggingface.co/{repo_id} to ask for access.",
            )
        return False

    # -- routes ----------------------------------------------------------------------
    def _route(self, head: bool) -> None:
        hub = self.server.hub
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        with hub.lock:
            hub.requests.append((self.command, path, self.headers.get("Range")))
        if path == "/api/agent-harnesses":  # huggingface_hub 2.x asks once a day
            return self._json({"standardEnvVars": [], "harnesses": {}})
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            return self._info(m.group(1), m.group(2) or "main")
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
            return self._tree(m.group(1), m.group(2), (m.group(3) or "").strip("/"))
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m.group(1), m.group(2), m.group(3))
        if m := re.fullmatch(r"/lfs-cdn/([0-9a-f]{64})", path):
            return self._cdn(m.group(1))
        self._error(404, "NotFound", "Sorry, we can't find the page you are looking for.")

    def _info(self, repo_id: str, rev: str) -> None:
        found = self._lookup(repo_id, rev)
        if found is None:
            return
        repo, sha = found
        # a gated repository's metadata is public, as on the hub; its files are not
        siblings = [{"rfilename": p} for p in sorted(repo.commits[sha])]
        self._json(
            {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
             "gated": "manual" if repo.gated else False, "siblings": siblings}
        )  # fmt: skip

    def _tree(self, repo_id: str, rev: str, prefix: str) -> None:
        found = self._lookup(repo_id, rev)
        if found is None:
            return
        repo, sha = found
        files = {p: d for p, d in repo.commits[sha].items() if p.startswith(prefix)}
        entries = []
        for name, data in sorted(files.items()):
            entry = {"type": "file", "oid": git_blob_sha(data), "size": len(data), "path": name}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {
                    "oid": hashlib.sha256(data).hexdigest(),
                    "size": len(data),
                    "pointerSize": 134,
                }
            entries.append(entry)
        self._json(entries)

    def _resolve(self, repo_id: str, rev: str, name: str) -> None:
        hub = self.server.hub
        found = self._lookup(repo_id, rev)
        if found is None or not self._gate_open(repo_id, found[0]):
            return
        repo, sha = found
        data = repo.commits[sha].get(name)
        if data is None or (repo_id, name) in hub.withheld:
            return self._error(404, "EntryNotFound", "Entry not found")
        headers = {"X-Repo-Commit": sha, "ETag": f'"{git_blob_sha(data)}"'}
        if name.endswith(LFS_SUFFIXES):
            oid = hashlib.sha256(data).hexdigest()
            with hub.lock:
                hub.cdn[oid] = (repo_id, name, data)
            location = f"{hub.cdn_endpoint}/lfs-cdn/{oid}"
            linked = {"X-Linked-Etag": f'"{oid}"', "X-Linked-Size": str(len(data))}
            return self._send(302, b"", {"Location": location, **headers, **linked})
        self._body(repo_id, name, data, headers)

    def _cdn(self, oid: str) -> None:
        item = self.server.hub.cdn.get(oid)
        if item is None:
            return self._send(404)
        repo_id, name, data = item
        self._body(repo_id, name, data, {"ETag": f'"{oid}"'})

    def _body(self, repo_id: str, name: str, data: bytes, headers: dict) -> None:
        hub = self.server.hub
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
        status, start = 200, 0
        if m := re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or ""):
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            status, data = 206, data[start : end + 1]
        cut = None
        if self.command == "GET":
            with hub.lock:
                cut = next((c for c in hub.cuts if (c.repo_id, c.path) == (repo_id, name)), None)
                if cut is not None:
                    hub.cuts.remove(cut)
        if cut is None:
            return self._send(status, data, headers)
        # the headers promise the whole body; part of it comes, then the connection drops
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data[: max(0, cut.after - start)])
        self.wfile.flush()
        self.close_connection = True
        if cut.die:
            hub.stop()  # listeners closed before the client notices: retries are refused
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    hub: HubServer

    def server_activate(self) -> None:
        self.connections: set[socket.socket] = set()
        super().server_activate()

    def process_request(self, request, client_address) -> None:
        self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Drop kept-alive connections too: a stopped hub answers nothing at all."""
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HubServer:
    """The hub protocol on 127.0.0.1 (API and files) and localhost (the "CDN")."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.withheld: set[tuple[str, str]] = set()
        self.cuts: list[Cut] = []
        self.cdn: dict[str, tuple[str, str, bytes]] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.lock = threading.Lock()
        self.port = self.cdn_port = 0
        self._life = threading.Lock()
        self._servers: list[_Server] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cdn_endpoint(self) -> str:
        # another host name: huggingface_hub reads X-Linked-* from the 302 and does not
        # follow a HEAD redirect there, as with the hub's real CDN
        return f"http://localhost:{self.cdn_port}"

    def add_commit(
        self,
        repo_id: str,
        files: dict[str, bytes],
        refs: tuple[str, ...] = ("main",),
        gated: bool = False,
    ) -> str:
        """Add a commit holding ``files`` under the branches/tags ``refs``; its sha."""
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name])
        sha = digest.hexdigest()
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[sha] = dict(files)
        repo.refs.update(dict.fromkeys(refs, sha))
        repo.gated = repo.gated or gated
        return sha

    def add_folder(self, repo_id: str, folder: Path, **kwargs: object) -> str:
        """Add a commit holding every file of ``folder``."""
        files = {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir()) if p.is_file()}
        return self.add_commit(repo_id, files, **kwargs)

    def start(self) -> HubServer:
        """Listen (again, on the same ports after a stop)."""
        with self._life:
            if self._servers:
                raise RuntimeError("already running")
            for attr, host in (("port", "127.0.0.1"), ("cdn_port", "localhost")):
                httpd = _Server((host, getattr(self, attr)), _Handler)
                httpd.hub = self
                setattr(self, attr, httpd.server_address[1])
                kwargs = {"poll_interval": 0.05}
                threading.Thread(target=httpd.serve_forever, kwargs=kwargs, daemon=True).start()
                self._servers.append(httpd)
        return self

    def stop(self) -> None:
        with self._life:
            servers, self._servers = self._servers, []
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()
            httpd.close_connections()
