"""flexinfer.scheduler: the kube-scheduler extender.

``wire`` (extender v1 JSON), ``logic`` (pure filter and score), ``inventory`` (Nodes, benchmark
ConfigMaps and Pods kept in memory by list+watch), ``server`` (routes on the ``flexinfer.http`` core),
``settings`` (``SCHED_*``), ``main`` (``flexinfer extender``).
"""
