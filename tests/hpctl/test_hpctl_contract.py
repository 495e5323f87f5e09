"""hpctl cannot import stacks at run time (it is installed without them), so its copies of the
shared names are checked here against the single source of truth in stacks.config."""

import stacks.config as stack_config
from hpctl import facts, step_logs, submit
from hpctl.project import DEFAULT_STACK_NAME


def test_facts_file_location():
    assert f"{stack_config.LIFECYCLE_PREFIX}/{stack_config.CLUSTER_FACTS_FILE}" == facts.FACTS_KEY


def test_fallback_node_values_match_the_generated_facts():
    assert {
        "payloads_dir": stack_config.fsx_dir(stack_config.PAYLOADS_FOLDER),
        "default_user": stack_config.DEFAULT_USER,
        "outputs_dir": stack_config.fsx_dir(stack_config.OUTPUTS_FOLDER),
    } == facts.CONTRACT_DEFAULTS


def test_bucket_prefixes():
    assert f"{stack_config.OUTPUTS_FOLDER}/" == step_logs.OUTPUTS_PREFIX
    assert submit.PAYLOADS_FOLDER == stack_config.PAYLOADS_FOLDER


def test_default_stack_name():
    assert stack_config.HyperPodConfig.from_context({}).stack_name == DEFAULT_STACK_NAME
