"""Training data whose global batch depends only on (seed, step): byte-level tokens, or `data.tokenizer`'s ids.

What makes runs comparable: the global batch of step t is a fixed set of
`train.global_batch` sequences chosen from the seed and t, never from the
world size, sp or grad_accum. It is then split evenly over dp ranks and
micro-batches, and each sequence's positions into `sp` contiguous chunks, so
every configuration trains on the same tokens at every step.

By default a sequence is one document padded with the ignore index, so the
number of valid tokens differs between ranks and micro-batches (which is what
exposes mean-of-means loss scaling). `data.packing=true` cuts full windows
from the concatenated corpus instead.

`data.valid_tokens` then chooses which of the step's targets count (`mask_targets`),
from each target's row and position in the global batch alone, never from the
layout, so every layout of a step still trains on the same targets:

- `full` (default): every target the documents give.
- `skewed`: row i (0-based, of the step's G rows) keeps the targets at positions
  t with t % (i + 1) == 0: row 0 all of them, row G-1 one in G. The rows are split
  in order over dp ranks, then micro-batches, so ranks and micro-batches hold very
  unequal counts (with G=16 and 4 micro-batches, about 7 : 2 : 1.3 : 1), while
  every sp chunk of a row keeps some (where the document reaches it).
- `one_empty`: `skewed`, and the last G // 4 rows keep no target. At every layout
  with dp x grad_accum >= 4 the last dp rank's last micro-batch (all its sp
  chunks) holds no valid target at all, and the ranks' counts differ a lot: the
  case a rule that divides a shard's loss by its own count turns into 0 / 0.
  (With fewer micro-batches per step the last one is partly empty.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from runner.config import DataConfig, ValidTokens
from runner.data.corpus import (
    PACKING_SEPARATOR,
    document_bytes,
    document_token_ids,
    separator_token_ids,
    text_field_of,
)

IGNORE_INDEX = -100
PAD_TOKEN = 0  # NUL never occurs in text; under a tokenizer any id would do: padded inputs come after a
# sequence's last target (causal attention never lets a valid target see them) and their targets are ignored.
BYTE_SEPARATOR = torch.tensor(list(PACKING_SEPARATOR), dtype=torch.uint8)


def load_documents(cfg: DataConfig) -> list[torch.Tensor]:
    """Each document's tokens: a uint8 tensor of its UTF-8 bytes (vocab 256), or with `data.tokenizer`
    an int32 tensor of its ids; documents under 2 tokens are dropped."""
    if cfg.tokenizer is not None:
        return [
            torch.tensor(ids, dtype=torch.int32)
            for ids in document_token_ids(cfg.path, text_field_of(cfg), cfg.tokenizer)
        ]
    return [torch.frombuffer(bytearray(raw), dtype=torch.uint8) for raw in document_bytes(cfg.path, text_field_of(cfg))]


def packing_separator(cfg: DataConfig) -> torch.Tensor:
    """What separates documents in the packed stream (data.packing=true), in the documents' tokens."""
    if cfg.tokenizer is not None:
        return torch.tensor(separator_token_ids(cfg.tokenizer), dtype=torch.int32)
    return BYTE_SEPARATOR


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor  # [batch, seq] int64 token ids
    labels: torch.Tensor  # [batch, seq] next-token targets, IGNORE_INDEX where padded
    position_offset: int = 0  # absolute position of column 0 (non-zero for sequence shards)
    # Valid targets of this micro-batch's whole sequences (all sp chunks); None: the batch is whole.
    sequence_valid_tokens: int | None = None
    # The labels of those whole sequences (all sp chunks: what a trainer's data loader hands every
    # context-parallel rank before it shards them); None: the batch is whole.
    sequence_labels: torch.Tensor | None = None

    @property
    def valid_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def whole_valid_tokens(self) -> int:
        """Valid targets of the whole sequences this batch is (a chunk of)."""
        return self.valid_tokens if self.sequence_valid_tokens is None else self.sequence_valid_tokens

    @property
    def whole_labels(self) -> torch.Tensor:
        """The labels of the whole sequences this batch is (a chunk of)."""
        return self.labels if self.sequence_labels is None else self.sequence_labels


