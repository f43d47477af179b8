"""The plan's checks on the data as a whole, before anything is written or queued (called by
launcher/resolve/preflight.py and launcher/commands/plan_cmd.py).

Eval rows (`check_eval_overlap`): no eval row of any source is a training row of any source
(contract/overlap.py). It runs on the login-node check's row hashes (contract/datacheck.py keeps one per
row, cached with its verdict), so it reads nothing again unless it finds an overlap, and then only to name
a row of each side. `eval_fraction` holds out the rows `eval_indices` picks, as the training does.

Rendering (`check_renders`): every good chat row of every source through the model's own chat template
(launcher/plan/tokencount.py: the tokenizer folder's template through Jinja, torch-free), from a local
tokenizer folder or a cached hub snapshot alike; contract/rendercheck.py says whether the rendering holds
every turn's text and every tool call. A row the template refuses (roles that do not alternate, parallel
calls it does not support) or trims (an assistant's text beside its tool_calls) is refused by its
location, or with `data.skip_unrenderable = true` counted and listed on the plan's `Checked` line; the
training skips exactly those (train/dataset/chat.py applies the same rule) and refuses any other it
cannot mask.

One optimizer step (`check_fills_one_step`): a step takes `gradient_accumulation_steps` micro-batches on
each data-parallel rank (a context-parallel group shares its). Data that packs into fewer fails at the
training's start, after the queue; so where every training row was counted with the model's tokenizer
(launcher/resolve/plan_sources.py: sources of up to SAMPLE_ROWS rows, exactly the data small enough for
this to happen), the plan packs one epoch as the training does (eval rows held out, the mixture's draw for
epoch 0, contract/packing.py's bins) and refuses in one line when the micro-batches fall short. A run of
only a few steps is a warning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from itertools import islice
from pathlib import Path

from contract import protocol
from contract.config import TrainConfig
from contract.datacheck import DataCheck, LocalData, cache_file, check_rows
from contract.formats import CHAT_FORMATS
from contract.overlap import Overlap, Part, eval_indices, find_overlap, refuse_overlap
from contract.packing import pack_bins
from contract.readers import DEFAULT_SPLIT
from contract.schema import ConfigError
from contract.sources import DataSource, Mixture, epoch_examples
from launcher.plan.planner import Plan
from launcher.plan.tokencount import CountingTokenizer, RenderCheck, check_rendering
from launcher.resolve.options import Launch
from launcher.resolve.plan_sources import counted_rows, tokenizer_dir

FEW_STEPS = 10  # fewer optimizer steps than this: warmup and schedule barely start
SKIP_KEY = "data.skip_unrenderable"


def check_eval_overlap(train: TrainConfig, checks: list[DataCheck], hf_home: str) -> Overlap | None:
    """Refuse (ConfigError) eval rows that are training rows, unless data.allow_eval_overlap; the overlap
    found (None: none)."""
    sources = {source.label: source for source in train.data.source_list()}
    trains, evals = [], []
    for check in checks:
        source, hashes = sources[check.name], check.row_hashes()
        if check.eval:
            evals.append(Part(check.name, hashes))
        elif source.eval_fraction:
            good = [i for i, h in enumerate(hashes) if h != bytes(len(h))]
            kept, held = eval_indices(len(good), source.eval_fraction, train.train.seed, [hashes[i] for i in good])
            trains.append(Part(check.name, hashes, [good[i] for i in kept]))
            evals.append(Part(check.name, hashes, [good[i] for i in held]))
        else:
            trains.append(Part(check.name, hashes))
    overlap = find_overlap(trains, evals)
    if overlap is None or train.data.allow_eval_overlap:
        return overlap
    by_side = {(check.name, check.eval): check for check in checks}

    def where(at: tuple[str, int], is_eval: bool) -> str:
        source = sources[at[0]]
        check = by_side.get((at[0], is_eval and not source.eval_fraction))
        return _location(source, check, at[1], hf_home) if check else f"#{at[1] + 1}"

    raise refuse_overlap(overlap, where(overlap.eval_at, True), where(overlap.train_at, False))


def _location(source: DataSource, check: DataCheck, ordinal: int, hf_home: str) -> str:
    """Where the row `ordinal` (0-based, every row counted) of a checked side is: file:line or id[row N]."""
    row = next(islice(check_rows(check, source, hf_home), ordinal, None), None)
    return row.location if row is not None else f"#{ordinal + 1}"


def describe(overlap: Overlap | None) -> str:
    """The plan's line on an overlap allowed knowingly ("" for none)."""
    if overlap is None:
        return ""
    return (f"{overlap.rows:,} of {overlap.of:,} eval rows are also training rows (allowed: "
            f"data.allow_eval_overlap = true); first: source {overlap.eval_at[0]!r} in source {overlap.train_at[0]!r}")


