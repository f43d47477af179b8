"""A mixture of sources stopped mid-run resumes at the exact data position: the restarted run equals
an uninterrupted one bit for bit (2 ranks, FSDP2 over gloo, across mixture epochs whose draws differ),
and eval loss is reported per source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.protocol import EXIT_REQUEUE
from tests.faults import STOP_AT_STEP_ENV
from tests.train.run_helpers import metrics, read_log, run_training, write_run
from tests.train.test_checkpoint_resume import assert_same_weights
from tests.train.test_sources import QA_SOURCE

pytestmark = pytest.mark.slow
SAMPLE_CHAT = Path(__file__).resolve().parents[2] / "train" / "assets" / "sample_chat.jsonl"


def mixture(root: Path) -> dict[str, dict]:
    """Chat (half of it per epoch, 10% held out) + a Parquet Q&A set (twice per epoch, its own CSV eval set)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": f"What is {i} times 3?", "answer": f"{3 * i}, since {i} + {i} + {i} = {3 * i}."}
            for i in range(60)]
    pq.write_table(pa.Table.from_pylist(rows), root / "qa.parquet")
    (root / "qa_eval.csv").write_text("question,answer\n" + "".join(f"What is {i} times 3?,{3 * i}.\n"
                                                                     for i in range(60, 70)))
    qa = {"path": str(root / "qa.parquet"), "name": "qa", "weight": 2.0, "eval_path": str(root / "qa_eval.csv"),
          **QA_SOURCE}
    chat = {"path": str(SAMPLE_CHAT), "name": "chat", "weight": 0.5, "eval_fraction": 0.1}
    return {"data": {"sources": [chat, qa]}, "train": {"eval_steps": 10}}


def test_a_mixture_resumes_bitwise_and_reports_eval_loss_per_source(tmp_path):
    reference = write_run(tmp_path / "reference", mixture(tmp_path))
    assert run_training(reference) == 0, read_log(reference)
    log = read_log(reference)
    assert "source chat: 285 examples (300 rows, 0 skipped), 142 per epoch, 15 eval" in log
    assert "source qa: 60 examples (60 rows, 0 skipped), 120 per epoch, 10 eval" in log
    records = metrics(reference)
    epochs = {r["epoch"] for r in records if "loss" in r}
    assert len(epochs) >= 2, f"the run must cross a mixture epoch boundary: {epochs}"
    epoch_at = {r["step"]: r["epoch"] for r in records if "loss" in r}
    assert epoch_at[30] > epoch_at[15], "the resumed part must cross a mixture epoch boundary too"
    evals = [r for r in records if "eval_loss" in r]
    assert evals and all({"eval_loss/chat", "eval_loss/qa"} <= set(r) for r in evals)
    last_step = max(r["step"] for r in records if "loss" in r)
    assert last_step % 10 == 0 and [r["step"] for r in evals] == list(range(10, last_step + 1, 10))  # the final eval once

    run_dir = write_run(tmp_path / "run", mixture(tmp_path))
    code = run_training(run_dir, {STOP_AT_STEP_ENV: "15"}, log_name="first.log")
    assert code in (EXIT_REQUEUE, 1) and "exitcode  : 75" in read_log(run_dir, "first.log")
    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    assert "resumed from" in read_log(run_dir, "second.log")
    strip = lambda rs: [json.dumps({k: v for k, v in r.items() if k in ("step", "epoch", "loss", "grad_norm")
                                    or k.startswith("eval_loss")}) for r in rs if "loss" in r or "eval_loss" in r]
    assert strip(metrics(run_dir)) == strip(records)
    assert_same_weights(run_dir, reference)
