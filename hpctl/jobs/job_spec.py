"""What a SageMaker training job of a run is made of, decided before the SDK or AWS is touched.

One run config, the same paths as on the cluster: the run config's ``${HPL_..._DIR}`` folders map to
S3 prefixes and, inside the job, to channels (llm_pipeline/jobs/sagemaker_env.py):

    s3://<bucket>/models/<model>/   -> channel `models`   -> HPL_MODELS_DIR/<model> (optional: else the job downloads)
    s3://<bucket>/datasets/<run>/   -> channel `datasets` -> HPL_DATASETS_DIR (when data.dataset is a file there)
    s3://<bucket>/outputs/<run>/    <- the first host's run folder, the job's checkpoint folder (synced while
                                       it runs), with each other host's checkpoint parts and step logs
    s3://<bucket>/jobs/<run>/       <- staged code, model.tar.gz / output.tar.gz, TensorBoard
    s3://<bucket>/neuron-cache/     -> channel `neuron_cache` -> HPL_COMPILE_CACHE_DIR, and back after
                                       precompile and train (Neuron types; every job of the stack shares it)

<run> is the run folder's name (paths.output_dir under ${HPL_OUTPUTS_DIR}), so a job's outputs land
where the cluster's FSx export puts the same run's.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from cluster_contract import COMPILE_CACHE_FOLDER, DATASETS_FOLDER, JOBS_FOLDER, MODELS_FOLDER, OUTPUTS_FOLDER
from hpctl.common.errors import HpctlError
from hpctl.jobs.job_instances import job_instance_facts
from llm_pipeline import config as run_config
from llm_pipeline.jobs import sagemaker_env
from llm_pipeline.run_files import SAGEMAKER_METRICS
from stacks.accelerators import NEURON

ENTRY_MODULE = "llm_pipeline.sagemaker_job"
CODE_CONFIGS_FOLDER = "configs"  # run configs sit here in the code channel, as in payloads/
SLURM_FOLDER = "slurm"
ACCELERATOR_SETTINGS = "accelerator_env.sh"  # payloads/slurm/: sourced by env.sh and inside the job
JOBS_PREFIX = JOBS_FOLDER
MODELS_PREFIX = MODELS_FOLDER
DATASETS_PREFIX = DATASETS_FOLDER
OUTPUTS_PREFIX = OUTPUTS_FOLDER
COMPILE_CACHE_PREFIX = COMPILE_CACHE_FOLDER
JOB_NAME_PREFIX = "hpl-"
BASE_NAME_LIMIT = 40  # the SDK appends -<timestamp>; training job names stop at 63 characters
# What SageMaker reads off the job's log into CloudWatch metrics and the console's charts: the
# progress line training/callbacks.py prints ("step 30/30 | loss 1.2345 | lr ... | 812 tokens/s |
# mfu 41.2% | ...", the mfu field only where the device's peak is known). The rehearsal matches them
# against a real run's log.
METRIC_DEFINITIONS = SAGEMAKER_METRICS
# Stand-ins for the HPL_* folders: a path under one of them is relative to that S3 prefix.
SENTINEL_ROOT = PurePosixPath("/hpl-job")
SENTINELS = {
    "HPL_MODELS_DIR": SENTINEL_ROOT / MODELS_PREFIX,
    "HPL_DATASETS_DIR": SENTINEL_ROOT / DATASETS_PREFIX,
    "HPL_OUTPUTS_DIR": SENTINEL_ROOT / OUTPUTS_PREFIX,
    "HPL_COMPILE_CACHE_DIR": SENTINEL_ROOT / "neuron-cache",
    "HPL_FSX_MOUNT_PATH": SENTINEL_ROOT,
    "HPL_SCRATCH_DIR": SENTINEL_ROOT / "scratch",
}


@dataclass(frozen=True)
class JobOptions:
    """Command-line choices that override the run config's [job] section (None: keep the config's)."""

    instance_type: str | None = None
    instance_count: int | None = None
    spot: bool | None = None
    max_runtime_hours: float | None = None
    image_uri: str | None = None
    role_arn: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    keep_alive_minutes: int = 0  # warm pool: keep the instances this long after the job for the next one
    smoke: bool = True  # the job runs its smoke stage first (llm_pipeline.sagemaker_job); --no-smoke: off
    last_step: str | None = None  # --to: the job stops after this step (its smoke stage too); None: the whole chain


@dataclass(frozen=True)
class RunPaths:
    """Where the run config's folders sit relative to the HPL_* folders."""

    run: str  # the run folder's path under ${HPL_OUTPUTS_DIR}, e.g. llama3-8b-dolly-lora
    model: str  # paths.model_dir under ${HPL_MODELS_DIR}
    dataset: str | None  # data.dataset under ${HPL_DATASETS_DIR}; None for a Hub dataset id


