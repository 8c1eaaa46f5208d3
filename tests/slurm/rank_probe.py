"""One rank of test_torchrun_sub.py's shim job: joins the rendezvous torchrun.sub set up (gloo), sums the ranks, writes
what it saw to OUT_DIR/rank<r>.json. Not collected by pytest."""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NCCL_NVLS_ENABLE", "PYTHONFAULTHANDLER")}
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({**seen, "sum": int(total), "argv": sys.argv[2:]}, f)
dist.destroy_process_group()
