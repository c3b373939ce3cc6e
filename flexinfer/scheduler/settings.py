"""Settings of the scheduler extender, read once from ``SCHED_*`` (and a few other) variables.

A frozen dataclass built by :func:`flexinfer.settings.from_env`; nothing else in the extender reads
the environment. The defaults are the original extender's (reference §5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flexinfer import labels
from flexinfer.settings import SettingsError, from_env
from flexinfer.settings import setting as _f


@dataclass(frozen=True, slots=True)
class ExtenderSettings:
    """Score weights, tenant fair share and where benchmark results live."""

    tps_weight: float = _f(0.7, "SCHED_TPS_WEIGHT", "Weight of measured tokens/s.")
    util_weight: float = _f(0.2, "SCHED_UTIL_WEIGHT", "Penalty per percent of GPU utilisation.")
    cost_weight: float = _f(0.1, "SCHED_COST_WEIGHT", "Penalty per unit of the node's cost annotation.")
    cache_weight: float = _f(0.3, "SCHED_CACHE_WEIGHT", "Penalty per unit (0..1) of KV-cache usage.")
    vram_free_weight: float = _f(10.0, "SCHED_VRAM_FREE_WEIGHT", "Bonus per unit (0..1) of free VRAM ratio.")
    kv_penalty_threshold: float = _f(0.85, None, "KV usage above which the extra penalty starts.")
    kv_penalty_weight: float = _f(20.0, None, "Extra penalty per unit of KV usage above the threshold.")
    tenant_fairshare_enabled: bool = _f(False, "SCHED_TENANT_FAIRSHARE_ENABLED", "Add the tenant term.")
    tenant_fairshare_weight: float = _f(5.0, "SCHED_TENANT_FAIRSHARE_WEIGHT", "Weight of the tenant term.")
    tenant_budget_gpus: float = _f(1.0, "SCHED_TENANT_FAIRSHARE_BUDGET_GPUS", "GPUs each tenant may use.")
    tenant_label_key: str = _f("", "SCHED_TENANT_LABEL_KEY", "Pod label naming the tenant; empty = namespace.")
    benchmark_configmap: str = _f(labels.BENCHMARK_CONFIGMAP, "BENCHMARK_RESULTS_CONFIGMAP",
                                  "Global tokens/s ConfigMap, read in the pod's namespace.")

    def validate(self) -> None:
        """Reject settings that cannot work."""
        if self.tenant_fairshare_enabled and self.tenant_budget_gpus <= 0:
            raise SettingsError("SCHED_TENANT_FAIRSHARE_BUDGET_GPUS must be > 0")
        if not self.benchmark_configmap:
            raise SettingsError("BENCHMARK_RESULTS_CONFIGMAP must not be empty")


def load_extender_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> ExtenderSettings:
    """Read the extender settings once (``overrides`` win; None means unset)."""
    settings: ExtenderSettings = from_env(ExtenderSettings, env, **overrides)
    return settings
