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

Where the histogram tapers, its edge is not shown, but its top still bounds the
workers from above over a long enough history: however the service times vary, no
request of a first-come-first-served server overtakes ``W`` others, while with more
workers the requests admitted over ``W + 1`` would, at about the rate the taper
predicts. :attr:`OvertakeEdge.ceiling` reads that bound over the last
``_LONG_HISTORY`` requests when the taper says the next value would have shown: on 2
to 8 log-normal sigma 0.5 workers the top value is held by a share of the requests
that a few thousand show many times over; on 32 the top few values are a handful of
requests each, and say nothing.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter, deque

__all__ = ["OvertakeEdge"]

_HISTORY = 8192  # releases remembered to count a request's overtakes
_WINDOW_PER_WORKER = 20  # requests in the histogram per worker of the last edge
_WINDOW_MIN = 256
_EVIDENCE = 12.0  # expected overtakes past the edge that were not seen
_PLATEAU = 0.75  # the top bin at least this x the one under it: level, not tapering
_PILED = 2.0  # ... and at most this x it: not requests in step, all ending at one value
_RECENT_MIN = 32  # the latest requests the lower bound reads (twice the most in flight)
_STRAY = 0.05  # requests past the edge forgiven, as a share of those at its top
_LONG_HISTORY = 4096  # requests the ceiling reads
_CEILING_TOP = 10  # requests that overtook the most, at least
_CEILING_EVIDENCE = 3.0  # ... and one more the taper predicts, at least (see ceiling)
_CEILING_CHANCES = 64  # requests admitted over the most + 2: they could overtake more


