"""One in-process engine at a time for a test module, switched by name.

(SGLang's ``Engine.shutdown`` kills every child process of the calling process, so a module's
own engines are started one after the other, beside the session's stock engine.)
"""

from __future__ import annotations

from typing import Any


class Engines:
    """Starts the engine a test asks for (``launch_engine`` keyword arguments by name), after
    shutting down the previous one."""

    def __init__(self, configs: dict[str, dict[str, Any]]) -> None:
        self.configs = configs
        self.name, self.backend = None, None

    def get(self, name: str):
        if name != self.name:
            self.close()
            from rksc_sgl.engine import launch_engine
            from rksc_sgl.engine_endpoint import RkscEngineEndpoint

            self.backend = RkscEngineEndpoint(launch_engine(log_level="error", **self.configs[name]))
            self.name = name
        return self.backend

    def close(self) -> None:
        if self.backend is not None:
            self.backend.shutdown()
        self.name, self.backend = None, None
