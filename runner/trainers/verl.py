"""verl's loss aggregation (`loss_agg_mode`) on its FSDP engine path, under objective=pg.

verl's own `agg_loss` is called where verl is installed (`make setup-verl`: verl 0.9.1 without its
dependencies, and the few its import needs; not in `make setup` nor `make test`, its import pulls ray);
elsewhere `agg_loss` below, a paraphrase of verl-project/verl at 1dda039b9c6311889a9c9a26040677e1254814f9
(verl/trainer/ppo/core_algos.py, identical to verl 0.9.1's). Each run records which ran (`upstream`), and
tests/test_verl_paraphrase.py compares the two where verl imports.

How the engine calls it, read at the same commit:
- verl/workers/engine/fsdp/transformer_impl.py, `FSDPEngine.forward_backward_batch`: once per mini-batch
  (the optimizer step), `batch_num_tokens` = the rank's response tokens (`loss_mask.sum()` over all its
  micro-batches), all-reduced over the dp group (Ulysses' "dp" mesh: sp ranks hold the same sequences);
  `dp_size` = world / sp; each micro-batch's loss is backpropagated as it is (no / GA).
- verl/trainer/ppo/ray_trainer.py, `_update_actor`: `global_batch_size` = ppo_mini_batch_size x rollout.n,
  the mini-batch's sequences over all dp ranks (`ctx.sequences`).
- verl/workers/utils/losses.py, `ppo_loss` (L59): those, and `loss_scale_factor` from the actor config (None by
  default), reach `agg_loss`, whose seq-mean-token-sum-norm divides by `loss_mask.shape[-1]` where it is None
  (core_algos.py L1190-1193). That width is `no_padding_2_padding`'s (verl/workers/utils/padding.py L113-125):
  the `max_response_len` recorded by `left_right_2_no_padding` (L49-51: `response_mask.shape[1]`, the whole
  batch's padded response width), which `_update_actor` (verl/trainer/ppo/ray_trainer.py L1335) applies to the
  batch before it is split; only responses that arrive nested with no width recorded are padded to the
  micro-batch's longest (L118-119). So on the trainer's path the width is one constant for every micro-batch,
  rank and layout (the agent loop pads every response to `rollout.response_length`): that is the `_constant`
  rule (`seq_mean_token_sum_norm_constant`, invariant); `seq_mean_token_sum_norm` is the fallback's, each
  micro-batch over its own longest response.
- Ulysses: the loss of whole sequences on every sp rank (`runner.trainers.policy_gradient`); FSDP's mean.

Per micro-batch m of dp rank r, over its whole responses (l_it = -A_i log p, n = |o_i|, B_g = the step's
sequences, N = its response tokens, dp, M = grad_accum), and the gradient after FSDP's mean over W (the
mean over dp ranks, summed over micro-batches):

| loss_agg_mode | agg_loss per micro-batch | objective after FSDP |
|---|---|---|
| token-mean | sum_it l / N x dp | sum l / N: the global token mean |
| token-sum | sum_it l x dp | sum l |
| seq-mean-token-sum | sum_i (sum_t l) / B_g x dp | sum l / B_g |
| seq-mean-token-mean | sum_i (sum_t l / n_i) / B_g x dp | (1/B_g) sum_i mean_t l: each response alike |
| seq-mean-token-sum-norm | as seq-mean-token-sum, / loss_scale_factor | / loss_scale_factor: None = the micro-batch's longest response, another constant for each micro-batch |

`legacy_token_mean` is the FSDP actor before the engines (volcengine/verl at
b178a3cd56f58b2d502255daba591e92833930a7, verl/workers/actor/dp_actor.py, `update_policy`: no global batch
information, so `agg_loss` divides by the micro-batch's own tokens, and the loss is scaled by
loss_scale_factor = 1 / gradient_accumulation): a mean of micro-batch means (verl issue #5625).
`cp_count_token_mean` counts batch_num_tokens as verl issue #5983 reports the Megatron engine with context
parallelism does: the tokens of the rank's own sequence shard, all-reduced over the dp group alone (N_s for
sp rank s). Every sp rank computes the loss of the whole sequences over its own N_s, and each keeps the
gradient of its own slice: the objective is sum_s S_s / N_s, each chunk's tokens over that chunk's count.
Where chunks hold equal counts (Megatron's load-balanced chunks) that is sp x the token mean, as the issue
says; here, where the first chunk holds the prompts, it weighs the later chunks' tokens more.
"""

from __future__ import annotations

import torch

