"""Replaying rank programs that share world-wide collectives: when each rank finishes.

A program is what one class of ranks (an SP group, whose ranks run in lockstep, or the ranks in
no group) does in a step, in order:

    ("compute", seconds, kind, microbatch)   local work: forward, backward, recompute, all-to-all
    ("issue", cid)                           start collective `cid` asynchronously
    ("wait", cid)                            block until collective `cid` has finished

Every program issues every collective exactly once (world-wide collectives: the executor issues
the same ones, in the same order, on every rank). A collective starts once the last rank has
issued it and the link is free: the GPU's collectives share one link, so they run one at a
time, the earliest-ready first (ties in issue order), each for its priced seconds. That is a
work-conserving queue: it neither idles while a collective is ready nor runs one before every
rank has joined it, which is what makes a slow group delay the others.

Never imports torch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from dcp.costmodel.spec import CostModelError

Op = tuple
"""("compute", seconds, kind, microbatch) | ("issue", cid) | ("wait", cid)."""
Span = tuple[float, float, str, int | None]
"""(start_s, end_s, kind, microbatch index or None) of one stretch of a rank's step."""


@dataclass
class Replay:
    """When each program ended, and (when asked) what each did when."""

    end_s: list[float]
    """Per program: the time its last op finished."""
    start_s: list[float]
    """Per collective: when it started on the link."""
    done_s: list[float]
    """Per collective: when it finished."""
    spans: list[list[Span]] | None = None
    """Per program: its compute, and its waits split into idle (before the collective started)
    and the collective's own kind (while it ran); None unless asked for."""


def replay(programs: Sequence[Sequence[Op]], durations: Sequence[float], kinds: Sequence[str],
           *, spans: bool = False) -> Replay:
    """Run the programs against one shared link; `durations[cid]` and `kinds[cid]` price and
    label collective `cid`. CostModelError if they cannot finish (a collective some program never
    issues, or waits in an order that deadlocks), which would be a hang on the real ranks."""
    n, count = len(programs), len(durations)
    issued = [0] * count
    ready = [0.0] * count
    start, done = [-1.0] * count, [-1.0] * count
    pc, clock = [0] * n, [0.0] * n
    out: list[list[Span]] | None = [[] for _ in range(n)] if spans else None
    waiting: dict[int, list[int]] = {}
    queue: list[tuple[float, int]] = []

    def advance(c: int) -> None:
        prog, t = programs[c], clock[c]
        while pc[c] < len(prog):
            op = prog[pc[c]]
            if op[0] == "compute":
                if out is not None and op[1] > 0:
                    _append(out[c], (t, t + op[1], op[2], op[3]))
                t += op[1]
            elif op[0] == "issue":
                cid = op[1]
                issued[cid] += 1
                ready[cid] = max(ready[cid], t)
                if issued[cid] == n:
                    heapq.heappush(queue, (ready[cid], cid))
            else:
                cid = op[1]
                if done[cid] < 0:
                    waiting.setdefault(cid, []).append(c)
                    clock[c] = t
                    return
                if out is not None and done[cid] > t:
                    began = max(t, start[cid])
                    if began > t:
                        _append(out[c], (t, began, "idle", None))
                    _append(out[c], (began, done[cid], kinds[cid], None))
                t = max(t, done[cid])
            pc[c] += 1
        clock[c] = t

    for c in range(n):
        advance(c)
    link_free = 0.0
    while queue:
        at, cid = heapq.heappop(queue)
        start[cid] = max(link_free, at)
        done[cid] = link_free = start[cid] + durations[cid]
        for c in waiting.pop(cid, []):
            advance(c)
    stuck = [c for c in range(n) if pc[c] < len(programs[c])]
    if stuck or any(k != n for k in issued):
        missing = next((cid for cid, k in enumerate(issued) if k != n), None)
        raise CostModelError(f"the step's collectives do not line up across ranks (programs {stuck} cannot finish; "
                             f"collective {missing} issued by {issued[missing] if missing is not None else n} of {n}): "
                             "a schedule that would hang")
    return Replay(clock, start, done, out)


def _append(spans: list[Span], span: Span) -> None:
    """Add a span, merged into the previous one when it continues it with the same label."""
    if spans and spans[-1][2] == span[2] and spans[-1][3] == span[3] and abs(spans[-1][1] - span[0]) <= 1e-15:
        prev = spans[-1]
        spans[-1] = (prev[0], span[1], prev[2], prev[3])
    else:
        spans.append(span)
