"""``RkscRadixCache``: SGLang's RadixCache whose nodes carry a branch depth and score.

Registered as radix-cache backend ``rksc`` (``radix_ext.plugin``), selected with
``--radix-cache-backend rksc``. Under any stock eviction policy it is SGLang's ``RadixCache``
plus metadata that nothing reads; ``--radix-eviction-policy rsbcm`` evicts by
``radix_ext.eviction.policy.RSBCMStrategy``, and so does ``RkscConfig(rsbcm=True)`` (``--rsbcm``), which
implies the backend.

Where the metadata comes from (wire format: ``rksc_sgl.scores``): every request may carry a
``BranchTag`` in ``sampling_params.custom_params``. At each checkpoint (prefill done, chunk
done, request finished) the parent inserts the request's tokens, then

* the nodes holding tokens this request computed itself (positions >= ``req.prefix_len``, the
  prefix it found cached) get its depth; a node two branches computed keeps the shallower one;
* if the tag has a score, every node on the request's path at depth >= the tag's depth gets it
  (the latest report wins), whenever those nodes were inserted.

Overrides of RadixCache, each pinned by ``tests/unit/test_backend_tree.py``:

* ``__init__``: SGLang's strategy table is private, so under ``rsbcm`` the parent is built with
  ``lru`` and the strategy replaced afterwards;
* ``checkpoint``: the parent's, then the tagging above (``req.last_node`` is then the deepest
  node of the request's path); a request ASKS blend served inserts only its tokens before the
  first whose KV came from a donor (``radix_ext.asks.blend.EXACT_LEN_ATTR``), the rest being freed
  at release as the parent frees what it did not insert, or, at its release with
  ``--asks-blended-donors``, kept as its group's private node (``radix_ext.asks.private``);
* ``_split_node``: the new upper node holds a prefix of the same branch, so it inherits depth and
  score;
* ``reset``: clears the report counter (the metadata lives on nodes and goes with them).

With ASKS on (``--asks``, ``radix_ext.asks.decision``), ``asks`` holds the gate and counters, and:

* ``checkpoint`` also moves a span commit's signature (``radix_ext.asks.capture``) onto the node
  that ends at the span's end, unless that node has one or the signature cap is reached;
* ``_split_node`` leaves the signature on the lower node, which still ends where the span ends;
* ``_delete_leaf`` (eviction) and ``reset`` release signature bytes with their nodes; evicted
  tokens are tallied scored / unscored for ``radix_ext.ops.metrics``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

from radix_ext.asks import blend as asks_blend, capture as asks_capture, private as asks_private, segments as asks_segments
from radix_ext.asks.decision import SIG_ATTR, AsksState
from radix_ext.eviction.policy import DEPTH_ATTR, POLICY_NAME, SCORE_ATTR, RSBCMStrategy, node_depth, node_score
from radix_ext.ops.metrics import EVICTED_TOKENS
from rksc_sgl.config import RkscConfig, parse_layers
from rksc_sgl.protocol import BranchTag

logger = logging.getLogger(__name__)

SCORE_COUNTED_ATTR = "_rksc_score_counted"  # on a Req whose score report was counted


class RkscRadixCache(RadixCache):
    def __init__(self, params, *, rsbcm: bool = False, asks: AsksState | None = None) -> None:
        """``rsbcm``: evict by RSBCM (``--rsbcm``); ``--radix-eviction-policy rsbcm`` also selects it.
        ``asks``: ASKS's gate and counters (``--asks``), None when off."""
        self.score_reports = 0
        self.asks = asks
        policy = params.eviction_policy.lower()
        rsbcm = rsbcm or policy == POLICY_NAME
        if rsbcm and policy not in ("lru", POLICY_NAME):
            raise ValueError(f"--rsbcm conflicts with --radix-eviction-policy {policy}; drop one of them")
        strategy_config = params.eviction_policy_config if rsbcm else None
        if rsbcm:
            params = dataclasses.replace(params, eviction_policy="lru", eviction_policy_config=None)
        super().__init__(params)
        if asks is not None:
            asks.cache = self
        if rsbcm:
            self.eviction_policy = POLICY_NAME
            if not self.disable:
                self.eviction_strategy = RSBCMStrategy(**(strategy_config or {}))

    def reset(self) -> None:
        super().reset()
        self.score_reports = 0
        if getattr(self, "asks", None) is not None:  # the parent's __init__ calls reset first
            self.asks.counters.signatures = self.asks.counters.signature_bytes = 0
            self.asks.index.clear()

    def checkpoint(self, req, *, up_to: int) -> None:
        own_start = req.prefix_len  # before the parent's insert: what the request found cached
        exact = getattr(req, asks_blend.EXACT_LEN_ATTR, None)  # a blended request: only its exact part
        if exact is not None:
            if exact > req.kv.cache_protected_len:
                self._checkpoint(req, own_start, up_to=min(up_to, exact))
            if req.finished() and self.asks is not None and self.asks.blend.blended_donors:
                kept = asks_private.keep(self, req, up_to)
                self.asks.blend_counters.kept_tokens += kept
                self.asks.blend_counters.kept_requests += bool(kept)
            return
        self._checkpoint(req, own_start, up_to=up_to)

    def _checkpoint(self, req, own_start: int, *, up_to: int) -> None:
        super().checkpoint(req, up_to=up_to)
        if self.disable:
            return
        if self.asks is not None:
            if self.asks.mode == "blend":
                asks_segments.on_checkpoint(self, req)
            else:
                self._keep_signature(req)
        tag = request_tag(req)
        if tag is None:
            return
        tag_own_nodes(req.last_node, self.root_node, own_start, tag.depth)
        if tag.score is not None:
            score_path(req.last_node, self.root_node, tag)
            if not getattr(req, SCORE_COUNTED_ATTR, False):  # a request checkpoints more than once
                setattr(req, SCORE_COUNTED_ATTR, True)
                self.score_reports += 1

    def _keep_signature(self, req) -> None:
        signature = asks_capture.take_signature(req)
        node = req.last_node
        if signature is None or node is self.root_node or getattr(node, SIG_ATTR, None) is not None:
            return
        if sum(len(n.key) for n in path_to_root(node, self.root_node)) != signature.end:
            return  # the span's end is not a node boundary (page alignment): no signature
        counters = self.asks.counters
        if counters.signature_bytes + signature.nbytes > self.asks.cap_bytes:
            counters.signatures_over_cap += 1
            return
        setattr(node, SIG_ATTR, signature)
        counters.signatures += 1
        counters.signature_bytes += signature.nbytes

    def _delete_leaf(self, node) -> None:
        super()._delete_leaf(node)
        EVICTED_TOKENS["unscored" if node_score(node) is None else "scored"] += len(node.key)
        asks_segments.on_delete(self, node)
        signature = getattr(node, SIG_ATTR, None)
        if signature is not None and self.asks is not None:
            setattr(node, SIG_ATTR, None)
            self.asks.counters.signatures -= 1
            self.asks.counters.signature_bytes -= signature.nbytes

    def _split_node(self, key, child: TreeNode, split_len: int) -> TreeNode:
        new_node = super()._split_node(key, child, split_len)
        for attr in (DEPTH_ATTR, SCORE_ATTR):
            if hasattr(child, attr):
                setattr(new_node, attr, getattr(child, attr))
        asks_segments.on_split(child, new_node)
        return new_node


