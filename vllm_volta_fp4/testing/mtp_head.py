"""The multi-token-prediction (MTP) module of Qwen3.5 checkpoints, in torch, computed as vLLM's Qwen3_5MTP computes it.

Hugging Face's Qwen3.5 has no MTP module (it drops ``mtp.*`` at load), so this is the one place that defines it for
the tiny checkpoints (random weights) and for devkit/mtp_training.py (trained weights). Its state dict, prefixed
``mtp.``, uses the names real exports use and vLLM 0.19.1 / 0.20.2 / 0.32.0 load (models/qwen3_5_mtp.py):
``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.N.*`` (a full-attention decoder
layer, Hugging Face's own Qwen3_5DecoderLayer), ``mtp.norm``. The embedding and lm_head are the main model's.

One draft step at position p: ``norm(layer(fc(cat(norm_emb(embed(token_{p+1})), norm_hidden(hidden_p)))))``, where
``hidden_p`` is the main model's final (normed) hidden state at p, and for the k-th chained draft (k > 1) the MTP's own
output at p. The layer attends causally over the MTP's inputs at every earlier position, with rotary position p.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

MTP_PREFIX = "mtp."


def mtp_text_config(config: dict):
    """A Qwen3_5TextConfig for ``num_layers`` full-attention layers, as vLLM builds its MTP layers (sdpa: causal)."""
    from transformers import Qwen3_5TextConfig

    text = copy.deepcopy(config.get("text_config", config))
    layers = int(text.get("mtp_num_hidden_layers") or 1)
    text.update(num_hidden_layers=layers, layer_types=["full_attention"] * layers)
    mtp_config = Qwen3_5TextConfig.from_dict(text)
    mtp_config._attn_implementation = "sdpa"
    return mtp_config


class MtpHead(nn.Module):
    """Qwen3.5's MTP module; ``state_dict()`` keys are the checkpoint's without the ``mtp.`` prefix."""

    def __init__(self, config: dict, seed: int = 0):
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

        super().__init__()
        text = mtp_text_config(config)
        hidden = text.hidden_size
        torch.manual_seed(seed)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=text.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=text.rms_norm_eps)
        self.layers = nn.ModuleList(Qwen3_5DecoderLayer(text, index) for index in range(text.num_hidden_layers))
        self.norm = Qwen3_5RMSNorm(hidden, eps=text.rms_norm_eps)
        self.rotary = Qwen3_5TextRotaryEmbedding(text)
        for module in self.modules():  # Hugging Face's initialisation of the same layers
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, next_embeddings: torch.Tensor, hidden: torch.Tensor, step: int = 0) -> torch.Tensor:
        """[batch, seq, hidden] embeddings of token p+1 and hidden states at p → the MTP's normed hidden at p
        (positions 0..seq-1); ``step`` picks the layer as vLLM does (step mod the number of layers)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeddings), self.pre_fc_norm_hidden(hidden)], -1))
        positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        x = self.layers[step % len(self.layers)](x, position_embeddings=self.rotary(x, positions),
                                                 position_ids=positions)
        return self.norm(x)


def mtp_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """float32 ``mtp.*`` tensors of a randomly initialised MtpHead, named as real checkpoints name them."""
    head = MtpHead(config, seed)
    return {MTP_PREFIX + name: tensor.detach().float().contiguous() for name, tensor in head.state_dict().items()
            if not name.startswith("rotary.")}
