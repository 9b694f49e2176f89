"""A run's identity: everything that changes its result, recorded in its summary.json (`identity`).

Two runs with the same identity give the same result; a rerun into a job's folder compares the identity of
what it would run with the one recorded there (`runner.sweep.rerun`), and the analysis can tell runs of one
group apart whose data differ. Its parts, each a sha256 or a version:

- `config`: config.yaml's text, the resolved config (every key, paths as given);
- `data`: the text the ranks read: data.path's files (a folder's .txt files, by path within it and content),
  or the embedded corpus (the standard library's pydoc_data/topics.py);
- `tokenizer`: data.tokenizer's tokenizer.json (null: byte-level tokens);
- `model.config`: model.config's config.json (null: no file, the config is model.overrides, in `config`);
- `custom.fn`: the source of the callable's module and the local modules it imports (null without custom);
- `versions`: torch, the runner's own package (its code runs every rule), transformers for a Hugging Face
  model, tokenizers for data.tokenizer, and every installed package the callable's module imports.

`digest` is a sha256 of them all. Reading a file's content is cached on its size and modification time, so
a sweep reads each data file once. Torch-free: the launcher computes it before any rank starts (the analysis
reads the record, summary.json's `identity`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import metadata, util
from pathlib import Path
from typing import Any

from runner.data.corpus import tokenizer_file
from runner.model.hf_config import config_file

PACKAGE = "loss-reduction-ablation"


@functools.lru_cache(maxsize=4096)
def _file_sha256(path: str, _size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    stat = path.stat()
    return _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)


def files_sha256(root: Path, files: list[Path]) -> str:
    """One sha256 over several files: each file's path within `root` and its content's sha256."""
    listing = {str(file.relative_to(root)) if file != root else file.name: file_sha256(file) for file in files}
    return hashlib.sha256(json.dumps(listing, sort_keys=True).encode()).hexdigest()


def data_sha256(path: str | None) -> str:
    """The data the ranks read (`runner.data.corpus.read_texts`): a file, every .txt file under a folder, or the
    embedded corpus."""
    if path is None:
        topics = Path(util.find_spec("pydoc_data.topics").origin)
        return files_sha256(topics, [topics])
    root = Path(path).expanduser()
    return files_sha256(root, sorted(root.rglob("*.txt")) if root.is_dir() else [root])


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run_identity(cfg: Any, config_yaml: str, custom_facts: dict | None = None) -> dict:
    """The identity of a valid config (`cfg`, its config.yaml text), with `runner.callables.callable_facts` of
    its custom.fn (reduction=custom)."""
    hf = cfg.model.arch.value == "hf"
    custom = cfg.reduction.value == "custom"
    parts = {
        "config": hashlib.sha256(config_yaml.encode()).hexdigest(),
        "data": data_sha256(cfg.data.path),
        "tokenizer": file_sha256(tokenizer_file(cfg.data.tokenizer)) if cfg.data.tokenizer else None,
        "model.config": file_sha256(config_file(cfg.model.config)) if hf and cfg.model.config else None,
        "custom.fn": (custom_facts or {}).get("source") if custom else None,
    }
    versions = {"torch": _version("torch"), PACKAGE: _version(PACKAGE)}
    if hf:
        versions["transformers"] = _version("transformers")
    if cfg.data.tokenizer:
        versions["tokenizers"] = _version("tokenizers")
    if custom:
        versions.update((custom_facts or {}).get("packages") or {})
    versions = dict(sorted(versions.items()))
    digest = hashlib.sha256(json.dumps({"parts": parts, "versions": versions}, sort_keys=True).encode()).hexdigest()
    identity = {"digest": digest, "parts": parts, "versions": versions}
    if custom:  # each file of custom.fn's part, which the ranks' own hashes are held to (`changed_sources`)
        identity["sources"] = (custom_facts or {}).get("sources") or {}
    return identity


def identity_changes(old: dict | None, new: dict) -> list[str]:
    """What differs between a recorded identity and a new one, one phrase each ("data (content)",
    "torch 2.12.0 -> 2.13.0"); the config's keys are named by `runner.sweep.rerun.differing_keys`."""
    if not isinstance(old, dict) or "digest" not in old:
        return ["the earlier run recorded no identity (an earlier version of the runner)"]
    changes = [
        f"{part} (content)"
        for part in new["parts"]
        if part != "config" and (old.get("parts") or {}).get(part) != new["parts"][part]
    ]
    old_versions = old.get("versions") or {}
    for package in sorted(old_versions.keys() | new["versions"].keys()):
        before, after = old_versions.get(package), new["versions"].get(package)
        if before != after:
            changes.append(f"{package} {before or 'not used'} -> {after or 'not used'}")
    return changes


def changed_sources(summary: dict) -> str | None:
    """What of custom.fn's code the ranks ran differs from what the launcher hashed into the identity before
    launch (a file edited in between), in one sentence; None: the same files, or no custom rule. Such a run's
    record would name code that did not run, so the job fails."""
    hashed = ((summary.get("identity") or {}).get("sources")) or {}
    ran = summary.get("custom_sources_ran") or {}
    differing = [name for name in sorted(hashed) if name in ran and ran[name] != hashed[name]]
    if not differing:
        return None
    return (
        f"custom.fn's code changed between the launcher's check and the ranks' import: {', '.join(differing)} "
        f"(sha256 {hashed[differing[0]][:12]} before launch, {ran[differing[0]][:12]} in the ranks); the ranks "
        "ran code that this run's identity does not name. Rerun it once the file is as you mean it"
    )
