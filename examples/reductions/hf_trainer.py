"""The Hugging Face Trainer's causal-LM loss, with and without `average_tokens_across_devices`.

Follows transformers 5.x:
- src/transformers/loss/loss_utils.py, `ForCausalLMLoss` (called here as it is): the summed token
  cross-entropy divided by `num_items_in_batch` when that is given. The runner's labels are already
  shifted, so they go in as `shift_labels` and nothing is shifted twice.
- src/transformers/trainer.py, `Trainer._get_num_items_in_batch`: the valid targets of all the step's
  micro-batches; with `args.average_tokens_across_devices` (the default) gathered and summed over the
  processes, then divided by the parallelism config's non-data-parallel size (context-parallel ranks
  see the same whole sequences). That is N, the step's global count (`ctx.global_tokens`, which the
  runner has all-reduced already). Without it: this process's own count (of its whole sequences,
  divided by that size likewise).
- `Trainer.compute_loss`: with `average_tokens_across_devices`, the loss is multiplied by the number of
  processes, `accelerator.num_processes`, because DDP and FSDP average the gradients.
- `Trainer.training_step` / `_maybe_log_save_evaluate`: the logged loss is the backpropagated loss,
  summed over micro-batches and averaged over processes (what the runner does with `logged`).

Gradient (W processes, FSDP's mean, custom.fsdp_reduce=mean):
- `loss`: (1/W) sum_r d(W S_r / N) = dL, the `scaled` mode: grad L.
- `loss_per_device` (average_tokens_across_devices=False): (1/W) sum_r dS_r / n_r, each rank's token
  mean averaged over ranks: another direction whenever the ranks hold unequal valid-token counts.
"""

from __future__ import annotations

from transformers.loss.loss_utils import ForCausalLMLoss


def _trainer_loss(logits, labels, ctx, average_tokens_across_devices: bool):
    if average_tokens_across_devices:
        num_items_in_batch = ctx.global_tokens  # gathered over processes, / sp
    else:
        num_items_in_batch = ctx.rank_sequence_tokens // ctx.sp  # this process's own count, / sp
    loss = ForCausalLMLoss(
        logits,
        None,  # labels: unused when shift_labels is given
        vocab_size=logits.size(-1),
        num_items_in_batch=num_items_in_batch,
        ignore_index=ctx.ignore_index,
        shift_labels=labels,
    )
    if average_tokens_across_devices:
        loss = loss * ctx.world_size  # compute_loss: loss *= accelerator.num_processes
    return loss, loss.detach()


def loss(logits, labels, ctx):
    """Trainer with average_tokens_across_devices=True (the default): W * S / N, FSDP mean."""
    return _trainer_loss(logits, labels, ctx, average_tokens_across_devices=True)


def loss_per_device(logits, labels, ctx):
    """Trainer with average_tokens_across_devices=False: S / (this process's tokens), FSDP mean."""
    return _trainer_loss(logits, labels, ctx, average_tokens_across_devices=False)
