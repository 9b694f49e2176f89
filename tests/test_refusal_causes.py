"""Refusal messages name the real cause: `data.tokenizer` given every kind of wrong thing.

A path that exists is never said not to exist (a folder without tokenizer.json was refused with "does not
exist"); a folder says what it holds, and a Hugging Face tokenizer's other files (tokenizer_config.json,
vocab.json, merges.txt) get the way to write the tokenizer.json the `tokenizers` library reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.config import config_with
from runner.sweep.validate import config_problems


def missing(folder: Path) -> Path:
    return folder / "nothing_here"


def empty_folder(folder: Path) -> Path:
    (folder / "empty").mkdir()
    return folder / "empty"


def slow_tokenizer_folder(folder: Path) -> Path:
    target = folder / "hf_tokenizer"
    target.mkdir()
    for name in ("tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json"):
        (target / name).write_text("{}")
    return target


def folder_of_other_files(folder: Path) -> Path:
    target = folder / "notes"
    target.mkdir()
    (target / "notes.txt").write_text("some notes")
    return target


def folder_named_tokenizer_json(folder: Path) -> Path:
    (folder / "tokenizer.json").mkdir()
    return folder / "tokenizer.json"


def a_model_config(folder: Path) -> Path:
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return folder / "config.json"


def a_binary_file(folder: Path) -> Path:
    (folder / "tok.bin").write_bytes(bytes(range(256)))
    return folder / "tok.bin"


# (what was given, the words that name its cause)
KINDS = [
    (missing, ["does not exist"]),
    (empty_folder, ["is a folder without tokenizer.json (it is empty)"]),
    (slow_tokenizer_folder, ["holds merges.txt, special_tokens_map.json, tokenizer_config.json", "save_pretrained"]),
    (folder_of_other_files, ["is a folder without tokenizer.json (it holds notes.txt)"]),
    (folder_named_tokenizer_json, ["is a folder, not a file"]),
    (a_model_config, ["is not a tokenizer.json the `tokenizers` library reads"]),
    (a_binary_file, ["is not a tokenizer.json the `tokenizers` library reads"]),
]


@pytest.mark.parametrize("given, says", KINDS, ids=[given.__name__ for given, _ in KINDS])
def test_a_wrong_tokenizer_is_refused_for_what_it_is(tmp_path, given, says):
    path = given(tmp_path)
    problems = config_problems(config_with({"data.tokenizer": str(path)}))
    said = " | ".join(message for field, message in problems if field == "data.tokenizer")
    assert said, problems
    for words in says:
        assert words in said, said
    assert ("does not exist" in said) == (not path.exists()), said
