"""Every chat row of every source through the model's own chat template, before the queue.

The login-node data check (contract/datacheck.py) parses every row; this renders every good chat row with
the template the training will use (launcher/plan/tokencount.py: the tokenizer folder's template through
Jinja, torch-free), from a local tokenizer folder or a cached hub snapshot alike, and asks
contract/rendercheck.py whether the rendering holds every turn's text and every tool call. A row the
template refuses (roles that do not alternate, parallel calls it does not support) or trims (an
assistant's text beside its tool_calls) is refused here by its location, or with
`data.skip_unrenderable = true` counted and listed on the plan's `Checked` line; the training skips
exactly those (train/dataset/chat.py applies the same rule) and refuses any other it cannot mask.
"""

from __future__ import annotations

from contract.datacheck import check_rows
from contract.formats import CHAT_FORMATS
from contract.schema import ConfigError
from launcher.plan.tokencount import CountingTokenizer, check_rendering
from launcher.resolve.options import Launch
from launcher.resolve.plan_sources import tokenizer_dir

SKIP_KEY = "data.skip_unrenderable"


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
        rows = check_rows(check, source, launch.profile.hf_home)
        result = check_rendering(rows, check.format, source.text_field, source.mapping, tokenizer)
        check.unrenderable, check.unrenderable_rows = result.unrenderable, result.problems
        if result.unrenderable and not data.skip_unrenderable:
            raise ConfigError(f"{result.problems[0]} ({result.unrenderable:,} of {result.rows:,} rows of source "
                              f"{check.name!r} cannot be rendered exactly by {directory}'s chat template, so the "
                              f"training would skip or change them; mend them, use another template "
                              f"(model.tokenizer), or set {SKIP_KEY} = true to skip them, counted in the plan)",
                              SKIP_KEY)
