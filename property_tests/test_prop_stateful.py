"""A schedule built op by op against a plain memory-accounting model, checked against the simulator.

The state machine walks the event sequence of the fixed order (start of F_1, end of F_1, ...,
end of B_1). At each event it may trigger offloads and prefetches (with optional ``before``
waits); :class:`MemoryModel` applies docs/model.md's rules as they happen, in plain Python, with no
code shared with the simulator. After every step the simulator replays the schedule built so
far (completed with the prefetches still owed, triggered now) and its memory curve must match
the model's up to the current instant; at the end the whole curve, every op and transfer time,
the peak, the makespan and the verdict at the platform's memory must match.

Chains here have no zero-length op (``min_time > 0``). Then no memory is both allocated and
freed at one instant, and "frees before allocations" makes memory fall then rise within an
instant, so the peak is the largest value that holds after an instant: the model needs only the
step function, not the order of events inside an instant.
"""

from __future__ import annotations

import math
from collections import defaultdict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _budget import examples
from chainoffload import Schedule, Transfer, fixed_order, simulate
from chainoffload.testing import chains, instances


class MemoryModel:
    """docs/model.md's memory and timing rules, applied event by event on a fixed-order schedule."""

    def __init__(self, chain, platform):
        self.chain = chain
        self.platform = platform
        self.L = chain.length
        self.compute = fixed_order(self.L)
        self.n = len(self.compute)
        self.event = -1  # the last event that happened: 2k = start of op k, 2k + 1 = its end
        self.start = [math.nan] * self.n
        self.end = [math.nan] * self.n
        self.transfers: list[Transfer] = []
        self.t_start: list[float] = []
        self.t_end: list[float] = []
        self.offloaded: dict[int, int] = {}  # unit -> transfer index
        self.prefetched: dict[int, int] = {}
        self.channel_free = defaultdict(float)
        self.delta = defaultdict(int)  # instant -> net change in bytes at it
        self.pending_free: dict[int, float] = {}  # unit -> end of its offload, waiting for F_{unit+1}
        self.alloc(0.0, int(chain.act[0]))  # a_0 is resident from time 0

    # -- bookkeeping -----------------------------------------------------------------------

    def alloc(self, t, nbytes):
        self.delta[t] += int(nbytes)

    def free(self, t, nbytes):
        self.delta[t] -= int(nbytes)

    def curve(self):
        """The step function: sorted (instant, bytes in use after it)."""
        out, running = [], 0
        for t in sorted(self.delta):
            running += self.delta[t]
            out.append((t, running))
        return out

    def pos(self, kind, stage):
        return stage - 1 if kind == "F" else 2 * self.L - stage

    @property
    def done(self):
        return self.event == 2 * self.n - 1

    def now(self):
        k, phase = divmod(self.event, 2)
        return self.start[k] if phase == 0 else self.end[k]

    def deadline(self, unit):
        """First event at which the prefetch of ``unit`` is too late: B_{unit+1} (B_L) starts."""
        reader = unit + 1 if unit < self.L else self.L
        return 2 * self.pos("B", reader)

    # -- what may happen now ----------------------------------------------------------------

    def can_offload(self):
        """Units whose F has ended, not offloaded yet, whose prefetch can still come in time."""
        if self.event < 0:
            return []
        return [
            u
            for u in range(1, self.L + 1)
            if u not in self.offloaded and self.event >= 2 * self.pos("F", u) + 1 and self.event < self.deadline(u)
        ]

    def owed(self):
        """Offloaded units whose prefetch is not triggered yet."""
        return [u for u in self.offloaded if u not in self.prefetched]

    # -- the rules ---------------------------------------------------------------------------

    def trigger(self, kind, unit, before=None):
        """Queue a transfer at the current event (FIFO per channel, docs/model.md)."""
        k, phase = divmod(self.event, 2)
        when = self.now()
        p = self.platform
        size = int(self.chain.saved[unit - 1])
        if kind == "offload":
            channel, bandwidth = "d2h", p.bandwidth_d2h
        else:
            channel, bandwidth = ("h2d" if p.duplex else "d2h"), p.bandwidth_h2d
        start = max(when, self.channel_free[channel])
        if kind == "prefetch":
            start = max(start, self.t_end[self.offloaded[unit]])  # P_i after O_i ends
        end = start + (p.latency + size / bandwidth)  # latency + x / bandwidth
        self.channel_free[channel] = end
        idx = len(self.transfers)
        self.transfers.append(Transfer(kind, unit, k, "end" if phase else "start", before))
        self.t_start.append(start)
        self.t_end.append(end)
        if kind == "offload":
            self.offloaded[unit] = idx
            # the GPU copy goes at max(end of O_i, end of F_{i+1}): F_{i+1} still reads a_i
            reader = self.pos("F", unit + 1) if unit < self.L else None
            if reader is None:
                self.free(end, size)
            elif not math.isnan(self.end[reader]):
                self.free(max(end, self.end[reader]), size)
            else:
                self.pending_free[unit] = end
        else:
            self.prefetched[unit] = idx
            self.alloc(start, size)  # P_i allocates when it starts

    def advance(self):
        """Move to the next event: the start or the end of the next op."""
        self.event += 1
        k, phase = divmod(self.event, 2)
        kind, i = self.compute[k]
        c = self.chain
        if phase == 0:
            s = self.end[k - 1] if k > 0 else 0.0
            for idx, t in enumerate(self.transfers):
                if t.before == k:
                    s = max(s, self.t_end[idx])
            if kind == "B":
                for u in (i, i - 1):  # B_i waits for the prefetches of units i and i - 1
                    if u in self.prefetched:
                        s = max(s, self.t_end[self.prefetched[u]])
            self.start[k] = s
            if kind == "F":
                self.alloc(s, int(c.saved[i - 1]) + int(c.fwd_tmp[i - 1]))
            else:
                extra = int(c.act[self.L]) if i == self.L else 0  # B_L also makes g_L
                self.alloc(s, int(c.act[i - 1]) + int(c.bwd_tmp[i - 1]) + extra)
        else:
            e = self.start[k] + (float(c.fwd[i - 1]) if kind == "F" else float(c.bwd[i - 1]))
            self.end[k] = e
            if kind == "F":
                self.free(e, int(c.fwd_tmp[i - 1]))
                if i - 1 in self.pending_free:
                    self.free(max(self.pending_free.pop(i - 1), e), int(c.saved[i - 2]))
            else:
                # saved[i] (the resident or the prefetched copy), g_i and bwd_tmp[i]
                self.free(e, int(c.saved[i - 1]) + int(c.act[i]) + int(c.bwd_tmp[i - 1]))
                if i == 1:
                    self.free(e, int(c.act[0]))  # a_0 (g_0 stays: the chain's input gradient)

    def schedule(self, complete=False):
        """The schedule so far; ``complete`` adds the prefetches still owed, triggered now."""
        extra = []
        if complete and self.event >= 0:
            k, phase = divmod(self.event, 2)
            extra = [Transfer("prefetch", u, k, "end" if phase else "start") for u in self.owed()]
        return Schedule(self.compute, tuple(self.transfers) + tuple(extra))


