"""bench.suites.gpu_single.steady_state: the clock starts at the first logged step past the warm-up, whatever the
logging interval, and the file says where it started."""

import json

from bench.suites.gpu_single import steady_state
from bench.report.results_io import WARMUP_STEPS, clock_start


def _metrics(tmp_path, every: int, last: int, first_window_s: float = 40.0):
    """A metrics.jsonl logging every `every` steps: the first window holds a slow compile, each step after
    takes 1 s and moves 1,000 real tokens."""
    lines, elapsed = [], 0.0
    for step in range(every, last + 1, every):
        seconds = first_window_s if step == every else float(every)
        elapsed += seconds
        rate = 1000.0 * every / seconds if step != every else 10.0
        lines.append(json.dumps({"step": step, "elapsed_s": elapsed, "tokens_per_s": rate, "loss": 1.0}))
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_step_starts_the_clock_after_the_warm_up(tmp_path):
    stats = steady_state(_metrics(tmp_path, every=1, last=44))
    assert (stats["warmup_steps"], stats["steps"], stats["seconds"]) == (WARMUP_STEPS, 40, 40.0)
    assert stats["real_tokens"] == 40_000


def test_every_tenth_step_starts_the_clock_at_the_first_window_past_the_warm_up(tmp_path):
    """Logging every 10 steps, the window ending at step 10 holds the compile: it is not timed, and the
    file records 10 as the warm-up rather than claiming 4."""
    stats = steady_state(_metrics(tmp_path, every=10, last=50))
    assert (stats["warmup_steps"], stats["steps"], stats["seconds"]) == (10, 40, 40.0)
    assert stats["real_tokens_per_s"] == 1000.0


def test_clock_start():
    assert clock_start([1, 2, 3, 4, 5]) == WARMUP_STEPS
    assert clock_start([10, 20, 30]) == 10
    assert clock_start([4, 8, 12]) == 4
