"""Train a tiny Qwen3.5 with its MTP head on a fixed corpus (CPU, minutes), write it as an NVFP4 checkpoint, and
measure the acceptance length greedy MTP speculation would get with it: a torch simulation, not a vLLM run.

    python -m devkit.mtp_training --out /tmp/mtp-tiny [--steps 200] [--seed 0] [--max-k 3] [--results FILE.md]

* Corpus: sentences from a small seeded grammar (``corpus(seed, lines)``): word lists, templates, number facts,
  so the same seed gives the same text everywhere; held-out text is the same grammar under another seed.
* Model: Hugging Face's Qwen3_5ForConditionalGeneration (4 layers: 3 Gated-DeltaNet + 1 full attention, hidden 128)
  plus vllm_volta_fp4.testing.mtp_head.MtpHead, trained jointly: next-token loss of the main model plus the MTP's
  loss on the token after next (input at position p: embedding of token p+1 and the main model's hidden state at p).
* Checkpoint: tiny_model.write_checkpoint (``--format``, MTP excluded from quantization as real exports ship it).
* Simulation (``acceptance``): the weights read back from that checkpoint and dequantized (what volta_nvfp4 serves,
  in float32 here); per held-out prompt, the target's greedy continuation, then rounds of greedy speculation: K drafts
  chained through the MTP head (draft k+1 gets draft k's embedding and the MTP's own output hidden state, at the
  next position, as vLLM's proposer chains them), accepted while they equal the target's greedy tokens, plus the
  target's bonus token. Acceptance length = tokens per round (vLLM's "mean acceptance length").
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vllm_volta_fp4.format.checkpoint import FP8, NVFP4, Checkpoint
from vllm_volta_fp4.format.nvfp4 import dequantize_fp8, dequantize_nvfp4, quantize_fp8, quantize_nvfp4
from vllm_volta_fp4.testing.mtp_head import MTP_PREFIX, MtpHead
from vllm_volta_fp4.testing.tiny_model import (
    HybridArch,
    qwen3_5_config,
    qwen3_5_model,
    write_checkpoint,
    write_tokenizer,
)

SHAPE = HybridArch(hidden=128, intermediate=384, heads=4, kv_heads=2, head_dim=64, layers=4, gdn_key_heads=2,
                   gdn_value_heads=4, gdn_head_dim=64, conv_kernel=4, mrope_section=(4, 2, 2), mtp_layers=1)
VOCAB = 512

_WORDS = {
    "adj": ["old", "fast", "quiet", "green", "small", "bright", "heavy", "patient", "curious", "tired"],
    "noun": ["gpu", "kernel", "model", "cache", "token", "server", "student", "river", "engine", "garden"],
    "verb": ["reads", "writes", "follows", "moves", "checks", "builds", "watches", "carries"],
    "place": ["the lab", "the city", "the forest", "the data center", "the library", "the harbor"],
}
_COUNTRIES = {"france": "paris", "italy": "rome", "japan": "tokyo", "egypt": "cairo", "peru": "lima",
              "kenya": "nairobi", "spain": "madrid", "canada": "ottawa"}
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


def _sentence(rng: random.Random) -> str:
    w = {key: rng.choice(values) for key, values in _WORDS.items()}
    kind = rng.randrange(5)
    if kind == 0:
        return f"the {w['adj']} {w['noun']} {w['verb']} the {rng.choice(_WORDS['noun'])} in {w['place']}."
    if kind == 1:
        country = rng.choice(list(_COUNTRIES))
        return f"the capital of {country} is {_COUNTRIES[country]}."
    if kind == 2:
        n = rng.randrange(len(_NUMBERS) - 3)
        return " ".join(_NUMBERS[n:n + rng.randrange(3, len(_NUMBERS) - n + 1)]) + "."
    if kind == 3:
        a, b = rng.randrange(7), rng.randrange(6)
        return f"{_NUMBERS[a]} plus {_NUMBERS[b]} is {_NUMBERS[a + b]}."
    return f"every {w['noun']} in {w['place']} is {w['adj']}, and every {w['adj']} {w['noun']} {w['verb']} slowly."


def corpus(seed: int, lines: int) -> list[str]:
    """``lines`` paragraphs of 3-6 sentences from the grammar, seeded."""
    rng = random.Random(seed)
    return [" ".join(_sentence(rng) for _ in range(rng.randrange(3, 7))) for _ in range(lines)]


def _tokenize(tokenizer, lines: list[str]) -> list[list[int]]:
    return [tokenizer.encode(line).ids for line in lines]


def held_out_prompts(model_dir: Path, seed: int, count: int, length: int = 16) -> list[list[int]]:
    """The first ``length`` token ids of ``count`` paragraphs of the grammar under a seed training never saw."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [ids[:length] for ids in _tokenize(tokenizer, corpus(seed + 1000, count))]


