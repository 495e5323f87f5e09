"""Build-time check of a training image (the last step of payloads/Dockerfile and Dockerfile.cuda).

It asserts that every pin of the image's requirements file is installed at exactly its version,
that the modules the pipeline steps import load and, on the CUDA image, that each speed lever
applies to a tiny model (an import alone passes a liger-kernel that refuses the pinned transformers
at apply time), that the EFA plugin NCCL loads (aws-ofi-nccl) is present and that `python` and
`python3` on PATH are the interpreter holding the pins (the base's venv), and that the base is the
DLC variant the build asked for, so a drifted or broken environment fails the image build
instead of the first training job on the cluster. The
versions are read from the requirements file itself; nothing here retypes them.

On the Trainium2 image (torchneuron) it also asserts that torch_xla is absent. On a serving image
(Dockerfile.serve, --family serving) it checks the pins and that vLLM's server and lm-eval import.

Usage: python3 verify_env.py [--family neuron|cuda|torchneuron|serving] [--variant ec2|sagemaker] REQUIREMENTS_FILE
(exit 0 ok, 1 check failed, 2 bad input)
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import shutil
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# (module, names it must export): what the pipeline steps import on the cluster. The training
# model class is the one in optimum.neuron.models.training, not the inference class of that name.
NEURON_IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch_neuronx", ()),
    ("neuronx_distributed", ()),
    ("optimum.neuron", ("NeuronSFTTrainer", "NeuronSFTConfig", "NeuronTrainingArguments")),
    ("optimum.neuron.models.training", ("NeuronModelForCausalLM",)),
    ("transformers", ()),
    ("trl", ()),
    ("peft", ()),
)
KEY_IMPORTS = NEURON_IMPORTS  # the Neuron image's set, under the name the Neuron tests use
# The GPU lane: torchtitan (pretraining), torchao (float8), the fine-tuning stack and its levers.
CUDA_IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ()),
    ("torchao.float8", ()),
    ("torchtitan", ()),
    ("transformers", ()),
    ("trl", ("SFTTrainer", "SFTConfig")),
    ("peft", ("LoraConfig",)),
    ("accelerate", ()),
    ("bitsandbytes", ()),
    ("liger_kernel.transformers", ()),
)
# Trainium2 (TorchNeuron): torch-neuronx's native device plugin and the fine-tuning stack.
TORCHNEURON_IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch_neuronx", ()),
    ("transformers", ()),
    ("trl", ("SFTTrainer", "SFTConfig")),
    ("peft", ("LoraConfig",)),
    ("accelerate", ()),
)
# The serving image (Dockerfile.serve, any accelerator): vLLM's OpenAI-compatible server and lm-eval's task
# manager and its API model (the benchmark step's), the AWS SDK; importing them needs no device.
SERVING_IMPORTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm", ()),
    ("vllm.entrypoints.openai.api_server", ()),
    ("lm_eval", ("simple_evaluate",)),
    ("lm_eval.tasks", ("TaskManager",)),
    ("lm_eval.models.openai_completions", ()),
    ("boto3", ()),  # the download step reads the Hub token's secret with it
)
FAMILY_IMPORTS = {
    "neuron": NEURON_IMPORTS,
    "cuda": CUDA_IMPORTS,
    "torchneuron": TORCHNEURON_IMPORTS,
    "serving": SERVING_IMPORTS,
}
# Modules an image must not hold: with torch_xla present accelerate and transformers take their XLA
# branch before the native `neuron` device (tests/payloads/test_trn2_contract.py), and the torch engine
# would train through torch-xla or not at all.
FAMILY_ABSENT = {"torchneuron": ("torch_xla",)}
# NCCL reaches EFA through the aws-ofi-nccl plugin (libnccl-net*.so); AWS's images install it with
# the EFA installer (the amzn2023 line in /opt/amazon/ofi-nccl/lib64). Any one of these places will do.
NCCL_EFA_PLUGIN_GLOBS = (
    "/opt/amazon/ofi-nccl/**/libnccl-net*.so",
    "/opt/aws-ofi-nccl/**/libnccl-net*.so",
    "/usr/local/lib/libnccl-net*.so",
    "/usr/lib/x86_64-linux-gnu/libnccl-net*.so",
)

# What tells AWS's two PyTorch training image variants apart from inside: the -sagemaker target
# installs the SageMaker training toolkit on the shared stage, the -ec2 target does not.
VARIANT_MARKER = "sagemaker-training"
VARIANTS = ("ec2", "sagemaker")


class PinError(ValueError):
    """The requirements file holds something other than exact `name==version` pins."""


def read_pins(path: Path) -> dict[str, str]:
    """Return {distribution name: exact version}; every non-comment line must be `name==version`."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path.name}:{number}"
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            raise PinError(f"{where}: {line!r} is not a requirement ({exc}); write name==version") from exc
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise PinError(f"{where}: {line!r} must pin one exact version with == (no ranges, no wildcards)")
        if requirement.marker is not None:
            raise PinError(f"{where}: {line!r} has an environment marker; the cluster set is unconditional")
        name = canonicalize_name(requirement.name)
        if name in pins:
            raise PinError(f"{where}: {requirement.name} is pinned twice")
        pins[name] = specs[0].version
    if not pins:
        raise PinError(f"{path.name}: no pins found")
    return pins


