"""Live tensor bytes of a CPU trainer step, for memory checks that need no CUDA allocator: `StepBytes` registers the
storage of every tensor an op makes while it is active (a TorchDispatchMode; storages keep their Python object while
any tensor, autograd's saved ones included, holds them) and, at every logits chunk of the trainer's forwards (where
a micro-batch's activations are all alive), sums the bytes of those still alive that are not a parameter or its gradient:
what the micro-batches and their collectives hold beyond the model's state."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from nemo_jetrl.models import logits
from nemo_jetrl.utils.dtensor import local_tensor


class StepBytes(TorchDispatchMode):
    """`with StepBytes(model) as probe: trainer.train(...)`; then `probe.samples`: bytes at each logits chunk."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.made: dict[int, weakref.ref] = {}
        self.samples: list[int] = []
        self._real: Callable | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = local_tensor(t).untyped_storage()
                known = self.made.get(id(storage))
                if known is None or known() is not storage:  # a dead storage's id may come back for a new one
                    self.made[id(storage)] = weakref.ref(storage)
        return out

    def live_bytes(self) -> int:
        """Bytes of the live storages made under the mode, the parameters (this rank's shards) and their gradients
        left out (a view of a parameter registers the parameter's storage)."""
        state = [p for p in self.model.parameters()] + [p.grad for p in self.model.parameters() if p.grad is not None]
        seen, total = {local_tensor(t).untyped_storage().data_ptr() for t in state}, 0
        for key, ref in list(self.made.items()):
            storage = ref()
            if storage is None:
                del self.made[key]
                continue
            try:
                ptr = storage.data_ptr()
            except RuntimeError:  # an invalid storage: freed
                continue
            if ptr not in seen:
                seen.add(ptr)
                total += storage.nbytes()
        return total

    def __enter__(self):
        self._real = logits.target_logprobs

        def sampled(*args, **kwargs):
            self.samples.append(self.live_bytes())
            return self._real(*args, **kwargs)

        logits.target_logprobs = sampled
        return super().__enter__()

    def __exit__(self, *exc):
        logits.target_logprobs = self._real
        return super().__exit__(*exc)
