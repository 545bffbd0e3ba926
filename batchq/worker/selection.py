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
    """Plans the pops of one fetch round over ``n`` queues."""

    def __init__(self, n: int, order: str, weights: tuple[int, ...], fetch_batch: int) -> None:
        self.n = n
        self.strict = order == "strict"
        self.weights = weights if weights and len(set(weights)) > 1 else ()
        """Empty: plain rotation (equal weights rotate exactly like no weights)."""
        self.fetch_batch = fetch_batch
        self._rotation = 0
        self._credit = [0.0] * n
        self._dry = [False] * n

    def plan(self, free: int, among: list[int] | None = None) -> list[tuple[int, int]]:
        """(queue index, jobs wanted) for a pipelined round, in pop order; ``among``:
        only these queues (a retry after a round that found nothing in the queues it
        asked). Strict order is planned by the caller queue by queue
        (``strict_want``)."""
        n = self.n
        self._rotation = (self._rotation + 1) % n
        rotated = [(self._rotation + i) % n for i in range(n)]
        order = rotated if among is None else [i for i in rotated if i in among]
        if not self.weights:
            share = max(1, min(self.fetch_batch, -(-free // len(order))))
            out = []
            for i in order:
                want = min(share, free)
                free -= want
                out.append((i, want))
            return out
        return self._weighted(free, order)

    def _weighted(self, free: int, order: list[int]) -> list[tuple[int, int]]:
        w = self.weights
        active = [i for i in order if not self._dry[i]] or order
        wants = dict.fromkeys(order, 0)
        left = free
        for i in order:
            if i not in active and left > 0:
                wants[i] = 1  # a probe: does the dry queue have work again?
                left -= 1
        total_w = sum(w[i] for i in active)
        shares = {i: left * w[i] / total_w for i in active}
        top = max(shares.values())
        if top > self.fetch_batch:
            # one pop takes at most fetch_batch: shrink every share alike, so the
            # proportions hold (the rest is taken next round)
            shares = {i: x * self.fetch_batch / top for i, x in shares.items()}
        for i in active:
            exact = shares[i] + self._credit[i]
            want = min(self.fetch_batch, math.floor(exact))
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
        """A pop of queue ``index`` asked for ``asked`` jobs and returned ``got``."""
        if asked > 0:
            self._dry[index] = got < asked