def check_renders(launch: Launch) -> None:
    """Render every chat row (see the module doc); a ConfigError for the first row that does not render
    exactly unless data.skip_unrenderable; the counts are kept on the data checks."""
    checks = [check for check in launch.data_checks if check.format in CHAT_FORMATS]
    directory = tokenizer_dir(launch.train, launch.profile.hf_home) if checks else None
    if directory is None:
        return  # no chat data, or no tokenizer.json here: check_model's mask check is all there is
    model = launch.train.model
    key = "model.tokenizer" if model.tokenizer else "model.path"
    try:
        tokenizer = CountingTokenizer(directory)
    except Exception:  # tokenizers raises its own kinds: check_model loads it again and names the problem
        return
    if not tokenizer.template:
        raise ConfigError(f"{key}: the tokenizer in {directory} has no chat template, but the data is chat (use "
                          "an instruct model's tokenizer via model.tokenizer, or data.format = \"text\")", key)
    data, sources = launch.train.data, {source.label: source for source in launch.train.data.source_list()}
    for check in checks:
        source = sources[check.name]
        result = _rendered(check, source, tokenizer, launch.profile.hf_home)
        check.unrenderable, check.unrenderable_rows = result.unrenderable, result.problems
        if result.unrenderable and not data.skip_unrenderable:
            raise ConfigError(f"{result.problems[0]} ({result.unrenderable:,} of {result.rows:,} rows of source "
                              f"{check.name!r} cannot be rendered exactly by {directory}'s chat template, so the "
                              f"training would skip or change them; mend them, use another template "
                              f"(model.tokenizer), or set {SKIP_KEY} = true to skip them, counted in the plan)",
                              SKIP_KEY)


def _rendered(check: DataCheck, source: DataSource, tokenizer: CountingTokenizer, hf_home: str) -> RenderCheck:
    """`check_rendering` of a checked side, cached beside large local data (keyed by the content's SHA-256,
    the template, the special tokens and the mapping) so a second plan does not render it again."""
    cache = None
    if check.sha256 and Path(check.path).exists():
        split = (source.eval_split or DEFAULT_SPLIT) if check.eval else source.split
        cache = cache_file(LocalData(Path(check.path), split, beside=bool(check.eval and source.eval_split)),
                           kind="renders")
    parts = [check.sha256, tokenizer.template, tokenizer.specials, check.format, source.text_field,
             asdict(source.mapping)]
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    try:
        stored = json.loads(cache.read_text(encoding="utf-8")) if cache is not None else {}
        if stored.get("key") == key:
            return RenderCheck(**stored["check"])
    except (OSError, ValueError, TypeError, KeyError):
        pass  # absent or unreadable: render again
    rows = check_rows(check, source, hf_home)
    result = check_rendering(rows, check.format, source.text_field, source.mapping, tokenizer)
    if cache is not None:
        protocol.write_json_atomically(cache, {"key": key, "check": asdict(result)})
    return result


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
