"""The evaluation report names who ran it and under which Slurm account (jobs/accounts.py)."""

from __future__ import annotations

from llm_pipeline.evaluate import as_markdown
from llm_pipeline.jobs.accounts import job_owner, sbatch_options

RESULT = {"base": {"model": "b"}, "tuned": {"model": "t"}, "held_out_rows": 0, "answers": []}


def test_the_report_names_the_user_account_and_qos_from_the_jobs_environment():
    owner = job_owner({"SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "research", "SLURM_JOB_QOS": "research-qos"})
    assert owner == {"user": "alice", "account": "research", "qos": "research-qos"}
    report = as_markdown({**RESULT, "run_by": owner})
    assert "- run by: `alice`, account `research`, QOS `research-qos`\n" in report
    assert "run by" not in as_markdown(RESULT)  # an eval.json from before this field


def test_sbatch_gets_the_account_and_qos_only_when_known():
    assert sbatch_options({"HPL_ACCOUNT": "research", "HPL_QOS": "research-qos"}) == [
        "--account=research",
        "--qos=research-qos",
    ]
    assert sbatch_options({}) == []
