"""The training text as documents, without torch: read by the ranks and checked by the launcher.

The launcher (a process that never imports torch) checks before any rank
starts that the data can be read and holds at least one sequence; the ranks
then tokenize the same documents (`runner.data.batches`).

Tokens are a document's UTF-8 bytes (vocab 256), or with `data.tokenizer` the
ids a `tokenizers` tokenizer.json gives it (that library is Rust with Python
bindings: it never imports torch, so the launcher reads the same tokenizer to
check its vocab against the model's).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
MIN_DOCUMENT_BYTES = 2  # one input token and its target (bytes, or tokens under data.tokenizer)
PACKING_SEPARATOR = b"\n\n"  # between documents when data.packing=true (its tokens under data.tokenizer)


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


def has_fields(path: str | None) -> bool:
    """Whether the data holds records with fields (a .jsonl file): the only data `data.text_field` acts on."""
    return path is not None and Path(path).suffix == ".jsonl" and not Path(path).expanduser().is_dir()


def text_field_of(data) -> str:
    """`data.text_field` where the data has fields; elsewhere the field is not read (any name does)."""
    return data.text_field if has_fields(data.path) else "text"


def read_texts(path: Path, text_field: str) -> list[str]:
    """Documents of a user's data: paragraphs of .txt files, or records of a .jsonl file."""
    if path.is_dir():
        return [p for file in sorted(path.rglob("*.txt")) for p in paragraphs(read_text(file, path))]
    if path.suffix == ".jsonl":
        return _jsonl_texts(path, text_field)
    return paragraphs(read_text(path, path))


def document_texts(path: str | None, text_field: str) -> list[str]:
    """The documents' text: paragraphs of the embedded corpus when `path` is None, else of the user's data."""
    if path is None:
        return [p for topic in embedded_corpus_text() for p in paragraphs(topic)]
    return read_texts(Path(path).expanduser(), text_field)


def _no_documents(path: str | None, unit: str) -> CorpusError:
    return CorpusError(
        f"data.path={path} holds no document of at least {MIN_DOCUMENT_BYTES} {unit}; give a file with text in it"
    )


def document_bytes(path: str | None, text_field: str) -> list[bytes]:
    """Each trainable document's UTF-8 bytes (the embedded corpus when `path` is None); shorter ones are dropped."""
    documents = [
        raw for raw in (text.encode() for text in document_texts(path, text_field)) if len(raw) >= MIN_DOCUMENT_BYTES
    ]
    if not documents:
        raise _no_documents(path, "bytes")
    return documents


def tokenizer_file(path: str) -> Path:
    file = Path(path).expanduser()
    return file / "tokenizer.json" if file.is_dir() else file


def load_tokenizer(path: str):
    """The `tokenizers.Tokenizer` of `data.tokenizer` (a tokenizer.json, or a folder holding one); CorpusError if unreadable."""
    from tokenizers import Tokenizer

    file = tokenizer_file(path)
    if not file.is_file():
        raise CorpusError(_no_tokenizer_file(path, file))
    try:
        return Tokenizer.from_file(str(file))
    except Exception as error:  # the Rust side raises plain Exceptions
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CorpusError(
            f"data.tokenizer={path} is not a tokenizer.json the `tokenizers` library reads ({first_line})"
        ) from None


def _no_tokenizer_file(path: str, file: Path) -> str:
    """Why `data.tokenizer` names no tokenizer.json, as it is: nothing there, or a folder without one."""
    given = Path(path).expanduser()
    valid = "give a tokenizer.json (the `tokenizers` library's format) or the folder that holds one"
    if not given.exists():
        return f"data.tokenizer={path} does not exist; {valid}, or data.tokenizer=null for byte-level tokens"
    entries = sorted(p.name for p in given.iterdir()) if given.is_dir() else []
    held = entries[:8] + ([f"and {len(entries) - 8} more"] if len(entries) > 8 else [])
    if (given.is_dir() and given.suffix == ".json") or file.is_dir():  # a folder named like the file
        return f"data.tokenizer={path} is a folder, not a file; {valid}"
    slow = [name for name in held if name in ("tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")]
    has = f"it holds {', '.join(held)}" if held else "it is empty"
    hint = (
        "; those are a Hugging Face tokenizer's other files: save the fast tokenizer's tokenizer.json "
        "(AutoTokenizer.from_pretrained(folder).save_pretrained(folder) writes one)"
        if slow
        else ""
    )
    return f"data.tokenizer={path} is a folder without tokenizer.json ({has}){hint}; {valid}"


def tokenizer_vocab_size(path: str) -> int:
    """Token ids the tokenizer can give: its vocabulary with its added (special) tokens (raises CorpusError)."""
    file = tokenizer_file(path)
    return _vocab_size(path, _version(str(file)) if file.is_file() else ())


@functools.lru_cache(maxsize=32)
def _vocab_size(path: str, _version: tuple) -> int:
    return load_tokenizer(path).get_vocab_size(with_added_tokens=True)


def document_token_ids(path: str | None, text_field: str, tokenizer: str) -> list[list[int]]:
    """Each trainable document's token ids under `tokenizer` (special tokens as its post-processor adds them)."""
    encoded = load_tokenizer(tokenizer).encode_batch(document_texts(path, text_field))
    documents = [encoding.ids for encoding in encoded if len(encoding.ids) >= MIN_DOCUMENT_BYTES]
    if not documents:
        raise _no_documents(path, f"tokens under data.tokenizer={tokenizer}")
    return documents


def separator_token_ids(tokenizer: str) -> list[int]:
    """The packing separator's ids under `tokenizer` (none for a tokenizer that drops whitespace)."""
    return load_tokenizer(tokenizer).encode(PACKING_SEPARATOR.decode(), add_special_tokens=False).ids


@functools.lru_cache(maxsize=32)
def _packed_length(path: str | None, text_field: str, tokenizer: str | None, _version: tuple) -> int:
    """The length of the stream data.packing=true cuts windows from, in tokens (raises CorpusError)."""
    if tokenizer is None:
        return sum(len(doc) + len(PACKING_SEPARATOR) for doc in document_bytes(path, text_field))
    separator = len(separator_token_ids(tokenizer))
    return sum(len(doc) + separator for doc in document_token_ids(path, text_field, tokenizer))


def _version(path: str | None) -> tuple:
    """What changes when the data does (a sweep checks each job's data, read once)."""
    if path is None:
        return ()
    root = Path(path).expanduser()
    files = sorted(root.rglob("*.txt")) if root.is_dir() else [root]
    stats = ((file, file.stat()) for file in files)
    return tuple((str(file), stat.st_mtime_ns, stat.st_size) for file, stat in stats)


def corpus_problem(
    path: str | None, text_field: str, *, seq_len: int, packing: bool, tokenizer: str | None = None
) -> str | None:
    """Why this data cannot give one training sequence, or None."""
    try:
        version = _version(path) + (_version(str(tokenizer_file(tokenizer))) if tokenizer else ())
        packed = _packed_length(path, text_field, tokenizer, version)
    except CorpusError as error:
        return str(error)
    unit = "bytes" if tokenizer is None else "tokens"
    # A packed window is seq_len inputs plus the last target; GlobalBatches needs one more token of slack.
    if packing and packed < seq_len + 2:
        return (
            f"data.path={path} holds {packed} {unit}, too few for one packed sequence of "
            f"train.seq_len={seq_len} (needs {seq_len + 2}); use train.seq_len<={packed - 2}, "
            f"more text, or data.packing=false"
        )
    return None
