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
"""

from __future__ import annotations

from dataclasses import dataclass

NEURON = "neuron"
CUDA = "cuda"
NO_ACCELERATOR = "none"
ACCELERATORS = (NEURON, CUDA, NO_ACCELERATOR)


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

    @property
    def accelerated(self) -> bool:
        return self.accelerator != NO_ACCELERATOR


def _cpu(*sizes: str, family: str) -> dict[str, InstanceFacts]:
    return {f"ml.{family}.{size}": InstanceFacts(NO_ACCELERATOR, 0, 0) for size in sizes}


INSTANCE_TYPES: dict[str, InstanceFacts] = {
    # Trainium (NeuronCores per node)
    "ml.trn1.32xlarge": InstanceFacts(NEURON, 32, 8, "Trainium", efa_device_rdma=True),
    "ml.trn1n.32xlarge": InstanceFacts(NEURON, 32, 16, "Trainium", efa_device_rdma=True),
    "ml.trn2.48xlarge": InstanceFacts(NEURON, 64, 16, "Trainium2", efa_device_rdma=True),
    # NVIDIA (GPUs per node)
    "ml.p4d.24xlarge": InstanceFacts(CUDA, 8, 4, "A100 40GB", efa_device_rdma=True),
    "ml.p4de.24xlarge": InstanceFacts(CUDA, 8, 4, "A100 80GB", efa_device_rdma=True),
    "ml.p5.48xlarge": InstanceFacts(CUDA, 8, 32, "H100", efa_device_rdma=True),
    "ml.p5e.48xlarge": InstanceFacts(CUDA, 8, 32, "H200", efa_device_rdma=True),
    "ml.p5en.48xlarge": InstanceFacts(CUDA, 8, 16, "H200", efa_device_rdma=True),
    "ml.g5.xlarge": InstanceFacts(CUDA, 1, 0, "A10G"),
    "ml.g5.2xlarge": InstanceFacts(CUDA, 1, 0, "A10G"),
    "ml.g5.4xlarge": InstanceFacts(CUDA, 1, 0, "A10G"),
    "ml.g5.8xlarge": InstanceFacts(CUDA, 1, 1, "A10G"),
    "ml.g5.12xlarge": InstanceFacts(CUDA, 4, 1, "A10G"),
    "ml.g5.16xlarge": InstanceFacts(CUDA, 1, 1, "A10G"),
    "ml.g5.24xlarge": InstanceFacts(CUDA, 4, 1, "A10G"),
    "ml.g5.48xlarge": InstanceFacts(CUDA, 8, 1, "A10G"),
    # CPU only: allowed as compute groups (data preparation, generation on CPU), no devices
    **_cpu("large", "xlarge", "2xlarge", "4xlarge", "9xlarge", "12xlarge", "18xlarge", "24xlarge", family="c5"),
    **_cpu("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", family="m5"),
}


def instance_facts(instance_type: str) -> InstanceFacts:
    """The table row; KeyError for a type the table does not know (callers validate first)."""
    return INSTANCE_TYPES[instance_type]


def accelerator_of(instance_type: str) -> str:
    return INSTANCE_TYPES[instance_type].accelerator