@dataclass(frozen=True)
class JobSpec:
    run: str
    model: str  # the model folder under ${HPL_MODELS_DIR}: the models channel is s3://<bucket>/models/<model>/
    config_file: Path  # the local run config; staged as configs/<name> in the code channel
    instance_type: str
    instance_count: int
    image_uri: str
    role_arn: str
    bucket: str
    channels: dict[str, str]  # channel name -> S3 prefix
    environment: dict[str, str]
    spot: bool
    max_runtime_s: int
    max_wait_s: int | None
    volume_size_gb: int
    tags: dict[str, str]
    resumes: bool = False  # the run folder in S3 already holds files: the job starts from them
    keep_alive_s: int = 0  # ResourceConfig.KeepAlivePeriodInSeconds (0: no warm pool)
    smoke: bool = True  # a smoke stage before the long steps, inside the job
    last_step: str | None = None  # the job's entry stops after this step (its --to)

    @property
    def command(self) -> str:
        command = f"python3 -m {ENTRY_MODULE} --config {CODE_CONFIGS_FOLDER}/{self.config_file.name}"
        if self.last_step:
            command += f" --to {self.last_step}"
        return command if self.smoke else f"{command} --no-smoke"

    @property
    def base_job_name(self) -> str:
        slug = re.sub(r"[^A-Za-z0-9-]+", "-", self.run).strip("-")
        return (JOB_NAME_PREFIX + slug)[:BASE_NAME_LIMIT].rstrip("-")

    @property
    def outputs_uri(self) -> str:
        return f"s3://{self.bucket}/{OUTPUTS_PREFIX}/{self.run}/"

    @property
    def jobs_prefix(self) -> str:
        return f"{JOBS_PREFIX}/{self.run}"

    @property
    def artifacts_uri(self) -> str:
        return f"s3://{self.bucket}/{self.jobs_prefix}/"

    @property
    def tensorboard_uri(self) -> str:
        return f"s3://{self.bucket}/{self.jobs_prefix}/tensorboard/"

    @property
    def checkpoint_local_path(self) -> str:
        return f"{sagemaker_env.CONTAINER_ROOT}/{sagemaker_env.CHECKPOINTS_FOLDER}/{self.run}"

    @property
    def tensorboard_local_path(self) -> str:
        return f"{self.checkpoint_local_path}/tensorboard"


def resolve_config_file(value: str, *, project_root: Path) -> Path:
    """A run config path, or a name under payloads/configs/ (`default`, `tiny-cpu.toml`)."""
    configs = project_root / "payloads" / CODE_CONFIGS_FOLDER
    for candidate in (Path(value), project_root / value, configs / value, configs / f"{value}.toml"):
        if candidate.is_file():
            return candidate.resolve()
    available = ", ".join(sorted(path.stem for path in configs.glob("*.toml"))) or "none"
    raise HpctlError(f"run config {value} not found (a path, or a name in payloads/configs/: {available})")


