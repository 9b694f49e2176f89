"""Loss-reduction ablations for FSDP2 LM training: is the differentiable all-reduce of the loss needed?"""
