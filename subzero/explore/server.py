"""Serving the explorer with uvicorn: in the foreground until Ctrl-C (``subzero
explore``), or in a background thread (tests, benchmarks, notebooks).

The listening socket is bound here, before uvicorn starts, so that a port in use
or a host that is not this machine's is one :class:`SubZeroError` naming it (and
``port=0`` gives the port the system chose).  It listens on 127.0.0.1 unless told
otherwise: the explorer has no authentication.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from subzero.errors import SubZeroError
from subzero.explore.app import build_app
from subzero.explore.session import Session
from subzero.tuning import EXPLORE_DRAIN_S, EXPLORE_POLL_S, EXPLORE_START_S, EXPLORE_STOP_S

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def bind(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: any free port)."""
    if not 0 <= int(port) <= 65535:
        raise SubZeroError(f"port {port} is out of range; give 0-65535 (0 = any free port)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise SubZeroError(f"cannot listen on host {host!r}: {getattr(e, 'strerror', None) or e}; "
                           f"give an address of this machine, e.g. `host='127.0.0.1'`") from e
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        hint = ("choose another `port` (0 = any free port)" if e.errno in (98, 48, 10048)
                else "give an address of this machine, e.g. `host='127.0.0.1'`")
        raise SubZeroError(f"cannot listen on {host}:{port}: {e.strerror or e}; {hint}") from e
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def _server(session: Session, sock: socket.socket) -> uvicorn.Server:
    config = uvicorn.Config(build_app(session), log_level="warning", access_log=False,
                            lifespan="off", timeout_graceful_shutdown=EXPLORE_DRAIN_S)
    return uvicorn.Server(config)


def session_of(run) -> Session:
    """A session over the same run as ``run`` (a :class:`~subzero.api.Run`), opened
    again in the session's own thread (see :mod:`subzero.explore.session`)."""
    return Session(run.store.path, run.id)


def serve(run, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, on_ready=None,
          sock: socket.socket | None = None) -> None:
    """Serve the explorer over ``run`` until interrupted (Ctrl-C).  ``on_ready(url)``
    is called once the socket listens (before requests are served)."""
    sock = sock or bind(host, port)
    session = session_of(run)
    server = _server(session, sock)
    if on_ready is not None:
        on_ready(url_of(sock))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        session.close()


@dataclass
class Running:
    """An explorer serving in a background thread: its ``url``, and ``stop()``."""

    url: str
    session: Session
    _server: uvicorn.Server
    _thread: threading.Thread
    _sock: socket.socket

    def stop(self, timeout: float = EXPLORE_STOP_S) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()
        self.session.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(run, host: str = DEFAULT_HOST, port: int = 0, timeout: float = EXPLORE_START_S) -> Running:
    """Serve the explorer over ``run`` in a background thread; returns once it answers."""
    sock = bind(host, port)
    session = session_of(run)
    server = _server(session, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="subzero-explore", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            session.close()
            raise SubZeroError("the explorer's server did not start")
        time.sleep(EXPLORE_POLL_S)
    return Running(url_of(sock), session, server, thread, sock)