class OvertakeEdge:
    """The workers shown by requests overtaking those admitted before them.

    ``record`` takes every released request (success or drop) in release order;
    ``workers`` is the edge while the histogram shows one (see the module docstring),
    else None.
    """

    def __init__(self) -> None:
        # Recent releases: their times (in release order, so sorted) and their
        # (admission time, in flight at admission), sorted; both from ``_start`` on.
        self._released: list[float] = []
        self._admitted: list[tuple[float, int]] = []
        self._start = 0
        # (overtakes, in flight at admission) of recent successes that counted.
        self._window: deque[tuple[int, int]] = deque()
        self._counts: Counter[int] = Counter()  # the window's overtakes, counted
        self._since_fit = 0
        self._edge: int | None = None
        self._size = _WINDOW_MIN  # requests the histogram keeps
        self._fit_every = 16  # requests between fits
        # Overtakes of the latest requests, for the lower bound (see ``at_least``).
        self._recent: deque[int] = deque()
        self._recent_level = 0  # the most in flight among them
        # The two most overtaken since the last take_round_bound(), and how many counted.
        self._round_top = [-1, -1]
        self._round_count = 0
        # The last _LONG_HISTORY requests counted: their overtakes and in flight at
        # admission (two deques of small ints, cheaper than one of pairs), and how many
        # of them overtook k and were admitted at level l (ceiling).
        self._long_overtaken: deque[int] = deque()
        self._long_inflight: deque[int] = deque()
        self._long_overtakes: Counter[int] = Counter()
        self._long_levels: Counter[int] = Counter()
        self.overtook = False
        """Whether any request has overtaken another so far (kept by :meth:`clear`):
        while not, the server may have one worker. Counted even with ``count=False``."""

    def record(
        self, now: float, rtt: float, inflight: int, dropped: bool, *, count: bool = True
    ) -> None:
        """A request released at ``now`` after ``rtt`` seconds, admitted with
        ``inflight`` in flight (itself included). ``count=False`` only remembers the
        release, for the requests after it (cheaper: no overtakes counted)."""
        admitted = now - rtt
        released, order = self._released, self._admitted
        if released and now < released[-1]:
            now = released[-1]  # keep release times sorted if samples come out of order
        key = (admitted, inflight)  # at one instant, the one admitted first found fewer
        start = self._start
        if (
            (count or not self.overtook)
            and not dropped
            and inflight > 1
            and rtt > 0
            and start < len(released)
            and released[start] <= admitted  # the history reaches back to its admission
        ):
            # Released during its life: all but those admitted after it (these
            # overtook it); the others were in flight when it was admitted.
            during = len(released) - bisect.bisect_right(released, admitted, lo=start)
            after = bisect.bisect_right(order, key, lo=start)
            if bisect.bisect_left(order, key, lo=start, hi=after) == after:
                # (Another admitted at the same instant and level: order unknown.)
                overtaken = inflight - 1 - (during - (len(order) - after))
                if overtaken > 0:
                    self.overtook = True
                if overtaken >= 0 and count:
                    self._add(overtaken, inflight)
        elif not released and inflight > 1 and not dropped:
            # The first release of all: every request admitted before it is in flight.
            self.overtook = True
        released.append(now)
        bisect.insort(order, key, lo=start)  # near the end: admissions are nearly in order
        if len(released) - start > _HISTORY:
            # Forget the oldest now and then (a list's head is dear to delete one by one).
            start += _HISTORY // 4
            if start >= _HISTORY:
                del released[:start]
                del order[:start]
                start = 0
            self._start = start

    def clear(self) -> None:
        """Forget the histogram (the service changed: its requests overtook old ones);
        the long history :attr:`ceiling` reads is kept."""
        self._window.clear()
        self._counts.clear()
        self._recent.clear()
        self._since_fit = 0
        self._edge = None

    def _add(self, overtaken: int, inflight: int) -> None:
        if self._edge is not None and overtaken >= self._edge:
            # Past the edge: more workers now (or a stray, the cheaper error): the
            # edge ends and the histogram starts again.
            self.clear()
        top = self._round_top
        if overtaken > top[0]:
            top[0], top[1] = overtaken, top[0]
        elif overtaken > top[1]:
            top[1] = overtaken
        self._round_count += 1
        recent = self._recent
        recent.append(overtaken)
        if inflight > self._recent_level:
            self._recent_level = inflight
        keep = 2 * self._recent_level
        if keep < _RECENT_MIN:
            keep = _RECENT_MIN
        while len(recent) > keep:
            recent.popleft()
            if self._recent_level > inflight:
                self._recent_level -= 1  # slowly forget a higher level
        self._remember(overtaken, inflight)
        window, counts = self._window, self._counts
        window.append((overtaken, inflight))
        counts[overtaken] += 1
        while len(window) > self._size:
            counts[window.popleft()[0]] -= 1
        self._since_fit += 1
        if self._since_fit >= self._fit_every:
            self._since_fit = 0
            self._edge = self._fit()

    def _remember(self, overtaken: int, inflight: int) -> None:
        """Add a request to the long history the ceiling reads (and forget the oldest)."""
        overtakes, levels = self._long_overtakes, self._long_levels
        self._long_overtaken.append(overtaken)
        self._long_inflight.append(inflight)
        overtakes[overtaken] += 1
        levels[inflight] += 1
        if len(self._long_overtaken) > _LONG_HISTORY:
            for counter, key in (
                (overtakes, self._long_overtaken.popleft()),
                (levels, self._long_inflight.popleft()),
            ):
                counter[key] -= 1
                if not counter[key]:
                    del counter[key]

    @property
    def ceiling(self) -> int | None:
        """The most workers a first-come-first-served server can have, by the long
        history: the most any request overtook, plus one (a single request alone at the
        top, well past the others, forgiven as a stray), or None while the history does
        not show it: at least ``_CEILING_TOP`` requests overtook that many, a taper
        going on past it would have shown ``_CEILING_EVIDENCE`` requests more (the top
        count x top / the count under it; none under it: a cliff, no taper), and
        ``_CEILING_CHANCES`` requests were admitted over that many + 2, free to overtake
        more. A server that lets requests pass each other (threads sharing cores) shows
        no such ceiling under its limit. One request past it (more workers now) leaves
        too few at the new top: None until enough reach it. Kept by :meth:`clear`: a
        slower or faster service has as many workers.
        """
        overtakes = self._long_overtakes
        if not overtakes:
            return None
        seen = heapq.nlargest(2, overtakes)  # the two most overtaken values
        most = seen[0]
        if overtakes[most] == 1 and len(seen) > 1 and seen[1] < most - 1:
            most = seen[1]  # one request far past the others: a stray
        top, under = overtakes[most], overtakes.get(most - 1, 0)
        if top < _CEILING_TOP or (under > 0 and top * top / under < _CEILING_EVIDENCE):
            return None
        chances = sum(n for level, n in self._long_levels.items() if level > most + 2)
        return most + 1 if chances >= _CEILING_CHANCES else None

    def _fit(self) -> int | None:
        """The edge of the histogram, or None when it shows none."""
        window = self._window
        if len(window) < _WINDOW_MIN:
            return None
        counts = self._counts
        # The edge: past it, no more than a few requests (1 in 20 of those at the top,
        # at least one): a completion seen a moment late, out of its order.
        highest = max(k for k, n in counts.items() if n > 0)
        edge, past = highest + 1, 0
        for candidate in range(highest, 1, -1):  # the lowest edge that passes
            past += counts[candidate]  # requests that overtook at least ``candidate``
            if past <= max(1.0, _STRAY * counts[candidate - 1]):
                edge = candidate
        self._size = max(_WINDOW_MIN, _WINDOW_PER_WORKER * edge)
        self._fit_every = max(16, self._size // 16)
        if self._edge is not None and edge == self._edge and counts[edge - 1] > 0:
            return edge  # nothing past the last edge, and requests still reach it
        # Requests admitted over the edge could have overtaken more: did they reach it?
        top = below = 0
        for k, level in window:
            if level > edge and edge - 2 <= k < edge:
                if k == edge - 1:
                    top += 1
                else:
                    below += 1
        if edge < 2 or not _PLATEAU * below <= top <= _PILED * below:
            return None  # tapering (no edge), or piled up at one value (requests in step)
        expected_past = top * min(1.0, top / below) if below else float(top)
        return edge if expected_past >= _EVIDENCE else None

    @property
    def at_least(self) -> int:
        """Workers the latest requests show there are at least (0: none yet): the second
        most any of them overtook, plus one (one request may be a stray)."""
        recent = self._recent
        return heapq.nlargest(2, recent)[1] + 1 if len(recent) >= 2 else 0

    @property
    def recent_level(self) -> int:
        """The most requests in flight at admission among the latest (0: none yet): a
        server of ``W`` workers that serves in order keeps :attr:`at_least` at ``W`` or
        under whatever this is; one that lets every request pass every other does not."""
        return self._recent_level

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
