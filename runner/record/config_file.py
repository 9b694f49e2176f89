"""A job's config.yaml as the analysis reads it, and the JSON copy that makes reading a sweep fast.

config.yaml is the record: the ranks load it, people read it. Parsing YAML is
what reading a large sweep's configs costs (about half a millisecond a file
with PyYAML's C loader, all of it holding the GIL), so the job also writes
config.json beside it: config.yaml's text and the config parsed from it, once.
A reader uses the parsed config only while the text in the copy is still
config.yaml's text; a config.yaml edited later, or one without a copy, is
parsed itself. A config that JSON would not give back unchanged (a NaN, a
date, a key that is not a string) gets no copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

COPY_NAME = "config.json"
# The C loader when PyYAML has it: OmegaConf.load is ~10x slower per file.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_config(text: str) -> object:
    """What config.yaml's `text` holds (raises yaml.YAMLError when it is not YAML)."""
    return yaml.load(text, Loader=LOADER)


def write_config(path: Path, text: str) -> None:
    """A job's config.yaml at `path` holding `text` (`runner.config.run_config_yaml`), and its JSON copy."""
    path.write_text(text)
    write_config_copy(path)


def write_config_copy(path: Path) -> Path | None:
    """Write config.json beside `path` (a config.yaml); returns it, or None when the config has no faithful JSON form."""
    text = path.read_text()
    try:
        config = parse_config(text)
        copy_text = json.dumps({"yaml": text, "config": config})
    except (yaml.YAMLError, TypeError, ValueError):
        return None
    if json.loads(copy_text)["config"] != config:  # NaN, or keys JSON turns into strings
        return None
    copy = path.with_name(COPY_NAME)
    tmp = copy.with_suffix(".json.tmp")
    tmp.write_text(copy_text)
    tmp.replace(copy)
    return copy


def _copied_config(copy: Path, text: str) -> tuple[bool, object]:
    """(True, the config) when `copy` was made from config.yaml's `text`; (False, None) otherwise."""
    try:
        record = json.loads(copy.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False, None
    if isinstance(record, dict) and record.get("yaml") == text and "config" in record:
        return True, record["config"]
    return False, None


def read_config(path: Path) -> object:
    """What config.yaml at `path` holds: from its JSON copy while that matches the file, else parsed.

    Raises what reading and parsing config.yaml raise (UnicodeDecodeError, yaml.YAMLError).
    """
    text = path.read_text()
    copied, config = _copied_config(path.with_name(COPY_NAME), text)
    return config if copied else parse_config(text)
