"""logs (choice of file, node filter, following across a restart) and plot (series, requeue marks)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.launcher.ops_fixtures import make_run

from launcher.ops import logs, plot, rundir

REPO = Path(__file__).resolve().parents[2]


def sft(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, cwd=REPO)


def test_logs_prints_the_newest_restart_or_the_one_asked(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    newest = sft("logs", str(run_dir))
    assert newest.returncode == 0 and "restart 1 on node1" in newest.stdout and "restart 0" not in newest.stdout
    first = sft("logs", str(run_dir), "--restart", "0")
    assert "restart 0 on node1" in first.stdout and "step 1/40" in first.stdout
    missing = sft("logs", str(run_dir), "--restart", "7")
    assert missing.returncode == 1 and "no log of restart 7" in missing.stderr


def test_node_filter_keeps_rank_and_srun_task_lines_of_that_node() -> None:
    assert logs.line_node("2026 [rank 3] INFO x", procs_per_node=2) == 1
    assert logs.line_node("srun: error: node2: task 1: Terminated", procs_per_node=8) == 1
    assert logs.line_node("sft-launch: job 5 restart 0 on node1", procs_per_node=1) is None
    out = io.StringIO()
    logs.LineFilter(1, 1, out).emit("a [rank 0] x\nb [rank 1] y\nuntagged\nsrun: error: node2: task 1: Killed\n")
    assert out.getvalue() == "b [rank 1] y\nsrun: error: node2: task 1: Killed\n"


def test_logs_cli_node_filter(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    node1 = sft("logs", str(run_dir), "--node", "1").stdout.splitlines()
    assert node1 and all("[rank 1]" in line or "task 1" in line for line in node1)


def test_logs_rank_prints_that_ranks_whole_output_of_the_chosen_attempt(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)  # job 900042, restarts 0 and 1
    for attempt in ("900042-r0", "900042-r1"):
        ranks = run_dir / "logs" / "ranks" / attempt
        ranks.mkdir(parents=True)
        (ranks / "rank-00001.log").write_text(f"Traceback of rank 1 in {attempt}\n")
    newest = sft("logs", str(run_dir), "--rank", "1")
    assert newest.returncode == 0 and newest.stdout == "Traceback of rank 1 in 900042-r1\n", newest.stderr
    assert sft("logs", str(run_dir), "--rank", "1", "--restart", "0").stdout == "Traceback of rank 1 in 900042-r0\n"
    missing = sft("logs", str(run_dir), "--rank", "3")
    assert missing.returncode == 1 and "no log of rank 3" in missing.stderr and "rank-00001.log" in missing.stderr
    local = tmp_path / "local"
    (local / "logs" / "ranks" / "local-20260101-000000").mkdir(parents=True)
    (local / "logs" / "ranks" / "local-20260101-000000" / "rank-00000.log").write_text("rank 0 of a local run\n")
    (local / "train.toml").touch()  # a local run: no per-restart log, the newest attempt
    assert sft("logs", str(local), "--rank", "0").stdout == "rank 0 of a local run\n"


def test_logs_of_a_local_run_is_rank_0s_output_of_its_newest_attempt(tmp_path: Path) -> None:
    """A local run has no per-restart log: `logs RUN` (and -f, once the run has ended) prints what its terminal
    showed, rank 0's output of the newest attempt, not "no log of any restart yet (job pending?)"."""
    run_dir = tmp_path / "local"
    for age, (attempt, text) in enumerate([("local-20260102-000000", "[rank 0] the newest attempt\n"),
                                           ("local-20260101-000000", "[rank 0] an older one\n")]):
        ranks = run_dir / "logs" / "ranks" / attempt
        ranks.mkdir(parents=True)
        (ranks / "rank-00000.log").write_text(text)
        (ranks / "rank-00001.log").write_text("[rank 1] not shown\n")
        os.utime(ranks, (time.time() - 100 * age, time.time() - 100 * age))
    (run_dir / "run.json").write_text(json.dumps({"job_ids": [], "events": [
        {"event": "start", "executor": "local"}, {"event": "finish", "executor": "local", "exit_code": 0}]}))
    for flags in ([], ["-f"]):
        shown = subprocess.run([sys.executable, "-m", "launcher.cli", "logs", str(run_dir), *flags],
                               capture_output=True, text=True, cwd=REPO, timeout=60)
        assert shown.returncode == 0 and shown.stdout == "[rank 0] the newest attempt\n", shown.stdout + shown.stderr


