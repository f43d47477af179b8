"""A default that fits: the micro-batch (and, if need be, activation checkpointing) chosen for the user.

When the user fixes neither `data.tokens_per_micro_batch` nor `train.per_device_train_batch_size`,
the launcher tries the default micro-batch (per_device_train_batch_size x model_max_length), then
the powers of two below it, and keeps the largest that the planner says fits. Documents are never
cut to avoid checkpointing: while the micro-batch would still hold a whole `model_max_length`
document, checkpointing (when the user left it alone and it is off) is turned on first; only then
does the search go below model_max_length (documents longer than the micro-batch are cut to it, and
the plan says so), and never when the user set model_max_length. Gradient accumulation is left as it
is. A value the user fixed (flag or --set) is never changed.

It takes the planner input (launcher/resolve/plan_input.py builds it from the launch) and a question, "did the
user set this key?", and returns the choice; launcher/resolve/options.py applies it to the launch.

The choice is written into train.toml (data.tokens_per_micro_batch, train.gradient_checkpointing,
only when they change), run.json ("micro_batch") and the plan ("Micro" line). When nothing fits, the
configuration stays as given and the plan's suggestions become the settings under which a micro-batch
would fit (more nodes, CPU offload, LoRA), each with the micro-batch the search would then choose.
Pure Python (no torch): it only asks the planner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from launcher.plan.memory import GIB
from launcher.plan.plan_format import suggestion_flags
from launcher.plan.planner import PlanInput, Suggestion, make_plan, suggestions_for

MIN_MICRO_BATCH_TOKENS = 256  # below this a step is all communication; suggest more GPUs instead
MICRO_BATCH_KEYS = ("data.tokens_per_micro_batch", "train.per_device_train_batch_size")
CHECKPOINTING_KEY = "train.gradient_checkpointing"
MAX_LENGTH_KEY = "train.model_max_length"  # set by the user: documents are never cut below it


@dataclass(frozen=True)
class Rules:
    """What the search may change: checkpointing unless the user set it; documents are cut (micro-batch
    below model_max_length) unless the user set model_max_length."""

    checkpointing_fixed: bool
    model_max_length: int
    cut_documents: bool = True


@dataclass
class Trial:
    tokens: int
    checkpointing: bool
    total_gib: float
    fits: bool


@dataclass
class MicroBatchChoice:
    """What the search decided, with the trials that explain it (search order)."""

    tokens: int  # the micro-batch the run uses
    checkpointing: bool
    source: Literal["default", "auto", "none"]  # the default fits / reduced or checkpointing on / nothing fits
    usable_gib: float
    rules: Rules
    trials: list[Trial] = field(default_factory=list)
    # only when nothing fits: (a way out, the micro-batch the search would then choose)
    alternatives: list[tuple[Suggestion, int]] = field(default_factory=list)
    # only when documents are cut: the fewest GPUs per sequence (parallel.context) that keep them whole
    whole_with: int | None = None

    @property
    def suggestions(self) -> list[Suggestion]:
        return [suggestion for suggestion, _ in self.alternatives]

    @property
    def chosen(self) -> Trial | None:
        return next((t for t in self.trials if t.fits), None)

    def describe(self) -> str:
        """One line for the plan: what was chosen and why."""
        usable = f"{self.usable_gib:.1f} GiB"
        if self.source == "none":
            smallest = self.trials[-1]
            ways = ", ".join(f"{tokens} with {suggestion_flags(s)}" for s, tokens in self.alternatives)
            whole = "" if self.rules.cut_documents else " (model_max_length is yours: documents are kept whole)"
            return (f"none fits: even {smallest.tokens} tokens{_ckpt(smallest)} needs {smallest.total_gib:.1f} "
                    f"GiB of {usable}{whole}" + (f"; would choose {ways}" if ways else ""))
        chosen = self.chosen
        assert chosen is not None
        if self.source == "default":
            return (f"{self.tokens} tokens (auto: the default, per_device_train_batch_size x model_max_length, "
                    f"fits in {usable}: {chosen.total_gib:.1f} GiB)")
        misses = [t for t in self.trials if not t.fits]
        larger = next((t for t in reversed(misses) if t.checkpointing == chosen.checkpointing), misses[-1])
        turned_on = chosen.checkpointing and not self.trials[0].checkpointing
        text = (f"{self.tokens} tokens (auto: largest that fits in {usable}, {chosen.total_gib:.1f} GiB; "
                f"{larger.tokens}{_ckpt(larger) if turned_on else ''} needs {larger.total_gib:.1f})")
        if turned_on:
            text += "; activation checkpointing turned on"
        if self.tokens < self.rules.model_max_length:
            text += (f"; documents longer than {self.tokens} tokens are cut to it "
                     f"(model_max_length {self.rules.model_max_length})")
            if self.whole_with:
                text += (f"; whole with --context_parallel {self.whole_with} ({self.rules.model_max_length} "
                         f"tokens over {self.whole_with} GPUs)")
        return text

    def record(self) -> dict[str, Any]:
        """For run.json: the decision and the trials behind it."""
        return {"tokens": self.tokens, "gradient_checkpointing": self.checkpointing, "source": self.source,
                "reason": self.describe(), "usable_gib": round(self.usable_gib, 2),
                "trials": [dataclasses.asdict(t) for t in self.trials]}


def _ckpt(trial: Trial) -> str:
    return " with checkpointing" if trial.checkpointing else " without checkpointing"


def candidates(default: int, floor: int = MIN_MICRO_BATCH_TOKENS) -> list[int]:
    """The default, then every power of two below it down to `floor` (largest first)."""
    out = [default]
    power = 1 << ((default - 1).bit_length() - 1) if default > 1 else 0
    while power >= floor:
        out.append(power)
        power //= 2
    return out


def _trial(inp: PlanInput, tokens: int, checkpointing: bool) -> Trial:
    plan = make_plan(dataclasses.replace(inp, micro_batch_tokens=tokens, gradient_checkpointing=checkpointing))
    return Trial(tokens, checkpointing, round(plan.gpu.total / GIB, 2), plan.fits is True)


def search(inp: PlanInput, rules: Rules) -> list[Trial]:
    """Trials in order until the first that fits (the last one then fits).

    1. whole documents (micro-batch >= model_max_length): the given checkpointing setting, then
       checkpointing on (unless the user fixed it or it is on already);
    2. unless documents must stay whole: below model_max_length, with the last setting of step 1, down
       to MIN_MICRO_BATCH_TOKENS.
    """
    sizes = candidates(inp.micro_batch_tokens)
    settings = [inp.gradient_checkpointing]
    if not inp.gradient_checkpointing and not rules.checkpointing_fixed:
        settings.append(True)
    whole = rules.model_max_length
    order = [(t, c) for c in settings for t in sizes if t >= whole]
    if rules.cut_documents:
        order += [(t, settings[-1]) for t in sizes if t < whole]
    trials = []
    for tokens, checkpointing in order:
        trials.append(_trial(inp, tokens, checkpointing))
        if trials[-1].fits:
            break
    return trials


def _alternatives(inp: PlanInput, last: Trial, rules: Rules) -> list[tuple[Suggestion, int]]:
    """Nothing fits: the planner's suggestions at the smallest micro-batch tried, each re-searched so it
    names the micro-batch the launcher would then choose (a smaller micro-batch is no longer a way out,
    except below a model_max_length the user set: then cutting documents is named first)."""
    found = []
    if not rules.cut_documents:
        cut = search(inp, dataclasses.replace(rules, cut_documents=True))[-1]
        if cut.fits:
            change: dict[str, Any] = {"micro_batch_tokens": cut.tokens}
            if cut.checkpointing != inp.gradient_checkpointing:
                change["gradient_checkpointing"] = cut.checkpointing
            found.append((Suggestion(change, cut.total_gib, f"micro_batch_tokens={cut.tokens} (documents cut to it)"),
                          cut.tokens))
    smallest = dataclasses.replace(inp, micro_batch_tokens=last.tokens, gradient_checkpointing=last.checkpointing)
    for suggestion in suggestions_for(smallest):
        if {"micro_batch_tokens", "gradient_checkpointing"} & suggestion.change.keys():
            continue
        trials = search(dataclasses.replace(inp, **suggestion.change), rules)
        if trials[-1].fits:
            found.append((Suggestion(suggestion.change, trials[-1].total_gib, suggestion.text), trials[-1].tokens))
    return found


def fit_micro_batch(inp: PlanInput, model_max_length: int, user_set: Callable[[str], bool]) -> MicroBatchChoice | None:
    """Choose the micro-batch for the planner input `inp` (see the module docstring); `user_set(key)`
    says whether the user fixed a dotted key. None when the user fixed the micro-batch or the memory is
    unknown (no gpu_type / mem), so there is nothing to choose against. The caller applies the choice."""
    if any(user_set(key) for key in MICRO_BATCH_KEYS):
        return None
    plan = make_plan(inp)
    if plan.fits is None or plan.gpu_usable_bytes is None:
        return None
    rules = Rules(user_set(CHECKPOINTING_KEY), model_max_length, cut_documents=not user_set(MAX_LENGTH_KEY))
    trials = search(inp, rules)
    choice = MicroBatchChoice(inp.micro_batch_tokens, inp.gradient_checkpointing, "none",
                              plan.gpu_usable_bytes / GIB, rules, trials)
    if not trials[-1].fits:
        choice.alternatives = _alternatives(inp, trials[-1], rules)
        return choice
    chosen = trials[-1]
    choice.tokens, choice.checkpointing = chosen.tokens, chosen.checkpointing
    choice.source = "default" if len(trials) == 1 else "auto"
    if chosen.tokens < model_max_length:
        choice.whole_with = context_parallel_for(dataclasses.replace(inp, gradient_checkpointing=chosen.checkpointing),
                                                 model_max_length)
    return choice


def context_parallel_for(inp: PlanInput, tokens: int) -> int | None:
    """The fewest GPUs of a node (1, 2, 4, ...: parallel.context, its all-to-alls on the node's links) to
    split a micro-batch of `tokens` over so that it fits; None when even a whole node's do not."""
    n = inp.context_parallel
    while n <= inp.gpus_per_node:
        split = dataclasses.replace(inp, micro_batch_tokens=tokens, context_parallel=n)
        if split.context_blocker is None and make_plan(split).fits is not False:
            return n
        n *= 2
    return None
