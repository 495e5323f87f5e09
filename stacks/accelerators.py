"""The accelerator table: what each compute instance type carries, written once (stdlib only).

It feeds config validation (known types, deep health checks), the per-partition facts the nodes
get (accelerator, devices per node, EFA interfaces) and so the launch (processes per node), and
which training images a config needs. hpctl and the SageMaker-jobs lane read it too.

Source: Amazon EC2 instance types guide, "Accelerated computing" specifications (accelerators per
instance; network specifications, column "Maximum EFA interfaces"),
https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (p5's 32 EFA devices also appear in
the EC2 EFA guide's P5 example, efa-acc-inst-types.html), and the AWS Neuron docs' Trn1/Trn2
architecture pages for NeuronCores (trn2 counted at the default logical size LNC=2). Only types
HyperPod offers for cluster instance groups (botocore's ClusterInstanceType enum) are listed.

CUDA compute capability per GPU model: NVIDIA's "CUDA GPUs - Compute Capability" table,
https://developer.nvidia.com/cuda-gpus (L4 and L40S are Ada, 8.9; H100/H200 Hopper, 9.0; B200
Blackwell, 10.0; B300 Blackwell Ultra, 10.3; RTX PRO 6000 Blackwell Server Edition, 12.0). It
decides what a GPU can run: FP8 matmuls (torchao's float8 training, the torchtitan ladder's FP8
rungs) need 8.9 or newer; CUDA 13 builds need 7.5 or newer (no V100).
EFA device RDMA (GPUDirect RDMA) is marked for the P (p4d, p5, p6) and Trn families, where AWS
documents it; the g5/g6/g6e/g7e rows leave it off: off only costs speed where a type might allow it,
while on where it is not valid breaks EFA transfers (see ``efa_device_rdma``). Types HyperPod offers
that the cluster cannot run are refused by name (``REFUSED_INSTANCE_TYPES``).
"""

from __future__ import annotations

from dataclasses import dataclass

NEURON = "neuron"
CUDA = "cuda"
NO_ACCELERATOR = "none"
# Training images by runtime: Trainium2 runs TorchNeuron (torch-neuronx's native `neuron` device, the
# torch engine; payloads/Dockerfile.trn2), not the trn1 image's torch-xla and optimum-neuron.
TORCHNEURON = "torchneuron"
# Image families the SageMaker-jobs lane does not build and `hpctl job submit` refuses: the Trainium2
# image has not run as a training job (its entry point, channels and compile-cache sync are the trn1 and
# CUDA images'), so trn2 runs on the cluster lane (hpctl submit) only.
CLUSTER_ONLY_FAMILIES = (TORCHNEURON,)
# Trainium2 chip, dense bf16 (Neuron docs, Trainium2 architecture page): 667 TFLOP/s, 16 chips per
# trn2.48xlarge (10.7 PFLOP/s per node); at LNC=2 a chip is 4 logical NeuronCores, one rank each.
TRAINIUM2_CHIP_BF16_TFLOPS = 667.0

# (major, minor) per NVIDIA GPU model, including models of training-job types the cluster table
# does not list (V100 on ml.p3, T4 on ml.g4dn), so a capability gate can name them too.
GPU_CUDA_CAPABILITY: dict[str, tuple[int, int]] = {
    "V100": (7, 0),
    "T4": (7, 5),
    "A100": (8, 0),
    "A10G": (8, 6),
    "L4": (8, 9),
    "L40S": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "B200": (10, 0),
    "B300": (10, 3),
    "RTX PRO 6000": (12, 0),  # the Blackwell Server Edition of ml.g7e
    "RTX PRO 4500": (12, 0),  # the Blackwell Server Edition of ml.g7 (GB203; NVIDIA MIG guide, supported GPUs)
}
FP8_MIN_CUDA_CAPABILITY = (8, 9)  # Ada/Hopper FP8 tensor cores; torchao float8 refuses older GPUs
# The CUDA training image (payloads/Dockerfile.cuda) is built on CUDA 13.0, whose toolkit and
# torch wheels support compute capability 7.5 and newer (Turing on): V100 (ml.p3) cannot run it.
CUDA_IMAGE_MIN_CAPABILITY = (7, 5)


