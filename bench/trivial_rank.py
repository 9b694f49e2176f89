"""The trivial torchrun job B2 compares with: import torch, join a gloo world, barrier, leave."""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