def test_follow_switches_to_the_new_restart_file_and_ends_when_finished(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, steps_per_restart=(2,), kinds=())
    first = run_dir / "logs" / "900042-r0.log"
    finished = threading.Event()

    def job() -> None:  # the job: appends, gets requeued (new file), writes a partial line, ends
        time.sleep(0.3)
        with open(first, "a") as handle:
            handle.write("more of restart 0\n")
        time.sleep(0.3)
        second = run_dir / "logs" / "900042-r1.log"
        second.write_text("sft-launch: job 900042 restart 1 on node2\nhalf a li")
        time.sleep(0.3)
        with open(second, "a") as handle:
            handle.write("ne\nlast line without newline")
        finished.set()

    writer = threading.Thread(target=job)
    writer.start()
    out = io.StringIO()
    logs.follow(run_dir, ["900042"], logs.LineFilter(None, 1, out), finished.is_set, poll_s=0.05)
    writer.join()
    text = out.getvalue()
    assert text.index("restart 0 on node1") < text.index("more of restart 0") < text.index("==> 900042-r1.log")
    assert "half a line\n" in text and text.endswith("last line without newline")


def test_plot_series_and_requeue_marks(tmp_path: Path) -> None:
    steps = rundir.step_records(rundir.read_metrics(make_run(tmp_path, steps_per_restart=(4, 3, 3),
                                                             kinds=("preemption", "timeout"))))
    assert plot.requeue_steps(steps) == [5, 8]
    figure = plot.make_figure(steps, "t")
    loss, lr, tokens, mfu = figure.axes
    assert [a.get_title() for a in figure.axes] == ["loss", "learning rate", "tokens/s", "MFU"]
    series = loss.lines[0]
    assert list(series.get_xdata()) == list(range(1, 11))
    assert list(series.get_ydata()) == [r["loss"] for r in steps]
    assert list(tokens.lines[0].get_ydata()) == [r["tokens_per_s"] for r in steps]
    marks = [line.get_xdata()[0] for line in lr.lines if line.get_linestyle() == "--"]
    assert marks == [5, 8]
    assert [t.get_text() for t in mfu.texts] == ["n/a (CPU)"]


def test_plot_cli_writes_a_png_with_mfu_when_known(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, mfu=0.41)
    steps = rundir.step_records(rundir.read_metrics(run_dir))
    mfu_axis = plot.make_figure(steps, "t").axes[3]
    assert not mfu_axis.texts and list(mfu_axis.lines[0].get_ydata())[0] == 0.41
    out = tmp_path / "curves.png"
    proc = sft("plot", str(run_dir), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_out_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    """--out in a folder that does not exist, or in a format matplotlib cannot write: one line (exit 2),
    not matplotlib's traceback."""
    run_dir = make_run(tmp_path)
    for out, words in ((tmp_path / "nope" / "curves.png", "no such directory"), (tmp_path / "curves.txt", "'.txt'")):
        proc = sft("plot", str(run_dir), "--out", str(out))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "--out" in lines[0] and words in lines[0], proc.stderr
        assert not out.exists()


def test_no_matplotlib_or_torch_when_importing_the_ops_modules() -> None:
    code = ("import sys, launcher.cli, launcher.ops.status, launcher.ops.runs, launcher.ops.logs, "
            "launcher.ops.cancel, launcher.ops.plot, launcher.api, launcher.execute.submitit_exec; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'submitit') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