@dataclass(frozen=True)
class InstanceFacts:
    """One instance type as the cluster uses it."""

    accelerator: str  # neuron | cuda | none
    devices: int  # NeuronCores (logical) or GPUs per node: processes per node at launch; 0 without one
    efa_interfaces: int  # EFA network interfaces per node (0: no EFA)
    device_model: str = ""  # for people: H100, A10G, Trainium, ...
    # EFA reads and writes accelerator memory directly (GPUDirect RDMA / Neuron): libfabric's
    # FI_EFA_USE_DEVICE_RDMA=1 is only valid where this holds (p4d, p5, trn; not g5).
    efa_device_rdma: bool = False
    # NVIDIA compute capability (major, minor); None for Trainium and CPU-only types.
    cuda_capability: tuple[int, int] | None = None
    # The training image family when it is not the accelerator's own (TORCHNEURON for Trainium2).
    runtime: str = ""
    # Dense bf16 peak of the whole node, TFLOP/s, where the payload's own table lacks the device
    # (llm_pipeline.training.metrics): it reaches training as HPL_PEAK_TFLOPS per rank for MFU.
    peak_bf16_tflops: float = 0.0
    # Host memory, GiB (EC2 instance types guide, "Memory (GiB)"); prepare checks a full fine-tuning load
    # against it (llm_pipeline.training.full_rules.check_host_memory, HPL_HOST_MEMORY_GIB). 0: not recorded.
    host_memory_gib: int = 0

    @property
    def image_family(self) -> str:
        """The training image this type runs: its runtime, else its accelerator."""
        return self.runtime or self.accelerator

    @property
    def peak_tflops_per_device(self) -> float:
        """The MFU peak of one rank (0: the payload decides, or no MFU)."""
        return self.peak_bf16_tflops / self.devices if self.devices and self.peak_bf16_tflops else 0.0

    @property
    def accelerated(self) -> bool:
        return self.accelerator != NO_ACCELERATOR

    def meets_cuda_capability(self, minimum: tuple[int, int]) -> bool:
        """True for an NVIDIA type whose GPUs have at least this compute capability."""
        return self.cuda_capability is not None and self.cuda_capability >= minimum

    @property
    def supports_fp8(self) -> bool:
        """FP8 tensor-core matmuls (torchao float8, the ladder's FP8 rungs): capability 8.9 or newer."""
        return self.meets_cuda_capability(FP8_MIN_CUDA_CAPABILITY)


def _gpu(gpu: str, gpus: int, efa_interfaces: int, *, memory: str = "", device_rdma: bool = False) -> InstanceFacts:
    """An NVIDIA row: its compute capability comes from the GPU model, written once above."""
    model = f"{gpu} {memory}" if memory else gpu
    return InstanceFacts(CUDA, gpus, efa_interfaces, model, device_rdma, GPU_CUDA_CAPABILITY[gpu])


def _cpu(*sizes: str, family: str) -> dict[str, InstanceFacts]:
    return {f"ml.{family}.{size}": InstanceFacts(NO_ACCELERATOR, 0, 0) for size in sizes}


