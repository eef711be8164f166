"""Who owns CGEE's thresholds: the server reports its ``--cgee-*`` values, ``verify()`` reads them."""

from __future__ import annotations

import dataclasses

from radix_ext.eviction.stats import cgee_policy
from rksc_sgl.config import RkscConfig
from rksc_sgl.protocol import CGEE_KEY
from rksc_sgl.cgee import CgeeThresholds


class Reporting:
    """A backend's ``get_server_info`` as a server answers it (the readback is all this reads)."""

    def __init__(self, state: dict):
        self.state, self.calls = state, 0

    def get_server_info(self):
        self.calls += 1
        return {"internal_states": [self.state]}


def test_the_servers_report_names_every_threshold_field():
    config = RkscConfig(cgee_tau_conf=0.9, cgee_margin=0.1, cgee_theta=3.0, cgee_epsilon=0.5, cgee_min_layer=7)
    report = cgee_policy(config)
    assert set(report) == {f.name for f in dataclasses.fields(CgeeThresholds)}
    assert CgeeThresholds(**report) == CgeeThresholds.from_config(config)


def test_verify_reads_the_servers_thresholds_once_per_backend():
    policy = {"tau_conf": 1.0, "margin": 1.0, "theta": 20.0, "epsilon": 20.0, "min_layer": 4}
    backend = Reporting({CGEE_KEY: policy})
    assert CgeeThresholds.of_server(backend) == CgeeThresholds(**policy)
    assert CgeeThresholds.of_server(backend) == CgeeThresholds(**policy) and backend.calls == 1


def test_a_server_that_reports_none_gets_the_defaults():
    assert CgeeThresholds.of_server(Reporting({})) == CgeeThresholds.from_config(RkscConfig())
