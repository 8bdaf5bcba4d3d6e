"""Paged attention on neuron for vLLM: the KV cache is a neuron tensor in vLLM's paged layout, written at
each step's slots; decode tokens attend through the kernel library's paged decode kernel (a block table
per sequence), prefill tokens (variable lengths, with or without cached context) through the fused SDPA
lowering over keys gathered from their blocks, all prefills of a step in one padded call.

Each step's metadata (slots, block tables, gather indices, masks) is computed once on the host, moved to
neuron once, and shared by all layers. Lengths are padded to powers of two so that a few shapes serve
all steps (each new shape is one XLA compile)."""
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType
from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
from vllm.v1.kv_cache_layout import KVCacheLayout

from ..kernels.lib import paged_attention_decode


class NeuronAttentionBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = True
    supported_dtypes = [torch.float32, torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [16, 32, 64, 128]  # the paged decode kernel's limit

    @classmethod
    def supported_kv_cache_layouts(cls):
        # each cache row [kv_heads, key | value] of one token is contiguous: a slot is one row
        return (KVCacheLayout.LBNHC,)

    @staticmethod
    def get_name() -> str:
        return "NEURON_ATTN"

    @staticmethod
    def get_impl_cls():
        return NeuronAttentionImpl

    @staticmethod
    def get_builder_cls():
        return NeuronAttentionMetadataBuilder


# vLLM's layers look their backend up by name among the registered ones
if "NEURON_ATTN" not in AttentionBackendEnum.__members__:
    register_backend("NEURON_ATTN", f"{__name__}.NeuronAttentionBackend")


@dataclass
class _Decode:
    tokens: torch.Tensor  # [decodes]: their token positions in the step
    block_table: torch.Tensor  # [decodes, blocks] int32
    seq_lens: torch.Tensor  # [decodes] int32


@dataclass
class _Prefill:
    tokens: torch.Tensor  # [prefill tokens]
    queries: torch.Tensor  # [prefills, query_len]: token positions, padded by repeating the last
    rows: torch.Tensor  # [prefills, key_len]: cache rows of each sequence's keys, padded with row 0
    mask: torch.Tensor  # [prefills, 1, query_len, key_len]: causal over cached context and new tokens
    padded: torch.Tensor  # [prefill tokens]: each token's row in the flattened padded output


@dataclass
class NeuronAttentionMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    decode: _Decode | None
    prefill: _Prefill | None


def _bucket(n: int, limit: int | None = None) -> int:
    size = 1 << max(n - 1, 0).bit_length()
    return size if limit is None else min(size, limit)


class NeuronAttentionMetadataBuilder(AttentionMetadataBuilder[NeuronAttentionMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.neuron = torch.device("neuron", torch.neuron.current_device())

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False) -> NeuronAttentionMetadata:
        m = common_attn_metadata
        if not isinstance(m.causal, bool) or not m.causal:
            raise NotImplementedError("vLLM on neuron: only causal decoder attention is supported")
        starts = m.query_start_loc_cpu.numpy()[: m.num_reqs + 1]
        query_lens = np.diff(starts)
        seq_lens = m.seq_lens[: m.num_reqs].cpu().numpy()
        table = m.block_table_tensor[: m.num_reqs].cpu().numpy()
        decodes, prefills = np.flatnonzero(query_lens == 1), np.flatnonzero(query_lens > 1)
        return NeuronAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            slot_mapping=self._put(m.slot_mapping[: m.num_actual_tokens].cpu().to(torch.int64)),
            decode=self._decode(starts[decodes], seq_lens[decodes], table[decodes]) if len(decodes) else None,
            prefill=self._prefill(starts[prefills], query_lens[prefills], seq_lens[prefills], table[prefills])
            if len(prefills) else None)

    def _put(self, value):
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(np.ascontiguousarray(value))
        return value.to(self.neuron)

    def _blocks(self, seq_lens, table) -> int:
        return _bucket(-(-int(seq_lens.max()) // self.block_size), table.shape[1])

    def _decode(self, starts, seq_lens, table) -> _Decode:
        blocks = self._blocks(seq_lens, table)
        return _Decode(self._put(starts.astype(np.int64)), self._put(table[:, :blocks].astype(np.int32)),
                       self._put(seq_lens.astype(np.int32)))

    def _prefill(self, starts, query_lens, seq_lens, table) -> _Prefill:
        query_len = _bucket(int(query_lens.max()))
        key_len = self._blocks(seq_lens, table) * self.block_size
        i, j = np.arange(query_len), np.arange(key_len)
        queries = starts[:, None] + np.minimum(i[None, :], query_lens[:, None] - 1)
        rows = np.maximum(table[:, j // self.block_size], 0) * self.block_size + j % self.block_size
        rows = np.where(j[None, :] < seq_lens[:, None], rows, 0)
        context = (seq_lens - query_lens)[:, None, None]
        mask = (j[None, None, :] <= context + i[None, :, None]) & (j[None, None, :] < seq_lens[:, None, None])
        valid = i[None, :] < query_lens[:, None]
        tokens = queries[valid]
        padded = (np.arange(len(starts))[:, None] * query_len + i[None, :])[valid]
        return _Prefill(self._put(tokens.astype(np.int64)), self._put(queries.astype(np.int64)),
                        self._put(rows.astype(np.int64)), self._put(mask[:, None]), self._put(padded.astype(np.int64)))


class NeuronAttentionImpl(AttentionImpl[NeuronAttentionMetadata]):
    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                 logits_soft_cap=None, attn_type=AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 sinks=None):
        unsupported = {"ALiBi": alibi_slopes is not None, "sliding windows": sliding_window is not None,
                       "logits soft-capping": bool(logits_soft_cap), "attention sinks": sinks is not None,
                       f"{attn_type} attention": attn_type != AttentionType.DECODER,
                       "KV cache sharing between layers": kv_sharing_target_layer_name is not None}
        for name, used in unsupported.items():
            if used:
                raise NotImplementedError(f"vLLM on neuron: {name} is not supported")
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        self.kv_sharing_target_layer_name = None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("vLLM on neuron: fused output quantization is not supported")
        if attn_metadata is None:  # a profiling run without a cache
            return output
        n, dim = attn_metadata.num_actual_tokens, self.head_size
        # [blocks, kv_heads, block_size, key | value] viewed (LBNHC) as one row per slot
        blocks, _, block_size, _ = kv_cache.shape
        rows = kv_cache.permute(0, 2, 1, 3).reshape(blocks * block_size, self.num_kv_heads, 2 * dim)
        rows.index_copy_(0, attn_metadata.slot_mapping, torch.cat([key[:n], value[:n]], -1))
        if attn_metadata.decode is not None:
            self._decode(query, rows, attn_metadata.decode, output, blocks, block_size)
        if attn_metadata.prefill is not None:
            self._prefill(query, rows, attn_metadata.prefill, output)
        return output

    def _decode(self, query, rows, decode, output, blocks, block_size):
        caches = rows.unflatten(0, (blocks, block_size))
        out = paged_attention_decode(query[decode.tokens], caches[..., : self.head_size],
                                     caches[..., self.head_size:], decode.block_table, decode.seq_lens,
                                     scale=self.scale)
        output.index_copy_(0, decode.tokens, out.to(output.dtype))

    def _prefill(self, query, rows, prefill, output):
        q = query[prefill.queries].transpose(1, 2)
        kv = rows[prefill.rows].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, kv[..., : self.head_size], kv[..., self.head_size:],
                                             attn_mask=prefill.mask, scale=self.scale, enable_gqa=True)
        out = out.transpose(1, 2).flatten(0, 1)[prefill.padded]
        output.index_copy_(0, prefill.tokens, out.to(output.dtype))
