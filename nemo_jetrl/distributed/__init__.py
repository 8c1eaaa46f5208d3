"""Scale-out: Ray worker group of colocated FSDP2 trainer + rollout workers, FP8 all-gather refit, data split.

Import-light on purpose: nothing here imports Ray (only `worker_group` / `ray_policy` do, when a run asks for
`cluster.backend: ray`), so the torch-only pieces run under torchrun on machines without Ray.
"""

from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.errors import WorkerGroupError

__all__ = ["ClusterSpec", "WorkerGroupError"]
