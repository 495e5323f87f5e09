"""`hpctl job submit`: the run as one SageMaker training job, built with the sagemaker SDK's ModelTrainer.

Everything that can be wrong is checked first (instance type, backend for the accelerator, image,
role, the S3 inputs); only then is the code staged and the job created. The job runs
``python3 -m llm_pipeline.sagemaker_job`` in the project's image on every host; that module runs
the pipeline's steps and launches torchrun across the job's hosts itself (jobs/launch.py), the
way the Slurm scripts do. It is not wrapped in the SDK's Torchrun driver, which would run one entry
script under torchrun on every rank: download, data and merge are single-process steps.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import boto3

from cluster_contract import HUB_TOKEN_SECRET_VARIABLE, JobStackOutput, StackOutput
from hpctl.common.errors import HpctlError, aws_errors
from hpctl.common.run_data import require_in_bucket
from hpctl.jobs.job_instances import (
    accelerator,
    check_instance_type,
    check_job_lane_runs,
    check_run_fits,
    training_shape_limit,
)
from hpctl.jobs.job_spec import (
    COMPILE_CACHE_PREFIX,
    DATASETS_PREFIX,
    METRIC_DEFINITIONS,
    MODELS_PREFIX,
    OUTPUTS_PREFIX,
    JobOptions,
    JobSpec,
    job_environment,
    run_paths,
    stage_source,
)
from llm_pipeline import config as run_config
from llm_pipeline.jobs import sagemaker_env

# Stack outputs a job needs (stacks/outputs.py writes them): the bucket, the execution role, and
# one training image per accelerator family: the jobs lane's own, so CudaImageUri is the CUDA image
# built on AWS's -sagemaker base, not the cluster's -ec2 one (stacks/image.py). A CPU instance runs
# the CUDA image's torch on CPU (the Neuron image would pick the neuron backend).
BUCKET_OUTPUT = StackOutput.BUCKET_NAME
ROLE_OUTPUT = JobStackOutput.JOB_ROLE_ARN
IMAGE_OUTPUTS = {
    "neuron": (JobStackOutput.NEURON_IMAGE_URI,),
    "cuda": (JobStackOutput.CUDA_IMAGE_URI,),
    "cpu": (JobStackOutput.CUDA_IMAGE_URI,),
}
HOURS = 3600
MAX_WAIT_S = int(run_config.JOB_MAX_HOURS * HOURS)


@dataclass(frozen=True)
class JobDeployment:
    stack: str
    region: str
    outputs: dict[str, str]

    def require(self, key: str, what: str, flag: str) -> str:
        value = self.outputs.get(key, "")
        if not value:
            raise HpctlError(
                f"stack {self.stack} has no output {key} ({what}): deploy the current version with the jobs "
                f"lane (cdk.json `lanes`: jobs or both), or pass {flag}"
            )
        return value

    def check_image(self, image_uri: str, instance_type: str) -> None:
        """--image must not be the stack's image of another accelerator family (a Neuron image on a GPU)."""
        kind = accelerator(instance_type)
        for other, keys in IMAGE_OUTPUTS.items():
            for key in keys:
                if other != kind and key not in IMAGE_OUTPUTS[kind] and self.outputs.get(key) == image_uri:
                    raise HpctlError(
                        f"--image {image_uri} is this stack's {key} ({other} image), but {instance_type} is a {kind} "
                        f"instance: pass its {' or '.join(IMAGE_OUTPUTS[kind])} image, or leave --image out"
                    )

    def image_for(self, instance_type: str) -> str:
        kind = accelerator(instance_type)
        for key in IMAGE_OUTPUTS[kind]:
            if self.outputs.get(key):
                return self.outputs[key]
        keys = " or ".join(IMAGE_OUTPUTS[kind])
        raise HpctlError(
            f"stack {self.stack} has no training image for {kind} instances such as {instance_type} (output {keys}): "
            f"deploy with that accelerator family, or pass --image URI"
        )


def s3_has(session: boto3.Session, bucket: str, prefix: str) -> bool:
    with aws_errors(f"list s3://{bucket}/{prefix}"):
        return session.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0) > 0


def keep_alive_seconds(minutes: int) -> int:
    """A warm pool's keep-alive within what CreateTrainingJob accepts (botocore's KeepAlivePeriodInSeconds)."""
    limit = training_shape_limit("KeepAlivePeriodInSeconds")
    if not 0 <= minutes * 60 <= limit:
        raise HpctlError(
            f"--keep-alive-minutes must be 0 to {limit // 60} (SageMaker keeps a warm pool at most {limit} s)"
        )
    return minutes * 60


