"""A fake HF_HOME whose datasets cache holds a tiny hub dataset, laid out exactly as `datasets` leaves
one that `load_dataset("ORG/NAME")` prepared online, so that the offline lookup finds it.

How `datasets` (read in 5.2's load.py / packaged_modules/cache; the same since 2.16) finds it with
HF_HUB_OFFLINE: `dataset_module_factory` cannot reach the hub, falls back to
`CachedDatasetModuleFactory`, which globs <cache>/ORG___NAME/<config>/<version>/<hash>/ and hands
the `cache` builder that folder; the builder reads `dataset_info.json` and `NAME-<split>.arrow`.
We prepare that folder with the JSON builder (no network), give it the hub's config id "default",
and rename the Arrow files to the name the hub builder would have used. A few KiB, built per test.
"""

from __future__ import annotations

import json
from pathlib import Path


def build_hub_cache(hf_home: Path, repo_id: str, splits: dict[str, list[dict]], config: str = "default") -> Path:
    """Write `splits` (split -> rows) as hub dataset `repo_id` into hf_home's datasets cache; returns hf_home."""
    from datasets.packaged_modules.json.json import Json

    namespace, name = repo_id.split("/")
    source = hf_home.parent / f"{name}-source"
    source.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, rows in splits.items():
        files[split] = str(source / f"{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    folder_name = f"{namespace}___{name}"
    builder = Json(cache_dir=str(hf_home / "datasets"), dataset_name=folder_name, config_name=config,
                   config_id=config, data_files=files, hash="0123456789abcdef")
    builder.download_and_prepare()
    prepared = Path(builder.cache_dir)
    for arrow in prepared.glob("*.arrow"):
        arrow.rename(prepared / arrow.name.replace(folder_name, name))
    for lock in (hf_home / "datasets").rglob("*.lock"):
        lock.unlink()
    return hf_home