from runner.train.custom_rule import custom_rule
from runner.train.upstream import Package, Source, Tested
from runner.trainers.policy_gradient import dp_sum, longest_response, pg_token_losses, response_matrix

try:  # verl's import pulls ray (about 5 s, 200 MB): only where `make setup-verl` installed it
    from verl.trainer.ppo.core_algos import agg_loss as verl_agg_loss
except ImportError:
    verl_agg_loss = None

COMMIT = "1dda039b9c6311889a9c9a26040677e1254814f9"
FOLLOWS = (
    "verl/workers/engine/fsdp/transformer_impl.py: FSDPEngine.forward_backward_batch (batch_num_tokens, dp_size)",
    "verl/trainer/ppo/ray_trainer.py: _update_actor (global_batch_size)",
    "verl/workers/utils/losses.py: ppo_loss (global_batch_info, loss_scale_factor)",
    "verl/workers/utils/padding.py: no_padding_2_padding (responses padded to the micro-batch's longest)",
    "verl/utils/ulysses.py: Gather, gather_outputs_and_unpad (whole sequences on every sp rank)",
)
CALLED = Package("verl", calls=("verl.trainer.ppo.core_algos.agg_loss",), follows=FOLLOWS)
PARAPHRASED = Source("verl-project/verl", COMMIT, ("verl/trainer/ppo/core_algos.py: agg_loss", *FOLLOWS))
UPSTREAM = CALLED if verl_agg_loss is not None else PARAPHRASED
LEGACY = Source(
    "volcengine/verl",
    "b178a3cd56f58b2d502255daba591e92833930a7",
    ("verl/workers/actor/dp_actor.py: DataParallelPPOActor.update_policy (loss_scale_factor, issue #5625)",),
)
CP_COUNT = Source(
    "verl-project/verl",
    COMMIT,
    ("verl/workers/engine/megatron/transformer_impl.py: forward_backward_batch (the count of issue #5983)",),
)

# The tests that hold `agg_loss` (every rule's aggregation) against verl: verl 0.9.1's own, where it is installed,
# and verl's unit-test cases at COMMIT (tests/test_upstream_cases_verl.py), for the modes each exercises.
RELEASED = Tested(
    "release",
    "tests/test_verl_paraphrase.py::test_the_paraphrase_is_verls_agg_loss",
    "verl 0.9.1's own agg_loss (make setup-verl), value and gradient, every loss_agg_mode",
    via=("paraphrased_agg_loss",),
    needs="verl",
)
VERL_TESTS = f"verl-project/verl@{COMMIT[:7]} tests/trainer/ppo/"
AGGREGATION_CASES = f"{VERL_TESTS}test_loss_aggregation_on_cpu.py cases"
VALUE_LOSS_CASES = f"{VERL_TESTS}test_value_loss_normalization_on_cpu.py cases (agg_loss's half)"


def upstream_cases(against: str, *tests: str) -> tuple[Tested, ...]:
    """verl's unit-test cases reproduced by tests/test_upstream_cases_verl.py's `tests`, fed to `agg_loss`."""
    return tuple(
        Tested("upstream_tests", f"tests/test_upstream_cases_verl.py::{test}", against, via=("paraphrased_agg_loss",))
        for test in tests
    )


MODE_CASES = ("test_microbatch_invariant_all_modes", "test_microbatch_invariant_variable_length")
TOKEN_SUM_CASES = upstream_cases(
    AGGREGATION_CASES,
    "test_token_sum_masks_tokens_and_scales_for_dp",
    "test_token_sum_is_microbatch_invariant",
    "test_token_sum_matches_global_sum_after_fsdp_mean_reduction",
)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """verl/utils/torch_functional.py `masked_sum`."""
    return (values * mask).sum()


def paraphrased_agg_loss(
    loss_mat, loss_mask, loss_agg_mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None
):
    """verl's `agg_loss` (verl/trainer/ppo/core_algos.py at COMMIT), written out."""
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / (tokens + 1e-8)
        seq_mask = (tokens > 0).float()  # fully masked sequences excluded
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")


agg_loss = verl_agg_loss if verl_agg_loss is not None else paraphrased_agg_loss


def batch_info(ctx, loss_scale_factor: int | None = None) -> dict:
    """`forward_backward_batch` and `_update_actor`: the step's global batch information (one all-reduce)."""
    rank_tokens = sum(int(responses.length.sum()) for responses in ctx.responses)
    (tokens,) = dp_sum([rank_tokens], ctx)
    return {
        "dp_size": ctx.dp,
        "batch_num_tokens": int(tokens),
        "global_batch_size": ctx.sequences,
        "loss_scale_factor": loss_scale_factor,
    }