def build_spec(
    cfg: run_config.RunConfig,
    *,
    config_file: Path,
    options: JobOptions,
    deployment: JobDeployment,
    session: boto3.Session,
) -> JobSpec:
    """The job for this run on this deployment; an HpctlError for anything that would fail later."""
    instance_type = cfg.job.instance_type
    key = "--instance-type" if options.instance_type else "job.instance_type"
    check_instance_type(instance_type, key=key)
    check_job_lane_runs(instance_type, key=key)
    check_run_fits(cfg, instance_type)
    if options.image_uri:
        deployment.check_image(options.image_uri, instance_type)
    image = options.image_uri or deployment.image_for(instance_type)
    role = options.role_arn or deployment.require(ROLE_OUTPUT, "the SageMaker execution role", "--role ARN")
    bucket = deployment.require(BUCKET_OUTPUT, "the data bucket", "a stack that has one")
    paths = run_paths(cfg)
    channels = {}
    environment = job_environment(instance_type, devices_per_node=cfg.parallel.devices_per_node, bucket=bucket)
    cache_uri = environment.get(sagemaker_env.COMPILE_CACHE_URI_VARIABLE)
    if cache_uri and s3_has(session, bucket, f"{COMPILE_CACHE_PREFIX}/"):  # an empty S3 channel fails the job
        channels[sagemaker_env.COMPILE_CACHE_CHANNEL] = cache_uri
    token_secret = deployment.outputs.get(StackOutput.HF_TOKEN_SECRET_ARN, "")
    if token_secret:  # the secret's ARN only: the download step reads the token with the job role
        environment[HUB_TOKEN_SECRET_VARIABLE] = token_secret
    model_prefix = f"{MODELS_PREFIX}/{paths.model}/"  # keyed by the model folder: uploaded once, any run
    if s3_has(session, bucket, model_prefix):
        channels[sagemaker_env.MODELS_CHANNEL] = f"s3://{bucket}/{model_prefix}"
        environment[sagemaker_env.MODEL_FOLDER_VARIABLE] = paths.model
    if paths.dataset is not None:
        dataset_prefix = f"{DATASETS_PREFIX}/{paths.run}/"
        dataset_key = f"{dataset_prefix}{paths.dataset}"
        require_in_bucket(session, bucket=bucket, key=dataset_key, what=f"data.dataset {paths.dataset}")
        channels[sagemaker_env.DATASETS_CHANNEL] = f"s3://{bucket}/{dataset_prefix}"
    runtime_s = int(cfg.job.max_runtime_hours * HOURS)
    max_wait_s = None
    if cfg.job.spot:
        max_wait_s = int(cfg.job.max_wait_hours * HOURS) if cfg.job.max_wait_hours else min(2 * runtime_s, MAX_WAIT_S)
    tags = {"project": "hyperpod-llm-pipeline", "hpl-run": paths.run, "hpl-config": config_file.name}
    return JobSpec(
        run=paths.run,
        model=paths.model,
        config_file=config_file,
        instance_type=instance_type,
        instance_count=cfg.parallel.nodes,
        image_uri=image,
        role_arn=role,
        bucket=bucket,
        channels=channels,
        environment=environment,
        spot=cfg.job.spot,
        max_runtime_s=runtime_s,
        max_wait_s=max_wait_s,
        volume_size_gb=cfg.job.volume_size_gb,
        tags={**tags, **options.tags},
        resumes=s3_has(session, bucket, f"{OUTPUTS_PREFIX}/{paths.run}/"),
        keep_alive_s=keep_alive_seconds(options.keep_alive_minutes),
        smoke=options.smoke,
        last_step=options.last_step,
    )


