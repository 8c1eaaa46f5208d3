"""The trainer's parallel plans (none / fsdp / fsdp_tp): how one `NativePolicy` spreads over the ranks of a process
group. plan.py (the ranks, cutting and gathering), sharding.py (a trainer laid out by its plan, its state in the
one-process layout), fsdp.py (FSDP2 over the rest, the float64 grad norm), fp8_gather.py (the FP8 linears' bits
gathered once a step, read by trainer and rollout), tensor_parallel.py, weight_sync.py (the refit into the rollout
replica), kv_sync.py (FP8 KV scales from every rank's records). Torch only: torchrun ranks and Ray workers alike.
"""
