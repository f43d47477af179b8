"""A default that fits and runs fastest: the micro-batch, checkpointing, activation offload and context
parallelism chosen for the user.

When the user fixes neither `data.tokens_per_micro_batch` nor `train.per_device_train_batch_size`, the launcher
plans every setting it may change: the default micro-batch (per_device_train_batch_size x model_max_length) and
the powers of two below it; activation checkpointing on and off; train.activation_offload on and off;
parallel.context 1, 2, 4, ... within a node (a micro-batch of model_max_length or more split over that many
GPUs). Of those that fit it keeps the one the speed model (launcher/plan/speed.py) predicts the most tokens/s
for, except that a setting which keeps whole `model_max_length` documents always ranks above one that cuts
them (a micro-batch below model_max_length, never when the user set model_max_length). Where the one kept
checkpoints every layer (no activation offload), the fewest checkpointed layers that still fit
(train.checkpoint_layers, a bisection: memory only grows as fewer layers recompute) make one more trial, faster
by the recompute it leaves out, where that is predicted to gain at least MIN_THINNING_GAIN. A value the user
fixed (flag or --set) is never changed; CPU offload of the optimizer stays a suggestion for when nothing fits.
Gradient accumulation is left as it is.

It takes the planner input (launcher/resolve/plan_input.py builds it from the launch) and a question, "did the
user set this key?", and returns the choice; launcher/resolve/options.py applies it to the launch.

The choice is written into train.toml (data.tokens_per_micro_batch, train.gradient_checkpointing,
train.checkpoint_layers, train.activation_offload, parallel.context, only when they change), run.json
("micro_batch", with every trial) and the plan ("Micro" line: the choice and the runner-up, each with its
predicted tokens/s). When nothing fits, the configuration stays as given and the plan's suggestions become the
settings under which a micro-batch would fit (more nodes, CPU offload, LoRA), each with the micro-batch the search
would then choose.
Pure Python (no torch): it only asks the planner.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from contract.config import ALL_LAYERS
from contract.shape import ModelShape
from launcher.plan.memory import GIB
from launcher.plan.plan_format import suggestion_flags
from launcher.plan.planner import PlanInput, Suggestion, make_plan, suggestions_for

MIN_MICRO_BATCH_TOKENS = 256  # below this a step is all communication; suggest more GPUs instead
# A trial thinned of checkpointed layers fills the card to the planner's limit: kept only where the speed model
# predicts at least this gain over checkpointing every layer (less is within what a plan's error can undo).
MIN_THINNING_GAIN = 0.03
MICRO_BATCH_KEYS = ("data.tokens_per_micro_batch", "train.per_device_train_batch_size")
CHECKPOINTING_KEY = "train.gradient_checkpointing"
LAYERS_KEY = "train.checkpoint_layers"
OFFLOAD_KEY = "train.activation_offload"
CONTEXT_KEY = "parallel.context"
MAX_LENGTH_KEY = "train.model_max_length"  # set by the user: documents are never cut below it


@dataclass(frozen=True)
class Rules:
    """What the search may change: checkpointing, activation offload and context parallelism unless the user set
    them; documents are cut (micro-batch below model_max_length) unless the user set model_max_length."""

    checkpointing_fixed: bool
    model_max_length: int
    cut_documents: bool = True
    offload_fixed: bool = True
    context_fixed: bool = True
    layers_fixed: bool = True  # train.checkpoint_layers


@dataclass
class Trial:
    tokens: int
    checkpointing: bool
    total_gib: float
    fits: bool
    activation_offload: bool = False
    context_parallel: int = 1
    tokens_per_s: float | None = None  # predicted, whole job (launcher/plan/speed.py)
    whole: bool = True  # holds a model_max_length document
    checkpoint_layers: int | str = ALL_LAYERS  # with checkpointing: how many layers recompute

    def setting(self) -> str:
        """The trial as the plan names it: "4096 tokens, checkpointing, activation offload, context parallel 2"."""
        parts = [f"{self.tokens} tokens", f"checkpointing{_layers(self)}" if self.checkpointing else "no checkpointing"]
        if self.activation_offload:
            parts.append("activation offload")
        if self.context_parallel > 1:
            parts.append(f"context parallel {self.context_parallel}")
        return ", ".join(parts)

    def rank(self) -> tuple[bool, float]:
        """Whole documents first, then the predicted speed."""
        return self.whole, self.tokens_per_s or 0.0


@dataclass
class MicroBatchChoice:
    """What the search decided, with the trials that explain it (search order)."""

    tokens: int  # the micro-batch the run uses
    checkpointing: bool
    source: Literal["default", "auto", "none"]  # the given setting is the fastest / another one is / nothing fits
    usable_gib: float
    rules: Rules
    trials: list[Trial] = field(default_factory=list)
    # only when nothing fits: (a way out, the micro-batch the search would then choose)
    alternatives: list[tuple[Suggestion, int]] = field(default_factory=list)
    # only when documents are cut: the fewest GPUs per sequence (parallel.context) that keep them whole
    whole_with: int | None = None
    activation_offload: bool = False
    context_parallel: int = 1
    checkpoint_layers: int | str = ALL_LAYERS

    @property
    def suggestions(self) -> list[Suggestion]:
        return [suggestion for suggestion, _ in self.alternatives]

    @property
    def chosen(self) -> Trial | None:
        return best([t for t in self.trials if t.fits])

    @property
    def runner_up(self) -> Trial | None:
        chosen = self.chosen
        return best([t for t in self.trials if t.fits and t is not chosen])

    def describe(self) -> str:
        """One line for the plan: what was chosen and why."""
        usable = f"{self.usable_gib:.1f} GiB"
        if self.source == "none":
            smallest = min(self.trials, key=lambda t: t.total_gib)
            ways = ", ".join(f"{tokens} with {suggestion_flags(s)}" for s, tokens in self.alternatives)
            whole = "" if self.rules.cut_documents else " (model_max_length is yours: documents are kept whole)"
            return (f"none fits: even {smallest.tokens} tokens{_ckpt(smallest)} needs {smallest.total_gib:.1f} "
                    f"GiB of {usable}{whole}" + (f"; would choose {ways}" if ways else ""))
        chosen = self.chosen
        assert chosen is not None
        extras = "".join([f", checkpointing{_layers(chosen)}" if _layers(chosen) else "",
                          ", activation offload" if chosen.activation_offload else "",
                          f", context parallel {chosen.context_parallel}" if chosen.context_parallel > 1 else ""])
        why = ("the default, per_device_train_batch_size x model_max_length, fits in" if self.source == "default"
               else "fastest that fits in")
        text = f"{self.tokens} tokens{extras} (auto: {why} {usable}: {chosen.total_gib:.1f} GiB{_rate(chosen)}"
        larger = _larger_miss(self.trials, chosen)
        text += f"; {larger.tokens} needs {larger.total_gib:.1f})" if larger else ")"
        runner = self.runner_up
        if runner is not None:
            text += f"; runner-up {runner.setting()}{_rate(runner)}"
        if chosen.checkpointing and not self.trials[0].checkpointing:
            text += "; activation checkpointing turned on"
        if self.tokens < self.rules.model_max_length and not chosen.whole:
            text += (f"; documents longer than {self.tokens} tokens are cut to it "
                     f"(model_max_length {self.rules.model_max_length})")
            if self.whole_with:
                text += (f"; whole with --context_parallel {self.whole_with} ({self.rules.model_max_length} "
                         f"tokens over {self.whole_with} GPUs)")
        return text

    def record(self) -> dict[str, Any]:
        """For run.json: the decision and the trials behind it."""
        chosen = self.chosen
        return {"tokens": self.tokens, "gradient_checkpointing": self.checkpointing,
                "checkpoint_layers": self.checkpoint_layers,
                "activation_offload": self.activation_offload, "context_parallel": self.context_parallel,
                "tokens_per_s": chosen.tokens_per_s if chosen else None, "source": self.source,
                "reason": self.describe(), "usable_gib": round(self.usable_gib, 2),
                "trials": [dataclasses.asdict(t) for t in self.trials]}


def _ckpt(trial: Trial) -> str:
    return " with checkpointing" if trial.checkpointing else " without checkpointing"


def _layers(trial: Trial) -> str:
    """" of N layers" where a checkpointing trial checkpoints only some."""
    return f" of {trial.checkpoint_layers} layers" if trial.checkpointing and trial.checkpoint_layers != ALL_LAYERS \
        else ""


def _rate(trial: Trial) -> str:
    return f", ~{trial.tokens_per_s:,.0f} tok/s" if trial.tokens_per_s else ""


def _larger_miss(trials: list[Trial], chosen: Trial) -> Trial | None:
    """The next larger micro-batch of the chosen setting that did not fit (what stopped the micro-batch there)."""
    misses = [t for t in trials if not t.fits and t.tokens > chosen.tokens and t.checkpointing == chosen.checkpointing
              and t.activation_offload == chosen.activation_offload and t.context_parallel == chosen.context_parallel]
    return min(misses, key=lambda t: t.tokens, default=None)


def best(trials: list[Trial]) -> Trial | None:
    """The highest-ranked trial (Trial.rank); the first of equals, so the search order breaks ties."""
    return max(trials, key=Trial.rank, default=None)


def candidates(default: int, floor: int = MIN_MICRO_BATCH_TOKENS) -> list[int]:
    """The default, then every power of two below it down to `floor` (largest first)."""
    out = [default]
    power = 1 << ((default - 1).bit_length() - 1) if default > 1 else 0
    while power >= floor:
        out.append(power)
        power //= 2
    return out


def _trial(inp: PlanInput, tokens: int, checkpointing: bool, offload: bool | None = None,
           context: int | None = None, whole: bool = True, layers: int | str | None = None) -> Trial:
    offload = inp.activation_offload if offload is None else offload
    context = inp.context_parallel if context is None else context
    layers = inp.checkpoint_layers if layers is None else layers
    plan = make_plan(dataclasses.replace(inp, micro_batch_tokens=tokens, gradient_checkpointing=checkpointing,
                                         activation_offload=offload, context_parallel=context,
                                         checkpoint_layers=layers))
    return Trial(tokens, checkpointing, round(plan.gpu.total / GIB, 2), plan.fits is True, offload, context,
                 plan.time.tokens_per_s, whole, layers)


def _refinable(trials: list[Trial]) -> list[Trial]:
    """The trials whose layers `fewest_checkpointed` thins: the fastest that fits and the fastest that fits
    checkpointing every layer without offload (offloaded, the other layers' activations would all cross PCIe),
    where the same micro-batch does not fit without checkpointing (which is faster still)."""
    fits = [t for t in trials if t.fits]
    unchecked = {(t.tokens, t.context_parallel) for t in fits if not t.checkpointing}
    candidates = [t for t in fits if t.checkpointing and not t.activation_offload
                  and t.checkpoint_layers == ALL_LAYERS and (t.tokens, t.context_parallel) not in unchecked]
    return list({id(t): t for t in (best(fits), best(candidates)) if t in candidates}.values())


def fewest_checkpointed(inp: PlanInput, chosen: Trial) -> Trial | None:
    """`chosen` (one of `_refinable`'s) with the fewest checkpointed layers that still fit (bisection: memory grows
    as fewer layers recompute); None when that gains less than MIN_THINNING_GAIN or when every layer must
    recompute."""
    low, high, found = 1, ModelShape.from_arch(inp.arch).layers - 1, None
    while low <= high:  # the smallest n in [1, layers - 1] that fits
        middle = (low + high) // 2
        trial = _trial(inp, chosen.tokens, True, False, chosen.context_parallel, chosen.whole, middle)
        if trial.fits:
            found, high = trial, middle - 1
        else:
            low = middle + 1
    worth = found and (found.tokens_per_s or 0) >= (1 + MIN_THINNING_GAIN) * (chosen.tokens_per_s or math.inf)
    return found if worth else None


def _options(given: Any, fixed: bool, choices: list[Any]) -> list[Any]:
    """The given value first, then the others the search may try (none when the user fixed it)."""
    return [given] + ([] if fixed else [c for c in choices if c != given])


def _contexts(inp: PlanInput, rules: Rules) -> list[int]:
    """parallel.context values to try: within a node (all-to-alls on its links), where the heads and ranks split,
    under FSDP2 or DDP (launcher/resolve/options.py's check_context_parallel)."""
    spec = inp.spec
    splits = spec.engine != "deepspeed" and spec.fsdp_version != 1
    choices, n = [], 2
    while splits and n <= inp.gpus_per_node:
        if dataclasses.replace(inp, context_parallel=n).context_blocker is None:
            choices.append(n)
        n *= 2
    return _options(inp.context_parallel, rules.context_fixed, [1, *choices])


def search(inp: PlanInput, rules: Rules) -> list[Trial]:
    """Every setting the rules allow, planned (module docstring): whole documents (micro-batch >=
    model_max_length) with each checkpointing / activation offload / context-parallel choice; then, unless
    documents must stay whole, the micro-batches below model_max_length."""
    contexts = _contexts(inp, rules)
    trials = [_trial(inp, t, c, o, n) for c, o in _pairs(inp, rules) for n in contexts
              for t in candidates(inp.micro_batch_tokens)
              if t >= rules.model_max_length and t // n >= MIN_MICRO_BATCH_TOKENS]
    return trials + (_cut_trials(inp, rules) if rules.cut_documents else [])


def _pairs(inp: PlanInput, rules: Rules) -> list[tuple[bool, bool]]:
    """(checkpointing, activation offload) settings the rules allow, the given ones first."""
    settings = _options(inp.gradient_checkpointing, rules.checkpointing_fixed, [True, False])
    offloads = _options(inp.activation_offload, rules.offload_fixed, [False, True])
    # Offload is tried with checkpointing only, where it moves the layer inputs (hidden x 2 bytes a token a layer);
    # without, every saved activation would go to the host: tens of GiB of pinned RAM per GPU at 70B sizes.
    return [(c, o) for c in settings for o in offloads if c or o == inp.activation_offload]


def _cut_trials(inp: PlanInput, rules: Rules) -> list[Trial]:
    """The micro-batches below model_max_length (documents cut to them), with each of `_pairs`."""
    return [_trial(inp, t, c, o, whole=False) for c, o in _pairs(inp, rules)
            for t in candidates(inp.micro_batch_tokens) if t < rules.model_max_length]


def _alternatives(inp: PlanInput, last: Trial, rules: Rules) -> list[tuple[Suggestion, int]]:
    """Nothing fits: the planner's suggestions at the smallest setting tried, each re-searched so it names the
    micro-batch the launcher would then choose (a smaller micro-batch is no longer a way out, except below a
    model_max_length the user set: then cutting documents is named first)."""
    found = []
    if not rules.cut_documents:
        # nothing fits, so none of the whole-document trials already planned does: only the cut ones can
        cut = best([t for t in _cut_trials(inp, rules) if t.fits])
        if cut is not None:
            change: dict[str, Any] = {"micro_batch_tokens": cut.tokens}
            if cut.checkpointing != inp.gradient_checkpointing:
                change["gradient_checkpointing"] = cut.checkpointing
            found.append((Suggestion(change, cut.total_gib, f"micro_batch_tokens={cut.tokens} (documents cut to it)"),
                          cut.tokens))
    smallest = dataclasses.replace(inp, micro_batch_tokens=last.tokens, gradient_checkpointing=last.checkpointing,
                                   activation_offload=last.activation_offload, context_parallel=last.context_parallel)
    for suggestion in suggestions_for(smallest):
        if {"micro_batch_tokens", "gradient_checkpointing", "context_parallel"} & suggestion.change.keys():
            continue
        chosen = best([t for t in search(dataclasses.replace(inp, **suggestion.change), rules) if t.fits])
        if chosen is not None:
            found.append((Suggestion(suggestion.change, chosen.total_gib, suggestion.text), chosen.tokens))
    return found


def fit_micro_batch(inp: PlanInput, model_max_length: int, user_set: Callable[[str], bool]) -> MicroBatchChoice | None:
    """Choose the setting for the planner input `inp` (see the module docstring); `user_set(key)` says whether
    the user fixed a dotted key. None when the user fixed the micro-batch or the memory is unknown (no
    gpu_type / mem), so there is nothing to choose against. The caller applies the choice."""
    if any(user_set(key) for key in MICRO_BATCH_KEYS):
        return None
    plan = make_plan(inp)
    if plan.fits is None or plan.gpu_usable_bytes is None:
        return None
    # train.checkpoint_layers set by the user: checkpointing stays as it is too (on, unless they turned it off)
    rules = Rules(user_set(CHECKPOINTING_KEY) or user_set(LAYERS_KEY), model_max_length,
                  cut_documents=not user_set(MAX_LENGTH_KEY),
                  offload_fixed=user_set(OFFLOAD_KEY), context_fixed=user_set(CONTEXT_KEY),
                  layers_fixed=user_set(LAYERS_KEY))
    trials = search(inp, rules)
    if not rules.layers_fixed:
        trials += [trial for trial in map(partial(fewest_checkpointed, inp), _refinable(trials)) if trial is not None]
    choice = MicroBatchChoice(inp.micro_batch_tokens, inp.gradient_checkpointing, "none",
                              plan.gpu_usable_bytes / GIB, rules, trials, activation_offload=inp.activation_offload,
                              context_parallel=inp.context_parallel)
    chosen = choice.chosen
    if chosen is None:
        choice.alternatives = _alternatives(inp, min(trials, key=lambda t: t.total_gib), rules)
        return choice
    choice.tokens, choice.checkpointing = chosen.tokens, chosen.checkpointing
    choice.checkpoint_layers = chosen.checkpoint_layers
    choice.activation_offload, choice.context_parallel = chosen.activation_offload, chosen.context_parallel
    choice.source = "default" if chosen is trials[0] else "auto"
    if not chosen.whole:
        choice.whole_with = context_parallel_for(
            dataclasses.replace(inp, gradient_checkpointing=chosen.checkpointing,
                                activation_offload=chosen.activation_offload), model_max_length)
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
