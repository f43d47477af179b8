"""Does the data fill one optimizer step on the ranks asked for? Checked by the plan, before the queue.

One optimizer step takes `gradient_accumulation_steps` micro-batches on each data-parallel rank (the
ranks of one context-parallel group share theirs). Data that packs into fewer micro-batches than that
fails at the training's start, after the queue; so where every training row was counted with the
model's tokenizer (launcher/resolve/plan_sources.py: sources of up to SAMPLE_ROWS rows, exactly the data
small enough for this to happen), the plan packs one epoch as the training does (eval rows held out,
the mixture's draw for epoch 0, contract/packing.py's bins) and refuses in one line when the
micro-batches fall short. A run of only a few steps is a warning.
"""

from __future__ import annotations

from contract.overlap import eval_indices
from contract.packing import pack_bins
from contract.schema import ConfigError
from contract.sources import Mixture, epoch_examples
from launcher.plan.planner import Plan
from launcher.resolve.options import Launch
from launcher.resolve.plan_sources import counted_rows

FEW_STEPS = 10  # fewer optimizer steps than this: warmup and schedule barely start


def epoch_micro_batches(launch: Launch, budget: int) -> int | None:
    """Micro-batches one epoch packs into, when every training row was counted (None: not known exactly)."""
    t, sizes, takes, lengths = launch.train.train, [], [], []
    for source in launch.train.data.source_list():
        counted = counted_rows(launch, source)
        if counted is None or not counted.complete or source.eval_split == source.split:
            return None
        kept = [min(n, t.model_max_length) for n in counted.lengths]
        if source.eval_fraction and not source.eval_path:
            hashes = _good_hashes(launch, source.label)
            kept = [kept[i] for i in eval_indices(len(kept), source.eval_fraction, t.seed,
                                                  hashes if hashes and len(hashes) == len(kept) else None)[0]]
        sizes.append(len(kept))
        takes.append(epoch_examples(source, len(kept)))
        lengths += kept
    mixture = Mixture(tuple(sizes), tuple(takes))
    chosen = range(len(lengths)) if mixture.is_plain else mixture.select(t.seed, 0)
    return len(pack_bins([lengths[i] for i in chosen], budget)) if lengths else 0


def _good_hashes(launch: Launch, name: str) -> list[bytes]:
    """The row hashes of a source's good training rows (contract/datacheck.py), as eval_fraction splits them."""
    check = next((c for c in launch.data_checks if c.name == name and not c.eval), None)
    return [h for h in check.row_hashes() if any(h)] if check else []


def check_fills_one_step(launch: Launch, plan: Plan) -> list[str]:
    """Refuse (ConfigError) data that cannot fill one optimizer step; the warnings for a run of few steps."""
    inp = plan.input
    ranks = inp.world_size // inp.context_parallel
    needed = ranks * inp.gradient_accumulation_steps
    packed = epoch_micro_batches(launch, inp.micro_batch_tokens)
    if packed is not None and packed < needed:
        raise ConfigError(f"data: one epoch packs into {packed:,} micro-batch{'es' if packed != 1 else ''} of "
                          f"{inp.micro_batch_tokens:,} tokens, fewer than one optimizer step needs ({ranks} "
                          f"data-parallel rank{'s' if ranks != 1 else ''} x {inp.gradient_accumulation_steps} "
                          f"accumulation = {needed}); add data, or lower --nodes, gradient_accumulation_steps or "
                          "data.tokens_per_micro_batch", "data")
    steps = plan.time.steps
    if steps is not None and steps < FEW_STEPS and launch.train.train.max_steps <= 0:
        return [f"the run is only {steps} optimizer step{'s' if steps != 1 else ''} ({needed} micro-batches each"
                f"{f', the data packs into {packed:,} per epoch' if packed is not None else ''}): warmup and the "
                "learning-rate schedule barely start; add data or epochs, or use fewer ranks"]
    return []
