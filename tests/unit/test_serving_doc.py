"""The plain ``sglang.launch_server`` command of ``docs/serving.md`` (which
``tests/integration/test_plain_sglang_server.py`` runs) sets up what ``rksc_sgl.launch_server``
would: a doc that drifts from the CPU defaults or names another backend fails here."""

from __future__ import annotations

import json

import pytest

from rksc_sgl.config import RkscConfig
from rksc_sgl.engine import CPU_DEFAULTS
from rksc_sgl.launch_server import flag_value
from rksc_sgl.model_cache import MODEL_NAME
from tests.integration.serving_doc import documented_admin_paths, documented_command, sglang_admin_routes

ENV, MODULE, ARGS = documented_command()


def test_it_runs_sglangs_own_launcher():
    assert MODULE == "sglang.launch_server"


@pytest.mark.parametrize("field, value", CPU_DEFAULTS.items())
def test_it_gives_each_cpu_default_of_our_launcher(field, value):
    assert flag_value(ARGS, field) == ("" if value is True else str(value)), f"--{field.replace('_', '-')}"


def test_it_names_our_cache_backend_and_eviction_policy():
    assert flag_value(ARGS, "radix_cache_backend") == "rksc"
    assert flag_value(ARGS, "radix_eviction_policy") == "rsbcm"


def test_its_environment_is_a_valid_config_on_sglangs_cpu_path():
    assert ENV["SGLANG_USE_CPU_ENGINE"] == "1"
    assert RkscConfig(**json.loads(ENV["RKSC_SGL_CONFIG"])).rsbcm


def test_its_model_is_where_make_model_converts_it():
    assert flag_value(ARGS, "model_path").endswith(f"/.cache/rksc-sgl/models/{MODEL_NAME}")


def test_it_lists_exactly_sglangs_admin_endpoints():
    routes = sglang_admin_routes()
    assert {"/flush_cache", "/start_profile", "/release_memory_occupation", "/update_weights_from_disk"} <= set(routes)
    assert documented_admin_paths() == set(routes)
