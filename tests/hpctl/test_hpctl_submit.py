"""`hpctl submit`: run config checks, the remote command, and the session run for real against a recorder."""

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

import llm_pipeline
from cluster_contract import CLUSTER_FACTS_KEY, PAYLOAD_CODE_DIGEST_FILE, payload_code_digest
from hpctl.common.errors import HpctlError
from hpctl.runs.submit import CLUSTER_FOLDERS_ENV, SubmitOptions, remote_command, resolve_run_config, send_run_config
from llm_pipeline.config import load
from tests.hpctl.conftest import CONFIG_TEXT

REPO = Path(__file__).resolve().parents[2]

FACTS = {"payloads_dir": "/fsx/payloads", "default_user": "ubuntu"}
REMOTE = (
    'cd "${HPL_PAYLOADS_DIR:-/fsx/payloads}" && '
    "python3 -m llm_pipeline.submit --config configs/tiny.toml --from train --dry-run; "
    'echo "hpctl-remote-exit=$?"'
)


@pytest.mark.parametrize("value", ["tiny", "tiny.toml", "configs/tiny.toml", "payloads/configs/tiny.toml"])
def test_run_config_spellings(project, value):
    assert resolve_run_config(value, project_root=project) == (project / "payloads/configs/tiny.toml").resolve()


def test_run_config_absolute_path(project):
    path = project / "payloads/configs/tiny.toml"
    assert resolve_run_config(str(path), project_root=project) == path.resolve()


