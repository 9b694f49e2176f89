"""The training text as documents, without torch: read by the ranks and checked by the launcher.

The launcher (a process that never imports torch) checks before any rank
starts that the data can be read and holds at least one sequence; the ranks
then tokenize the same documents (`runner.data.batches`).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
MIN_DOCUMENT_BYTES = 2  # one input token and its target
PACKING_SEPARATOR = b"\n\n"  # between documents when data.packing=true


class CorpusError(ValueError):
    """The data cannot be trained on; the message names the field to change."""


def embedded_corpus_text() -> list[str]:
    """Python's own help topics: real English text shipped with the standard library."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def paragraphs(text: str) -> list[str]:
    return [part.strip() for part in _PARAGRAPH_BREAK.split(text) if part.strip()]


def read_text(file: Path, given: str | Path) -> str:
    """A file's text, refused unless it is UTF-8 without NUL bytes (a binary file named .txt, say):
    the message names the file and the first offending byte's offset."""
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorpusError(
            f"data.path={given}: {file} is not UTF-8 text (byte {error.start}: {raw[error.start : error.start + 1]!r}); "
            "give text files, or convert this one to UTF-8"
        ) from None
    nul = raw.find(b"\0")
    if nul >= 0:
        raise CorpusError(f"data.path={given}: {file} holds a NUL byte at byte {nul}: it is not text")
    return text


def _jsonl_texts(path: Path, text_field: str) -> list[str]:
    documents = []
    for line_number, line in enumerate(read_text(path, path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorpusError(
                f"data.path={path} line {line_number} is not JSON ({error.msg}); each line must be one record"
            ) from None
        if not isinstance(record, dict) or text_field not in record:
            keys = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise CorpusError(
                f"data.path={path} line {line_number} has no field {text_field!r} (data.text_field); "
                f"it has: {keys or 'nothing'}; set data.text_field to the field that holds the text"
            )
        if not isinstance(record[text_field], str):
            raise CorpusError(
                f"data.path={path} line {line_number}: field {text_field!r} is a {type(record[text_field]).__name__}, not text"
            )
        documents.append(record[text_field])
    return documents


def read_texts(path: Path, text_field: str) -> list[str]:
    """Documents of a user's data: paragraphs of .txt files, or records of a .jsonl file."""
    if path.is_dir():
        return [p for file in sorted(path.rglob("*.txt")) for p in paragraphs(read_text(file, path))]
    if path.suffix == ".jsonl":
        return _jsonl_texts(path, text_field)
    return paragraphs(read_text(path, path))


def document_bytes(path: str | None, text_field: str) -> list[bytes]:
    """Each trainable document's UTF-8 bytes (the embedded corpus when `path` is None); shorter ones are dropped."""
    texts = (
        [p for topic in embedded_corpus_text() for p in paragraphs(topic)]
        if path is None
        else read_texts(Path(path).expanduser(), text_field)
    )
    documents = [raw for raw in (text.encode() for text in texts) if len(raw) >= MIN_DOCUMENT_BYTES]
    if not documents:
        raise CorpusError(
            f"data.path={path} holds no document of at least {MIN_DOCUMENT_BYTES} bytes; give a file with text in it"
        )
    return documents


@functools.lru_cache(maxsize=32)
def _packed_bytes(path: str | None, text_field: str, _version: tuple) -> int:
    """The length of the stream data.packing=true cuts windows from (raises CorpusError)."""
    return sum(len(doc) + len(PACKING_SEPARATOR) for doc in document_bytes(path, text_field))


def _version(path: str | None) -> tuple:
    """What changes when the data does (a sweep checks each job's data, read once)."""
    if path is None:
        return ()
    root = Path(path).expanduser()
    files = sorted(root.rglob("*.txt")) if root.is_dir() else [root]
    stats = ((file, file.stat()) for file in files)
    return tuple((str(file), stat.st_mtime_ns, stat.st_size) for file, stat in stats)


def corpus_problem(path: str | None, text_field: str, *, seq_len: int, packing: bool) -> str | None:
    """Why this data cannot give one training sequence, or None."""
    try:
        packed_bytes = _packed_bytes(path, text_field, _version(path))
    except CorpusError as error:
        return str(error)
    # A packed window is seq_len inputs plus the last target; GlobalBatches needs one more byte of slack.
    if packing and packed_bytes < seq_len + 2:
        return (
            f"data.path={path} holds {packed_bytes} bytes, too few for one packed sequence of "
            f"train.seq_len={seq_len} (needs {seq_len + 2}); use train.seq_len<={packed_bytes - 2}, "
            f"more text, or data.packing=false"
        )
    return None
