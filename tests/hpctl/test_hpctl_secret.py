"""The Hugging Face token's path: `hpctl secret set hf-token` (hidden prompt or stdin) into the stack's
Secrets Manager secret (moto), then the download step reads it by the ARN fact and hands it to
huggingface_hub in-process (a local Hub records the Authorization header), with the token written to no
file, log, output line or environment variable on the way."""

import io
import json
import os
from typing import ClassVar

import pytest

from cluster_contract import HUB_TOKEN_FIELD, HUB_TOKEN_SECRET_VARIABLE, StackOutput
from llm_pipeline import download, hub_token
from tests.hpctl.conftest import BUCKET, FIXTURE_SESSION
from tests.local_http import serving
from tests.payloads.hub_stub import FakeHub
from tests.payloads.payload_configs import write_config

TOKEN = "hf_TestTokenThatMustStaySecret0123456789"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def secret_stack(bare_stack, monkeypatch):
    """The secret as the stack creates it (no token yet) and a stack whose output names it."""
    arn = FIXTURE_SESSION.client("secretsmanager").create_secret(
        Name="hpl-hub-token", SecretString=json.dumps({HUB_TOKEN_FIELD: "", "unset": "generated-filler"})
    )["ARN"]
    bare_stack.create({StackOutput.BUCKET_NAME: BUCKET, StackOutput.HF_TOKEN_SECRET_ARN: arn})
    monkeypatch.setattr("sys.stdin", io.StringIO())
    return arn


def stored(arn: str) -> dict:
    return json.loads(FIXTURE_SESSION.client("secretsmanager").get_secret_value(SecretId=arn)["SecretString"])


class RecordingHub(FakeHub):
    """The download tests' Hub: a gated model's info, no files (404); records each request's Authorization."""

    seen: ClassVar[list[tuple[str, str]]] = []  # (path, Authorization)

    def do_GET(self):
        RecordingHub.seen.append((self.path, self.headers.get("Authorization", "")))
        if self.path.startswith("/api/models/org/gated-model/revision/"):
            super().do_GET()
        else:
            self._reply(404, {"error": "Entry not found"})


@pytest.fixture
def hub():
    RecordingHub.seen = []
    with serving(RecordingHub) as url:
        yield url


def files_holding(folder, text: str) -> list[str]:
    return [str(path) for path in folder.rglob("*") if path.is_file() and text.encode() in path.read_bytes()]


def test_from_stdin_to_the_download_step_and_nowhere_else(secret_stack, hpctl, hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN + "\n"))
    code, out, err = hpctl("secret", "set", "hf-token")
    assert code == 0, err
    assert out.startswith(f"stored the Hugging Face token in {secret_stack} (version ")
    assert stored(secret_stack) == {HUB_TOKEN_FIELD: TOKEN}

    # On a node (or in a job): only the secret's ARN is in the environment; the step reads the token itself.
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_ENDPOINT", hub)
    monkeypatch.setenv(HUB_TOKEN_SECRET_VARIABLE, secret_stack)
    folders = {name: str(tmp_path / name.lower()) for name in ("HPL_MODELS_DIR", "HPL_DATASETS_DIR", "HPL_OUTPUTS_DIR")}
    model = {"id": "org/gated-model", "dtype": "bfloat16"}
    run = write_config(tmp_path / "run.toml", folders, model=model, paths={"model_dir": str(tmp_path / "model")})
    assert download.main(["--config", str(run)]) == 2  # the local Hub serves no files: the step stops
    step = capsys.readouterr()
    model_info = [auth for path, auth in RecordingHub.seen if path.startswith("/api/models/org/gated-model")]
    assert model_info and set(model_info) == {f"Bearer {TOKEN}"}  # model info, then the file listing

    assert TOKEN not in out + err + step.out + step.err
    assert files_holding(tmp_path, TOKEN) == []
    assert [name for name, value in os.environ.items() if TOKEN in value] == []


def test_hidden_prompt_at_a_terminal(secret_stack, hpctl, monkeypatch):
    prompts = []
    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or f"  {TOKEN}  ")
    code, out, _ = hpctl("secret", "set", "hf-token")
    assert code == 0 and prompts == ["Hugging Face token (input hidden): "]
    assert stored(secret_stack)[HUB_TOKEN_FIELD] == TOKEN and TOKEN not in out


def test_the_token_never_comes_from_the_command_line(secret_stack, hpctl):
    with pytest.raises(SystemExit):
        hpctl("secret", "set", "hf-token", TOKEN)
    assert stored(secret_stack)[HUB_TOKEN_FIELD] == ""


def test_empty_or_spaced_input_is_refused(secret_stack, hpctl, monkeypatch):
    code, _, err = hpctl("secret", "set", "hf-token")
    assert code == 2 and err.startswith("error: no Hugging Face token given")
    monkeypatch.setattr("sys.stdin", io.StringIO("hf_a hf_b\n"))
    code, _, err = hpctl("secret", "set", "hf-token")
    assert code == 2 and "holds whitespace" in err
    assert stored(secret_stack)[HUB_TOKEN_FIELD] == ""


def test_a_secret_not_set_yet_means_no_token_and_the_gated_model_says_how(secret_stack, hub, tmp_path):
    assert hub_token.read_token(secret_stack) is None
    env = {HUB_TOKEN_SECRET_VARIABLE: secret_stack, "HF_HOME": str(tmp_path)}
    assert download.find_token(env) is None
    with pytest.raises(download.StepError, match=r"gated model.*`hpctl secret set hf-token`"):
        download.fetch("org/gated-model", "main", tmp_path / "model", download.find_token(env), endpoint=hub)


def test_an_unreadable_secret_names_it(secret_stack):
    missing = secret_stack.replace("hpl-hub-token", "gone")
    with pytest.raises(download.StepError, match=f"cannot read the Hugging Face token from {missing}: "):
        download.find_token({HUB_TOKEN_SECRET_VARIABLE: missing})


def test_an_older_stack_without_the_secret_is_told_to_deploy(bare_stack, hpctl):
    bare_stack.create({StackOutput.BUCKET_NAME: BUCKET})
    code, _, err = hpctl("secret", "set", "hf-token")
    assert code == 2 and f"has no output {StackOutput.HF_TOKEN_SECRET_ARN}: deploy the current version" in err


def test_the_payload_names_match_the_contract():
    assert (hub_token.SECRET_ARN_VARIABLE, hub_token.TOKEN_FIELD) == (HUB_TOKEN_SECRET_VARIABLE, HUB_TOKEN_FIELD)
