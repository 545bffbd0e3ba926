"""Which queues a fetch round pops from, and how many jobs it asks each for.

A worker serving several queues takes them in one of three ways (``WorkerSettings.order``
and ``weights``; ``-q a,b``, ``--order strict``, ``-q a=3,b=1`` on the command line):

* **rotate** (the default): every round pops all the queues in one pipelined round
  trip, the order rotating by one per round, the free slots split evenly
  (``ceil(free / n)`` each, capped at ``fetch_batch``), so a busy queue cannot starve
  the others;
* **weighted** (rotate with weights): the free slots are split in proportion to the
  weights (fractions carried over to the next round, so small rounds still come out
  right on average), the order rotating too. A queue whose last pop came back short
  is *dry*: it is only probed (one job) and its share goes to the queues that have
  work, so an idle heavy queue never holds the others back; it gets its full share
  again as soon as a probe comes back full;
* **strict**: like a classic multi-key ``BLPOP``: the first queue is popped first, and
  only what it could not fill is asked of the next one (one round trip per queue
  visited, in order; a round stops at the first queue that fills its share).

A sharded queue (``batchq/store/shards.py``) counts as one queue here: its share of a round
(at most ``fetch_batch`` per shard) is split over as few of its shards as can carry it,
in whole pops of ``fetch_batch`` when the share is larger and the worker serves this
queue alone (the remainder waits for the next round, so each pop is as large as one
unsharded queue's), the shards taken in turn, those whose last pop came back full
first; one shard that came back short is probed for one job per round, so new work
there is found while the others are busy, and a queue whose shards all came back short
is asked on every shard at once. A round that found nothing asks the shards not asked
yet (``among``), so an idle shard never keeps the worker from a busy one.

This module only plans; ``fetch.Fetcher.pop`` sends the pops and reports back.
"""

from __future__ import annotations

import math

ORDERS = ("rotate", "strict")

MAX_WEIGHT = 1000


