"""Serving probes: one server or a cluster under load (``load``, ``soak``), a worker killed under
load (``faults``), a light client beside a heavy one (``fairness``), routing policies
(``scaleout``)."""
