"""The peers' clock keeps each timed step's host seconds, so a stall in a peer's run can be found as in ours."""

from __future__ import annotations

from types import SimpleNamespace

from bench.peers.peer_clock import TimedSteps, _StepClock
from bench.report.results_io import WARMUP_STEPS


def test_each_timed_step_runs_from_the_previous_steps_end_and_the_first_from_the_clocks_start(monkeypatch) -> None:
    clock = SimpleNamespace(t_end=None, step_ends=[], t0=None)
    callback = _StepClock(clock)
    ticks = iter(range(100, 200, 10))  # the host's clock at each step's end
    monkeypatch.setattr("bench.peers.peer_clock.time.perf_counter", lambda: float(next(ticks)))
    steps = WARMUP_STEPS + 3
    for step in range(1, steps):  # every step but the last (the last one waits for the GPU)
        callback.on_step_end(None, SimpleNamespace(global_step=step, max_steps=steps), None)
    clock.t0 = clock.step_ends[WARMUP_STEPS - 1] + 4.0  # started just before step WARMUP_STEPS + 1
    assert clock.t_end is None
    assert TimedSteps.timed_step_seconds(clock) == [6.0, 10.0]
