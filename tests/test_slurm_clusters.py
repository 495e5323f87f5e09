"""Every Slurm test shares its worker's local Slurm (tests/slurm/conftest.py: one_node, two_nodes): a test module
that starts a cluster of its own (a LocalSlurm, or the product's rehearsal, which starts one) must be named
here with the reason it cannot share, or this test fails. Starting a cluster costs seconds (MariaDB and
slurmdbd more), and a chain on a cluster of its own is what the shared one is for."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED_FIXTURE = "slurm/conftest.py"
# The product's rehearsals start their own LocalSlurm (tools/rehearse.py, tools/rehearse_ladder.py): run as
# `python -m <module>`, or as `make rehearse` in a shell.
REHEARSAL_MODULES = ("tools.rehearse", "tools.rehearse_ladder")
MAKE_REHEARSE = "make rehearse"
ALLOWED = {
    "slurm/test_teams.py": "teams' accounts, QOS and fair share in Slurm accounting (MariaDB, slurmdbd), a restarted "
    "controller, in a world-searchable folder its users' jobs can read",
    "slurm/test_team_chains.py": "two team users' chains under enforced associations (accounting with teams=), in a "
    "world-searchable folder its users' jobs write under",
    "slurm/test_gpu_job_mapping.py": "GPU nodes (Gres=gpu:4, a gres.conf of fake devices) in slurm.conf",
    "slurm/test_run_series_end.py": "an Epilog in slurm.conf (the series-end hook under test)",
    "slurm/test_local_slurm_owner.py": "tests LocalSlurm itself: a cluster under a folder a normal user owns",
    "slurm/test_rehearsal_safety.py": "runs `make rehearse`'s program, which starts and stops its own cluster",
    "docs/test_newcomer_journey.py": "a newcomer's `make rehearse` runs, from a fresh clone",
    "docs/test_ladder_rehearsal_lock.py": "the ladder rehearsal's program, refused by its lock before it starts one",
}


def leading_text(node: ast.AST) -> str:
    """The literal start of a string or f-string expression ('' for anything else)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return leading_text(node.values[0])
    return ""


def cluster_starts(source: str) -> list[str]:
    """What in this module's source starts a local Slurm: a LocalSlurm(...) call, a `-m tools.rehearse` argument
    list, a call whose command is `make rehearse ...`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called == "LocalSlurm":
                found.append(f"LocalSlurm( at line {node.lineno}")
            elif node.args and leading_text(node.args[0]).startswith(MAKE_REHEARSE):
                found.append(f"{MAKE_REHEARSE} at line {node.lineno}")
        elif isinstance(node, ast.List | ast.Tuple):
            words = [leading_text(element) for element in node.elts]
            if any(a == "-m" and b in REHEARSAL_MODULES for a, b in itertools.pairwise(words)):
                found.append(f"-m tools.rehearse... at line {node.lineno}")
    return found


def starters() -> dict[str, list[str]]:
    modules = {path.relative_to(TESTS).as_posix(): path for path in TESTS.rglob("*.py")}
    modules.pop(SHARED_FIXTURE)
    return {name: found for name, path in sorted(modules.items()) if (found := cluster_starts(path.read_text()))}


def test_only_the_allowed_modules_start_a_cluster_of_their_own():
    found = starters()
    unexpected = {name: where for name, where in found.items() if name not in ALLOWED}
    assert not unexpected, (
        f"these test modules start a local Slurm of their own: {unexpected}; use the shared one (the one_node or "
        f"two_nodes fixture of tests/{SHARED_FIXTURE}), or name the module in ALLOWED with the reason"
    )
    assert set(ALLOWED) <= set(found), (
        f"ALLOWED names modules that no longer start a cluster: {set(ALLOWED) - set(found)}"
    )


def test_a_cluster_started_in_any_form_is_found():
    """The scan sees each way a module starts one, and not a mention of the command."""
    assert cluster_starts("with LocalSlurm(root) as slurm:\n    pass\n") == ["LocalSlurm( at line 1"]
    assert cluster_starts("from tools import local_slurm\nlocal_slurm.LocalSlurm(root, nodes=2).start()\n")
    assert cluster_starts('run([python, "-m", "tools.rehearse", "--root", root])\n')
    assert cluster_starts('run((python, "-m", "tools.rehearse_ladder"))\n')
    assert cluster_starts('user.run("make rehearse", checkout)\nuser.run(f"make rehearse CONFIG={x}", checkout)\n')
    mentions = '"""as make rehearse does"""\nassert "make rehearse" in commands\n'
    mentions += 'run(["sh", "need_root.sh", "make rehearse"])\n'
    assert cluster_starts(mentions + 'run(["python", "-m", "tools.rehearse_root_check"])\n') == []
