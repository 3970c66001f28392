"""How many workers a first-come-first-served server has, from the order requests end.

A server of ``W`` workers that serves requests in the order they arrive starts a
request only once every request admitted before it has started. So when a request
ends, the requests admitted before it that are still in flight were all in service
beside it: at most ``W - 1`` of them. Call that number its overtakes ``k``. Every
request's ``k + 1`` is a lower bound on the workers, whatever the load and the service
time.

The same edge bounds the workers from above once service times vary enough: with
the limit over the workers, each request could overtake more, and with varying
service some would (with exponential service ``k`` is uniform on ``0 .. W - 1``: one
request in ``W`` overtakes every other). A histogram of ``k`` that runs level up to an
edge and stops there is a server of that many workers; one that tapers off (log-normal
service with a heavy tail, or nearly constant service, where nobody overtakes) says
nothing, and no edge is reported. This is where the latency of a queue cannot help:
above the workers each slot adds ``S / W`` to a mean whose noise is ``S`` (3 % of the
noise on 32 workers, thousands of requests to see), while the edge shows after a few
hundred.

A dropped request (its client gone or its deadline passed) never counts itself, and
counts as gone for those after it from the moment it was dropped, though its worker
may still be running it: overtakes then read low, never high, so every bound stays a
lower bound. Many drops smear the histogram's edge (no plateau: no edge reported);
work left running by clients who gave up takes workers, and the edge then shows the
workers left for new requests. A server that does not serve in order (threads
sharing cores, a priority queue) lets requests overtake more: the edge reads high or
not at all. Pure arithmetic on release times: no clock, no state machine.
"""

from __future__ import annotations

from collections import Counter, deque

__all__ = ["OvertakeEdge"]

_HISTORY = 8192  # releases remembered to count a request's overtakes
_WINDOW_PER_WORKER = 20  # requests in the histogram per worker of the last edge
_WINDOW_MIN = 256
_EVIDENCE = 12.0  # expected overtakes past the edge that were not seen
_PLATEAU = 0.75  # the top bin at least this x the one under it: level, not tapering
_PILED = 2.0  # ... and at most this x it: not requests in step, all ending at one value
_RECENT_MIN = 32  # the latest requests the lower bound reads (twice the most in flight)
_PAST_ENDS = 1  # requests past the edge that end it
_STRAY = 0.05  # requests past the edge forgiven, as a share of those at its top


