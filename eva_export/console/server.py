"""The review console's HTTP server (no ROS imports: the node passes in a ``Backend``).

Why the standard library's ``ThreadingHTTPServer``: the console serves one operator on
loopback, a handful of JSON routes, server-rendered pages and MP4 files with byte ranges (about
40 lines here). aiohttp or similar would add a dependency and an asyncio loop next to rclpy's
executor threads for no gain at this size; each request gets its own thread, so a long video
stream never blocks a review click.

Security, because the page changes data:
- every mutating request is a POST with a JSON body and the per-process CSRF token in the
  ``X-CSRF-Token`` header; an ``Origin`` (or ``Sec-Fetch-Site``) that is not this server's own
  origin is refused, and so is a ``Host`` that is not the configured address (DNS rebinding);
- pages are rendered with every dataset string escaped, and sent with a Content-Security-Policy
  that allows only this server's own scripts (no inline script), so a task name cannot run;
- files are served only from inside a dataset root under log_dir, after resolving symlinks.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import secrets
import socket
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from ..errors import DatasetError, UnsafeNameError
from ..export.paths import ExportPaths
from ..formats.common.records import REVIEW_VERDICTS, Quality
from ..formats.registry import FORMATS
from . import data, pages
from .httpio import (
    MAX_NAME,
    MAX_NOTE,
    Refused,
    bounded_index,
    copy_span,
    media_headers,
    parse_json_object,
    parse_range,
    valid_text,
)
from .report import build_report
from .status import JobBook, status_for

LOG = logging.getLogger("eva_export.console")
STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"console.js", "console.css"}
MAX_BODY = 64 * 1024
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "media-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class Backend(Protocol):
    """What the console asks the other nodes (services); each returns (ok, message, payload)."""

    def list_episodes(self, dataset: str) -> tuple[bool, str, list[dict[str, Any]]]: ...
    def review(self, dataset: str, episode: int, verdict: str, note: str,
               set_note: bool, take_id: str = "") -> tuple[bool, str, dict[str, Any]]: ...
    def start_job(self, kind: str, source_dir: str, fmt: str,
                  accepted_dir: str) -> tuple[bool, str, dict[str, Any]]: ...
    def get_job(self, kind: str, job_id: str) -> tuple[bool, str, dict[str, Any]]: ...
    def status(self) -> dict[str, Any]:
        """capture: a line; export/upload: {"queue": line, "job": the current or last job}."""
        ...


class ConsoleServer(ThreadingHTTPServer):
    daemon_threads = True  # a browser holding a video connection open must not block shutdown

    def __init__(self, bind: str, port: int, log_dir: Path, backend: Backend,
                 upload_configured: bool = False) -> None:
        # ThreadingHTTPServer is IPv4 only by default: an IPv6 bind address needs AF_INET6
        self.address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        super().__init__((bind, port), ConsoleHandler)
        self.log_dir = Path(log_dir)
        self.backend = backend
        self.csrf_token = secrets.token_urlsafe(32)
        self.bind_host = bind
        self.upload_configured = upload_configured
        self.jobs = JobBook()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = self.server_address[0]
        if not isinstance(host, str):  # typeshed allows bytes; getsockname() of a TCP socket gives str
            host = bytes(host).decode()
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.server_address[1]}/"

    def allowed_hosts(self) -> set[str] | None:
        """Host header values accepted; None (any) only when bound to all addresses."""
        port = self.server_address[1]
        if self.bind_host in ("0.0.0.0", "::", ""):
            return None
        hosts = {f"{self.bind_host}:{port}", f"[{self.bind_host}]:{port}"}
        if self.bind_host in ("127.0.0.1", "::1", "localhost"):
            hosts |= {f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
        return hosts

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="eva-console-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(5.0)


class ConsoleHandler(BaseHTTPRequestHandler):
    server: ConsoleServer
    protocol_version = "HTTP/1.1"
    server_version = "eva_console"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        LOG.debug("%s " + format, self.address_string(), *args)

    # ---- dispatch ---------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._handle(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle(head=True)

    def do_POST(self) -> None:  # noqa: N802
        self._head = False  # one handler serves every request of a keep-alive connection
        try:
            self._check_host()
            self._check_same_origin()
            body = self._json_body()
            route = urllib.parse.urlsplit(self.path).path
            if route == "/api/review":
                self._review(body)
            elif route in ("/api/export", "/api/upload"):
                self._start_job(route.rsplit("/", 1)[1], body)
            else:
                raise Refused(HTTPStatus.NOT_FOUND, "no such action")
        except Refused as exc:
            # the body may be unread: never parse its bytes as the next request on this connection
            self.close_connection = True
            self._send_json({"ok": False, "message": str(exc)}, exc.status)
        except Exception as exc:  # noqa: BLE001 - every request gets an answer, never a dropped connection
            LOG.exception("console POST %s failed", self.path[:200])
            self.close_connection = True
            self._send_json({"ok": False, "message": f"internal error: {type(exc).__name__}"},
                            HTTPStatus.INTERNAL_SERVER_ERROR)

    def _handle(self, head: bool) -> None:
        self._head = head
        try:
            self._check_host()
            parts = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parts.query)
            path = parts.path
            m = re.fullmatch(r"/d/([^/]+)(?:/(e)/(\d+)|/(report))?/?", path)
            if path == "/":
                self._send_html(pages.datasets_page(data.list_datasets(self.server.log_dir)))
            elif m:
                name = valid_text(urllib.parse.unquote(m.group(1), errors="strict"), "dataset name", MAX_NAME)
                data.dataset_root(self.server.log_dir, name)  # refuse bad names early
                if not data.dataset_exists(self.server.log_dir, name):
                    self._send_html(pages.missing_dataset_page(name), HTTPStatus.NOT_FOUND)
                elif m.group(2):
                    self._episode_page(name, bounded_index(m.group(3)))
                elif m.group(4):
                    self._send_html(build_report(data.dataset_root(self.server.log_dir, name), name))
                else:
                    self._episodes_page(name, query)
            elif path == "/api/episode":
                self._api_episode(query)
            elif path == "/api/job":
                kind = _one(query, "kind")
                if kind not in ("export", "upload"):
                    raise Refused(HTTPStatus.BAD_REQUEST, "kind must be export or upload")
                ok, msg, job = self.server.backend.get_job(kind, _one(query, "id"))
                self._send_json({"ok": ok, "message": msg, "job": job})
            elif path == "/api/status":
                self._api_status(_one(query, "dataset"))
            elif path.startswith("/media/"):
                self._media(path[len("/media/"):])
            elif path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif path.startswith("/static/"):
                self._static(path[len("/static/"):])
            else:
                raise Refused(HTTPStatus.NOT_FOUND, "not found")
        except Refused as exc:
            self._send_text(str(exc), exc.status)
        except UnsafeNameError as exc:
            self._send_text(f"refused: {exc}", HTTPStatus.FORBIDDEN)
        except UnicodeDecodeError:
            self._send_text("the path is not valid UTF-8 after percent-decoding", HTTPStatus.BAD_REQUEST)
        except DatasetError as exc:
            self._send_text(f"dataset error: {exc}", HTTPStatus.NOT_FOUND)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser dropped a video request while seeking
        except Exception as exc:  # noqa: BLE001 - every request gets an answer, never a dropped connection
            LOG.exception("console GET %s failed", self.path[:200])
            self.close_connection = True
            self._send_text(f"internal error: {type(exc).__name__}", HTTPStatus.INTERNAL_SERVER_ERROR)

    # ---- checks -----------------------------------------------------------------------------
    def _check_host(self) -> None:
        allowed = self.server.allowed_hosts()
        host = self.headers.get("Host", "")
        if allowed is not None and host not in allowed:
            raise Refused(HTTPStatus.FORBIDDEN, f"refused: Host {host!r} is not this console")

    def _check_same_origin(self) -> None:
        host = self.headers.get("Host", "")
        origin = self.headers.get("Origin")
        if origin is not None and origin != f"http://{host}":
            raise Refused(HTTPStatus.FORBIDDEN, f"refused: cross-origin request from {origin!r}")
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise Refused(HTTPStatus.FORBIDDEN, f"refused: cross-site request ({site})")
        token = self.headers.get("X-CSRF-Token", "")
        if not hmac.compare_digest(token.encode(), self.server.csrf_token.encode()):
            raise Refused(HTTPStatus.FORBIDDEN, "refused: missing or wrong CSRF token (reload the page)")

    def _json_body(self) -> dict[str, Any]:
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            raise Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "refused: body must be application/json")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise Refused(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if not 0 < length <= MAX_BODY:
            raise Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body empty or too large")
        return parse_json_object(self.rfile.read(length))

    # ---- pages ------------------------------------------------------------------------------
    def _episodes_page(self, name: str, query: dict[str, list[str]]) -> None:
        ok, msg, rows = self.server.backend.list_episodes(name)
        red_only = _one(query, "red") == "1"
        unreviewed_only = _one(query, "unreviewed") == "1"
        shown = [r for r in rows if (not red_only or r["quality"] == Quality.RED)
                 and (not unreviewed_only or not r["qc_verdict"])]
        self._send_html(pages.episodes_page(name, ok, msg, rows, shown, red_only, unreviewed_only,
                                            self.server.csrf_token, list(FORMATS), self.server.upload_configured))

    def _episode_page(self, name: str, index: int) -> None:
        self._send_html(pages.episode_page(name, index, self.server.csrf_token))

    def _api_episode(self, query: dict[str, list[str]]) -> None:
        name = valid_text(_one(query, "dataset"), "dataset", MAX_NAME)
        index = bounded_index(_one(query, "episode"))
        root, info = data.read_info_of(self.server.log_dir, name)
        ok, msg, rows = self.server.backend.list_episodes(name)  # verdicts as the capture node has them
        if not ok:
            raise Refused(HTTPStatus.BAD_GATEWAY, f"list_episodes: {msg}")
        row = next((r for r in rows if r["episode_index"] == index), None)
        if row is None:
            raise Refused(HTTPStatus.NOT_FOUND, f"no episode {index} in {name}")
        _, disk_rows = data.episode_rows(root)  # stream_stats and issue details (read-only)
        disk = next((r for r in disk_rows if r.episode_index == index), None)
        plot = data.episode_series(root, info, index)
        cams = data.camera_files(root, info, index)
        for c in cams:
            c["url"] = "/media/" + urllib.parse.quote(name, safe="") + "/" + urllib.parse.quote(c.pop("rel"))
        indices = [r["episode_index"] for r in rows]
        pos = indices.index(index)
        payload = {
            "dataset": name, "fps": info.fps, "episode": row, "cameras": cams,
            "series": plot["series"],
            "issues": [i.to_dict() for i in disk.quality_issues] if disk else [],
            "stream_stats": (disk.fields_dict().get("stream_stats") if disk else None) or {},
            "markers": data.episode_markers(disk, plot["nonfinite"]) if disk else [],
            "prev": indices[pos - 1] if pos > 0 else None,
            "next": indices[pos + 1] if pos + 1 < len(indices) else None,
        }
        self._send_json(payload)

    def _api_status(self, name: str) -> None:
        source_dir = None
        if name:
            source_dir = str(data.dataset_root(self.server.log_dir, valid_text(name, "dataset", MAX_NAME)))
        line, seen = status_for(self.server.backend.status(), source_dir)
        jobs = self.server.jobs.of(name) if name else []
        jobs += [j for j in seen if j not in jobs]
        self._send_json({"status": line, "jobs": jobs})

    # ---- actions ----------------------------------------------------------------------------
    def _review(self, body: dict[str, Any]) -> None:
        name = valid_text(body.get("dataset", ""), "dataset", MAX_NAME)
        verdict = body.get("verdict", "")
        if verdict not in REVIEW_VERDICTS:
            raise Refused(HTTPStatus.BAD_REQUEST, "verdict must be pass, fail, clear or empty")
        index = bounded_index(body.get("episode"))
        note = body.get("note")
        text = "" if note is None else valid_text(note, "note", MAX_NOTE)
        take_id = valid_text(body.get("take_id", ""), "take_id", MAX_NAME)  # the take the page shows
        ok, msg, row = self.server.backend.review(name, index, str(verdict), text, note is not None, take_id)
        self._send_json({"ok": ok, "message": msg, "episode": row},
                        HTTPStatus.OK if ok else HTTPStatus.CONFLICT)

    def _start_job(self, kind: str, body: dict[str, Any]) -> None:
        name = valid_text(body.get("dataset", ""), "dataset", MAX_NAME)
        fmt = valid_text(body.get("format", ""), "format", 64)
        try:
            root = data.dataset_root(self.server.log_dir, name)
        except UnsafeNameError as exc:
            raise Refused(HTTPStatus.FORBIDDEN, f"refused: {exc}") from None
        # the upload names the accepted export where the export node publishes it (same code);
        # the upload gate decides whether it is current and complete
        accepted = str(ExportPaths.of(root, fmt).accepted) if kind == "upload" and fmt in FORMATS else ""
        if kind == "upload" and not self.server.upload_configured:
            raise Refused(HTTPStatus.CONFLICT, "no upload backend is configured (no backend section under "
                                               "collection.storage, e.g. collection.storage.sftp); nothing was started")
        ok, msg, reply = self.server.backend.start_job(kind, str(root), fmt, accepted)
        if ok and reply.get("job_id"):
            self.server.jobs.started(name, kind, str(reply["job_id"]))
        self._send_json({"ok": ok, "message": msg, **reply}, HTTPStatus.OK if ok else HTTPStatus.CONFLICT)

    # ---- files ------------------------------------------------------------------------------
    def _static(self, name: str) -> None:
        if name not in STATIC_FILES:
            raise Refused(HTTPStatus.NOT_FOUND, "not found")
        body = (STATIC_DIR / name).read_bytes()
        ctype = "text/javascript" if name.endswith(".js") else "text/css"
        self._send(HTTPStatus.OK, body, f"{ctype}; charset=utf-8")

    def _media(self, rest: str) -> None:
        name, _, rel = rest.partition("/")
        path = data.confined_file(self.server.log_dir, urllib.parse.unquote(name), urllib.parse.unquote(rel))
        size = path.stat().st_size
        span, partial = (0, size - 1), False
        rng = self.headers.get("Range")
        if rng:
            try:
                parsed = parse_range(rng, size)
            except Refused as exc:
                self._send_text(str(exc), exc.status, [("Content-Range", f"bytes */{size}")])
                return
            if parsed is None:
                self._send_text("Range is outside the file", HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                                [("Content-Range", f"bytes */{size}")])
                return
            span, partial = parsed, True
        self.send_response(HTTPStatus.PARTIAL_CONTENT if partial else HTTPStatus.OK)
        for k, v in media_headers(path, size, span, partial):
            self.send_header(k, v)
        self.end_headers()
        if not self._head:
            copy_span(path, span, self.wfile)

    # ---- responses --------------------------------------------------------------------------
    def _send(self, status: HTTPStatus, body: bytes, ctype: str,
              extra: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        for k, v in extra or ():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if not getattr(self, "_head", False):
            self.wfile.write(body)

    def _send_html(self, text: str, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, text.encode("utf-8"), "text/html; charset=utf-8")

    def _send_text(self, text: str, status: HTTPStatus, extra: list[tuple[str, str]] | None = None) -> None:
        self._send(status, text.encode("utf-8", "replace"), "text/plain; charset=utf-8", extra)

    def _send_json(self, obj: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(obj, allow_nan=False).encode("utf-8"), "application/json")


def _one(query: dict[str, list[str]], key: str) -> str:
    return (query.get(key) or [""])[0]


__all__ = ["Backend", "ConsoleServer"]