def request_tag(req) -> BranchTag | None:
    """The request's BranchTag; a malformed one (rejected at the tokenizer, see plugin) is ignored."""
    try:
        return BranchTag.from_custom_params(getattr(req.sampling_params, "custom_params", None))
    except ValueError as e:
        logger.warning("request %s: ignoring rksc metadata: %s", getattr(req, "rid", "?"), e)
        return None


def path_to_root(node: TreeNode, root: TreeNode) -> list[TreeNode]:
    """Nodes from ``node`` up to the root's child, deepest first."""
    path = []
    while node is not None and node is not root:
        path.append(node)
        node = node.parent
    return path


def tag_own_nodes(last_node: TreeNode, root: TreeNode, own_start: int, depth: int) -> None:
    """Give ``depth`` to the path's nodes that start at token position >= ``own_start``."""
    path = path_to_root(last_node, root)
    end = sum(len(node.key) for node in path)
    for node in path:
        start = end - len(node.key)
        if start < own_start:
            return
        current = node_depth(node)
        setattr(node, DEPTH_ATTR, depth if current is None else min(current, depth))
        end = start


def score_path(last_node: TreeNode, root: TreeNode, tag: BranchTag) -> None:
    """Set the tag's score on the path's nodes that belong to a branch at depth >= tag.depth."""
    for node in path_to_root(last_node, root):
        depth = node_depth(node)
        if depth is not None and depth >= tag.depth:
            setattr(node, SCORE_ATTR, float(tag.score))


def build_cache(ctx: Any) -> RkscRadixCache:
    """The factory SGLang's registry calls (``TreeCacheBuildContext`` -> cache), once per scheduler."""
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError(
            "--radix-cache-backend rksc supports full-attention models only "
            "(this model has sliding-window or state-space layers)"
        )
    if ctx.enable_hierarchical_cache:
        raise ValueError("--radix-cache-backend rksc does not support --enable-hierarchical-cache")
    config = RkscConfig.from_env()
    return RkscRadixCache(ctx.params, rsbcm=config.rsbcm, asks=asks_state(ctx, config) if config.asks else None)


def asks_state(ctx: Any, config: RkscConfig) -> AsksState:
    """ASKS's gate for the served model (layers, background) and its counters."""
    from radix_ext.asks import background as asks_background
    from radix_ext.asks.gate import Gate

    if ctx.tp_size > 1:
        raise ValueError("--asks needs --tp-size 1: each rank would capture a shard's signatures and could "
                         "decide differently, so ranks would disagree on the prompt")
    num_layers = ctx.model_config.num_hidden_layers
    layers = parse_layers(config.asks_layers, num_layers)
    model = getattr(getattr(ctx.tp_worker, "model_runner", None), "model", None)
    background = asks_background.load(config.asks_background, asks_background.model_fingerprint(model), layers,
                                      config.asks_pooling)
    gate = Gate(config.asks_tau, config.asks_alpha, layers, num_layers, background, config.asks_pooling)
    blend = asks_blend.BlendSettings(config.asks_recompute, config.asks_select, config.asks_fresh_tail,
                                     config.asks_max_deviation, config.asks_check_layers, config.asks_blended_donors)
    return AsksState(gate, config.asks_min_tail, int(config.asks_signature_cap_mb * 2**20), mode=config.asks_mode,
                     blend=blend)