def describe_spec(spec: JobSpec) -> str:
    waits = f", waits {spec.max_wait_s // HOURS} h in all for spot capacity" if spec.max_wait_s else ""
    lines = [
        f"run {spec.run}: {spec.instance_count} x {spec.instance_type}{' (managed spot)' if spec.spot else ''}",
        f"  image      {spec.image_uri}",
        f"  role       {spec.role_arn}",
        f"  command    {spec.command}",
    ]
    for name, uri in spec.channels.items():
        lines.append(f"  channel    {name} <- {uri}")
    if sagemaker_env.COMPILE_CACHE_URI_VARIABLE in spec.environment and not spec.channels.get(
        sagemaker_env.COMPILE_CACHE_CHANNEL
    ):
        cache = spec.environment[sagemaker_env.COMPILE_CACHE_URI_VARIABLE]
        lines.append(f"  compile    {cache} is empty: this job compiles, then writes its cache there for the next")
    if sagemaker_env.MODELS_CHANNEL not in spec.channels:
        folder = spec.environment.get(sagemaker_env.MODEL_FOLDER_VARIABLE) or spec.model
        lines.append(f"  model      not in s3://{spec.bucket}/{MODELS_PREFIX}/{folder}/: the job downloads it")
    lines += [
        f"  run folder {spec.outputs_uri} (checkpoints: a restarted job resumes from them)",
        *(
            [
                "  note       the run folder already holds files: train resumes from its newest checkpoint; "
                "use a new paths.output_dir for a fresh run"
            ]
            if spec.resumes
            else []
        ),
        f"  artifacts  {spec.artifacts_uri} (code, model.tar.gz, TensorBoard)",
        f"  stops      after {spec.max_runtime_s // HOURS} h{waits}",
        *(
            [f"  warm pool  the instances stay {spec.keep_alive_s // 60} min after the job for the next one (billed)"]
            if spec.keep_alive_s
            else []
        ),
    ]
    return "\n".join(lines)


def model_trainer(
    spec: JobSpec, *, boto_session: boto3.Session, source_dir: Path, sagemaker_config: dict | None = None
):
    """The SDK's ModelTrainer for the job (the SDK is imported here: it is slow to import)."""
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.shapes import MetricDefinition, Tag
    from sagemaker.core.training.configs import (
        CheckpointConfig,
        Compute,
        InputData,
        OutputDataConfig,
        SourceCode,
        StoppingCondition,
        TensorBoardOutputConfig,
    )
    from sagemaker.train.model_trainer import ModelTrainer

    session = Session(boto_session=boto_session, default_bucket=spec.bucket, sagemaker_config=sagemaker_config)
    trainer = ModelTrainer(
        sagemaker_session=session,
        role=spec.role_arn,
        training_image=spec.image_uri,
        base_job_name=spec.base_job_name,
        input_s3_key_prefix=spec.jobs_prefix,
        source_code=SourceCode(source_dir=str(source_dir), command=spec.command),
        compute=Compute(
            instance_type=spec.instance_type,
            instance_count=spec.instance_count,
            volume_size_in_gb=spec.volume_size_gb,
            enable_managed_spot_training=spec.spot,
            keep_alive_period_in_seconds=spec.keep_alive_s or None,
        ),
        stopping_condition=StoppingCondition(
            max_runtime_in_seconds=spec.max_runtime_s, max_wait_time_in_seconds=spec.max_wait_s
        ),
        output_data_config=OutputDataConfig(s3_output_path=spec.artifacts_uri),
        checkpoint_config=CheckpointConfig(s3_uri=spec.outputs_uri, local_path=spec.checkpoint_local_path),
        input_data_config=[InputData(channel_name=name, data_source=uri) for name, uri in spec.channels.items()],
        environment=spec.environment,
        tags=[Tag(key=key, value=value) for key, value in spec.tags.items()],
    )
    return trainer.with_tensorboard_output_config(
        TensorBoardOutputConfig(s3_output_path=spec.tensorboard_uri, local_path=spec.tensorboard_local_path)
    ).with_metric_definitions([MetricDefinition(name=name, regex=regex) for name, regex in METRIC_DEFINITIONS.items()])


def create_job(spec: JobSpec, *, boto_session: boto3.Session, sagemaker_config: dict | None = None) -> str:
    """Stage the code, create the training job, return its name (the job runs on without us)."""
    from sagemaker.core.helper.iam_role_resolver import RoleValidationError

    with tempfile.TemporaryDirectory(prefix="hpl-job-") as folder:
        source = stage_source(spec, Path(folder) / "code")
        try:
            with aws_errors("create the training job"):
                trainer = model_trainer(
                    spec, boto_session=boto_session, source_dir=source, sagemaker_config=sagemaker_config
                )
                trainer.train(wait=False, logs=False)
        except RoleValidationError as error:  # the SDK checks the role's permissions and trust first
            raise HpctlError(f"execution role {spec.role_arn}: {error}") from None
        except ValueError as error:  # the SDK's own validation (pydantic errors are ValueErrors too)
            raise HpctlError(f"the sagemaker SDK refused the job: {error}") from None
    return trainer._latest_training_job.training_job_name
