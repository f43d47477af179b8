"""`train.model_max_length = "auto"` (`--model_max_length auto`): the longest document of the data.

Resolved on the login node while the launch is resolved (launcher/resolve/options.py), before anything
reads the length: the micro-batch fit (launcher/plan/autofit.py), the plan, the run directory's hash,
train.toml (an int; train never sees "auto": contract/config.py's load_train_config refuses it) and
run.json ("model_max_length_auto"). The longest document is the plan's own estimate of the data
(launcher/resolve/plan_input.py's data_estimate: counted with the model's tokenizer on each source's
first rows where its tokenizer.json is here, else characters / 3.5 of a sample), rounded up to a power
of two, the sizes the micro-batch search tries. Never below the length the launch would have without
"auto" (the model preset's, else TrainSection's default): a short dataset keeps today's plan. Never
above AUTO_MAX_LENGTH: longer documents are still cut to it, and the plan's long-documents line says
how many. Past the model's context, train/engine/model.py stretches RoPE (the plan's RoPE line). Where the
data raised the length past the default, the micro-batch fit keeps documents whole (as for a length the
user set); at the default, the launch is planned as without "auto".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.config import AUTO_LENGTH, TrainSection
from launcher.plan.datasize import holding_length
from launcher.resolve.plan_input import LaunchView, data_estimate

# 128k tokens: the longest single sequence measured to train (8B LoRA on one H200, 87 GiB, issue #54);
# past it a run needs context parallelism over several GPUs and a model_max_length the user chose.
AUTO_MAX_LENGTH = 131_072


@dataclass(frozen=True)
class AutoLength:
    """What "auto" resolved to, and from what."""

    tokens: int  # the model_max_length the run uses
    longest: int  # tokens of the longest document found; 0 = the data's lengths are unknown here
    floor: int  # the length without "auto"
    lengths: str = ""  # how the longest was had (DataEstimate.lengths)

    @property
    def raised(self) -> bool:
        """The data's longest document took the length past the default: the micro-batch fit then keeps
        documents whole, as for a length the user chose; at the default it fits the micro-batch as without auto."""
        return self.tokens > self.floor

    def describe(self) -> str:
        if not self.longest:
            return f"model_max_length auto: {self.tokens}, the default (the data's document lengths are unknown here)"
        why = "" if self.tokens > self.floor else f"; never below the default {self.floor}"
        if self.longest > self.tokens:
            why = f"; at most {AUTO_MAX_LENGTH}: longer documents are cut to it"
        how = f" ({self.lengths})" if self.lengths else ""
        return f"model_max_length auto: {self.tokens}, the longest document ~{self.longest:,} tokens{how}{why}"

    def record(self) -> dict[str, Any]:
        return {"model_max_length": self.tokens, "longest": self.longest, "floor": self.floor, "lengths": self.lengths}


def default_length(preset_defaults: dict[str, Any]) -> int:
    """The model_max_length a launch has without "auto": the model preset's, else TrainSection's."""
    fallback = TrainSection().model_max_length
    default = preset_defaults.get("model_max_length", fallback)
    return default if isinstance(default, int) else fallback


def resolve_auto_length(launch: LaunchView) -> AutoLength | None:
    """Replace model_max_length "auto" in the launch's config by the length that holds its longest document
    (None, and nothing changed, when the length is a number)."""
    t = launch.train.train
    if t.model_max_length != AUTO_LENGTH:
        return None
    floor = default_length(launch.preset.train_defaults)
    t.model_max_length = floor  # a number to estimate with; the longest document is measured uncut anyway
    data = data_estimate(launch)
    longest = data.longest if data else 0
    t.model_max_length = min(AUTO_MAX_LENGTH, max(floor, holding_length(longest)))
    return AutoLength(t.model_max_length, longest, floor, data.lengths if data else "")