def load_run_config(path: Path, options: JobOptions) -> run_config.RunConfig:
    """The run config with its ${HPL_*} folders at stand-ins, command-line overrides applied, validated."""
    try:
        cfg = run_config.load(path, env={name: str(value) for name, value in SENTINELS.items()})
        if options.instance_count is not None:
            cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, nodes=options.instance_count))
        job = cfg.job
        for name in ("instance_type", "spot", "max_runtime_hours"):
            if getattr(options, name) is not None:
                job = dataclasses.replace(job, **{name: getattr(options, name)})
        cfg = dataclasses.replace(cfg, job=job)
        run_config.validate(cfg)
    except run_config.ConfigError as error:
        raise HpctlError(f"{path}: {error}") from None
    return cfg


def _under(path: str, folder: str, key: str, *, what: str) -> str:
    sentinel = SENTINELS[folder]
    relative = PurePosixPath(path).relative_to(sentinel) if PurePosixPath(path).is_relative_to(sentinel) else None
    if relative is None or not relative.parts:
        raise HpctlError(
            f"{key} = {path!r} is not under ${{{folder}}}: a training job finds {what} only there; "
            f'write it as "${{{folder}}}/<name>" (as payloads/configs/default.toml does)'
        )
    return relative.as_posix()


def run_paths(cfg: run_config.RunConfig) -> RunPaths:
    run = _under(cfg.paths.output_dir, "HPL_OUTPUTS_DIR", "paths.output_dir", what="its run folder")
    model = _under(cfg.paths.model_dir, "HPL_MODELS_DIR", "paths.model_dir", what="the model")
    dataset = None
    if cfg.data.dataset.startswith("/"):
        dataset = _under(cfg.data.dataset, "HPL_DATASETS_DIR", "data.dataset", what="a dataset file")
    return RunPaths(run=run, model=model, dataset=dataset)


def compile_cache_uri(bucket: str) -> str:
    """The stack's Neuron compile cache, shared by all its jobs (llm_pipeline/compile_cache.py)."""
    return f"s3://{bucket}/{COMPILE_CACHE_PREFIX}/"


def job_environment(instance_type: str, *, devices_per_node: int, bucket: str) -> dict[str, str]:
    """The job's Environment: processes per host and the accelerator and network facts of the
    instance's row, which payloads/slurm/accelerator_env.sh turns into settings in the job as it
    does on the cluster (a CPU type: the run config's processes, no accelerator, no EFA); on a
    Neuron type also where the compile cache persists."""
    facts = job_instance_facts(instance_type)
    environment = {
        "PYTHONUNBUFFERED": "1",
        "HPL_DEVICES_PER_NODE": str(facts.devices if facts.accelerated else devices_per_node),
        "HPL_ACCELERATOR": facts.accelerator,
        "HPL_EFA_INTERFACES": str(facts.efa_interfaces),
        "HPL_EFA_DEVICE_RDMA": "1" if facts.efa_device_rdma else "0",
        "HPL_IMAGE_FAMILY": facts.image_family,
    }
    if facts.peak_tflops_per_device:
        environment["HPL_PEAK_TFLOPS"] = str(facts.peak_tflops_per_device)
    if facts.accelerator == NEURON:
        environment[sagemaker_env.COMPILE_CACHE_URI_VARIABLE] = compile_cache_uri(bucket)
    return environment


def stage_source(spec: JobSpec, destination: Path) -> Path:
    """The code channel: the payload package, the accelerator settings the cluster's env.sh sources
    too, and the run config, as payloads/ lays them out."""
    import llm_pipeline

    package = Path(llm_pipeline.__file__).resolve().parent
    shutil.copytree(package, destination / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    settings = package.parent / SLURM_FOLDER / ACCELERATOR_SETTINGS
    (destination / SLURM_FOLDER).mkdir(parents=True, exist_ok=True)
    shutil.copy2(settings, destination / SLURM_FOLDER / ACCELERATOR_SETTINGS)
    (destination / CODE_CONFIGS_FOLDER).mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.config_file, destination / CODE_CONFIGS_FOLDER / spec.config_file.name)
    return destination