def sim_curve(tl):
    """The simulator's step function: (instant, bytes in use after everything at that instant)."""
    out = []
    for t, b in zip(tl.memory_time.tolist(), tl.memory_bytes.tolist(), strict=True):
        if out and out[-1][0] == t:
            out[-1] = (t, b)
        else:
            out.append((t, b))
    return out


def value_at(curve, t):
    v = 0
    for ti, b in curve:
        if ti > t:
            break
        v = b
    return v


def compare_curves(model_curve, sim, until=math.inf):
    """Both step functions agree at every instant either has, below ``until``."""
    times = sorted({t for t, _ in model_curve} | {t for t, _ in sim})
    for t in times:
        if t >= until:
            break
        m, s = value_at(model_curve, t), value_at(sim, t)
        assert m == s, f"memory after t={t!r}: model {m} B, simulator {s} B"


class ScheduleMachine(RuleBasedStateMachine):
    """Builds a fixed-order schedule one event at a time, checking the simulator as it goes."""

    def __init__(self):
        super().__init__()
        self.model = None

    @initialize(
        instance=instances(
            chains=chains(min_length=1, max_length=5, min_time=1e-3, max_time=4.0, max_bytes=1000),
            inf_bandwidth=True,
        )
    )
    def setup(self, instance):
        self.model = MemoryModel(*instance)
        self.model.advance()  # the start of F_1

    def _before(self, data):
        k = self.model.event // 2
        if k + 1 >= self.model.n:
            return None
        return data.draw(st.none() | st.integers(k + 1, self.model.n - 1), label="before")

    @precondition(lambda self: self.model is not None and self.model.can_offload())
    @rule(data=st.data())
    def offload(self, data):
        unit = data.draw(st.sampled_from(self.model.can_offload()), label="offload unit")
        self.model.trigger("offload", unit, self._before(data))

    @precondition(lambda self: self.model is not None and self.model.owed())
    @rule(data=st.data())
    def prefetch(self, data):
        unit = data.draw(st.sampled_from(sorted(self.model.owed())), label="prefetch unit")
        self.model.trigger("prefetch", unit, self._before(data))

    @precondition(lambda self: self.model is not None and not self.model.done)
    @rule()
    def advance(self):
        self._advance()

    @precondition(lambda self: self.model is not None and self.model.done)
    @rule(data=st.data())
    def verdict_at_another_memory(self, data):
        # Once built, the schedule is judged at other limits: over exactly where the model's curve is.
        m = self.model
        curve = m.curve()
        peak = max(b for _, b in curve)
        memory = data.draw(st.sampled_from([peak, peak - 1, 0]) | st.integers(0, 2 * peak + 1), label="memory")
        if memory < 0:
            return
        v = simulate(m.chain, m.platform.with_memory(memory), m.schedule()).violation
        over = [t for t, b in curve if b > memory]
        if over:
            assert v is not None and v.rule == "memory" and v.time == over[0], (memory, over[0], v)
        else:
            assert v is None, (memory, v)

    def _advance(self):
        m = self.model
        # A backward may not start before the prefetches it reads are queued: owe none at B_{u+1}.
        for u in sorted(m.owed()):
            if m.event + 1 >= m.deadline(u):
                m.trigger("prefetch", u)
        m.advance()

    @invariant()
    def memory_so_far_matches_the_simulator(self):
        m = self.model
        if m is None:
            return
        tl = simulate(m.chain, m.platform, m.schedule(complete=True))
        now = m.now()
        compare_curves(m.curve(), sim_curve(tl), until=now)
        # every op up to now started (and ended) when the model says
        for k in range(m.event // 2 + 1):
            assert tl.op_start[k] == m.start[k], (k, tl.op_start[k], m.start[k])
            if not math.isnan(m.end[k]):
                assert tl.op_end[k] == m.end[k], (k, tl.op_end[k], m.end[k])
        for idx in range(len(m.transfers)):
            assert (tl.transfer_start[idx], tl.transfer_end[idx]) == (m.t_start[idx], m.t_end[idx]), idx
        # memory <= limit: over the limit before now exactly when the model was
        over = [t for t, b in m.curve() if t < now and b > m.platform.memory]
        v = tl.violation
        if over:
            assert v is not None and v.rule == "memory" and v.time == over[0], (over[0], v)
        else:
            assert v is None or v.time >= now, v

    def teardown(self):
        m = self.model
        if m is None:
            return
        while not m.done:
            self._advance()
        tl = simulate(m.chain, m.platform, m.schedule())
        assert tl.op_start.tolist() == m.start and tl.op_end.tolist() == m.end
        assert tl.transfer_start.tolist() == m.t_start and tl.transfer_end.tolist() == m.t_end
        curve = m.curve()
        compare_curves(curve, sim_curve(tl))
        peak = max(b for _, b in curve)
        assert tl.peak_memory == peak, (tl.peak_memory, peak)
        assert tl.makespan == m.end[-1]
        # what is left after B_1: g_0 alone
        assert curve[-1][1] == int(m.chain.act[0])
        over = [t for t, b in curve if b > m.platform.memory]
        if over:
            assert tl.violation is not None and tl.violation.rule == "memory" and tl.violation.time == over[0]
        else:
            assert tl.violation is None, tl.violation


ScheduleMachine.TestCase.settings = settings(max_examples=examples(1), stateful_step_count=40)
TestScheduleMachine = ScheduleMachine.TestCase