def test_run_config_anywhere_is_accepted(project, tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text("")
    assert resolve_run_config(str(mine), project_root=project) == mine.resolve()


def test_unknown_run_config_lists_the_available_ones(project):
    with pytest.raises(
        HpctlError, match=r"^run config llama not found \(a path, or a name in payloads/configs/: tiny.toml\)$"
    ):
        resolve_run_config("llama", project_root=project)


def test_remote_command_runs_submit_as_the_default_user_in_a_login_shell():
    command = remote_command(SubmitOptions(config="configs/tiny.toml", from_step="train", dry_run=True), facts=FACTS)
    # The SSM agent splits the command like a POSIX shell and runs it without one.
    assert shlex.split(command) == ["sudo", "-n", "-u", "ubuntu", "-H", "bash", "-lc", REMOTE]
    no_smoke = remote_command(SubmitOptions(config="configs/tiny.toml", smoke=False), facts=FACTS)
    assert "llm_pipeline.submit --config configs/tiny.toml --no-smoke;" in shlex.split(no_smoke)[-1]
    to_merge = remote_command(
        SubmitOptions(config="configs/tiny.toml", from_step="train", to_step="merge"), facts=FACTS
    )
    assert "llm_pipeline.submit --config configs/tiny.toml --from train --to merge;" in shlex.split(to_merge)[-1]
    replace = remote_command(SubmitOptions(config="configs/tiny.toml", replace_outputs=True), facts=FACTS)
    assert "llm_pipeline.submit --config configs/tiny.toml --replace-outputs;" in shlex.split(replace)[-1]


def test_payloads_dir_must_be_a_plain_path():
    with pytest.raises(HpctlError, match=r"payloads_dir '/fsx/my payloads' is not a plain absolute path"):
        remote_command(SubmitOptions(config="configs/x.toml"), facts={**FACTS, "payloads_dir": "/fsx/my payloads"})


def test_remote_script_runs_in_the_payloads_folder(tmp_path):
    """Run the script part with bash for real: it must find the payloads folder, pass the options, report $?."""
    payloads = tmp_path / "payloads"
    (payloads / "llm_pipeline").mkdir(parents=True)
    (payloads / "llm_pipeline" / "__init__.py").write_text("")
    (payloads / "llm_pipeline" / "submit.py").write_text(
        "import os, sys\nprint('cwd', os.getcwd())\nprint('args', *sys.argv[1:])\nsys.exit(3)\n"
    )
    facts = {**FACTS, "payloads_dir": str(payloads)}
    script = shlex.split(remote_command(SubmitOptions(config="configs/x.toml"), facts=facts))[-1]
    env = {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"}
    for label, extra in (("facts default", {}), ("HPL_PAYLOADS_DIR", {"HPL_PAYLOADS_DIR": str(payloads)})):
        result = subprocess.run(
            ["bash", "-c", script], env={**env, **extra}, capture_output=True, text=True, timeout=60
        )
        expected = [f"cwd {payloads}", "args --config configs/x.toml", "hpctl-remote-exit=3"]
        assert result.stdout.splitlines() == expected, label


def sent_key(text: str, stem: str = "tiny") -> str:
    return f"payloads/run-configs/{stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.toml"


def test_submit_sends_the_config_and_runs_it_through_an_ssm_session(deployed, session_tools, hpctl):
    session_tools.replay_session(
        "submitted download job 101",
        "submitted data job 102",
        "submitted train job 103",
        "logs: /fsx/outputs/tiny/logs",
        "hpctl-remote-exit=0",
    )
    code, out, err = hpctl("submit", "--config", "tiny", "--from", "download")
    assert code == 0, err
    key = sent_key(deployed.config_text)
    body = boto3.client("s3", region_name=deployed.region).get_object(Bucket=deployed.bucket, Key=key)["Body"]
    assert body.read().decode() == deployed.config_text
    argv = session_tools.calls()
    target = f"sagemaker-cluster:{deployed.cluster_id}_controller-controller-0"
    assert argv[:7] == ["ssm", "start-session", "--target", target, "--region", "us-west-2", "--document-name"]
    assert argv[7:9] == ["AWS-StartNonInteractiveCommand", "--parameters"]
    command = json.loads(argv[9])["command"]
    assert len(command) == 1 and shlex.split(command[0])[:7] == ["sudo", "-n", "-u", "ubuntu", "-H", "bash", "-lc"]
    assert f"python3 -m llm_pipeline.submit --config {key.removeprefix('payloads/')} --from download;" in command[0]
    assert "logs: /fsx/outputs/tiny/logs" in out and "hpctl-remote-exit" not in out
    jobs = out.split("submitted jobs:\n")[1].splitlines()[:3]
    assert jobs == ["  download  101", "  data      102", "  train     103"]


def test_an_edited_or_outside_config_is_sent_without_a_deploy(deployed, session_tools, hpctl, project, tmp_path):
    s3 = boto3.client("s3", region_name=deployed.region)
    edited = '[model]\nid = "edited"\n'
    (project / "payloads/configs/tiny.toml").write_text(edited)
    mine = tmp_path / "my-run.toml"
    mine.write_text('[model]\nid = "mine"\n')
    for config, key in (("tiny", sent_key(edited)), (str(mine), sent_key(mine.read_text(), "my-run"))):
        session_tools.replay_session("submitted prepare job 1", "hpctl-remote-exit=0")
        assert hpctl("submit", "--config", config)[0] == 0
        assert (
            s3.get_object(Bucket=deployed.bucket, Key=key)["Body"].read().decode()
            == Path(project / "payloads/configs/tiny.toml" if config == "tiny" else mine).read_text()
        )
    # the deployed copy is left as the deploy wrote it; nothing under the stack changed
    assert s3.get_object(Bucket=deployed.bucket, Key="payloads/configs/tiny.toml")["Body"].read().decode() == (
        deployed.config_text
    )


def test_ladder_and_sweep_reach_their_submitters(deployed, session_tools, hpctl):
    for flags, expected in (
        (["--ladder"], "python3 -m llm_pipeline.submit ladder --config run-configs/"),
        (["--sweep", "1,2", "--no-smoke"], "python3 -m llm_pipeline.sweep --config run-configs/"),
    ):
        session_tools.replay_session("submitted prepare job 1", "hpctl-remote-exit=0")
        assert hpctl("submit", "--config", "tiny", *flags)[0] == 0
        command = json.loads(session_tools.calls()[9])["command"][0]
        assert expected in command, command
    assert "--nodes 1,2 --no-smoke;" in command
    for flag in ("--from", "--to"):
        code, _, err = hpctl("submit", "--config", "tiny", "--ladder", flag, "train")
        assert (code, err) == (
            2,
            f"error: {flag} names a step of the pipeline: the ladder and the sweep always run whole\n",
        )


def test_a_bad_config_stops_before_any_upload(deployed, session_tools, hpctl, project):
    (project / "payloads/configs/tiny.toml").write_text("[train]\nepochs = 0\n")
    code, _, err = hpctl("submit", "--config", "tiny")
    assert code == 2 and "train.epochs: invalid value 0.0" in err
    listed = boto3.client("s3", region_name=deployed.region).list_objects_v2(
        Bucket=deployed.bucket, Prefix="payloads/run-configs/"
    )
    assert listed["KeyCount"] == 0 and not session_tools.record.exists()


def test_payload_code_older_than_the_checkout_is_named(deployed, session_tools, hpctl, project):
    code_file = project / "payloads/llm_pipeline/__init__.py"
    code_file.parent.mkdir()
    code_file.write_text("")
    s3 = boto3.client("s3", region_name=deployed.region)
    note = "note: the payload code on FSx differs from this checkout's payloads/"
    for deployed_digest, shown in (
        (payload_code_digest(project / "payloads"), None),
        ("0" * 64, note),
        (None, "note: the deploy records no payload code digest"),
    ):
        key = f"payloads/{PAYLOAD_CODE_DIGEST_FILE}"
        if deployed_digest is None:
            s3.delete_object(Bucket=deployed.bucket, Key=key)
        else:
            s3.put_object(Bucket=deployed.bucket, Key=key, Body=(deployed_digest + "\n").encode())
        session_tools.replay_session("submitted prepare job 1", "hpctl-remote-exit=0")
        code, _, err = hpctl("submit", "--config", "tiny")
        assert code == 0
        assert ("note:" in err) == (shown is not None) and (shown is None or shown in err), err


def run_remote(command: str, payloads: Path, *, python_path: str = "") -> subprocess.CompletedProcess:
    """The script part of a remote command, run with bash for real in ``payloads``."""
    script = shlex.split(command)[-1]
    env = {**CLUSTER_FOLDERS_ENV, "PYTHONPATH": python_path} if python_path else {}
    env |= {"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "HPL_PAYLOADS_DIR": str(payloads)}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)


def test_the_sent_config_runs_the_chain_once_fsx_shows_it(deployed, tmp_path, monkeypatch):
    """Moto S3 holds the upload; a folder standing in for FSx gets it; the chain's dry run reads it there."""
    session = boto3.Session(region_name=deployed.region)
    local = tmp_path / "my-run.toml"
    local.write_text('[model]\nid = "tiny"\n[paths]\noutput_dir = "${HPL_OUTPUTS_DIR}/my-run"\n')
    sent = send_run_config(session, bucket=deployed.bucket, local=local)
    payloads = tmp_path / "fsx-payloads"
    (payloads / "run-configs").mkdir(parents=True)
    for name in ("llm_pipeline", "slurm"):
        (payloads / name).symlink_to(Path(llm_pipeline.__file__).resolve().parents[1] / name)
    options = SubmitOptions(config=sent.path, dry_run=True, smoke=False)
    monkeypatch.setattr("hpctl.runs.submit.IMPORT_WAIT_S", 2)
    command = remote_command(options, facts={**FACTS, "payloads_dir": str(payloads)}, sent=sent)
    missing = run_remote(command, payloads)
    assert missing.stdout.splitlines()[-2:] == [
        f"error: {sent.path} has not reached FSx after 2 s (auto-import from s3://.../{sent.key}): "
        "check the data repository association of payloads/",
        "hpctl-remote-exit=1",
    ]
    imported = session.client("s3").get_object(Bucket=deployed.bucket, Key=sent.key)["Body"].read()
    (payloads / sent.path).write_bytes(imported)
    result = run_remote(command, payloads, python_path=str(payloads))
    assert result.stdout.splitlines()[-1] == "hpctl-remote-exit=0", result.stderr
    assert f"HPL_RUN_CONFIG={payloads / sent.path}" in result.stdout
    assert "--output=/fsx/outputs/my-run/logs/train-%j.log" in result.stdout


@pytest.fixture
def offline(project, monkeypatch, tmp_path):
    """No AWS at all: no credentials, no config file, no AWS CLI or session plugin on PATH."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return project


def test_dry_run_is_offline_and_prints_the_chain(offline, capfd):
    from hpctl.cli import main

    assert main(["submit", "--config", "configs/tiny.toml", "--dry-run", "--from", "train", "--no-smoke"]) == 0
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(("train_job=", "evaluate_job="))]
    assert len(lines) == 2, out
    sent = sent_key(CONFIG_TEXT).removeprefix("payloads/")
    assert "--output=/fsx/outputs/" in lines[0] and f"HPL_RUN_CONFIG=/fsx/payloads/{sent}" in lines[0]
    assert str(offline) not in "\n".join(lines)  # the cluster's paths, not this machine's
    assert "prepare_job=" not in out and "smoke" not in out  # --from and --no-smoke reach the chain


def test_the_dpo_examples_dry_run_says_at_submit_it_needs_its_sft_run(offline, capfd):
    from hpctl.cli import main

    example = "llama3-8b-dpo-g6e.toml"
    (offline / "payloads/configs" / example).write_text((REPO / "payloads/configs" / example).read_text())
    assert main(["submit", "--config", "llama3-8b-dpo-g6e", "--dry-run"]) == 0
    out = capfd.readouterr().out
    # no run folders here: where its train.init_from run stands is known on the cluster only
    assert "# at submit: train.init_from: no run llama3-8b-lora-g6e in /fsx/outputs: " in out
    assert "prepare_job=" in out and "after_job" not in out


def test_dry_run_validates_the_config_first(offline, capfd):
    from hpctl.cli import main

    (offline / "payloads/configs/tiny.toml").write_text("[train]\nepochs = 0\n")
    assert main(["submit", "--config", "tiny", "--dry-run"]) == 2
    captured = capfd.readouterr()
    assert captured.err == f"error: run config {offline}/payloads/configs/tiny.toml: train.epochs: " + (
        "invalid value 0.0 (allowed: > 0)\n"
    )
    assert "sbatch" not in captured.out


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ["Traceback ...", "ConfigError: [train] epochs must be > 0", "hpctl-remote-exit=1"],
            "error: the submit command failed on the controller (exit 1): see its output above\n",
        ),
        (
            ["sbatch: error: Batch job submission failed"],
            "error: the session ended before the submit command finished (aws exit 0): see the output above\n",
        ),
        (
            ["nothing to do", "hpctl-remote-exit=0"],
            "error: the submit command printed no job ids: see its output above\n",
        ),
    ],
)
def test_remote_failures(deployed, session_tools, hpctl, lines, message):
    session_tools.replay_session(*lines)
    code, out, err = hpctl("submit", "--config", "tiny")
    assert code == 2 and err.startswith("session on controller/controller-0 (Running)\n") and err.endswith(message)
    assert lines[0] in out


def test_session_refused(deployed, session_tools, hpctl, monkeypatch):
    monkeypatch.setenv("HPCTL_TEST_RC", "254")  # e.g. TargetNotConnected: aws prints to stderr and exits
    code, _, err = hpctl("submit", "--config", "tiny")
    assert code == 2
    assert err.endswith(
        "error: the session ended before the submit command finished (aws exit 254): see the output above\n"
    )


def test_unknown_step_is_refused_before_anything_runs(hpctl, capsys):
    with pytest.raises(SystemExit) as stop:
        hpctl("submit", "--config", "tiny", "--from", "finetune")
    assert stop.value.code == 2
    assert "argument --from: invalid choice: 'finetune'" in capsys.readouterr().err


def test_cluster_must_be_in_service(deployed, session_tools, hpctl):
    deployed.set_cluster(status="Creating")
    code, _, err = hpctl("submit", "--config", "tiny")
    assert (code, err) == (
        2,
        f"error: cluster {deployed.cluster} is Creating: `hpctl wait` follows it until it is in service\n",
    )


def test_plugin_missing_stops_before_any_aws_call(aws_env, project, session_tools, hpctl):
    (session_tools.bin_dir / "session-manager-plugin").unlink()
    code, _, err = hpctl("submit", "--config", "tiny")  # no moto here: an AWS call would fail differently
    assert code == 2 and err.startswith("error: the Session Manager plugin (`session-manager-plugin`) is not on PATH")


def test_facts_choose_user_and_folder(deployed, session_tools, hpctl):
    facts = {"payloads_dir": "/lustre/payloads", "default_user": "trainer"}
    boto3.client("s3", region_name=deployed.region).put_object(
        Bucket=deployed.bucket, Key=CLUSTER_FACTS_KEY, Body=json.dumps(facts).encode()
    )
    session_tools.replay_session("submitted train job 7", "hpctl-remote-exit=0")
    assert hpctl("submit", "--config", "tiny")[0] == 0
    words = shlex.split(json.loads(session_tools.calls()[9])["command"][0])
    assert words[3] == "trainer" and words[-1].startswith('cd "${HPL_PAYLOADS_DIR:-/lustre/payloads}" && ')


GPU_RUN = '[paths]\noutput_dir = "${HPL_OUTPUTS_DIR}/gpu-run"\n[train]\nbackend = "torch"\n'
TRN1_GROUP = {"name": "compute", "instance_type": "ml.trn1.32xlarge", "count": 1, "partition": "trn1"}
GPU_GROUP = {"name": "gpus", "instance_type": "ml.g5.12xlarge", "count": 2, "partition": "g5"}


def with_groups(project: Path, *groups: dict) -> None:
    cdk_json = json.loads((project / "cdk.json").read_text())
    cdk_json["context"]["compute_groups"] = list(groups)
    (project / "cdk.json").write_text(json.dumps(cdk_json))
    (project / "payloads/configs/gpu-run.toml").write_text(GPU_RUN)


def test_dry_run_opens_with_where_each_job_runs_on_the_run_s_partition(offline, capfd):
    from hpctl.cli import main

    with_groups(offline, TRN1_GROUP, GPU_GROUP)
    assert main(["submit", "--config", "gpu-run", "--dry-run", "--no-smoke"]) == 0
    captured = capfd.readouterr()
    out = captured.out
    assert "# partition g5: compute group gpus, 2 x ml.g5.12xlarge (4 cuda devices per node), from cdk.json" in out
    lines = out.splitlines()
    # the table is the first thing printed, on either stream; the notes (partition, config, account) follow it
    assert lines[0].startswith("# dry run: nothing submitted.") and lines[1].startswith("# step"), out
    assert captured.err == ""  # no warning; the laptop Slurm's account is not the cluster's, so not shown
    (account,) = [line for line in lines if line.startswith("# account")]
    assert account == "# account: the submitting cluster user's team account, looked up on the cluster at submit"
    assert out.index("# evaluate ") < out.index("# offline: this checkout's submit step")
    table = [line.split() for line in lines[1:11]]
    assert table[0] == ["#", "step", "partition", "nodes", "x", "devices", "depends", "on"]
    assert ["#", "train", "g5", "1", "x", "4", "cuda", "precompile"] in table
    assert ["#", "prepare", "g5", "1", "x", "4", "cuda", "-"] in table
    script = [line for line in out.splitlines() if "sbatch" in line]
    assert len(script) == 9 and all("--partition=g5" in line for line in script)
    assert all("HPL_PAYLOADS_DIR=/fsx/payloads," in line and str(offline) not in line for line in script)
    assert out.index("# step") < out.index("sbatch") and "warning" not in captured.err


def test_dry_run_warns_when_cdk_json_has_no_group_for_the_run_s_accelerator(offline, capfd):
    from hpctl.cli import main

    with_groups(offline, TRN1_GROUP)
    assert main(["submit", "--config", "gpu-run", "--dry-run", "--no-smoke"]) == 0
    assert (
        "warning: cdk.json has no compute group with cuda instances, which train.backend = 'torch' needs "
        "(its groups: trn1 (ml.trn1.32xlarge, neuron)): add one to compute_groups and deploy"
    ) in capfd.readouterr().err


def test_the_dry_run_from_the_config_s_own_folder_uses_the_installed_checkout_and_warns_first(tmp_path):
    """docs/custom-data.md's step 2 from the folder of my-run.toml (no cdk.json there): this checkout's cdk.json
    (trn1 only) and payloads; the GPU run's warning opens the output, naming where its steps land."""
    config, _ = local_data_run(tmp_path / "my-data")
    config.write_text(config.read_text() + '[train]\nbackend = "torch"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "payloads")))}
    done = subprocess.run(
        [sys.executable, "-m", "hpctl", "submit", "--config", "./my-run.toml", "--dry-run"],
        cwd=config.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert done.returncode == 0 and "Traceback" not in done.stdout, done.stdout
    first, second = done.stdout.splitlines()[:2]
    assert first.startswith("warning: cdk.json has no compute group with cuda instances") and first.endswith(
        "as it stands every step lands on partition trn1 (neuron), as drawn below"
    )
    assert second.startswith("# dry run: nothing submitted.")
    assert "# data.dataset " in done.stdout and "/fsx/datasets/my-run/my-records.jsonl" in done.stdout


def test_the_dry_run_without_a_checkout_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from hpctl.cli import main

    config, _ = local_data_run(tmp_path / "my-data")
    monkeypatch.chdir(config.parent)
    monkeypatch.setattr("hpctl.common.project.PACKAGE_CHECKOUT", tmp_path / "a-wheel")
    assert main(["submit", "--config", "./my-run.toml", "--dry-run"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: hpctl submit --dry-run needs this project's checkout (its cdk.json and payloads/)")


def local_data_run(folder: Path) -> tuple[Path, Path]:
    """A run config beside the data file it names (a path on this machine, relative to the config)."""
    folder.mkdir(parents=True, exist_ok=True)
    records = folder / "my-records.jsonl"
    records.write_text('{"instruction": "Name a fruit.", "context": "", "response": "An apple."}\n')
    config = folder / "my-run.toml"
    config.write_text('[data]\ndataset = "my-records.jsonl"\n[paths]\noutput_dir = "${HPL_OUTPUTS_DIR}/my-run"\n')
    return config, records


def test_a_local_data_file_goes_up_with_the_config_and_the_cluster_reads_it_there(
    deployed, session_tools, hpctl, tmp_path
):
    config, records = local_data_run(tmp_path / "laptop")
    session_tools.replay_session("submitted prepare job 1", "hpctl-remote-exit=0")
    code, out, err = hpctl("submit", "--config", str(config))
    assert code == 0, err
    s3 = boto3.client("s3", region_name=deployed.region)
    uploaded = s3.get_object(Bucket=deployed.bucket, Key="datasets/my-run/my-records.jsonl")["Body"].read()
    assert uploaded == records.read_bytes()
    assert f"data.dataset {records} -> s3://{deployed.bucket}/datasets/my-run/my-records.jsonl" in out
    (sent,) = s3.list_objects_v2(Bucket=deployed.bucket, Prefix="payloads/run-configs/my-run-")["Contents"]
    fsx_copy = tmp_path / "fsx" / "my-run.toml"
    fsx_copy.parent.mkdir()
    fsx_copy.write_bytes(s3.get_object(Bucket=deployed.bucket, Key=sent["Key"])["Body"].read())
    assert load(fsx_copy, env=CLUSTER_FOLDERS_ENV).data.dataset == "/fsx/datasets/my-run/my-records.jsonl"
    assert config.read_text().count("my-records.jsonl") == 1  # the local config is left as it was


def test_the_dry_run_says_where_a_local_data_file_goes(offline, capfd, tmp_path):
    from hpctl.cli import main

    config, records = local_data_run(tmp_path / "laptop")
    assert main(["submit", "--config", str(config), "--dry-run", "--no-smoke"]) == 0
    assert (
        f"# data.dataset {records} -> s3://<bucket>/datasets/my-run/my-records.jsonl (uploaded at submit), read on "
        "the cluster as /fsx/datasets/my-run/my-records.jsonl"
    ) in capfd.readouterr().out


def test_the_file_uploaded_is_the_one_beside_the_config_whatever_the_working_folder(tmp_path, monkeypatch):
    """config.load resolves a relative data.dataset against the config's folder, as the preview and the rehearsal
    read it; a file of that name in the working folder is not the run's."""
    from hpctl.runs.submit import validate_run_config

    config, records = local_data_run(tmp_path / "laptop")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "my-records.jsonl").write_text('{"instruction": "Not this one."}\n')
    monkeypatch.chdir(tmp_path / "elsewhere")
    to_send = validate_run_config(config)
    assert to_send.dataset.local == records and to_send.dataset.key == "datasets/my-run/my-records.jsonl"
    (tmp_path / "laptop" / "my-records.jsonl").unlink()
    with pytest.raises(HpctlError, match=rf"data.dataset {records} is neither a file here nor under /fsx/datasets"):
        validate_run_config(config)


def test_a_cluster_data_file_missing_from_the_bucket_is_refused_with_the_upload(
    deployed, session_tools, hpctl, tmp_path
):
    config = tmp_path / "theirs.toml"
    config.write_text('[data]\ndataset = "${HPL_DATASETS_DIR}/theirs.jsonl"\n')
    code, _, err = hpctl("submit", "--config", str(config))
    assert code == 2
    assert (
        f"data.dataset is not in s3://{deployed.bucket}/datasets/: upload it first "
        f"(aws s3 cp <file> s3://{deployed.bucket}/datasets/theirs.jsonl)"
    ) in err
    listed = boto3.client("s3", region_name=deployed.region).list_objects_v2(
        Bucket=deployed.bucket, Prefix="payloads/run-configs/"
    )
    assert listed["KeyCount"] == 0 and not session_tools.record.exists()


def test_the_dry_run_as_a_team_user_shows_their_own_outputs_folder(offline, capfd):
    """The node's profile points a users-file user's ${HPL_OUTPUTS_DIR} at outputs/<user>: the dry run says so."""
    from hpctl.cli import main

    cdk_json = json.loads((offline / "cdk.json").read_text())
    cdk_json["context"]["teams"] = [{"name": "research", "gid": 3001}]
    cdk_json["context"]["users"] = [{"name": "alice", "uid": 3101, "team": "research"}]
    (offline / "cdk.json").write_text(json.dumps(cdk_json))
    argv = ["submit", "--config", "configs/tiny.toml", "--dry-run", "--no-smoke"]
    assert main([*argv, "--as-user", "alice"]) == 0
    out = capfd.readouterr().out
    assert "# as alice: ${HPL_OUTPUTS_DIR} is /fsx/outputs/alice (their own)" in out
    script = [line for line in out.splitlines() if "sbatch" in line]
    assert script and all("--output=/fsx/outputs/alice/" in line for line in script), out
    assert main([*argv, "--as-user", "mallory"]) == 2
    assert capfd.readouterr().err.startswith("error: --as-user mallory: not a user in cdk.json (users: alice)")
