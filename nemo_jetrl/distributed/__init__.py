"""Scale-out around the trainer: the `cluster` section, the torchrun launch, the Ray worker group of colocated
trainer + rollout workers (the trainer's own parallel plans live in policy/parallel/), the batch split.

Import-light on purpose: nothing here imports Ray (only `worker_group` / `ray_policy` do, when a run asks for
`cluster.backend: ray`), so the torch-only pieces run under torchrun on machines without Ray.
"""

from nemo_jetrl.distributed.cluster import ClusterSpec
from nemo_jetrl.distributed.errors import WorkerGroupError

__all__ = ["ClusterSpec", "WorkerGroupError"]
