"""`sft-launch status RUN [--json]`: where a run stands, across requeues.

Sources: SLURM (`scontrol show job -o`) for the live state, its accounting (`sacct`, where the
cluster keeps one) for a job slurmctld has forgotten; run.json for job ids, restarts and
what each stop was (preemption / time limit / node failure); logs/node_failures.txt for the nodes the
batch shell excluded and why; metrics.jsonl for step, loss, throughput and ETA;
checkpoints/ for the last complete checkpoint; eval/ for the newest `sft-launch eval` scores.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract import failure, protocol
from launcher.ops import evalresults, rundir, slurm
from launcher.usage import Parser

ETA_WINDOW = 20  # recent step records used for seconds per step
ACTIVE_STATES = frozenset({"RUNNING", "PENDING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"})

JobQuery = Callable[[str], dict[str, str] | None]


def state_from_record(run: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """The outcome run.json / metrics.jsonl recorded, for jobs SLURM has forgotten (or local runs)."""
    events = [e for e in run.get("events", []) if e.get("event") != "cancel_requested"]
    last = events[-1] if events else {}
    if last.get("event") == "cancel":
        return "CANCELLED"
    if last.get("event") == "finish":
        outcome = last.get("outcome", "")
        if outcome == "gave-up":
            return "STOPPED (max_timeouts reached)"
        if outcome == "cancelled":
            return "CANCELLED"
        if outcome == "stopped":
            return "STOPPED (checkpointed; the same command resumes it)"
        return "COMPLETED" if int(last.get("exit_code", 1)) == 0 else f"FAILED (exit {last.get('exit_code')})"
    if any(r.get("event") == "done" for r in records):
        return "COMPLETED"
    if last.get("event") == "requeue":
        return "REQUEUED (job unknown to SLURM now)"
    if last.get("event") == "start" and last.get("executor") == "local":
        return _local_state(last)
    if last.get("event") == "start":
        return "UNKNOWN (was running; job unknown to SLURM now)"
    return "NOT STARTED" if not run.get("job_ids") else "UNKNOWN (job unknown to SLURM)"


def _local_state(start: dict[str, Any]) -> str:
    """A local run that recorded its start and no end: RUNNING while its launcher process lives."""
    host, pid = start.get("host"), start.get("pid")
    if host != socket.gethostname() or not isinstance(pid, int):
        return f"UNKNOWN (a local run on {host}; ask there)"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "UNKNOWN (the local run ended without a record: killed?)"
    except PermissionError:
        pass  # someone else's process: alive
    return "RUNNING"


def slurm_state(job_id: str, query: JobQuery,
                accounting: JobQuery = slurm.accounting_fields) -> tuple[str | None, dict[str, str], str]:
    """(state, fields, source): scontrol while slurmctld knows the job, else sacct where the cluster
    keeps accounting; (None, {}, "run.json") when SLURM cannot tell."""
    try:
        fields, source = query(job_id), "slurm"
    except slurm.SlurmUnavailable:
        fields = None
    if not fields:
        fields, source = accounting(job_id), "sacct"
    if not fields:
        return None, {}, "run.json"
    return fields.get("JobState", "UNKNOWN"), fields, source


def seconds_per_step(steps: list[dict[str, Any]]) -> float | None:
    """Recent seconds per optimizer step, from elapsed_s of the newest restart's records."""
    if not steps:
        return None
    restart = steps[-1].get("restart", 0)
    recent = [r for r in steps if r.get("restart", 0) == restart][-ETA_WINDOW:]
    if len(recent) < 2 or recent[-1].get("elapsed_s") is None or recent[0].get("elapsed_s") is None:
        return None
    dsteps = recent[-1]["step"] - recent[0]["step"]
    dtime = recent[-1]["elapsed_s"] - recent[0]["elapsed_s"]
    return dtime / dsteps if dsteps > 0 and dtime > 0 else None