def train(dest: Path, steps: int, seed: int, batch: int = 16, seq: int = 64, lr: float = 3e-3, log=print):
    """Train the main model and its MTP head jointly; returns (config, float weights with mtp.*, losses)."""
    from tokenizers import Tokenizer

    torch.manual_seed(seed)
    vocab = write_tokenizer(dest, VOCAB, corpus(seed, 3000))
    tokenizer = Tokenizer.from_file(str(dest / "tokenizer.json"))
    stream = torch.tensor([t for ids in _tokenize(tokenizer, corpus(seed, 3000)) for t in [*ids, 0]])
    config = qwen3_5_config(SHAPE, vocab)
    model, mtp = qwen3_5_model(config, seed), MtpHead(config, seed + 1)
    text = model.model.language_model
    params = [*text.parameters(), *model.lm_head.parameters(), *mtp.parameters()]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / steps)))
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq, (batch,), generator=generator)
        ids = torch.stack([stream[s:s + seq] for s in starts.tolist()])
        hidden = text(input_ids=ids).last_hidden_state
        main_loss = F.cross_entropy(model.lm_head(hidden[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        drafted = mtp(text.embed_tokens(ids[:, 1:]), hidden[:, :-1])  # position p: token p+1, hidden p
        mtp_loss = F.cross_entropy(model.lm_head(drafted[:, :-1]).flatten(0, 1), ids[:, 2:].flatten())
        optimizer.zero_grad()
        (main_loss + mtp_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append((main_loss.item(), mtp_loss.item()))
        if step % 25 == 0 or step == steps - 1:
            log(f"step {step}: main loss {main_loss.item():.3f}, mtp loss {mtp_loss.item():.3f}")
    weights = {name: tensor.detach().float() for name, tensor in model.state_dict().items()}
    weights.update({MTP_PREFIX + name: tensor.detach().float() for name, tensor in mtp.state_dict().items()
                    if not name.startswith("rotary.")})
    return config, weights, losses


def served_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint as float32, quantized ones decoded exactly as volta_nvfp4 decodes them."""
    checkpoint = Checkpoint(model_dir)
    modules = checkpoint.linear_modules()
    weights = {}
    for name in checkpoint.tensors:
        module, _, leaf = name.rpartition(".")
        scheme = modules.get(module)
        if scheme is None or scheme.kind not in (NVFP4, FP8):
            weights[name] = checkpoint.load(name).float()
        elif scheme.kind == NVFP4 and leaf == checkpoint.format.tensor_names(scheme)["packed"]:
            nvfp4 = checkpoint.load_nvfp4(module)
            weights[f"{module}.weight"] = dequantize_nvfp4(nvfp4.packed, nvfp4.block_scale, nvfp4.global_scale)
        elif scheme.kind == FP8 and leaf == "weight":
            weights[name] = dequantize_fp8(*checkpoint.load_fp8(module))
    return weights


def load_models(config: dict, weights: dict[str, torch.Tensor]):
    model, mtp = qwen3_5_model(config), MtpHead(config)
    model.load_state_dict({k: v for k, v in weights.items() if not k.startswith(MTP_PREFIX)}, strict=True)
    mtp.load_state_dict({k.removeprefix(MTP_PREFIX): v for k, v in weights.items() if k.startswith(MTP_PREFIX)},
                        strict=True)
    return model.eval(), mtp.eval()


@torch.no_grad()
def _greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    text = model.model.language_model
    tokens = list(prompt)
    for _ in range(new_tokens):  # full recomputation: tiny model, and no cache path to get wrong
        hidden = text(input_ids=torch.tensor([tokens])).last_hidden_state
        tokens.append(int(model.lm_head(hidden[0, -1]).argmax()))
    return tokens


@torch.no_grad()
def _rounds(model, mtp, tokens: list[int], prompt_len: int, k: int, draft_head=None) -> list[int]:
    """Accepted drafts per round of greedy speculation with ``k`` drafts over the target's greedy ``tokens``; the
    drafts are scored by ``draft_head`` (default: the model's lm_head)."""
    draft_head = draft_head or model.lm_head
    text = model.model.language_model
    ids = torch.tensor([tokens])
    hidden = text(input_ids=ids).last_hidden_state  # causal: the same as the engine's incremental states
    embed = text.embed_tokens
    accepted = []
    committed = prompt_len + 1  # the prefill's sampled token is committed before the first draft
    while committed + k <= len(tokens):
        # MTP inputs at positions 0..committed-2: (token q+1, target hidden q); then the chained drafts
        inputs_embed, inputs_hidden = embed(ids[:, 1:committed]), hidden[:, :committed - 1]
        drafts = []
        for step in range(k):
            out = mtp(inputs_embed, inputs_hidden, step)
            draft = int(draft_head(out[0, -1]).argmax())
            drafts.append(draft)
            inputs_embed = torch.cat([inputs_embed, embed(torch.tensor([[draft]]))], 1)
            inputs_hidden = torch.cat([inputs_hidden, out[:, -1:]], 1)
        good = 0
        while good < k and drafts[good] == tokens[committed + good]:
            good += 1
        accepted.append(good)
        committed += good + 1
    return accepted


NOISE_SEED = 1


def perturbed_weight(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """``weight`` as the plugin's drafter serves it (plugin/models/draft_weights.py), decoded back to float32: "fp8"
    (E4M3 with a scale per row), "nvfp4" (as one NVFP4 tensor); or, for "noise", plus seeded Gaussian noise of
    NVFP4's relative error (a control: what any perturbation of this size does)."""
    q = quantize_nvfp4(weight)
    nvfp4 = dequantize_nvfp4(q.packed, q.block_scale, q.global_scale)
    if fmt == "nvfp4":
        return nvfp4
    if fmt == "fp8":
        return dequantize_fp8(*quantize_fp8(weight, per_channel=True))
    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(NOISE_SEED))
    return weight + noise * (nvfp4 - weight).norm() / noise.norm()


@torch.no_grad()
def perturbed_drafter(model, mtp, fmt: str):
    """What the plugin's drafter runs with ``fmt``: the MTP module's 16-bit matrices replaced in ``mtp`` and a copy
    of lm_head for the drafts (verification keeps the model's); the head function and the head's relative error."""
    for module in mtp.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.copy_(perturbed_weight(module.weight, fmt))
    weight = model.lm_head.weight.detach()
    dense = perturbed_weight(weight, fmt)
    relative_error = ((dense - weight).norm() / weight.norm()).item()
    return (lambda hidden: hidden @ dense.T), relative_error


def acceptance(model, mtp, prompts: list[list[int]], new_tokens: int, max_k: int,
               draft_head=None) -> dict[int, dict]:
    """Per K: mean acceptance length (tokens per verification round) and per-position acceptance rates."""
    sequences = [(_greedy(model, prompt, new_tokens), len(prompt)) for prompt in prompts]
    results = {}
    for k in range(1, max_k + 1):
        accepted = [a for tokens, prompt_len in sequences
                    for a in _rounds(model, mtp, tokens, prompt_len, k, draft_head)]
        results[k] = {"rounds": len(accepted), "acceptance_length": 1 + sum(accepted) / len(accepted),
                      "position_rates": [sum(a > j for a in accepted) / len(accepted) for j in range(k)]}
    return results


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def results_table(args, results: dict[str, dict[int, dict]], losses, seconds: float) -> str:
    setup = (f"Date {datetime.date.today()}, commit {_commit()}, `python -m devkit.mtp_training --steps {args.steps} "
             f"--seed {args.seed} --max-k {args.max_k} --format {args.format}` ({seconds:.0f} s on "
             f"{torch.get_num_threads()} CPU threads).")
    model = (f"Model: Qwen3.5 text model, {SHAPE.layers} layers (3 Gated-DeltaNet + 1 full attention), hidden "
             f"{SHAPE.hidden}, vocab {VOCAB}, one MTP layer, trained jointly for {args.steps} steps of 16 x 64 tokens "
             "on a seeded synthetic grammar corpus (devkit/mtp_training.py); final losses main "
             f"{losses[-1][0]:.3f}, MTP {losses[-1][1]:.3f}.")
    held_out = (f"Held out: {args.prompts} prompts from the same grammar under another seed, {args.new_tokens} greedy "
                "tokens each. Acceptance length = tokens per verification round (accepted drafts + the target's bonus "
                "token).")
    caveat = ("**This is a simulation in torch** of what greedy MTP speculation accepts with these weights, not a "
              "vLLM run, and the corpus is far more predictable than real text: it shows the head is trained and "
              "wired as vLLM runs it, not what Qwen3.8 gets. The rows with the drafter's weights perturbed (the "
              "plugin's FP8 and NVFP4 drafters: MTP layer quantized and drafts on a quantized lm_head copy; and "
              "random noise as large as NVFP4's error as a control) show how much this tiny model's acceptance moves "
              "when the drafts' logits move at all; they do not rank the formats for a real model.")
    lines = ["# MTP acceptance of a tiny trained Qwen3.5 (CPU, torch simulation of greedy speculation)", "", setup, "",
             model, held_out, "", caveat, "",
             "| weights | K | rounds | acceptance length | acceptance rate per draft position |",
             "|---|---|---|---|---|"]
    for label, by_k in results.items():
        for k, row in by_k.items():
            rates = ", ".join(f"{rate:.2f}" for rate in row["position_rates"])
            lines.append(f"| {label} | {k} | {row['rounds']} | {row['acceptance_length']:.2f} | {rates} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the trained NVFP4 checkpoint")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-k", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--format", default="modelopt-nvfp4", help="tiny_model producer format of the checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, help="write the markdown table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    config, trained, losses = train(args.out, args.steps, args.seed)
    write_checkpoint(args.out, trained, config, args.format)
    (args.out / "training.json").write_text(json.dumps({"steps": args.steps, "seed": args.seed, "losses": losses}))
    prompts = held_out_prompts(args.out, args.seed, args.prompts)
    results = {}
    served = f"{args.format} (served)"
    runs = [("float32 (as trained)", trained, None), (served, served_weights(args.out), None),
            *((f"{served}, {fmt.upper()} drafter (MTP layer and lm_head copy)", served_weights(args.out), fmt)
              for fmt in ("fp8", "nvfp4")),
            (f"{served}, drafter's weights + random noise (control)", served_weights(args.out), "noise")]
    for label, weights, drafter_format in runs:
        model, mtp = load_models(config, weights)
        head = None
        if drafter_format:
            head, relative_error = perturbed_drafter(model, mtp, drafter_format)
            label += f" (lm_head relative error {100 * relative_error:.1f} %)"
        results[label] = acceptance(model, mtp, prompts, args.new_tokens, args.max_k, head)
        for k, row in results[label].items():
            print(f"{label} K={k}: acceptance length {row['acceptance_length']:.2f} over {row['rounds']} rounds")
    table = results_table(args, results, losses, time.time() - start)
    if args.results:
        args.results.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
