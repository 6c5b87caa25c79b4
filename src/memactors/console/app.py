"""The console's ASGI app: routes, sign-in, the checks on every request, and the pages.

Every page is drawn from the operator RPC's own method table (``rpc.methods.operator_methods``, handed
in by the daemon): each call goes through the same ``Method`` (its tier, its declared parameters, its
typed and bounded parameter checks, its MemoryService handler) as a websocket client's, so the console
has no private path to memory (REQ-19). The tier is the signed-in session's; a control method from a
read-tier session is refused before its handler runs, as on the RPC.

Checks, in order, on every request:

* **Host** must be this listener's loopback address (``127.0.0.1:<port>``, ``localhost:<port>``,
  ``[::1]:<port>``): a page on another site that rebinds its DNS name to 127.0.0.1 reaches the port
  under its own name and is refused (421).
* **POST** (every state change, and recall, whose question stays out of URLs and history): ``Origin``
  must be present and this listener's own origin, and the form's ``csrf`` field must be the session's
  CSRF token (the sign-in form: its own cookie's); otherwise 403 and nothing runs.
* **Session**: every page but sign-in needs a session cookie; without one a browser is sent to sign in.

Every response carries a Content-Security-Policy allowing only this origin's own stylesheet and script
(no inline script at all), ``X-Frame-Options: DENY``, ``nosniff``, a same-origin referrer policy and ``no-store``.
Templates are autoescaped; agent-written text (episode text and fields, recall and briefing items,
run logs, stderr tails) is additionally shown inside ``.untrusted`` blocks marked as such.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import attrs
import trio
from jinja2 import Environment, PackageLoader, StrictUndefined, UndefinedError, select_autoescape

from ..documents import lead
from ..errors import MemactorsError, PermissionDenied, single_leaf
from ..logs import get_logger
from ..net.asgi import serve_lifespan
from .charts import Sampler
from .people import FILTERS
from .sessions import COOKIE, PRE_COOKIE, Session, Sessions, same_token

__all__ = ["ConsoleApp", "Request"]

_log = get_logger(component="console")

SERVICE_PREFIX = "harness.v1.MemoryService/"
#: Episodes shown on one page of the list.
PAGE_SIZE = 25
#: The timeline's days back, unless the page asks for others (1..90).
TIMELINE_DAYS = 7
#: The most ListEpisodes pages (of 1000) the timeline reads.
TIMELINE_PAGES = 5
#: An episode page's "later runs that touched the same files": how many, asked by at most this many paths.
LATER_RUNS = 10
LATER_PATHS = 50
#: How long one server-sent-events poll of RunLogs waits for a new event while the run runs.
LOG_WAIT_SECONDS = 15.0
#: Form fields read at most (a form is small; anything past this is not a console form).
MAX_FIELDS = 64

_CSP = ("default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_SECURITY_HEADERS = [
    (b"content-security-policy", _CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make browsers send `Origin: null`
    (b"cache-control", b"no-store"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
_STATUS = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401,
           "FAILED_PRECONDITION": 409, "ALREADY_EXISTS": 409, "OUT_OF_RANGE": 400, "UNAVAILABLE": 503,
           "DEADLINE_EXCEEDED": 504, "RESOURCE_EXHAUSTED": 429, "UNIMPLEMENTED": 501}
_STATIC = {"console.css": "text/css; charset=utf-8", "live.js": "text/javascript; charset=utf-8"}
_OUTCOMES = ("succeeded", "failed", "cancelled", "timed_out", "crashed", "capped")


@attrs.frozen
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    cookies: dict[str, str]
    form: dict[str, str]
    host: str


@attrs.define
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[bytes, bytes]] = attrs.Factory(list)
    #: A streamed body (server-sent events) instead of ``body``.
    stream: Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[None]] | None = None


class Refused(Exception):
    """A request refused before any handler ran (bad Host, Origin or CSRF token)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class ConsoleApp:
    """The console over a method table (``operator_methods``), the operator tokens and the metrics."""

    def __init__(self, methods: Iterable[Any], tokens: Any, *, registry: Any,
                 harnesses: Callable[[], list[str]], token_dir: str = "") -> None:
        self.methods = {m.name.removeprefix(SERVICE_PREFIX): m for m in methods}
        self.tokens = tokens
        self.sessions = Sessions()
        self.registry = registry
        self.sampler = Sampler(registry)
        self.harnesses = harnesses
        self.token_dir = token_dir
        self.env = Environment(loader=PackageLoader("memactors.console", "templates"),
                               autoescape=select_autoescape(default=True, default_for_string=True),
                               undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        self.env.filters["json"] = lambda v: json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False)
        self.env.filters["q"] = lambda v: quote(str(v), safe="")
        self.env.filters.update(FILTERS)
        self.env.globals["outcomes"] = _OUTCOMES
        self._static = {name: resources.files("memactors.console").joinpath("static", name).read_bytes()
                        for name in _STATIC}

    # -- ASGI ---------------------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            request = await _read_request(scope, receive)
            response = await self.handle(request)
        except Refused as refused:
            response = self._page("refused.html", None, status=refused.status, reason=refused.reason)
        except Exception as exc:  # ok: one page failed; logged by type and place, never its content
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb else "?"
            # A template's missing name is the template's (a console bug), never the page's data.
            missing = str(exc)[:120] if isinstance(exc, UndefinedError) else None
            _log.bind(path=scope.get("path"), error_type=type(exc).__name__, at=where, missing=missing).error(
                "console page failed")
            response = self._text(500, "internal error; see the daemon log\n")
        await _send(send, response, head=scope["method"] == "HEAD", receive=receive)

    async def handle(self, request: Request) -> Response:
        if request.path.startswith("/static/"):
            name = request.path.removeprefix("/static/")
            if name not in _STATIC:
                return self._text(404, "not found\n")
            return Response(body=self._static[name], content_type=_STATIC[name])
        if request.path == "/favicon.ico":
            return Response(status=204)
        if request.method not in ("GET", "HEAD", "POST"):
            return self._text(405, "method not allowed\n", [(b"allow", b"GET, HEAD, POST")])
        if request.method == "POST":
            _check_origin(request)
        if request.path == "/login":
            return await self.login(request)
        session = self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            if request.path.endswith("/events"):
                return self._text(401, "signed out\n")
            return _redirect("/login")
        if request.method == "POST" and not same_token(request.form.get("csrf"), session.csrf):
            raise Refused(403, "the form's CSRF token is missing or not this session's; reload the page")
        route = self._route(request)
        if route is None:
            return self._page("error.html", session, status=404, code="NOT_FOUND", message="no such page")
        handler, args = route
        try:
            return await handler(request, session, *args)
        except MemactorsError as exc:
            return self._error(session, exc)
        except BaseExceptionGroup as group:  # ok: an actor's single failure arrives wrapped
            leaf = single_leaf(group)
            if isinstance(leaf, MemactorsError):
                return self._error(session, leaf)
            raise

    def _route(self, request: Request) -> tuple[Callable[..., Awaitable[Response]], tuple[str, ...]] | None:
        path, post = request.path, request.method == "POST"
        if path == "/":
            return self.home, ()
        if path == "/logout" and post:
            return self.logout, ()
        if path == "/episodes" and not post:
            return self.episodes, ()
        if path == "/timeline" and not post:
            return self.timeline, ()
        if path == "/episodes/of-run" and not post:
            return self.episode_of_run, ()
        if (m := re.fullmatch(r"/episodes/([^/]+)", path)) and not post:
            return self.episode, (m.group(1),)
        if m := re.fullmatch(r"/episodes/([^/]+)/forget", path):
            return self.forget, (m.group(1),)
        if path == "/recall":
            return self.recall, ()
        if path == "/briefings" and not post:
            return self.briefings, ()
        if (m := re.fullmatch(r"/briefings/([^/]+)", path)) and not post:
            return self.briefing, (m.group(1),)
        if path == "/runs" and not post:
            return self.runs, ()
        if (m := re.fullmatch(r"/runs/([^/]+)", path)) and not post:
            return self.run, (m.group(1),)
        if (m := re.fullmatch(r"/runs/([^/]+)/events", path)) and not post:
            return self.run_events, (m.group(1),)
        if m := re.fullmatch(r"/runs/([^/]+)/cancel", path):
            return self.cancel, (m.group(1),)
        if path == "/health" and not post:
            return self.health, ()
        if path == "/health/check-provider":
            return self.check_provider, ()
        return None

    # -- calling MemoryService through the RPC's methods --------------------------------------------
    async def call(self, session: Session, name: str, **params: Any) -> Any:
        """Run method ``name`` as the session's tier: the RPC's tier check, its declared parameters,
        its handler (which checks every parameter as it does for a websocket client)."""
        method = self.methods[name]
        if method.tier == "control" and not session.control:
            raise PermissionDenied(f"{name} needs the control tier: sign in with the control token")
        clean = {k: v for k, v in params.items() if v is not None}
        if method.params is not None and (unknown := sorted(set(clean) - method.params)):
            raise AssertionError(f"console passes {unknown} to {name}")  # a console bug, not a request's
        return await method.handler(clean)

    # -- sign-in ------------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if request.method != "POST":
            # Kept across loads (another tab, a favicon fetch) so an open sign-in form stays valid.
            pre = request.cookies.get(PRE_COOKIE, "")
            if not re.fullmatch(r"[A-Za-z0-9_-]{43}", pre):
                pre = secrets.token_urlsafe(32)
            response = self._page("login.html", None, csrf=pre, failed=False, token_dir=self.token_dir)
            response.headers.append(_cookie(PRE_COOKIE, pre, max_age=600))
            return response
        pre = request.cookies.get(PRE_COOKIE, "")
        if not pre or not same_token(request.form.get("csrf"), pre):
            raise Refused(403, "the sign-in form's CSRF token is missing or stale; reload the sign-in page")
        tier = self.tokens.tier_for(request.form.get("token", "").strip() or None)
        if tier is None:
            _log.bind(outcome="refused").info("console sign-in refused")
            fresh = secrets.token_urlsafe(32)
            response = self._page("login.html", None, status=401, csrf=fresh, failed=True, token_dir=self.token_dir)
            response.headers.append(_cookie(PRE_COOKIE, fresh, max_age=600))
            return response
        session = self.sessions.create(tier)
        _log.bind(tier=tier, sessions=len(self.sessions)).info("console sign-in")
        response = _redirect("/episodes")
        response.headers.append(_cookie(COOKIE, session.sid))
        response.headers.append(_cookie(PRE_COOKIE, "", max_age=0))
        return response

    async def logout(self, request: Request, session: Session) -> Response:
        self.sessions.drop(session.sid)
        response = _redirect("/login")
        response.headers.append(_cookie(COOKIE, "", max_age=0))
        return response

    async def home(self, request: Request, session: Session) -> Response:
        return _redirect("/episodes")

    # -- episodes -----------------------------------------------------------------------------------
    async def episodes(self, request: Request, session: Session) -> Response:
        q = request.query
        filters = {k: q.get(k, "").strip() for k in ("repo", "harness", "outcome", "since")}
        after = q.get("after") or None
        page = await self.call(session, "ListEpisodes", repo=filters["repo"] or None,
                               harness=filters["harness"] or None, since=filters["since"] or None,
                               outcome=filters["outcome"] or None, limit=PAGE_SIZE, after=after)
        cursor = page["next_cursor"]
        base = {k: v for k, v in filters.items() if v}
        next_url = f"/episodes?{urlencode({**base, 'after': cursor})}" if cursor else None
        first_url = f"/episodes?{urlencode(base)}" if after else None
        return self._page("episodes.html", session, rows=page["episodes"], filters=filters, total=page["total"],
                          next_url=next_url, first_url=first_url, repo_match=page.get("repo_match"),
                          harnesses=self.harnesses())

    async def timeline(self, request: Request, session: Session) -> Response:
        """What happened in the last days (7 unless ``days`` says), grouped by day and repository."""
        q = request.query
        try:
            days = min(max(int(q.get("days") or TIMELINE_DAYS), 1), 3650)
        except ValueError:
            days = TIMELINE_DAYS
        filters = {k: q.get(k, "").strip() for k in ("repo", "harness")}
        rows: list[dict[str, Any]] = []
        cursor = None
        total = 0
        for _ in range(TIMELINE_PAGES):
            page = await self.call(session, "ListEpisodes", repo=filters["repo"] or None,
                                   harness=filters["harness"] or None, since=f"{days}d", limit=1000, after=cursor)
            rows += page["episodes"]
            total = page["total"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for row in rows:  # newest first already: days and repositories come out in that order
            grouped.setdefault(row["started_at"][:10], {}).setdefault(row["repo"] or "", []).append(row)
        return self._page("timeline.html", session, days=days, grouped=grouped, shown=len(rows), total=total,
                          filters=filters)

    async def episode(self, request: Request, session: Session, episode_id: str) -> Response:
        view = await self.call(session, "GetEpisode", episode_id=episode_id)
        body = view.get("episode") or {}
        files = [f for f in body.get("files_touched") or () if isinstance(f, str)]
        later: list[dict[str, Any]] = []
        if files and view.get("started_at"):
            page = await self.call(session, "ListEpisodes", paths=files[:LATER_PATHS], since=view["started_at"],
                                   limit=LATER_RUNS + 1)
            later = [r for r in page["episodes"] if r["episode_id"] != episode_id
                     and (r["started_at"], r["episode_id"]) > (view["started_at"], episode_id)][:LATER_RUNS]
        return self._page("episode.html", session, e=view, body=body, files=files, later=later,
                          said=lead(body), failures=body.get("verify_failures") or [])

    async def episode_of_run(self, request: Request, session: Session) -> Response:
        """A briefing's or a recall's run item, linked to its episode: the episode of (harness, run)."""
        harness, run_id = request.query.get("harness", "").strip(), request.query.get("run", "").strip()
        if not harness or not run_id:
            return self._page("error.html", session, status=400, code="INVALID_ARGUMENT",
                              message="a run's episode needs its harness and run")
        page = await self.call(session, "ListEpisodes", harness=harness, run_id=run_id, limit=1)
        if not page["episodes"]:
            return self._page("error.html", session, status=404, code="NOT_FOUND",
                              message="this run has no episode (it was not recorded, or it was forgotten)")
        return _redirect(f"/episodes/{quote(page['episodes'][0]['episode_id'], safe='')}")

    async def forget(self, request: Request, session: Session, episode_id: str) -> Response:
        if request.method != "POST" or request.form.get("confirm") != "yes":
            view = await self.call(session, "GetEpisode", episode_id=episode_id)
            return self._page("confirm.html", session, title=f"Forget episode {episode_id}",
                              action=f"/episodes/{quote(episode_id, safe='')}/forget",
                              what="forget this episode: it is tombstoned at once (no recall or briefing "
                                   "shows it again) and forgotten at the provider",
                              subject=view, back=f"/episodes/{quote(episode_id, safe='')}", verb="Forget")
        result = await self.call(session, "Forget", episode_id=episode_id)
        _log.bind(tier=session.tier).info("console forget")
        return self._page("done.html", session, title="Episode forgotten", result=result,
                          back=f"/episodes/{quote(episode_id, safe='')}")

    # -- recall and briefings -----------------------------------------------------------------------
    async def recall(self, request: Request, session: Session) -> Response:
        form = request.form if request.method == "POST" else {}
        asked = {"query": form.get("query", ""), "paths": form.get("paths", ""),
                 "as_kind": form.get("as_kind", "repo"), "target": form.get("target", "").strip()}
        answer = None
        elapsed_ms = None
        drops: dict[str, int] = {}
        if request.method == "POST":
            paths = [p.strip() for p in re.split(r"[\n,]", asked["paths"]) if p.strip()]
            by_repo = asked["as_kind"] != "harness"
            before = _dropped_counts(self.registry)
            started = trio.current_time()
            answer = await self.call(session, "Recall", query=asked["query"], paths=paths,
                                     repo=asked["target"] if by_repo else None,
                                     **{"as": None if by_repo else asked["target"]})
            elapsed_ms = round((trio.current_time() - started) * 1000, 1)
            after = _dropped_counts(self.registry)
            drops = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
        return self._page("recall.html", session, asked=asked, answer=answer, elapsed_ms=elapsed_ms,
                          drops=drops, harnesses=self.harnesses())

    async def briefings(self, request: Request, session: Session) -> Response:
        return self._page("briefings.html", session, harnesses=self.harnesses())

    async def briefing(self, request: Request, session: Session, harness: str) -> Response:
        started = trio.current_time()
        brief = await self.call(session, "GetBriefing", harness=harness)
        elapsed_ms = round((trio.current_time() - started) * 1000, 1)
        described = await self.call(session, "DescribeHarness", harness=harness)
        runs = await self.call(session, "ListRuns", harness=harness, limit=10)
        status = await self.call(session, "Status")
        dropped = {s["name"]: s.get("dropped", 0) for s in brief["structured"].get("sections", [])}
        items = ", ".join(f"{k} {v}" for k, v in sorted(brief["items"].items())) or "none"
        dropped_text = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()) if v) or "none"
        return self._page("briefing.html", session, b=brief, described=described, runs=runs["runs"],
                          provider=status, items=items, dropped=dropped_text, elapsed_ms=elapsed_ms)

    # -- runs ---------------------------------------------------------------------------------------
    async def runs(self, request: Request, session: Session) -> Response:
        q = request.query
        harness, state = q.get("harness", "").strip() or None, q.get("state", "").strip() or None
        page = await self.call(session, "ListRuns", harness=harness, state=state, limit=50,
                               after=q.get("after") or None)
        base = {k: v for k, v in (("harness", harness), ("state", state)) if v}
        next_url = f"/runs?{urlencode({**base, 'after': page['next_cursor']})}" if page.get("next_cursor") else None
        return self._page("runs.html", session, runs=page["runs"], total=page.get("total"), harness=harness or "",
                          state=state or "", next_url=next_url, harnesses=self.harnesses())

    async def run(self, request: Request, session: Session, run_id: str) -> Response:
        harness = request.query.get("harness") or None
        state = await self.call(session, "GetRun", run_id=run_id, harness=harness)
        logs = await self.call(session, "RunLogs", run_id=run_id, harness=state["harness"])
        return self._page("run.html", session, r=state, logs=logs, lines=[_log_line(e) for e in logs["events"]])

    async def run_events(self, request: Request, session: Session, run_id: str) -> Response:
        """The run's log as server-sent events from ``after`` (or ``Last-Event-ID``) on: one event per
        log line, ``end`` once the run has ended and everything was sent. RunLogs, polled with a wait."""
        harness = request.query.get("harness") or None
        try:
            after = int(request.headers.get("last-event-id") or request.query.get("after") or 0)
        except ValueError:
            after = 0
        await self.call(session, "GetRun", run_id=run_id, harness=harness)  # unknown run: an error page, not a stream

        async def stream(write: Callable[[bytes], Awaitable[None]]) -> None:
            nonlocal after
            await write(b"retry: 2000\n\n")
            while self.sessions.get(session.sid) is not None:
                logs = await self.call(session, "RunLogs", run_id=run_id, harness=harness, after=after,
                                       wait_seconds=LOG_WAIT_SECONDS)
                for event in logs["events"]:
                    data = json.dumps({"seq": event.get("seq"), "line": _log_line(event)}, ensure_ascii=False)
                    await write(f"id: {event.get('seq')}\nevent: line\ndata: {data}\n\n".encode())
                after = logs["next"]
                if logs["state"] != "running" and not logs["events"]:
                    final = await self.call(session, "GetRun", run_id=run_id, harness=harness)
                    ended = {"state": final["state"], "outcome": final["outcome"], "reason": final["reason"]}
                    await write(f"event: end\ndata: {json.dumps(ended)}\n\n".encode())
                    return
                if not logs["events"]:
                    await write(b": waiting\n\n")  # a comment: tells a vanished client's socket apart

        return Response(content_type="text/event-stream; charset=utf-8", stream=stream,
                        headers=[(b"x-accel-buffering", b"no")])

    async def cancel(self, request: Request, session: Session, run_id: str) -> Response:
        harness = request.query.get("harness") or request.form.get("harness") or None
        if request.method != "POST" or request.form.get("confirm") != "yes":
            state = await self.call(session, "GetRun", run_id=run_id, harness=harness)
            return self._page("confirm.html", session, title=f"Cancel run {run_id}",
                              action=f"/runs/{quote(run_id, safe='')}/cancel?harness={quote(state['harness'], safe='')}",
                              what="stop this run (SIGTERM, a grace period, SIGKILL); it is recorded as "
                                   "cancelled by the operator", subject=state,
                              back=f"/runs/{quote(run_id, safe='')}?harness={quote(state['harness'], safe='')}",
                              verb="Cancel run")
        result = await self.call(session, "CancelRun", run_id=run_id, harness=harness)
        return self._page("done.html", session, title="Run cancel asked", result=result,
                          back=f"/runs/{quote(run_id, safe='')}?harness={quote(result['harness'], safe='')}")

    # -- health -------------------------------------------------------------------------------------
    async def health(self, request: Request, session: Session) -> Response:
        status = await self.call(session, "Status")
        doctor = await self.call(session, "Doctor")
        return self._page("health.html", session, s=status, doctor=doctor, charts=self.sampler.charts())

    async def check_provider(self, request: Request, session: Session) -> Response:
        if request.method != "POST" or request.form.get("confirm") != "yes":
            return self._page("confirm.html", session, title="Check the provider",
                              action="/health/check-provider",
                              what="run the seven conformance checks against the configured provider (its own "
                                   "connection; synthetic episodes, forgotten before it answers)",
                              subject=None, back="/health", verb="Run the check")
        result = await self.call(session, "CheckProvider")
        return self._page("done.html", session, title="Provider check", result=result, back="/health")

    # -- rendering ----------------------------------------------------------------------------------
    def _page(self, template: str, session: Session | None, *, status: int = 200, **context: Any) -> Response:
        html = self.env.get_template(template).render(session=session, now=_now(), **context)
        return Response(status=status, body=html.encode("utf-8"))

    def _error(self, session: Session, exc: MemactorsError) -> Response:
        return self._page("error.html", session, status=_STATUS.get(exc.code, 500), code=exc.code, message=str(exc))

    @staticmethod
    def _text(status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> Response:
        return Response(status=status, body=text.encode(), content_type="text/plain; charset=utf-8",
                        headers=headers or [])


def _dropped_counts(registry: Any) -> dict[str, int]:
    """REQ-21's results-dropped counter by REQ-9 reason, as the daemon counts it now."""
    out: dict[str, int] = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == "harness_memory_results_dropped_total":
                reason = s.labels.get("reason", "?")
                out[reason] = out.get(reason, 0) + int(s.value)
    return out


def _log_line(event: dict[str, Any]) -> str:
    rest = {k: v for k, v in event.items() if k not in ("seq", "at", "kind")}
    text = rest.pop("text", None)
    tail = text if isinstance(text, str) else ""
    if rest:
        tail = (tail + " " if tail else "") + json.dumps(rest, ensure_ascii=False, sort_keys=True)
    return f"{event.get('seq', '?'):>5} {event.get('at', '')} {event.get('kind', '?')}: {tail}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cookie(name: str, value: str, *, max_age: int | None = None) -> tuple[bytes, bytes]:
    parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return b"set-cookie", "; ".join(parts).encode("latin-1")


def _redirect(to: str) -> Response:
    return Response(status=303, headers=[(b"location", to.encode("latin-1"))], content_type="text/plain; charset=utf-8")


_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def _check_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    if not origin:
        raise Refused(403, "a form post must carry an Origin header (every current browser sends one)")
    if origin.lower() != f"http://{request.host}":
        raise Refused(403, "the form was posted from another origin")


async def _read_request(scope: dict[str, Any], receive: Any) -> Request:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        headers[raw_name.decode("latin-1").lower()] = raw_value.decode("latin-1")
    host = headers.get("host", "").lower()
    server = scope.get("server") or ("", 0)
    if host not in {f"{name}:{server[1]}" for name in _LOOPBACK_NAMES}:
        raise Refused(421, "this console answers only at its loopback address (127.0.0.1, localhost or [::1])")
    body = b""
    if scope["method"] == "POST":
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
    form: dict[str, str] = {}
    if body:
        if not headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            raise Refused(415, "forms are posted as application/x-www-form-urlencoded")
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FIELDS)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "the form is not valid UTF-8 url-encoded text") from None
        form = dict(pairs)
    query: dict[str, str] = {}
    try:
        query = dict(parse_qsl(scope.get("query_string", b"").decode("utf-8"), keep_blank_values=True,
                               max_num_fields=MAX_FIELDS))
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "the query string is not valid UTF-8 url-encoded text") from None
    cookies: dict[str, str] = {}
    if "cookie" in headers:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers["cookie"])
        except Exception:  # ok: a malformed cookie header is no session
            jar = SimpleCookie()
        cookies = {k: m.value for k, m in jar.items()}
    return Request(method=scope["method"], path=scope["path"], query=query, headers=headers, cookies=cookies,
                   form=form, host=host)


async def _send(send: Any, response: Response, *, head: bool, receive: Any) -> None:
    headers = [(b"content-type", response.content_type.encode()), *_SECURITY_HEADERS, *response.headers]
    if response.stream is None:
        headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    if response.stream is None or head:
        await send({"type": "http.response.body", "body": b"" if head else response.body})
        return

    async def write(chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def until_gone(scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()  # the browser left (tab closed, page changed): stop polling for it

    async with trio.open_nursery() as nursery:
        nursery.start_soon(until_gone, nursery.cancel_scope)
        try:
            await response.stream(write)
        except MemactorsError as exc:
            await write(f"event: error\ndata: {json.dumps({'code': exc.code, 'message': str(exc)})}\n\n".encode())
        nursery.cancel_scope.cancel()
    await send({"type": "http.response.body", "body": b""})
