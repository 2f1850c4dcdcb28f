"""Our NLP surgeries on a Hugging Face BERT against Composer's, on the same weights and the same batch.

Usage: python benchmarks/hf_surgery_vs_composer.py [--peer-python PATH] [--threads 1]

A BERT for masked LM (4 layers, width 64, 4 heads, random weights, positions up to 64) is built here; its
state dict goes to the peer (Composer 0.32.1 with transformers 4.51, which Composer's BERT surgery needs:
``pip install transformers==4.51.3`` into the peer environment). Both sides apply the surgery to the same
weights and run the same padded batch in evaluation mode; the table prints the largest difference of the
logits over the tokens the mask keeps, and that of the unsurgered models (the floor both sides share).

- ALiBi (``max_sequence_length=128``) on 96-token rows, longer than the 64 positions the model had: Composer's
  eager forward against our ``sdpa`` and ``eager`` attention. Composer's surgery leaves BERT's 64-long
  ``token_type_ids`` buffer as it was, so its model fails on such rows unless they are given; both sides are
  given them (ours gives the same logits without).
- LowPrecisionLayerNorm under CPU bfloat16 autocast.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from _peer import Peer, PeerError, find_peer_python, format_table, pin_threads

from composer_fn.algorithms.alibi import apply_alibi
from composer_fn.algorithms.low_precision_layernorm import apply_low_precision_layernorm

CONFIG: dict[str, Any] = dict(
    vocab_size=100,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)

PEER_SOURCE = r"""
import torch, transformers
from transformers import BertConfig, BertForMaskedLM
from composer.algorithms.alibi import apply_alibi
from composer.algorithms.low_precision_layernorm import apply_low_precision_layernorm

def setup():
    return {"transformers": transformers.__version__}

def logits(path, surgery, config):
    saved = torch.load(path)
    model = BertForMaskedLM(BertConfig(**config, attn_implementation="eager"))
    missing, unexpected = model.load_state_dict(saved["state"], strict=False)
    assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
    model.eval()
    if surgery == "alibi":
        apply_alibi(model, max_sequence_length=128)
    elif surgery == "lpln":
        apply_low_precision_layernorm(model, optimizers=None, precision="amp_bf16")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=surgery in ("lpln", "none-bf16")):
        # Composer's BERT surgery keeps the 64-long token_type_ids buffer: longer rows need them given.
        out = model(
            input_ids=saved["ids"], attention_mask=saved["mask"], token_type_ids=torch.zeros_like(saved["ids"])
        ).logits.float()
    torch.save(out, path + "." + surgery)
    return path + "." + surgery
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    pin_threads(args.threads)
    python = find_peer_python(args.peer_python)
    if python is None:
        sys.exit("no peer environment: build it with ../shared/tools/peer-env.sh")
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    models = {
        impl: BertForMaskedLM(BertConfig(**CONFIG, attn_implementation=impl)).eval()
        for impl in ("sdpa", "eager")
    }
    models["eager"].load_state_dict(models["sdpa"].state_dict())
    ids = torch.randint(0, CONFIG["vocab_size"], (4, 96))
    mask = torch.ones_like(ids)
    mask[1, 70:] = 0
    mask[3, 20:] = 0
    short = (ids[:, :60], mask[:, :60])
    rows: list[list[str]] = []
    with (
        tempfile.TemporaryDirectory() as folder,
        Peer(python, PEER_SOURCE, threads=args.threads).start() as peer,
    ):
        try:
            info = peer.wait_ready()
        except PeerError as error:
            sys.exit(f"the peer failed: {error}")
        cases = [
            ("no surgery (60 tokens)", "none", short, lambda m: m, False),
            ("ALiBi (96 tokens)", "alibi", (ids, mask), lambda m: apply_alibi(m, 128), False),
            ("no surgery, bf16 autocast", "none-bf16", short, lambda m: m, True),
            ("LowPrecisionLayerNorm, bf16 autocast", "lpln", short, apply_low_precision_layernorm, True),
        ]
        for label, surgery, (batch_ids, batch_mask), ours, autocast in cases:
            path = str(Path(folder) / f"{surgery}.pt")
            torch.save({"state": models["sdpa"].state_dict(), "ids": batch_ids, "mask": batch_mask}, path)
            theirs = torch.load(peer.call("logits", path=path, surgery=surgery, config=CONFIG))
            keep = batch_mask.bool()
            cells = [label]
            for impl in ("sdpa", "eager"):
                model = ours(models[impl])
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    out = model(input_ids=batch_ids, attention_mask=batch_mask).logits.float()
                    if surgery == "alibi":  # ours lengthened the buffer: the token types are not needed
                        given = model(
                            input_ids=batch_ids,
                            attention_mask=batch_mask,
                            token_type_ids=torch.zeros_like(batch_ids),
                        ).logits.float()
                        assert torch.equal(out, given)
                cells.append(f"{(out - theirs)[keep].abs().max().item():.2e}")
            cells.append(f"{theirs[keep].abs().max().item():.2f}")
            rows.append(cells)
    print(f"peer: Composer 0.32.1, transformers {info['transformers']}; ours: torch {torch.__version__}")
    header = ["surgery", "max |ours - Composer| (sdpa)", "(eager)", "max |logit|"]
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
