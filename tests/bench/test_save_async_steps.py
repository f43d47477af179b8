"""bench/multi/gpu_save_async.py's step medians: the steps that ran while an asynchronous write was in flight are the
ones begun within its write_s of the save's step, and a resume appended to the same metrics.jsonl is not counted."""

from __future__ import annotations

import json
from pathlib import Path

from bench.multi.gpu_save_async import metrics_records, step_medians


def test_steps_during_a_write_are_those_begun_before_it_ended(tmp_path: Path):
    # steps of 1 s, step 5 (during the write of step 4's save, 2.5 s) of 3 s; then a resumed run's step 6 of 100 s
    elapsed = {1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 16.0, 6: 17.0, 7: 18.0, 8: 19.0}
    save = {"event": "checkpoint", "step": 4, "mode": "async", "save_pause_s": 0.1, "write_s": 2.5, "gb": 1.0}
    records = [{"step": s, "loss": 1.0, "elapsed_s": e} for s, e in elapsed.items()]
    records[4:4] = [save]
    records += [{"event": "done", "step": 8}, {"step": 7, "loss": 1.0, "elapsed_s": 119.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    medians = step_medians(metrics_records(tmp_path), warmup_steps=1, saves=[save])
    # timed steps 2..8: 1, 1, 1, 3, 1, 1, 1 s; in flight: step 5 (begun at 13.0, the write ends 15.5), step 6
    # begun at 16.0 is past it
    assert medians == {"step_s_median": 1.0, "step_s_median_writing": 3.0}
    assert step_medians(metrics_records(tmp_path), warmup_steps=1, saves=[])["step_s_median_writing"] is None