def cp_count_batch_info(ctx) -> dict:
    """batch_num_tokens as issue #5983 reports it under context parallelism: the shard's own targets (this sp
    rank's columns), all-reduced over the dp group alone."""
    (tokens,) = dp_sum([ctx.rank_tokens], ctx)
    return {**batch_info(ctx), "batch_num_tokens": int(tokens)}


def aggregate(logits, labels, ctx, loss_agg_mode: str, **info) -> torch.Tensor:
    """The micro-batch's policy loss: its whole responses, padded to its longest, through `agg_loss`."""
    responses = ctx.micro_responses
    loss_mat, mask = response_matrix(pg_token_losses(logits, labels, ctx), responses, longest_response(responses))
    return agg_loss(loss_mat, mask, loss_agg_mode, **info)


@custom_rule(
    upstream=(
        UPSTREAM,
        RELEASED,
        *upstream_cases(VALUE_LOSS_CASES, *MODE_CASES, "test_dp_size_matches_global_mean_after_fsdp_reduce"),
    ),
    start_step=batch_info,
)
def token_mean(logits, labels, ctx):
    """token-mean: masked sum / global response tokens x dp_size."""
    return aggregate(logits, labels, ctx, "token-mean", **ctx.plan)


@custom_rule(upstream=(UPSTREAM, RELEASED, *TOKEN_SUM_CASES), start_step=batch_info)
def token_sum(logits, labels, ctx):
    """token-sum: masked sum x dp_size."""
    return aggregate(logits, labels, ctx, "token-sum", **ctx.plan)


@custom_rule(upstream=(UPSTREAM, RELEASED, *upstream_cases(VALUE_LOSS_CASES, *MODE_CASES)), start_step=batch_info)
def seq_mean_token_sum(logits, labels, ctx):
    """seq-mean-token-sum: each response's sum, / global sequences x dp_size."""
    return aggregate(logits, labels, ctx, "seq-mean-token-sum", **ctx.plan)


@custom_rule(upstream=(UPSTREAM, RELEASED, *upstream_cases(VALUE_LOSS_CASES, *MODE_CASES)), start_step=batch_info)
def seq_mean_token_mean(logits, labels, ctx):
    """seq-mean-token-mean: each response's mean, / global sequences x dp_size."""
    return aggregate(logits, labels, ctx, "seq-mean-token-mean", **ctx.plan)


@custom_rule(
    upstream=(UPSTREAM, RELEASED, *upstream_cases(VALUE_LOSS_CASES, "test_microbatch_invariant_all_modes")),
    start_step=batch_info,
)
def seq_mean_token_sum_norm(logits, labels, ctx):
    """seq-mean-token-sum-norm with loss_scale_factor None, padded as `no_padding_2_padding`'s fallback (no width
    recorded): / the micro-batch's longest response. The trainer's own path records one width: `_constant`."""
    return aggregate(logits, labels, ctx, "seq-mean-token-sum-norm", **ctx.plan)


@custom_rule(
    upstream=(UPSTREAM, RELEASED, *upstream_cases(VALUE_LOSS_CASES, "test_loss_scale_factor_is_forwarded")),
    start_step=lambda ctx: batch_info(ctx, ctx.objective.max_response),
)
def seq_mean_token_sum_norm_constant(logits, labels, ctx):
    """seq-mean-token-sum-norm over a constant width, objective.max_response: the trainer's path (`_update_actor`
    records the batch's padded response width for every micro-batch), or a loss_scale_factor set, as its doc advises."""
    return aggregate(logits, labels, ctx, "seq-mean-token-sum-norm", **ctx.plan)


@custom_rule(
    upstream=(
        UPSTREAM,
        LEGACY,
        RELEASED,
        *upstream_cases(VALUE_LOSS_CASES, "test_without_global_info_is_microbatch_dependent"),
    )
)
def legacy_token_mean(logits, labels, ctx):
    """The pre-engine FSDP actor: token-mean over the micro-batch's own tokens, x 1 / gradient_accumulation."""
    return aggregate(logits, labels, ctx, "token-mean") / ctx.grad_accum


@custom_rule(upstream=(UPSTREAM, CP_COUNT, RELEASED), start_step=cp_count_batch_info)
def cp_count_token_mean(logits, labels, ctx):
    """token-mean with batch_num_tokens counted on the sequence shard, over the dp group alone (issue #5983)."""
    return aggregate(logits, labels, ctx, "token-mean", **ctx.plan)
