"""The run's whole config, composed at the top of the package: `MasterConfig` holds every component's section
(each section type lives beside its component: `policy/config.py`, `algorithms/config.py`, ...), with the rules
that span sections; `validate_config` translates NeMo-RL's keys onto it first (`nemo_rl.py`).

Nothing below this package imports it; `nemo_jetrl.config` (loader, section base types, errors) is the ground floor.
"""

from nemo_jetrl._lazy import lazy_exports

_EXPORTS = {"MasterConfig": "master", "validate_config": "validate"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