def check_selection(queues: tuple[str, ...], order: str, weights: tuple[int, ...]) -> None:
    """Raise ``ValueError`` for an order or weights a worker cannot use."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    if not weights:
        return
    if len(weights) != len(queues):
        raise ValueError(f"weights must give one weight per queue: {len(queues)} queues, "
                         f"{len(weights)} weights")
    for q, w in zip(queues, weights, strict=True):
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WEIGHT:
            raise ValueError(f"the weight of queue {q!r} must be an integer 1..{MAX_WEIGHT}, "
                             f"not {w!r}")
    if order == "strict":
        raise ValueError("weights apply to the rotating order only, not to order='strict'")


class Selector:
    """Plans the pops of one fetch round over ``n`` queues; ``shards``: the indices of
    each queue's sub-queues (the pops name sub-queues; default: one each, index = queue)."""

    def __init__(self, n: int, order: str, weights: tuple[int, ...], fetch_batch: int,
                 shards: list[list[int]] | None = None) -> None:
        self.n = n
        self.strict = order == "strict"
        self.weights = weights if weights and len(set(weights)) > 1 else ()
        """Empty: plain rotation (equal weights rotate exactly like no weights)."""
        self.fetch_batch = fetch_batch
        """A pop's size: the worker's ``fetch_batch``, or ``BEHIND_BATCH`` times it while
        its queues are behind (``fetch_size.Sizing.grow`` sets it between rounds)."""
        self.shards = shards or [[i] for i in range(n)]
        self._base = {s: b for b, subs in enumerate(self.shards) for s in subs}
        self._rotation = 0
        self._credit = [0.0] * n
        self._dry = [False] * n
        self._sdry = dict.fromkeys(self._base, False)
        """Per sub-queue: its last pop came back short."""
        self._srot = [0] * n
        self._round: dict[int, list[int]] = {}
        """Per queue, [asked, got] over its sub-queues in the current round."""

    def plan(self, free: int, among: list[int] | None = None) -> list[tuple[int, int]]:
        """(sub-queue index, jobs wanted) for a pipelined round, in pop order; ``among``:
        only these sub-queues (a retry after a round that found nothing in the ones it
        asked). Strict order is planned by the caller queue by queue
        (``strict_order``, ``strict_want``)."""
        n = self.n
        self._round = {}
        self._rotation = (self._rotation + 1) % n
        rotated = [(self._rotation + i) % n for i in range(n)]
        subs = {b: self._subs(b, among) for b in rotated}
        order = [b for b in rotated if subs[b]]
        if not self.weights:
            out: list[tuple[int, int]] = []
            share = max(1, -(-free // len(order)))
            for b in order:
                want = min(share, free, self.fetch_batch * len(subs[b]))
                free -= want
                out += self._split(b, subs[b], want)
            return out
        return [x for b, want in self._weighted(free, order, subs)
                for x in self._split(b, subs[b], want)]

    def _subs(self, b: int, among: list[int] | None) -> list[int]:
        """Queue ``b``'s sub-queues in this round's turn (``among`` only), those that
        came back full first."""
        subs = self.shards[b]
        if len(subs) == 1:
            return [s for s in subs if among is None or s in among]
        r = self._srot[b] % len(subs)
        turn = [s for s in subs[r:] + subs[:r] if among is None or s in among]
        return [s for s in turn if not self._sdry[s]] + [s for s in turn if self._sdry[s]]

    def _split(self, b: int, subs: list[int], want: int) -> list[tuple[int, int]]:
        """Queue ``b``'s ``want`` over its sub-queues ``subs`` (see the module doc)."""
        if len(self.shards[b]) == 1:
            return [(subs[0], want)]
        full = [s for s in subs if not self._sdry[s]]
        fb = self.fetch_batch
        if not full:
            # every shard came back short last time: ask each (evenly), in one round
            k = max(1, min(len(subs), want))
        else:
            if want > fb and self.n == 1:
                # whole pops, as one unsharded queue's: the rest of the room is the next
                # round's (or a read-ahead's), not a third pop of a third shard. Only for
                # a worker of this queue alone: beside other queues the share rotation
                # or the weights gave it stands (a weighted share cut here would be lost)
                want -= want % fb
            k = min(len(subs), max(1, -(-want // fb)))
        out, left = [], want
        for j, s in enumerate(subs[:k]):
            part = -(-left // (k - j))
            out.append((s, part))
            left -= part
        if full and k < len(subs) and self._sdry[subs[-1]] and want > len(out):
            # a probe of one shard that came back short: new work there is found soon
            s = subs[-1]
            out[0] = (out[0][0], out[0][1] - 1)
            out.append((s, 1))
        self._srot[b] += k
        return [x for x in out if x[1] > 0] or out[:1]

    def strict_order(self) -> list[int]:
        """Strict order: the sub-queues in the order their queues were given, each
        queue's shards in turn."""
        self._round = {}
        return [s for b in range(self.n) for s in self._subs_strict(b)]

    def _subs_strict(self, b: int) -> list[int]:
        subs = self._subs(b, None)
        self._srot[b] += 1
        return subs

    def _weighted(self, free: int, order: list[int], subs: dict[int, list[int]]
                  ) -> list[tuple[int, int]]:
        w = self.weights
        cap = {i: self.fetch_batch * len(subs[i]) for i in order}
        active = [i for i in order if not self._dry[i]] or order
        wants = dict.fromkeys(order, 0)
        left = free
        for i in order:
            if i not in active and left > 0:
                wants[i] = 1  # a probe: does the dry queue have work again?
                left -= 1
        total_w = sum(w[i] for i in active)
        shares = {i: left * w[i] / total_w for i in active}
        top = max(x / cap[i] for i, x in shares.items())
        if top > 1:
            # one pop takes at most fetch_batch: shrink every share alike, so the
            # proportions hold (the rest is taken next round)
            shares = {i: x / top for i, x in shares.items()}
        for i in active:
            exact = shares[i] + self._credit[i]
            want = min(cap[i], math.floor(exact))
            # carry the fraction (never a debt, never more than a job's worth beyond
            # what the round's end could not give: see below)
            self._credit[i] = min(1.0, max(0.0, exact - want))
            wants[i] = want
        if left > 0 and not any(wants[i] for i in active):
            best = max(active, key=lambda i: (self._credit[i], w[i]))
            wants[best] = 1
            self._credit[best] = 0.0
        out = []
        for i in order:
            want = min(wants[i], free)
            if want < wants[i] and i in active:
                self._credit[i] += wants[i] - want  # its turn comes next round
            free -= want
            out.append((i, want))
        return out

    def strict_want(self, free: int) -> int:
        return min(free, self.fetch_batch)

    def came_back(self, index: int, asked: int, got: int) -> None:
        """A pop of sub-queue ``index`` asked for ``asked`` jobs and returned ``got``."""
        if asked > 0:
            self._sdry[index] = got < asked
            b = self._base[index]
            tally = self._round.setdefault(b, [0, 0])
            tally[0] += asked
            tally[1] += got
            self._dry[b] = tally[1] < tally[0]
