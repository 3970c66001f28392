"""The request watch: what the middleware puts between the server and the app.

A :class:`RequestWatch` hands the app its messages, notes the answer's status, adds
``Server-Timing``, and notices a client that left, by reading the server's
``receive`` in a :class:`BodyReader` task (which also buffers a queued request's
body, bounded). :class:`RequestWatches` starts the watch of the requests that last
longer than ``disconnect_watch_after``, with one timer for all of them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from loadshed.admission import Token
from loadshed.asgitypes import Message, Receive, Send

__all__ = ["BodyReader", "RequestWatch", "RequestWatches", "send_too_large"]


async def send_too_large(send: Send, max_bytes: int) -> None:
    """Answer 413 and close the connection (the rest of the body is never read)."""
    body = json.dumps(
        {"error": "payload_too_large", "reason": f"body over {max_bytes} bytes"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestWatch:
    """One request's connection: hands the app its messages and notices a disconnect.

    Until :meth:`start`, the app's ``receive`` goes straight to the server's. Once
    started (the request lasted ``disconnect_watch_after``), a :class:`BodyReader`
    task owns the server's ``receive`` and sees ``http.disconnect``; the app reads
    through its replay. While queued, the reader buffers the body (bounded). Once
    admitted, watching waits until the app has read the body itself, so an upload
    to a slow app keeps the server's flow control rather than filling a buffer.
    A disconnect before the answer was sent sets :attr:`gone`.
    """

    # Defaults live on the class and no __slots__: a request that ends before its
    # watch begins (most of them) sets the few attributes it uses, not all of them.
    _body: BodyReader | None = None
    _reader: asyncio.Task[None] | None = None
    _inside = 0  # app calls in the server's receive right now
    _due = False  # start() came while it could not begin
    _stopped = False
    queued = False
    """Waiting in the queue: the reader may buffer the body."""
    answered = False
    """The last body message was sent: later disconnects are the normal end."""
    gone = False
    """The client disconnected before the answer was complete."""
    gone_after = 0.0
    """Seconds from arrival to the disconnect (what the client was willing to wait)."""
    on_stop: Callable[[], None] | None = None
    """Called when the reader stops (disconnect or body over the bound)."""
    status = 0
    """The status the app answered with (0: none yet)."""
    timing: Token | None = None
    """The token whose queue wait and app time :meth:`send` reports in Server-Timing."""
    over_bound = False
    """A body of unknown length went over the bound while the app read it."""
    refused = False
    """... and before the app answered: the client got 413, and what the app sends
    goes nowhere."""
    _body_read = 0  # bytes the app has read through :meth:`bounded`

    def __init__(
        self,
        receive: Receive,
        send: Send,
        max_bytes: int,
        has_body: bool,
        now: Callable[[], float],
        since: float,
    ) -> None:
        self._receive = receive
        self._send = send
        self._max_bytes = max_bytes
        self._body_unread = has_body  # the app has not read the whole body yet
        self.now = now
        """Reads the limiter's clock."""
        self.since = since
        """When the request arrived, on the limiter's clock."""

    @property
    def too_large(self) -> bool:
        """The body went over the bound while being buffered."""
        return self._body is not None and self._body.too_large

    def start(self) -> None:
        """Begin watching (a no-op once the request ended or while the app itself is
        waiting in the server's receive: then it sees the disconnect first-hand)."""
        if self._stopped or self._reader is not None:
            return
        if self._inside or (self._body_unread and not self.queued):
            self._due = True  # begin when the app is done reading
            return
        body = BodyReader(self._receive, self._max_bytes)
        body.on_stop = self._reader_stopped
        self._body = body
        self._reader = asyncio.get_running_loop().create_task(body.read())

    def send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``: notes the status, adds Server-Timing, marks the end.

        A plain function handing back the server's awaitable: one coroutine fewer
        per message than an ``async def`` wrapper.
        """
        if self.refused:
            return _nothing()  # the client was answered 413: the app's answer goes nowhere
        if message["type"] == "http.response.start":
            self.status = message["status"]
            token = self.timing
            if token is not None:
                app_ms = (self.now() - token.admitted_at) * 1000.0
                timing = b"queue;dur=%.1f, app;dur=%.1f" % (token.queue_wait * 1000.0, app_ms)
                # A new message and header list: an app may send the same dict every time.
                headers = [*message.get("headers", ()), (b"server-timing", timing)]
                message = {**message, "headers": headers}
        elif not message.get("more_body", False):
            self.answered = True  # a disconnect from here on is the normal end
        return self._send(message)

    async def receive(self) -> Message:
        """The app's ``receive``."""
        if self._body is not None:
            return await self._body.replay()
        self._inside += 1
        try:
            message = await self._receive()
        except BaseException:  # e.g. the app polls with a timeout: watch in its place
            self._inside -= 1
            if self._due and not self._inside and not self._body_unread:
                self.start()
            raise
        self._inside -= 1
        if message["type"] == "http.disconnect":
            self._client_left()
        elif not message.get("more_body", False):
            self._body_unread = False
        if self._due and not self._inside and not self._body_unread:
            self.start()
        return message

    async def bounded(self) -> Message:
        """The app's ``receive`` for a body of unknown length: once the body read goes
        over the bound, the client gets 413 (unless the app has begun its answer) and
        the app ``http.disconnect``, as if the client had left."""
        if self.over_bound:
            return {"type": "http.disconnect"}
        message = await self.receive()
        if message["type"] == "http.request":
            self._body_read += len(message.get("body", b""))
            if self._body_read > self._max_bytes:
                self.over_bound = True
                if self.status == 0:  # else the app's answer has begun: it may finish it
                    # Marked before sending: from here on the app's own sends (another
                    # task of the app may be answering right now) go nowhere.
                    self.status = 413
                    self.answered = True
                    self.refused = True
                    await send_too_large(self._send, self._max_bytes)
                return {"type": "http.disconnect"}
        return message

    def _client_left(self) -> None:
        if not self.answered and not self.gone:
            self.gone = True
            self.gone_after = self.now() - self.since

    def _reader_stopped(self) -> None:
        body = self._body
        assert body is not None
        if body.messages and body.messages[-1]["type"] == "http.disconnect":
            self._client_left()
        if self.on_stop is not None:
            self.on_stop()