INSTANCE_TYPES: dict[str, InstanceFacts] = {
    # Trainium (NeuronCores per node)
    "ml.trn1.32xlarge": InstanceFacts(NEURON, 32, 8, "Trainium", efa_device_rdma=True, host_memory_gib=512),
    "ml.trn1n.32xlarge": InstanceFacts(NEURON, 32, 16, "Trainium", efa_device_rdma=True, host_memory_gib=512),
    # 2 TiB host memory (Neuron's Trn2 architecture page; the EC2 guide's 2,048 GiB)
    "ml.trn2.48xlarge": InstanceFacts(
        NEURON,
        64,
        16,
        "Trainium2",
        True,
        runtime=TORCHNEURON,
        peak_bf16_tflops=16 * TRAINIUM2_CHIP_BF16_TFLOPS,
        host_memory_gib=2048,
    ),
    # One Trainium2 chip (4 logical NeuronCores) and one EFA, as AWS's HyperPod CLI records it (INSTANCE_RESOURCES,
    # cited below). Device RDMA is not in that source, so it stays off (EFA without it is slower, not broken).
    "ml.trn2.3xlarge": InstanceFacts(
        NEURON, 4, 1, "Trainium2", runtime=TORCHNEURON, peak_bf16_tflops=TRAINIUM2_CHIP_BF16_TFLOPS, host_memory_gib=128
    ),
    # NVIDIA (GPUs per node, EFA interfaces)
    "ml.p4d.24xlarge": _gpu("A100", 8, 4, memory="40GB", device_rdma=True),
    "ml.p4de.24xlarge": _gpu("A100", 8, 4, memory="80GB", device_rdma=True),
    "ml.p5.48xlarge": _gpu("H100", 8, 32, device_rdma=True),
    "ml.p5e.48xlarge": _gpu("H200", 8, 32, device_rdma=True),
    "ml.p5en.48xlarge": _gpu("H200", 8, 16, device_rdma=True),
    "ml.p6-b200.48xlarge": _gpu("B200", 8, 8, device_rdma=True),
    # Types HyperPod added later (botocore's ClusterInstanceType). EFA: the EC2 EFA guide lists p5.4xlarge,
    # p6-b300 and g7e from 8xlarge up as EFA types (with RDMA read/write), not g7e.2xlarge/4xlarge,
    # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types; one EFA per network
    # card (EC2 guide, using-eni.html#network-cards: g7e.24xlarge 2, g7e.48xlarge 4, p6-b300 17, the
    # rest 1). EFA counts and GPUs per type as AWS's own HyperPod CLI records them (INSTANCE_RESOURCES in
    # aws/sagemaker-hyperpod-cli, src/sagemaker/hyperpod/training/constants.py): p5.4xlarge 1 GPU, 1 EFA;
    # p6-b300 8 GPUs, 16 EFA (one of its 17 cards carries no EFA); g7e 1/1/1/2/4/8 GPUs, 0/0/1/1/2/4 EFA.
    "ml.p5.4xlarge": _gpu("H100", 1, 1, device_rdma=True),
    "ml.p6-b300.48xlarge": _gpu("B300", 8, 16, device_rdma=True),
    "ml.g5.xlarge": _gpu("A10G", 1, 0),
    "ml.g5.2xlarge": _gpu("A10G", 1, 0),
    "ml.g5.4xlarge": _gpu("A10G", 1, 0),
    "ml.g5.8xlarge": _gpu("A10G", 1, 1),
    "ml.g5.12xlarge": _gpu("A10G", 4, 1),
    "ml.g5.16xlarge": _gpu("A10G", 1, 1),
    "ml.g5.24xlarge": _gpu("A10G", 4, 1),
    "ml.g5.48xlarge": _gpu("A10G", 8, 1),
    # Gr6: L4 GPUs with more host memory per GPU; 1 GPU each, EFA 0 and 1 (the HyperPod CLI's INSTANCE_RESOURCES).
    "ml.gr6.4xlarge": _gpu("L4", 1, 0),
    "ml.gr6.8xlarge": _gpu("L4", 1, 1),
    "ml.g6.xlarge": _gpu("L4", 1, 0),
    "ml.g6.2xlarge": _gpu("L4", 1, 0),
    "ml.g6.4xlarge": _gpu("L4", 1, 0),
    "ml.g6.8xlarge": _gpu("L4", 1, 1),
    "ml.g6.12xlarge": _gpu("L4", 4, 1),
    "ml.g6.16xlarge": _gpu("L4", 1, 1),
    "ml.g6.24xlarge": _gpu("L4", 4, 1),
    "ml.g6.48xlarge": _gpu("L4", 8, 1),
    "ml.g6e.xlarge": _gpu("L40S", 1, 0),
    "ml.g6e.2xlarge": _gpu("L40S", 1, 0),
    "ml.g6e.4xlarge": _gpu("L40S", 1, 0),
    "ml.g6e.8xlarge": _gpu("L40S", 1, 1),
    "ml.g6e.12xlarge": _gpu("L40S", 4, 1),
    "ml.g6e.16xlarge": _gpu("L40S", 1, 1),
    "ml.g6e.24xlarge": _gpu("L40S", 4, 2),
    "ml.g6e.48xlarge": _gpu("L40S", 8, 4),
    # G7e (RTX PRO 6000 Blackwell Server Edition): device RDMA left off like the other G rows (see the docstring).
    "ml.g7e.2xlarge": _gpu("RTX PRO 6000", 1, 0),
    "ml.g7e.4xlarge": _gpu("RTX PRO 6000", 1, 0),
    "ml.g7e.8xlarge": _gpu("RTX PRO 6000", 1, 1),
    "ml.g7e.12xlarge": _gpu("RTX PRO 6000", 2, 1),
    "ml.g7e.24xlarge": _gpu("RTX PRO 6000", 4, 2),
    "ml.g7e.48xlarge": _gpu("RTX PRO 6000", 8, 4),
    # G7 (NVIDIA RTX PRO 4500 Blackwell Server Edition, 32 GB GPU memory each, compute capability 12.0: NVIDIA's
    # MIG user guide, "Supported GPUs", https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html).
    # The sizes are botocore's ClusterInstanceType (sagemaker 2017-07-24 service-2.json). GPUs per size: 1, 1, 1, 2,
    # 4, 8 with 8/16/32/48/96/192 vCPUs and 32/64/128/192/384/768 GiB host memory, as published at launch (June
    # 2026) for AppStream's stream.graphics.g7.8xlarge (1 GPU, 32 vCPUs, 128 GiB) and .12xlarge (2 GPUs) and AWS's
    # SageMaker G7 inference benchmark (ml.g7.12xlarge: 2 x 32 GB). No AWS page found gives EFA per G7 size (only
    # the 48xlarge's 700 Gbps network), so EFA is 0 here: multi-node jobs then use TCP, slower but correct, while
    # a wrong EFA count would make the launch ask for interfaces the node does not have.
    "ml.g7.2xlarge": _gpu("RTX PRO 4500", 1, 0, memory="32GB"),
    "ml.g7.4xlarge": _gpu("RTX PRO 4500", 1, 0, memory="32GB"),
    "ml.g7.8xlarge": _gpu("RTX PRO 4500", 1, 0, memory="32GB"),
    "ml.g7.12xlarge": _gpu("RTX PRO 4500", 2, 0, memory="32GB"),
    "ml.g7.24xlarge": _gpu("RTX PRO 4500", 4, 0, memory="32GB"),
    "ml.g7.48xlarge": _gpu("RTX PRO 4500", 8, 0, memory="32GB"),
    # CPU only: allowed as compute groups (data preparation, generation on CPU), no devices
    **_cpu("large", "xlarge", "2xlarge", "4xlarge", "9xlarge", "12xlarge", "18xlarge", "24xlarge", family="c5"),
    **_cpu("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", family="m5"),
}

