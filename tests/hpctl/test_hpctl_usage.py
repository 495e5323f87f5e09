"""`hpctl usage` totals from sacct lines, `hpctl users` from cdk.json (a live sacct: tests/slurm/test_teams.py)."""

from __future__ import annotations

import json

import pytest

from hpctl import cli
from hpctl.teams import usage

SACCT = """session on controller/i-0abc (Running)
hpctl-usage-begin
101|alice|research|p5|3600|2|billing=2,cpu=384,gres/gpu=16,mem=0,node=2
102|bob|product|p5|1800|1|cpu=192,node=1
103|bob|product|cpu|7200|1|cpu=4,node=1
hpctl-usage-end
"""
PARTITIONS = {
    "p5": {"instance_type": "ml.p5.48xlarge", "devices_per_node": 8},
    "cpu": {"instance_type": "ml.c5.xlarge"},
}


def test_node_and_device_hours_and_cost_per_user_and_team():
    prices = {"ml.p5.48xlarge": 100.0}
    totals = usage.summarize(usage.parse(SACCT), partitions=PARTITIONS, price_of=prices.get)
    alice, bob = totals["users"]["alice"], totals["users"]["bob"]
    assert alice["node_hours"] == pytest.approx(2.0) and alice["device_hours"] == pytest.approx(16.0)
    assert alice["cost_usd"] == pytest.approx(200.0)
    # bob: half an hour on one p5 node (8 devices from the partition's facts), two hours on an unpriced type
    assert bob["node_hours"] == pytest.approx(2.5) and bob["device_hours"] == pytest.approx(4.0)
    assert bob["cost_usd"] == pytest.approx(50.0) and bob["unpriced_node_hours"] == pytest.approx(2.0)
    assert totals["teams"]["product"] == bob and totals["teams"]["research"] == alice
    text = usage.render_text(totals, "now-30days")
    assert "research" in text and "$200.00" in text and "+2.000 node-h unpriced" in text


def test_hpctl_users_lists_the_config(tmp_path, monkeypatch, capsys):
    context = {
        "teams": [{"name": "research", "gid": 3001, "fairshare": 3, "max_nodes": 2}],
        "users": [{"name": "alice", "uid": 3101, "team": "research"}],
    }
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "x", "context": context}))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["users"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row == ["alice", "3101", "research", "3", "2", "SSM"]
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "x", "context": {**context, "users": [{"name": "x"}]}}))
    assert cli.main(["users"]) == 2
    assert "config key 'users' entry [0] (x) lacks uid, team" in capsys.readouterr().err