async def _nothing() -> None:
    """An awaitable that does nothing (a message dropped after a 413)."""


class RequestWatches:
    """Requests in progress; starts watching those that have lasted ``delay``.

    A timer per request costs more than admitting it (a timer handle, heap
    operations, a cancel). Here a request costs a set insertion and removal, and
    one timer sweeps every ``delay`` seconds while any request is in progress,
    starting the watch of those that have lasted ``delay`` (so a watch begins
    between ``delay`` and twice that after the request arrived).
    """

    __slots__ = ("_active", "_delay", "_loop", "_timer")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._active: set[RequestWatch] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, watch: RequestWatch) -> None:
        """Watch this request's connection once it has lasted ``delay``."""
        if self._delay == 0:
            watch.start()
            return
        self._active.add(watch)
        loop = asyncio.get_running_loop()
        if self._timer is None or loop is not self._loop:  # none yet, or a new loop
            self._loop = loop
            self._timer = loop.call_later(self._delay, self._sweep)

    def finish(self, watch: RequestWatch) -> None:
        """The request is over: forget it and stop its watch."""
        self._active.discard(watch)
        watch._stopped = True
        if watch._reader is not None:
            watch._reader.cancel()

    def _sweep(self) -> None:
        self._timer = None
        delay = self._delay
        due = [watch for watch in self._active if watch.now() - watch.since >= delay]
        for watch in due:
            self._active.discard(watch)
            watch.start()
        if self._active and self._loop is not None:
            self._timer = self._loop.call_later(self._delay, self._sweep)


class BodyReader:
    """Reads a queued request's messages (body bounded) until the client leaves.

    While the request waits, this is what notices a disconnect. After admission it
    keeps reading on the app's behalf and :meth:`replay` hands the app every
    message in order, the buffered body first.
    """

    def __init__(self, receive: Receive, max_bytes: int) -> None:
        self._receive = receive
        self._max_bytes = max_bytes
        self._arrived = asyncio.Event()
        self.messages: list[Message] = []
        self.size = 0
        self.too_large = False
        self.stopped = False
        self.on_stop: Callable[[], None] | None = None
        """Called once when reading stops (disconnect or body over the bound)."""
        self._index = 0

    async def read(self) -> None:
        """Read until ``http.disconnect`` or a body over the bound, then call ``on_stop``.

        A failing ``receive`` counts as a disconnect: nothing more can be watched.
        """
        try:
            while True:
                message = await self._receive()
                self.messages.append(message)
                if message["type"] == "http.disconnect":
                    break
                self.size += len(message.get("body", b""))
                if self.size > self._max_bytes:
                    self.too_large = True
                    break
                self._arrived.set()
        except Exception:
            pass  # the server's own error handling reports it; here it ends the watch
        finally:  # also on cancellation, so a replay never waits forever
            self.stopped = True
            self._arrived.set()
        if self.on_stop is not None:
            self.on_stop()

    async def replay(self) -> Message:
        """The app's receive: buffered messages in order, waiting for the next if needed."""
        while self._index >= len(self.messages):
            if self.stopped:
                if self.messages and self.messages[-1]["type"] == "http.disconnect":
                    return self.messages[-1]
                return await self._receive()  # admitted with a body over the bound
            self._arrived.clear()
            await self._arrived.wait()
        message = self.messages[self._index]
        self._index += 1
        return message