def version_problems(pins: dict[str, str]) -> list[str]:
    """One message per pin that is missing or installed at another version.

    A local version label (torch's `+cpu`, Neuron's `+<commit>`) is ignored, as pip does for `==`.
    """
    problems = []
    for name, wanted in sorted(pins.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed (pinned {wanted})")
            continue
        if Version(installed).public != Version(wanted).public:
            problems.append(f"{name}: installed {installed}, pinned {wanted}")
    return problems


def import_problems(imports=KEY_IMPORTS) -> list[str]:
    """One message per module that fails to import or lacks a name it must export."""
    problems = []
    for module_name, names in imports:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # any import-time failure is a broken image, report them all
            problems.append(f"import {module_name}: {type(exc).__name__}: {exc}")
            continue
        for name in names:
            try:  # lazy modules (optimum.neuron) import on attribute access, and may fail there
                getattr(module, name)
            except AttributeError:
                problems.append(f"{module_name}.{name}: missing")
            except Exception as exc:
                problems.append(f"{module_name}.{name}: {type(exc).__name__}: {exc}")
    return problems


def absent_problems(family: str) -> list[str]:
    """A module this family's image must not hold (find_spec: nothing is imported)."""
    return [
        f"{module}: installed, but the {family} image must not hold it (it takes accelerate's device branch first)"
        for module in FAMILY_ABSENT.get(family, ())
        if importlib.util.find_spec(module) is not None
    ]


def file_problems(family: str, root: str = "/") -> list[str]:
    """On the CUDA image: the NCCL EFA plugin must be installed (no GPU needed to see the file)."""
    if family != "cuda":
        return []
    base = root.rstrip("/")
    found = [path for pattern in NCCL_EFA_PLUGIN_GLOBS for path in glob.glob(base + pattern, recursive=True)]
    if found:
        return []
    return ["NCCL EFA plugin (aws-ofi-nccl, libnccl-net*.so) not found in " + ", ".join(NCCL_EFA_PLUGIN_GLOBS)]


# The names the pipeline steps start Python by (slurm scripts, jobs' drivers).
STEP_INTERPRETERS = ("python", "python3")


def interpreter_problems(family: str) -> list[str]:
    """On the CUDA image: each interpreter name on PATH is this one (the base's venv, where pip put the
    pins), so a step never starts another Python that lacks them."""
    if family != "cuda":
        return []
    here = Path(sys.executable).parent
    problems = []
    for name in STEP_INTERPRETERS:
        found = shutil.which(name)
        if found is None or Path(found).parent != here:
            problems.append(f"`{name}` on PATH is {found or 'missing'}, not the interpreter holding the pins ({here})")
    return problems


def variant_problems(variant: str | None) -> list[str]:
    """The base is the variant the build argument named (none named: nothing to check)."""
    if variant is None:
        return []
    try:
        metadata.version(VARIANT_MARKER)
        has_toolkit = True
    except metadata.PackageNotFoundError:
        has_toolkit = False
    if has_toolkit == (variant == "sagemaker"):
        return []
    state = "installed" if has_toolkit else "missing"
    return [
        f"base variant {variant}: the SageMaker training toolkit ({VARIANT_MARKER}) is {state}; FROM is another image"
    ]


def apply_liger() -> None:
    """liger-kernel's Llama patch, then a tiny Llama built from the patched classes."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers import LlamaConfig, LlamaForCausalLM

    apply_liger_kernel_to_llama()  # raises where the liger release does not support this transformers
    tiny = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    norm = type(LlamaForCausalLM(tiny).model.norm).__name__
    if not norm.startswith("Liger"):
        raise RuntimeError(f"the patched Llama still builds {norm}, not liger's RMSNorm")


def load_flash_attention() -> None:
    """flash-attn's compiled CUDA extension (built for one torch) and the variable-length entry point."""
    importlib.import_module("flash_attn_2_cuda")
    from flash_attn import flash_attn_varlen_func  # noqa: F401  (packing's path)


def quantize_4bit() -> None:
    """A bitsandbytes NF4 round trip in bf16 storage, as the qlora method loads its base."""
    import bitsandbytes.functional as bnb
    import torch

    weight = torch.linspace(-1, 1, 64 * 64, dtype=torch.bfloat16).reshape(64, 64)
    packed, state = bnb.quantize_4bit(weight, quant_type="nf4", quant_storage=torch.bfloat16)
    if packed.dtype != torch.bfloat16:
        raise RuntimeError(f"packed 4-bit storage is {packed.dtype}, not bfloat16")
    error = (bnb.dequantize_4bit(packed, state) - weight).abs().max().item()
    if error > 0.1:  # NF4 steps near +-1 are about 0.07 apart
        raise RuntimeError(f"NF4 round trip is off by {error:.3f}")


# (lever, check): on the CUDA image every speed lever must work, not just import.
CUDA_LEVERS = (("liger-kernel", apply_liger), ("flash-attn", load_flash_attention), ("bitsandbytes", quantize_4bit))
FAMILY_LEVERS = {"neuron": (), "cuda": CUDA_LEVERS, "torchneuron": (), "serving": ()}


def lever_problems(levers) -> list[str]:
    """One message per lever whose check raises."""
    problems = []
    for name, check in levers:
        try:
            check()
        except Exception as exc:  # report every broken lever, not only the first
            problems.append(f"{name} lever ({check.__name__}): {type(exc).__name__}: {exc}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILY_IMPORTS), default="neuron", help="which image this is")
    parser.add_argument("--variant", choices=VARIANTS, help="the DLC base variant the image was built from")
    parser.add_argument("requirements", type=Path, help="the pinned requirements file the image installed")
    args = parser.parse_args(argv)
    if not args.requirements.is_file():
        print(f"error: {args.requirements} not found; pass the requirements file copied into the image")
        return 2
    try:
        pins = read_pins(args.requirements)
    except PinError as exc:
        print(f"error: {exc}")
        return 2
    imports = FAMILY_IMPORTS[args.family]
    print(f"checking {len(pins)} pins from {args.requirements.name} and {len(imports)} key imports ({args.family})")
    levers = FAMILY_LEVERS[args.family]
    problems = version_problems(pins) + import_problems(imports) + lever_problems(levers)
    problems += file_problems(args.family) + interpreter_problems(args.family) + variant_problems(args.variant)
    problems += absent_problems(args.family)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        print(f"error: the image environment does not match {args.requirements.name} ({len(problems)} problems)")
        return 1
    print(f"ok: every pin installed at its version, every key import loads, {len(levers)} levers apply")
    return 0


if __name__ == "__main__":
    sys.exit(main())
