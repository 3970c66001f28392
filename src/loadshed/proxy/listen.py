"""Listening sockets bound before anything is served, so that a taken port or an
address that is not this machine's is one line naming the flag (exit 2), never a
traceback from inside a server that already started.

Both ``loadshed proxy`` (``--listen``, ``--metrics-host``/``--metrics-port``) and
``loadshed serve-demo`` (``--host``/``--port``) bind through :func:`bind_listener`.
Each socket listens as soon as it is bound: a second listener on the same port
then fails at once (``SO_REUSEADDR`` lets two sockets that are only bound share a
port on Linux), and a client that connects as soon as the address is printed waits
in the backlog instead of being refused.
"""

from __future__ import annotations

import errno
import socket

from loadshed.errors import ConfigError

__all__ = ["ListenError", "bind_listener"]

# The port is the problem: taken, or privileged. Anything else is the address's.
_PORT_ERRORS = frozenset({errno.EADDRINUSE, errno.EACCES})


class ListenError(ConfigError):
    """A listener could not be bound. ``field`` is the flag at fault (the host's or the
    port's), ``reason`` what the system said."""

    def __init__(self, field: str, address: str, reason: str) -> None:
        super().__init__(field, f"cannot listen on {address}: {reason}")
        self.address = address
        self.reason = reason


def _shown(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_listener(
    host: str, port: int, *, host_flag: str, port_flag: str, backlog: int = 2048
) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening (inheritable, for uvicorn).

    Raises :class:`ListenError` naming ``port_flag`` when the port is taken or
    privileged, ``host_flag`` when the host is not a local address (or not one at all).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    address = _shown(host, port)
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as error:  # IPv6 off, or out of descriptors
        raise ListenError(host_flag, address, error.strerror or str(error)) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except socket.gaierror as error:
        sock.close()
        reason = f"not an address of this machine ({error.strerror})"
        raise ListenError(host_flag, address, reason) from None
    except OSError as error:
        sock.close()
        reason = error.strerror or str(error)
        flag = port_flag if error.errno in _PORT_ERRORS else host_flag
        raise ListenError(flag, address, reason) from None
    sock.set_inheritable(True)
    return sock
