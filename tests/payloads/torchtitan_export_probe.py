"""torchtitan 0.2.2's llama3 debug model around the Hugging Face export; run with torchtitan importable.

    python torchtitan_export_probe.py checkpoint STEP_DIR ASSETS_DIR   save a trained-like checkpoint
    python torchtitan_export_probe.py compare STEP_DIR HF_DIR          logits: torchtitan vs transformers

`checkpoint` saves the model the way torchtitan's CheckpointManager saves a rung's last step with
last_save_model_only (ModelWrapper's state dict through torch.distributed.checkpoint into step-N),
and writes into ASSETS_DIR the Hugging Face config.json that describes the flavor (what the
download step puts there for the 8B flavor: Llama-3.1-8B's). `compare` loads the checkpoint into
torchtitan's model and the exported folder with transformers, and prints both models' logits gap.
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
    model = spec.model_cls(args)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    return model, args


def hf_config(model, args) -> dict:
    scaling = args.rope_scaling_args
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "intermediate_size": model.layers["0"].feed_forward.w1.weight.shape[0],
        "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": scaling.scaling_factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        },
        "max_position_embeddings": args.max_seq_len,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def checkpoint(step_dir: Path, assets: Path) -> dict:
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpoint import ModelWrapper

    model, args = debug_model()
    with torch.no_grad():  # move the weights off their initial values, as training would
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    dcp.save(ModelWrapper(model).state_dict(), checkpoint_id=str(step_dir))
    assets.mkdir(parents=True, exist_ok=True)
    (assets / "config.json").write_text(json.dumps(hf_config(model, args), indent=2))
    return {"saved": str(step_dir)}


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
    action, first, second = argv[0], Path(argv[1]), Path(argv[2])
    result = checkpoint(first, second) if action == "checkpoint" else compare(first, second)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
