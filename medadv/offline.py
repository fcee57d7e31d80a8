"""Nothing downloads: a guard that turns a network connection attempt into a clear error.

medadv runs offline (weights come from a checkpoint file the user gives). Refusing the arguments that
request pretrained weights (``weights: DEFAULT``, ``pretrained: true``) catches the known cases before
anything runs; :func:`no_network` catches the rest while code that might download runs (a model builder
that fetches weights, a MONAI network whose default pulls a Hugging Face model). It patches Python's
``socket`` functions, so it stops Python-level downloads (``urllib``, ``requests``, ``torch.hub``,
``huggingface_hub``); it is a guard against surprises, not a sandbox: C extensions open their own sockets.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["NetworkBlockedError", "no_network", "blocked_in"]


class NetworkBlockedError(RuntimeError):
    """A connection (or a host-name lookup) attempted inside :func:`no_network`.

    A ``RuntimeError``, not an ``OSError``: ``urllib`` and ``requests`` turn ``OSError`` into their own
    "connection failed" errors (and some callers retry or fall back on those); this one reaches the caller.
    """

    def __init__(self, address: str, during: str) -> None:
        self.address = address
        self.during = during
        super().__init__(f"a connection to {address} was attempted {during}: medadv downloads nothing")


_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: dict[str, Any] = {}
_STATE: dict[str, Any] = {"during": "", "allow_local": False}


def _is_local(host: Any) -> bool:
    if host in (None, "", "localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _address(addr: Any) -> tuple[str, bool]:
    """``("host:port", local?)`` of a ``connect`` address (a UNIX socket path is local)."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = str(addr[0])
        return (f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"), _is_local(host)
    return str(addr), True


def _check(sock: socket.socket | None, addr: Any) -> None:
    if sock is not None and getattr(sock, "family", None) == getattr(socket, "AF_UNIX", object()):
        return  # a local socket file: not the network
    where, local = _address(addr)
    if not (local and _STATE["allow_local"]):
        raise NetworkBlockedError(where, _STATE["during"])


def _install() -> None:
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo
    _SAVED.update(connect=real_connect, connect_ex=real_connect_ex, getaddrinfo=real_getaddrinfo)

    def connect(self: socket.socket, address: Any) -> None:
        _check(self, address)
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        _check(self, address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        # a name lookup is the first step of every download: refuse it before any packet leaves
        if not (_STATE["allow_local"] and _is_local(host)):
            raise NetworkBlockedError(f"{host}:{port}", _STATE["during"])
        return real_getaddrinfo(host, port, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]
    socket.getaddrinfo = getaddrinfo


def _uninstall() -> None:
    socket.socket.connect = _SAVED.pop("connect")  # type: ignore[method-assign]
    socket.socket.connect_ex = _SAVED.pop("connect_ex")  # type: ignore[method-assign]
    socket.getaddrinfo = _SAVED.pop("getaddrinfo")


@contextlib.contextmanager
def no_network(during: str = "while medadv ran", *, allow_local: bool = False) -> Iterator[None]:
    """Inside, any socket connection or host-name lookup raises :class:`NetworkBlockedError`.

    ``during`` completes the error's message (``"while the model was built"``). ``allow_local`` lets
    connections to the loopback interface through (a model build has no business there either, so the
    default refuses them too: a local proxy would otherwise carry a download). UNIX-domain sockets are
    always allowed. Re-entrant and process-wide (the patch is on the ``socket`` module), restored on exit;
    the outermost call's settings apply.
    """
    global _DEPTH
    with _LOCK:
        if _DEPTH == 0:
            _STATE.update(during=during, allow_local=allow_local)
            _install()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0:
                _uninstall()


def blocked_in(exc: BaseException) -> NetworkBlockedError | None:
    """The :class:`NetworkBlockedError` behind ``exc`` (itself, or in its chain of causes), if any: libraries
    may wrap it (``raise X from e``) before it reaches the caller."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, NetworkBlockedError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None