# Types HyperPod offers that the cluster cannot use, with the reason config validation gives. The
# P6e-GB200 UltraServer's hosts are Grace (arm64): the EC2 ENA Express guide lists p6e-gb200.36xlarge
# as arm64 (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ena-express.html), while the CUDA
# training image is built for linux/amd64 only (payloads/Dockerfile.cuda), so its containers cannot start.
REFUSED_INSTANCE_TYPES: dict[str, str] = {
    "ml.p6e-gb200.36xlarge": (
        "a P6e-GB200 UltraServer node has Grace arm64 CPUs and the CUDA training image is built for "
        "linux/amd64 only (payloads/Dockerfile.cuda); pick an x86_64 GPU type such as ml.p6-b300.48xlarge"
    ),
}


# Training-job types HyperPod does not offer for clusters (or that the cluster table leaves out),
# so `hpctl job submit` can check a run against them too; same sources as above.
JOB_ONLY_INSTANCE_TYPES: dict[str, InstanceFacts] = {
    "ml.trn1.2xlarge": InstanceFacts(NEURON, 2, 0, "Trainium"),
    "ml.p3.2xlarge": _gpu("V100", 1, 0),
    "ml.p3.8xlarge": _gpu("V100", 4, 0),
    "ml.p3.16xlarge": _gpu("V100", 8, 0),
    "ml.g4dn.xlarge": _gpu("T4", 1, 0),
    "ml.g4dn.2xlarge": _gpu("T4", 1, 0),
    "ml.g4dn.4xlarge": _gpu("T4", 1, 0),
    "ml.g4dn.8xlarge": _gpu("T4", 1, 1),
    "ml.g4dn.12xlarge": _gpu("T4", 4, 1),
    "ml.g4dn.16xlarge": _gpu("T4", 1, 1),
}
# What `hpctl job submit` knows: every cluster type plus the training-job-only ones.
JOB_INSTANCE_TYPES: dict[str, InstanceFacts] = {**INSTANCE_TYPES, **JOB_ONLY_INSTANCE_TYPES}


def instance_facts(instance_type: str) -> InstanceFacts:
    """The table row; KeyError for a type the table does not know (callers validate first)."""
    return INSTANCE_TYPES[instance_type]
