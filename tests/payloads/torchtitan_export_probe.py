"""torchtitan 0.2.2's llama3 debug model against a Hugging Face export; run with torchtitan importable.

    python torchtitan_export_probe.py compare STEP_DIR HF_DIR

Loads the rung checkpoint STEP_DIR (saved by torchtitan_rung_checkpoint_probe.py) into torchtitan's
plain debug model and the exported folder with transformers, and prints both models' logits gap.
torchao.float8 is imported first: a float8 all-gather checkpoint holds its weight class.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def debug_model():
    import torchtitan.protocols.train_spec as train_spec

    spec = train_spec.get_train_spec("llama3")
    args = spec.model_args["debugmodel"]
    torch.manual_seed(0)
    return spec.model_cls(args), args


def compare(step_dir: Path, hf_dir: Path) -> dict:
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpoint import ModelWrapper
    from transformers import LlamaForCausalLM

    model, args = debug_model()
    state = ModelWrapper(model)._get_state_dict()
    dcp.load(state, checkpoint_id=str(step_dir))
    model.load_state_dict(state)
    hf = LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32)
    tokens = torch.randint(0, args.vocab_size, (2, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    return {
        "max_abs_diff": (ours - theirs).abs().max().item(),
        "logit_scale": ours.abs().max().item(),
        "hf_files": sorted(p.name for p in hf_dir.iterdir()),
    }


def main(argv: list[str]) -> int:
    import torchao.float8  # noqa: F401

    print(json.dumps(compare(Path(argv[1]), Path(argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