def mask_targets(labels: torch.Tensor, valid_tokens: ValidTokens | str) -> torch.Tensor:
    """`labels` ([G, T], one step's global batch) with the targets `data.valid_tokens` leaves out set to
    IGNORE_INDEX (module docstring): a function of each target's row and position alone."""
    rule = ValidTokens(valid_tokens)
    if rule is ValidTokens.full:
        return labels
    rows, positions = labels.shape
    row = torch.arange(rows).unsqueeze(1)
    position = torch.arange(positions).unsqueeze(0)
    keep = position % (row + 1) == 0  # skewed: row i keeps one target in i + 1
    if rule is ValidTokens.one_empty:
        keep &= row < rows - rows // 4  # and the last quarter of the rows keeps none
    return labels.masked_fill(~keep, IGNORE_INDEX)


class GlobalBatches:
    def __init__(
        self,
        documents: list[torch.Tensor],
        *,
        seq_len: int,
        global_batch: int,
        seed: int,
        packing: bool,
        separator: torch.Tensor = BYTE_SEPARATOR,
        valid_tokens: ValidTokens | str = ValidTokens.full,
    ):
        """`documents` from `load_documents`; `separator` (`packing_separator`) goes between them when packing;
        `valid_tokens` (`data.valid_tokens`) chooses which targets count (`mask_targets`)."""
        self.valid_tokens = ValidTokens(valid_tokens)
        self.documents = documents
        self.seq_len = seq_len
        self.global_batch = global_batch
        self.seed = seed
        self.packing = packing
        if packing:
            separator = separator.to(documents[0].dtype)
            self.stream = torch.cat([piece for doc in documents for piece in (doc, separator)])
            if self.stream.numel() < seq_len + 2:
                raise ValueError(f"the corpus ({self.stream.numel()} tokens) is shorter than train.seq_len + 1")

    def __call__(self, step: int) -> Batch:
        """The global batch of optimizer step `step` (1-based)."""
        rng = np.random.default_rng([self.seed, step])
        window = self.seq_len + 1  # inputs and their shifted targets
        inputs = torch.full((self.global_batch, self.seq_len), PAD_TOKEN, dtype=torch.long)
        labels = torch.full((self.global_batch, self.seq_len), IGNORE_INDEX, dtype=torch.long)
        for row in range(self.global_batch):
            if self.packing:
                start = int(rng.integers(self.stream.numel() - window + 1))
                tokens = self.stream[start : start + window]
            else:
                doc = self.documents[int(rng.integers(len(self.documents)))]
                start = int(rng.integers(max(1, doc.numel() - window + 1)))
                tokens = doc[start : start + window]
            tokens = tokens.long()
            # Labels are shifted before any sequence split, so no target is lost at a shard border.
            inputs[row, : tokens.numel() - 1] = tokens[:-1]
            labels[row, : tokens.numel() - 1] = tokens[1:]
        return Batch(inputs, mask_targets(labels, self.valid_tokens))


def local_micro_batches(batch: Batch, *, dp: int, dp_rank: int, sp: int, sp_rank: int, grad_accum: int) -> list[Batch]:
    """This rank's share of the global batch: rows split over dp ranks then micro-batches, columns over sp."""
    rows_per_rank = batch.inputs.shape[0] // dp
    rows_per_micro = rows_per_rank // grad_accum
    cols = batch.inputs.shape[1] // sp
    col_start = sp_rank * cols
    micro_batches = []
    for micro in range(grad_accum):
        row_start = dp_rank * rows_per_rank + micro * rows_per_micro
        rows = slice(row_start, row_start + rows_per_micro)
        columns = slice(col_start, col_start + cols)
        whole = int((batch.labels[rows] != IGNORE_INDEX).sum())
        micro_batches.append(
            Batch(
                batch.inputs[rows, columns],
                batch.labels[rows, columns],
                position_offset=col_start,
                sequence_valid_tokens=whole,
                sequence_labels=batch.labels[rows],
            )
        )
    return micro_batches


def micro_batch_token_range(batch: Batch, *, dp: int, grad_accum: int) -> tuple[int, int]:
    """(min, max) valid targets over the dp * grad_accum micro-batches of whole sequences.

    When they differ, a mean of per-micro-batch means weights tokens unequally
    (what `mean_of_means` gets wrong); when they are equal it is the token mean.
    """
    rows = batch.labels.shape[0] // (dp * grad_accum)
    counts = (batch.labels != IGNORE_INDEX).reshape(dp * grad_accum, rows * batch.labels.shape[1]).sum(dim=1)
    return int(counts.min()), int(counts.max())
