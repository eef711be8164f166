"""SGLang plugin entry point (group ``sglang.srt.plugins``), run in every SGLang process.

SGLang calls ``load()`` early in the engine process and in each spawned scheduler, before the
radix cache is built, so registrations made here are visible where the cache is created.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def load() -> None:
    from radix_ext import introspection
    from rksc_sgl.config import RkscConfig

    config = RkscConfig.from_env()  # fails loudly on a malformed RKSC_SGL_CONFIG
    introspection.install()
    logger.debug("rksc-sgl plugin loaded with %s", config)