class OvertakeEdge:
    """The workers shown by requests overtaking those admitted before them.

    ``record`` takes every released request (success or drop) in release order;
    ``workers`` is the edge while the histogram shows one (see the module docstring),
    else None.
    """

    def __init__(self) -> None:
        # (release time, admission time, in flight at admission) of recent releases,
        # oldest first.
        self._releases: deque[tuple[float, float, int]] = deque(maxlen=_HISTORY)
        # (overtakes, in flight at admission) of recent successes that counted.
        self._window: deque[tuple[int, int]] = deque()
        self._since_fit = 0
        self._edge: int | None = None
        self._size = _WINDOW_MIN  # requests the histogram keeps
        self._past = 0  # requests past the edge since it was found
        # Overtakes of the latest requests, for the lower bound (see ``at_least``).
        self._recent: deque[int] = deque()
        self._recent_level = 0  # the most in flight among them
        # The two most overtaken since the last take_round_bound(), and how many counted.
        self._round_top = [-1, -1]
        self._round_count = 0

    def record(self, now: float, rtt: float, inflight: int, dropped: bool) -> None:
        """A request released at ``now`` after ``rtt`` seconds, admitted with
        ``inflight`` in flight (itself included)."""
        admitted = now - rtt
        releases = self._releases
        if releases and now < releases[-1][0]:
            now = releases[-1][0]  # keep release times sorted if samples come out of order
        if not dropped and inflight > 1 and rtt > 0:
            left = 0  # requests admitted before this one that ended during its life
            complete = False
            # About as many ended during its life as were in flight (Little's law);
            # past a few times that, give up rather than scan a long history.
            budget = 4 * inflight + 64
            for released, their_admission, their_level in reversed(releases):
                if released <= admitted:
                    complete = True
                    break
                budget -= 1
                if budget < 0:
                    break
                if their_admission < admitted or (
                    # Admitted at the same instant (several slots freed at once): the
                    # one admitted first found fewer in flight.
                    their_admission == admitted and their_level < inflight
                ):
                    left += 1
            overtaken = inflight - 1 - left
            if complete and overtaken >= 0:
                self._add(overtaken, inflight)
        releases.append((now, admitted, inflight))

    def clear(self) -> None:
        """Forget the histogram (the service changed: its requests overtook old ones)."""
        self._window.clear()
        self._recent.clear()
        self._since_fit = 0
        self._edge = None
        self._past = 0

    def _add(self, overtaken: int, inflight: int) -> None:
        if self._edge is not None and overtaken >= self._edge:
            # Past the edge: more workers now (or a stray); the second such request
            # since the edge was found ends it, and the histogram starts again.
            self._past += 1
            if self._past >= _PAST_ENDS:
                self.clear()
        top = self._round_top
        if overtaken > top[0]:
            top[0], top[1] = overtaken, top[0]
        elif overtaken > top[1]:
            top[1] = overtaken
        self._round_count += 1
        recent = self._recent
        recent.append(overtaken)
        self._recent_level = max(inflight, self._recent_level)
        while len(recent) > max(_RECENT_MIN, 2 * self._recent_level):
            recent.popleft()
            self._recent_level = max(inflight, self._recent_level - 1)  # slowly forget
        window = self._window
        window.append((overtaken, inflight))
        while len(window) > self._size:
            window.popleft()
        self._since_fit += 1
        if self._since_fit >= max(16, self._size // 16):
            self._since_fit = 0
            edge = self._fit()
            if edge != self._edge:
                self._past = 0
            self._edge = edge

    def _fit(self) -> int | None:
        """The edge of the histogram, or None when it shows none."""
        window = self._window
        if len(window) < _WINDOW_MIN:
            return None
        counts = Counter(k for k, _ in window)
        # The edge: past it, no more than a few requests (1 in 20 of those at the top,
        # at least one): a release seen a moment late, a drop counted as served.
        highest = max(counts)
        edge, past = highest + 1, 0
        for candidate in range(highest, 1, -1):  # the lowest edge that passes
            past += counts[candidate]  # requests that overtook at least ``candidate``
            if past <= max(1.0, _STRAY * counts[candidate - 1]):
                edge = candidate
        self._size = max(_WINDOW_MIN, _WINDOW_PER_WORKER * edge)
        if self._edge is not None and edge == self._edge and counts[edge - 1] > 0:
            return edge  # nothing past the last edge, and requests still reach it
        # Requests admitted over the edge could have overtaken more: did they reach it?
        top = sum(1 for k, level in window if k == edge - 1 and level > edge)
        below = sum(1 for k, level in window if k == edge - 2 and level > edge)
        if edge < 2 or not _PLATEAU * below <= top <= _PILED * below:
            return None  # tapering (no edge), or piled up at one value (requests in step)
        expected_past = top * min(1.0, top / below) if below else float(top)
        return edge if expected_past >= _EVIDENCE else None

    @property
    def at_least(self) -> int:
        """Workers the latest requests show there are at least (0: none yet): the second
        most any of them overtook, plus one (one request may be a stray)."""
        recent = self._recent
        if len(recent) < 2:
            return 0
        first = second = -1
        for k in recent:
            if k > first:
                first, second = k, first
            elif k > second:
                second = k
        return second + 1

    def take_round_bound(self) -> tuple[int, int]:
        """The lower bound (as ``at_least``) over the requests counted since the last
        call, and how many counted; starts the next round."""
        bound = self._round_top[1] + 1 if self._round_count >= 2 else 0
        count = self._round_count
        self._round_top = [-1, -1]
        self._round_count = 0
        return bound, count

    @property
    def workers(self) -> int | None:
        """The workers the order of completions shows, or None while it shows none."""
        return self._edge
