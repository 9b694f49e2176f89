"""Real trainers' causal-LM loss rules, each a `custom.fn` (conf/trainer/ names them; `experiment=trainers` runs them).

Installed with the package, so `trainer=NAME` (or `custom.fn=runner.trainers.MODULE:RULE`) works from any
working directory. Each rule calls the trainer's own packaged code where it is callable alone, and
records it (`upstream`: the package and the version that ran, or the repository, commit and files it
paraphrases, in summary.json's `custom_upstream`). The protocol is `runner.train.custom_rule`'s.

| module        | rules                                                                 | upstream                          |
|---------------|-----------------------------------------------------------------------|-----------------------------------|
| hf_trainer    | loss, loss_per_device, no_loss_kwargs, deepspeed_ulysses              | transformers (installed)          |
| megatron      | per_token, default                                                    | NVIDIA/Megatron-LM (paraphrase)   |
| torchtitan    | loss                                                                  | torchtitan 0.3.0 ([trainers] extra) |
| xtuner        | released, rfc_without_all_reduce, pr1968, sample, square              | InternLM/xtuner (paraphrase)      |
| counterexample| sum_backward_under_fsdp_sum (a deliberately wrong combination: W x grad L) | none                         |

This package's `__init__` is torch-free (the launcher may import it); each module imports what it needs.
"""
