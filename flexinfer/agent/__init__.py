"""flexinfer.agent: the GPU node agent.

``discovery`` (NVML → amdsmi → sysfs, CPU flags), ``publish`` (pure: desired labels/annotations and the
minimal node patch), ``kv`` (KV-cache usage from the model pods' Prometheus metrics), ``main``
(``flexinfer agent``: the loop, the one writer of its Node's keys, and the Prometheus gauges).
"""
