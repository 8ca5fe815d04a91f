"""Tensor parallel 1-8 on Qwen3.8-27B-shaped layers, through vLLM's own layers and weight loaders (ranks simulated
in one process): every rank's packed weights, block scales and per-row global scales are exactly its slice of the
full tensors, KV heads are replicated when ranks outnumber them, and each rank's output is its slice of y = x·Wᵀ.

Widths: the real attention geometry (24 query / 4 KV heads of 256, o_proj K = 6144) and Gated-DeltaNet projection
rows (16 key / 48 value heads of 128); hidden 5120 and intermediate 17408 scaled by 1/8 to 640 and 2176, which keeps
every divisibility the real model has at TP 8 (2176/8 = 272 = 17 blocks of 16, 6144/8 = 768 = 48 blocks)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tests.conftest import requires_vllm
from vllm_volta_fp4.format.checkpoint import parse_quant_config
from vllm_volta_fp4.format.nvfp4 import dequantize_nvfp4, quantize_nvfp4

pytestmark = requires_vllm

HIDDEN, INTERMEDIATE = 640, 2176
HEADS, KV_HEADS, HEAD_DIM = 24, 4, 256
KEY_DIM, VALUE_DIM = 16 * 128, 48 * 128


@dataclass(frozen=True)
class LayerSpec:
    kind: str  # "qkv", "merged" or "row"
    # (checkpoint name, rows, shard id). A tuple shard id is one checkpoint tensor spanning several fused shards
    # (Qwen3.5's in_proj_qkv → shards 0-2 of in_proj_qkvz), with one global scale; ``pieces`` gives their rows.
    shards: tuple[tuple[str, int, int | str | tuple[int, ...] | None], ...]
    input_size: int
    pieces: dict[str, tuple[int, ...]] | None = None

    def rows_by_piece(self, shard: str, rows: int) -> tuple[int, ...]:
        return (self.pieces or {}).get(shard, (rows,))

    @property
    def output_sizes(self) -> list[int]:
        return [piece for shard, rows, _ in self.shards for piece in self.rows_by_piece(shard, rows)]


SPECS = {
    "attention.qkv": LayerSpec("qkv", (("q_proj", HEADS * HEAD_DIM, "q"), ("k_proj", KV_HEADS * HEAD_DIM, "k"),
                                       ("v_proj", KV_HEADS * HEAD_DIM, "v")), HIDDEN),
    "attention.o": LayerSpec("row", (("o_proj", HIDDEN, None),), HEADS * HEAD_DIM),
    "mlp.gate_up": LayerSpec("merged", (("gate_proj", INTERMEDIATE, 0), ("up_proj", INTERMEDIATE, 1)), HIDDEN),
    "mlp.down": LayerSpec("row", (("down_proj", HIDDEN, None),), INTERMEDIATE),
    "gdn.in_proj_qkvz": LayerSpec("merged", (("in_proj_qkv", 2 * KEY_DIM + VALUE_DIM, (0, 1, 2)),
                                             ("in_proj_z", VALUE_DIM, 3)), HIDDEN,
                                  pieces={"in_proj_qkv": (KEY_DIM, KEY_DIM, VALUE_DIM)}),
    "gdn.out_proj": LayerSpec("row", (("out_proj", HIDDEN, None),), VALUE_DIM),
}


@pytest.fixture(scope="module")
def quantized_layers():
    """Each shard quantized on its own (own global scale), different magnitudes per shard."""
    generator = torch.Generator().manual_seed(27)
    layers = {}
    for name, spec in SPECS.items():
        layers[name] = {shard: quantize_nvfp4(torch.randn(rows, spec.input_size, generator=generator)
                                              * (index + 1) ** 2)
                        for index, (shard, rows, _) in enumerate(spec.shards)}
    return layers


def _config():
    import vllm_volta_fp4
    from vllm_volta_fp4.plugin.quantization.config import VoltaNvfp4Config

    vllm_volta_fp4.register()
    return VoltaNvfp4Config(parse_quant_config({"producer": {"name": "modelopt"},
                                                "quantization": {"quant_algo": "W4A16_NVFP4"}}))


def _build(spec: LayerSpec):
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear

    config = _config()
    if spec.kind == "qkv":
        return QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=False, quant_config=config,
                                 prefix="model.layers.3.self_attn.qkv_proj")
    if spec.kind == "merged":
        return MergedColumnParallelLinear(spec.input_size, spec.output_sizes, bias=False,
                                          quant_config=config, prefix="model.layers.0.merged")
    return RowParallelLinear(spec.input_size, spec.shards[0][1], bias=False, quant_config=config,
                             prefix="model.layers.0.row")


def _rows_of_rank(spec: LayerSpec, shard_id, rows: int, rank: int, tp: int) -> slice:
    """Which output rows of a shard vLLM gives to ``rank``: an even split, or for K/V with fewer heads than
    ranks, the head group this rank replicates."""
    if spec.kind == "row":
        return slice(0, rows)
    if shard_id in ("k", "v") and KV_HEADS < tp:
        group = rank // (tp // KV_HEADS)
        return slice(group * HEAD_DIM, (group + 1) * HEAD_DIM)
    per_rank = rows // tp
    return slice(rank * per_rank, (rank + 1) * per_rank)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_rank_holds_exactly_its_slice(simulated_tp, quantized_layers, name, tp):
    spec, shards = SPECS[name], quantized_layers[name]
    columns = spec.input_size // tp if spec.kind == "row" else spec.input_size
    x = torch.randn(2, columns, generator=torch.Generator().manual_seed(tp))
    for rank in range(tp):
        simulated_tp(rank, tp)
        layer = _build(spec)
        for shard, _, shard_id in spec.shards:
            for leaf, tensor in (("weight", shards[shard].packed), ("weight_scale", shards[shard].block_scale),
                                 ("weight_scale_2", shards[shard].global_scale)):
                param = getattr(layer, leaf)
                param.weight_loader(param, tensor, *(() if shard_id is None else (shard_id,)))
        layer.quant_method.process_weights_after_loading(layer)
        cols = slice(rank * columns, (rank + 1) * columns) if spec.kind == "row" else slice(None)
        expected_packed, expected_scales, expected_global, dense = [], [], [], []
        for shard, rows, shard_id in spec.shards:
            q = shards[shard]
            packed_cols = slice(cols.start // 2, cols.stop // 2) if spec.kind == "row" else cols
            scale_cols = slice(cols.start // 16, cols.stop // 16) if spec.kind == "row" else cols
            offset = 0
            for piece in spec.rows_by_piece(shard, rows):
                part = _rows_of_rank(spec, shard_id, piece, rank, tp)
                own = slice(offset + part.start, offset + part.stop)
                offset += piece
                expected_packed.append(q.packed[own, packed_cols])
                expected_scales.append(q.block_scale.view(torch.uint8)[own, scale_cols])
                expected_global.append(q.global_scale.expand(own.stop - own.start))
                dense.append(dequantize_nvfp4(q.packed, q.block_scale, q.global_scale)[own, cols])
        assert torch.equal(layer.volta_packed, torch.cat(expected_packed)), (name, tp, rank)
        assert torch.equal(layer.volta_block_scale.view(torch.uint8), torch.cat(expected_scales)), (name, tp, rank)
        assert torch.equal(layer.volta_global_scale, torch.cat(expected_global)), (name, tp, rank)
        expected = x.double() @ torch.cat(dense).double().T
        got = layer.quant_method.apply(layer, x)
        # float32 accumulation over up to 6144 products: compare norms, not elements
        assert float((got.double() - expected).norm() / expected.norm()) < 1e-5, (name, tp, rank)


def test_kv_heads_are_replicated_when_ranks_outnumber_them(simulated_tp, quantized_layers):
    spec, shards = SPECS["attention.qkv"], quantized_layers["attention.qkv"]
    held = []
    for rank in range(8):
        simulated_tp(rank, 8)
        layer = _build(spec)
        for shard, _, shard_id in spec.shards:
            param = layer.weight
            param.weight_loader(param, shards[shard].packed, shard_id)
        q_rows = HEADS * HEAD_DIM // 8
        held.append(layer.weight.data[q_rows:q_rows + HEAD_DIM])  # this rank's single K head
    for rank in range(8):  # ranks 2g and 2g+1 share K head g
        assert torch.equal(held[rank], shards["k_proj"].packed[rank // 2 * HEAD_DIM:(rank // 2 + 1) * HEAD_DIM])
    assert torch.equal(held[0], held[1]) and not torch.equal(held[1], held[2])


def test_a_row_parallel_split_off_block_boundaries_names_the_layer(simulated_tp):
    from vllm.model_executor.layers.linear import RowParallelLinear

    simulated_tp(0, 8)
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.down_proj' has 136 input features.*multiple of 16"):
        RowParallelLinear(1088, HIDDEN, bias=False, quant_config=_config(), prefix="model.layers.0.mlp.down_proj")


def test_a_tensor_spanning_several_fused_shards_scales_each_of_them(simulated_tp):
    """vLLM 0.19.1 / 0.20 load a per-tensor scale that arrives with a tuple shard id (Qwen3.5's in_proj_qkv into
    in_proj_qkvz) into slot 0 only; the plugin's scale parameters give it to every shard the tensor covers."""
    from vllm_volta_fp4.plugin.quantization.linear_method import per_shard_scale

    simulated_tp(0, 1)

    def loader_of_vllm_0_19(param, loaded_weight, shard_id=None):  # its PerTensorScaleParameter behaviour
        param.data[0 if shard_id is None or isinstance(shard_id, tuple) else shard_id] = loaded_weight

    layer = torch.nn.Module()
    scale = per_shard_scale(layer, "weight_scale_2", 4, loader_of_vllm_0_19)
    scale.weight_loader(scale, torch.tensor(2.0), (0, 1, 2))
    assert layer.volta_loaded["weight_scale_2"] == {0, 1, 2}  # shard 3 not loaded yet, and known not to be
    scale.weight_loader(scale, torch.tensor(5.0), 3)
    assert scale.data.tolist() == [2.0, 2.0, 2.0, 5.0]
    assert layer.volta_loaded["weight_scale_2"] == {0, 1, 2, 3}