def _requeue_counts(events: list[dict[str, Any]]) -> dict[str, int]:
    requeues = [e for e in events if e.get("event") == "requeue"]
    return {
        "restarts": len(requeues),
        "preemptions": sum(1 for e in requeues if e.get("kind") == "preemption"),
        "timeouts": sum(1 for e in requeues if e.get("kind") == "timeout"),
        "node_failures": sum(1 for e in requeues if e.get("kind") == "node-failure"),
    }


def excluded_nodes(run_dir: Path) -> list[dict[str, str]]:
    """The nodes the batch shell blamed and excluded, oldest first (lines "JOB RESTART NODE REASON...")."""
    try:
        lines = (run_dir / protocol.LOGS_DIR / protocol.NODE_FAILURES_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    fields = [line.split(" ", 3) for line in lines]
    return [{"job": f[0], "restart": f[1], "node": f[2], "reason": f[3] if len(f) > 3 else ""}
            for f in fields if len(f) >= 3]


def _updated(run_dir: Path, logs: list[rundir.LogFile]) -> str | None:
    paths = [run_dir / protocol.RUN_RECORD, run_dir / protocol.METRICS_FILE, *(log.path for log in logs[-1:])]
    times = [p.stat().st_mtime for p in paths if p.exists()]
    if not times:
        return None
    return datetime.datetime.fromtimestamp(max(times)).astimezone().isoformat(timespec="seconds")


def failure_line(run_dir: Path, run: dict[str, Any], state: str) -> str | None:
    """The first failing rank's first error line of the newest attempt, else the batch shell's own failure
    line (a setup line, scontrol: contract/failure.py); None while active."""
    if state in ACTIVE_STATES:
        return None
    starts = [e["time"] for e in run.get("events", []) if e.get("event") == "start" and e.get("time")]
    since = datetime.datetime.fromisoformat(starts[-1]).timestamp() if starts else 0.0
    record = failure.first_failure(run_dir, since)
    return failure.describe(record) if record else failure.batch_failure(run_dir, since)


def run_status(run_dir: Path, query: JobQuery = slurm.job_fields,
               accounting: JobQuery = slurm.accounting_fields) -> dict[str, Any]:
    """Everything `status` shows, as a JSON-ready dict (`query` is scontrol, `accounting` sacct)."""
    run = rundir.read_run_json(run_dir)
    settings = rundir.train_settings(run_dir)
    records = rundir.read_metrics(run_dir, settings)
    steps = rundir.step_records(records)
    job_ids = [str(j) for j in run.get("job_ids", [])]
    logs = rundir.log_files(run_dir, job_ids)
    state, fields, source = slurm_state(job_ids[-1], query, accounting) if job_ids else (None, {}, "run.json")
    if state is None:
        state = state_from_record(run, records)
    last = steps[-1] if steps else {}
    total = rundir.total_steps(settings, records)
    pace = seconds_per_step(steps)
    checkpoints = rundir.complete_checkpoints(run_dir, settings)
    eta = None
    if state in ACTIVE_STATES and pace and total and last:
        eta = max(0, total - int(last["step"])) * pace
    return {
        "run_dir": str(run_dir), "name": run_dir.name, "executor": rundir.executor(run),
        "state": state, "state_source": source, "reason": fields.get("Reason") if fields else None,
        "job_ids": job_ids, **_requeue_counts(run.get("events", [])),
        "slurm_restarts": int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else None,
        "max_timeouts": run.get("profile", {}).get("max_timeouts"),
        "max_node_failures": run.get("profile", {}).get("max_node_failures"),
        "excluded_nodes": excluded_nodes(run_dir),
        "last_checkpoint": {"step": checkpoints[-1][0], "path": str(checkpoints[-1][1])} if checkpoints else None,
        "step": last.get("step"), "total_steps": total, "loss": last.get("loss"), "lr": last.get("lr"),
        "tokens_per_s": last.get("tokens_per_s"), "mfu": last.get("mfu"),
        "seconds_per_step": pace, "eta_s": eta, "done": any(r.get("event") == "done" for r in records),
        "cancel_requested": (run_dir / protocol.CANCEL_FILE).exists(), "updated": _updated(run_dir, logs),
        "eval": evalresults.summary(evalresults.latest(run_dir)),
        "eval_loss": _latest_eval_loss(records),
        "error": failure_line(run_dir, run, state),
        **_expert_load(last),
    }


def _expert_load(last: dict[str, Any]) -> dict[str, Any]:
    """MoE runs (train/moe/router.py): the last record's aux loss and the least/most loaded expert of any
    layer, as shares of that layer's top-k assignments (1/E each when balanced); nothing for a dense run."""
    lows, highs = last.get("expert_load_min"), last.get("expert_load_max")
    if not lows or not highs:
        return {}
    return {"experts": {"aux_loss": last.get("aux_loss"), "load_min": min(lows), "load_max": max(highs),
                        "layer_min": lows.index(min(lows)), "layer_max": highs.index(max(highs))}}


def _latest_eval_loss(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest eval record of metrics.jsonl: step, eval_loss and each source's eval_loss/<name>."""
    evals = [r for r in records if "eval_loss" in r]
    if not evals:
        return None
    return {k: v for k, v in evals[-1].items() if k == "step" or k.startswith("eval_loss")}


def _eval_loss_line(latest: dict[str, Any]) -> str:
    per_source = [f"{k.removeprefix('eval_loss/')} {v:.4f}" for k, v in latest.items() if k.startswith("eval_loss/")]
    return (f"eval loss    {latest['eval_loss']:.4f}" + (f" ({', '.join(per_source)})" if per_source else "")
            + f" at step {latest.get('step', '-')}")


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_status(status: dict[str, Any]) -> str:
    total = status["total_steps"]
    step = "-" if status["step"] is None else f"{status['step']}" + (f"/{total}" if total else "")
    state = status["state"] + (f" ({status['reason']})" if status.get("reason") not in (None, "None") else "")
    ckpt = status["last_checkpoint"]
    budget = f"/{status['max_timeouts']}" if status["max_timeouts"] is not None else ""
    node_budget = f"/{status['max_node_failures']}" if status.get("max_node_failures") is not None else ""
    mfu = "n/a" if status["mfu"] is None else f"{status['mfu'] * 100:.1f}%"
    checkpoint = f"step {ckpt['step']} ({ckpt['path']})" if ckpt else "-"
    lines = [
        f"run          {status['name']}  ({status['run_dir']})",
        f"state        {state}  [{status['state_source']}, executor {status['executor']}]",
        f"jobs         {', '.join(status['job_ids']) or '-'}",
        f"restarts     {status['restarts']} (preemptions {status['preemptions']}, "
        f"time-limit hits {status['timeouts']}{budget}, node failures {status['node_failures']}{node_budget})",
        f"checkpoint   {checkpoint}",
        f"step         {step}   loss {_fmt(status['loss'], '.4f')}   lr {_fmt(status['lr'], '.2e')}",
        f"throughput   {_fmt(status['tokens_per_s'], ',.0f')} tokens/s   MFU {mfu}   "
        f"{_fmt(status['seconds_per_step'], '.2f')} s/step",
        f"eta          {format_duration(status['eta_s'])}",
        f"updated      {status['updated'] or '-'}",
    ]
    for out in status.get("excluded_nodes", []):
        lines.append(f"excluded     {out['node']}: {out['reason']} (job {out['job']}, restart {out['restart']})")
    if experts := status.get("experts"):
        lines.append(f"experts      load share min {experts['load_min']:.3f} (layer {experts['layer_min']}), max "
                     f"{experts['load_max']:.3f} (layer {experts['layer_max']}); "
                     f"aux loss {_fmt(experts['aux_loss'], '.4f')}")
    if status.get("eval_loss"):
        lines.append(_eval_loss_line(status["eval_loss"]))
    if status.get("eval"):
        lines.append(evalresults.format_summary(status["eval"]))
    if status["cancel_requested"]:
        lines.append(f"note         cancel requested ({protocol.CANCEL_FILE} present)")
    if status.get("error"):  # last: why the run failed, in one line
        lines.append(f"error        {status['error']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = Parser(prog="sft-launch status", description="State of a run across requeues.")
    rundir.add_run_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the status as JSON")
    args = parser.parse_args(argv)
    status = run_status(rundir.resolve_run(args))
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0
