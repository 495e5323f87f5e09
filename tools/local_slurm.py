"""A throwaway Slurm cluster on this host: munged, slurmctld and one or more slurmd.

Config, state and logs live under one folder (munge's key, seed and socket in the system temp
folder); the daemons run in the foreground as our children and are stopped by PID. Used by
`make rehearse` and tests/slurm. Needs root and the
Debian packages slurm-wlm and munge.

    with LocalSlurm(Path("/tmp/x"), nodes=2) as slurm:
        subprocess.run(["sbatch", "job.sh"], env=slurm.env())

Several nodes on one host (`nodes=2`) run one slurmd each under its own NodeName and port.
Stopping cancels the jobs, stops the daemons, then kills whatever still carries this cluster's
SLURM_CONF (a job step slurmd left behind, re-parented to PID 1): nothing of its jobs outlives it.

`accounting=True` adds Slurm accounting in a real database: a private MariaDB (its own datadir, socket
and port under <root>/mariadb), slurmdbd, and slurmctld with the settings lifecycle/slurm_teams.py owns
(enforced associations and QOS, multifactor priority). `teams=` (a users file's content) then creates
the teams' accounts, QOS and users in it, as the controller's lifecycle does. Needs slurmdbd and
mariadb-server too.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from lifecycle import slurm_teams

DAEMONS = ("munged", "slurmctld", "slurmd")
ACCOUNTING_DAEMONS = ("slurmdbd", "mariadbd", "mariadb-install-db", "sacctmgr", "sacct")
ACCOUNTING_DB = "slurm_acct_db"
PARTITION = "local"
STRAY_WAIT_S = 10.0
CLUSTER_NAME = "hpl-local"
CRED_EXPIRE_S = 10  # above KillWait (5 s): a requeued job starts after the old one's processes are gone


class LocalSlurmError(RuntimeError):
    """The local Slurm could not start; the message says what is missing or which log to read."""


def missing_binaries(*, accounting: bool = False) -> list[str]:
    extra = ACCOUNTING_DAEMONS if accounting else ()
    return [name for name in (*DAEMONS, "sbatch", "squeue", "scontrol", *extra) if not shutil.which(name)]


def hand_to_invoking_user(folder: Path) -> None:
    """Under sudo (as `make rehearse` runs it for a normal user), give the work folder back to that user,
    so they can read and delete it without sudo."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() != 0 or not uid or not gid or not folder.exists():
        return
    for parent, folders, files in os.walk(folder):
        for name in (parent, *(Path(parent) / entry for entry in (*folders, *files))):
            os.lchown(name, int(uid), int(gid))


def processes_of(conf: Path) -> list[int]:
    """The pids whose environment names ``conf`` as SLURM_CONF (the daemons, and every job they ran: sbatch
    exports the submitting environment), this process and its parents left out."""
    marker = f"SLURM_CONF={conf}".encode()
    spared = {os.getpid()}
    pid = os.getpid()
    while pid > 1:  # our parents (a test runner) may carry it in their environment
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        spared.add(pid)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_processes_of(conf: Path, timeout: float = STRAY_WAIT_S) -> list[int]:
    """SIGKILL every process of this cluster (processes_of) and wait until they are gone; the pids killed."""
    killed = processes_of(conf)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in processes_of(conf)):
        time.sleep(0.1)
    return killed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _real_memory_mb() -> int:
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    return int(out.split("RealMemory=")[1].split()[0])


class LocalSlurm:
    def __init__(
        self,
        root: Path,
        *,
        nodes: int = 1,
        cpus_per_node: int | None = None,
        extra_conf: tuple[str, ...] = (),
        node_conf: str = "",
        accounting: bool = False,
        teams: dict | None = None,
    ) -> None:
        self.root = Path(root)
        self.extra_conf = extra_conf  # more slurm.conf lines (e.g. an Epilog), before the node lines
        self.node_conf = node_conf  # more words on each NodeName line (e.g. Gres=gpu:4)
        self.accounting = accounting or teams is not None
        self.teams = teams
        self.dbd_port = _free_port() if self.accounting else 0
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node or max(1, (os.cpu_count() or 1) // nodes)
        self.conf = self.root / "slurm.conf"
        # Made at start in the system temp folder: munged, running as root, refuses a key, seed or log whose
        # folder or any parent is owned by another user (a normal user's checkout, under sudo), and needs
        # every parent of its socket world-searchable.
        self.munge_dir: Path | None = None
        self.node_names = [socket.gethostname()] if nodes == 1 else [f"node{i}" for i in range(1, nodes + 1)]
        self._procs: list[tuple[str, subprocess.Popen]] = []

    # -- environment -------------------------------------------------------------------------
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment in which sbatch/squeue/scontrol talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True, check=check)

    @property
    def socket(self) -> Path:
        assert self.munge_dir is not None, "start() first"
        return self.munge_dir / "munge.socket.2"

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> LocalSlurm:
        missing = missing_binaries(accounting=self.accounting)
        if missing:
            raise LocalSlurmError(
                f"missing {', '.join(missing)}: install them with `apt-get install -y slurm-wlm munge"
                f"{' slurmdbd mariadb-server' if self.accounting else ''}` (tools/system_packages.sh)"
            )
        if os.geteuid() != 0:
            raise LocalSlurmError(
                "the local Slurm runs its daemons (munged, slurmctld, slurmd) as root: run as root, or through "
                "`make rehearse` / `make rehearse-ladder`, which use sudo"
            )
        for sub in ("state", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.munge_dir = Path(tempfile.mkdtemp(prefix="hpl-munge-"))
        self.munge_dir.chmod(0o755)
        (self.munge_dir / "spool").mkdir()
        key = self._write_munge_key()
        self.conf.write_text(self._slurm_conf())
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={self.munge_dir / 'munged.pid'}",
                f"--log-file={self.munge_dir / 'munged.log'}",  # in the foreground it logs to munged.stdout
                f"--seed-file={key.parent / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self._alive() and self.socket.exists(), timeout, "munged socket", "munged.stdout")
        if self.accounting:
            self._start_accounting(timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for name in self.node_names:
            node_arg = ["-N", name] if self.nodes > 1 else []
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-f", str(self.conf), *node_arg])
        self._wait(self._all_idle, timeout, "nodes to become idle", "slurmctld.log")
        if self.teams is not None:
            slurm_teams.apply_associations(self.teams, CLUSTER_NAME, env=self.env())
        return self

    def stop(self) -> None:
        """Cancel what is left, stop the daemons we started (by PID, newest first), then kill any process of
        this cluster's jobs still alive (a job step whose slurmd is gone outlives a SIGTERM)."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self._procs):
            self.cancel_jobs()
        for _, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self._procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        kill_processes_of(self.conf)
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)

    def jobs(self, partition: str | None = None) -> list[str]:
        """The ids of the jobs Slurm still holds (every state), of ``partition`` or of the whole cluster."""
        where = ["--partition", partition] if partition else []
        return self.run("squeue", "-h", "-o", "%i", *where, check=False).stdout.split()

    def cancel_jobs(self, partition: str | None = None, timeout: float = 20.0) -> None:
        """Cancel the jobs of ``partition`` (default: every partition's) and wait until Slurm has let them go."""
        if ids := self.jobs(partition):
            self.run("scancel", *ids, check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.jobs(partition):
            time.sleep(0.5)

    def add_partition(self, name: str, nodes: list[str]) -> None:
        """A partition of ``nodes`` on the running cluster (one test's own on a cluster that several share)."""
        self.run("scontrol", "create", f"PartitionName={name}", f"Nodes={','.join(nodes)}", "MaxTime=INFINITE",
                 "State=UP")  # fmt: skip

    def remove_partition(self, name: str) -> None:
        """Cancel the partition's jobs, then delete it."""
        self.cancel_jobs(name)
        self.run("scontrol", "delete", f"PartitionName={name}")

    def restart_controller(self, timeout: float = 60.0) -> None:
        """Stop slurmctld (it saves its state, the associations' usage included) and start it again: with
        multifactor priority its first pass recomputes every fair-share factor from that usage, which it
        otherwise does only every PriorityCalcPeriod (minutes). Call it while no job runs."""
        for index, (name, proc) in enumerate(self._procs):
            if name == "slurmctld":
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
                del self._procs[index]
                break
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait(self._all_idle, timeout, "nodes to become idle after the restart", "slurmctld.log")

    def __enter__(self) -> LocalSlurm:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------
    def _write_munge_key(self) -> Path:
        """A fresh key for this cluster only, readable by root alone."""
        assert self.munge_dir is not None
        key_dir = self.munge_dir / "key"
        key_dir.mkdir(mode=0o700)
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        return key

    def _slurm_conf(self) -> str:
        host = socket.gethostname()
        memory = max(512, int(_real_memory_mb() * 0.8) // self.nodes)
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            # A requeued job waits cred_expire seconds before it starts again (Slurm: 120): the recovery drill waits.
            f"AuthInfo=socket={self.socket},cred_expire={CRED_EXPIRE_S}",
            "CredType=cred/munge",
            f"StateSaveLocation={self.root / 'state'}",
            # Beside munge's socket in the short temp folder, not under the root: slurmd's step sockets there must
            # fit a Unix socket name (108 bytes), and a root deep in a checkout or pytest's tmp made every job fail.
            f"SlurmdSpoolDir={self.munge_dir / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd'}.%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            *self._accounting_lines(),
            "ReturnToService=2",
            "DependencyParameters=kill_invalid_depend",
            "SlurmdParameters=config_overrides",
            "KillWait=5",
            # A job whose dependency just ended starts at once, not up to 3 s later (Slurm's default holds batch
            # scheduling back for throughput): a chain is a line of short jobs here, ~1.7 s saved per link.
            "SchedulerParameters=batch_sched_delay=0",
            "InactiveLimit=0",
            # Jobs derive their torchrun port from the job id (jobs/launch.py); clusters started side
            # by side on one host would otherwise all count from 1 and meet on the same port.
            f"FirstJobId={random.randint(1, 19_000)}",
            *self.extra_conf,
        ]
        for name in self.node_names:
            lines.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={_free_port()} "
                f"CPUs={self.cpus_per_node} RealMemory={memory} State=UNKNOWN {self.node_conf}".rstrip()
            )
        lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _accounting_lines(self) -> list[str]:
        if not self.accounting:
            return ["AccountingStorageType=accounting_storage/none"]
        settings = slurm_teams.accounting_settings("localhost", self.dbd_port)
        # With slurmdbd, Slurm 22.05 takes the munge socket for its connections from AccountingStoragePass
        # (AuthInfo covers the others): without it, clients look for the system's default socket.
        return [f"{key}={value}" for key, value in settings.items()] + [f"AccountingStoragePass={self.socket}"]

    def _start_accounting(self, timeout: float) -> None:
        """A private MariaDB, its database user (the password only in slurmdbd.conf, mode 0600), slurmdbd,
        and this cluster registered in it: before slurmctld, which connects to slurmdbd as it starts."""
        db = self.root / "mariadb"
        data, sock, db_port = db / "data", db / "mysqld.sock", _free_port()
        if not data.exists():
            db.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                [
                    "mariadb-install-db",
                    "--no-defaults",
                    "--user=root",
                    f"--datadir={data}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise LocalSlurmError(f"mariadb-install-db failed: {done.stderr.strip()[-500:]}")
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                "--user=root",
                f"--datadir={data}",
                f"--socket={sock}",
                f"--port={db_port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={db / 'mariadbd.pid'}",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--performance-schema=OFF",
            ],
        )
        self._wait(lambda: self._alive() and sock.exists(), timeout, "MariaDB's socket", "mariadbd.stdout")
        password = os.urandom(18).hex()
        # On stdin, not the command line: a password in argv shows in every process listing.
        sql = (
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
            f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
            f"GRANT ALL ON {ACCOUNTING_DB}.* TO 'slurm'@'127.0.0.1';"
        )
        done = subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root"], input=sql, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise LocalSlurmError(f"creating the slurm database user failed: {done.stderr.strip()}")
        self.dbd_conf = self.root / "slurmdbd.conf"
        slurm_teams.write_private(
            self.dbd_conf,
            slurm_teams.slurmdbd_conf(
                dbd_port=self.dbd_port,
                storage_host="127.0.0.1",
                storage_port=db_port,
                storage_user="slurm",
                storage_password=password,
                storage_db=ACCOUNTING_DB,
                slurm_user="root",
                log_file=self.root / "log" / "slurmdbd.log",
                pid_file=self.root / "slurmdbd.pid",
                auth_info=f"socket={self.socket}",
            ),
            owner="root",
        )
        # slurmdbd reads slurmdbd.conf from the folder of SLURM_CONF.
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(self._dbd_answers, timeout, "slurmdbd", "slurmdbd.log")
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER_NAME, check=False)

    def _dbd_answers(self) -> bool:
        self._alive()
        return self.run("sacctmgr", "-n", "list", "cluster", check=False).returncode == 0

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{name}.stdout").open("ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
        log.close()
        self._procs.append((name, proc))

    def _alive(self) -> bool:
        for name, proc in self._procs:
            if proc.poll() is not None:
                raise LocalSlurmError(f"{name} exited with {proc.returncode}: see the logs in {self.root / 'log'}")
        return True

    def _all_idle(self) -> bool:
        self._alive()
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        states = dict(zip(out[0::2], out[1::2], strict=True))
        return all(states.get(name) == "idle" for name in self.node_names)

    def _wait(self, ready, timeout: float, what: str, log: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise LocalSlurmError(f"timed out waiting for {what}: see {self.root / 'log' / log}")
            time.sleep(0.2)


class SlurmNodeScaler:
    """A stand-in for HyperPod's node APIs on the local Slurm (llm_pipeline.jobs.capacity's scaler): a node is
    added by resuming it and removed by draining it (a drained node is out of service until resumed, and
    ReturnToService never brings it back, as it would a DOWN one). Every call is appended to HPL_SCALER_LOG
    (JSON lines), for tests to check what the chain asked for and when.

    Select it with HPL_SCALER=tools.local_slurm:SlurmNodeScaler (the repository root on PYTHONPATH). The group's
    nodes are those of partition HPL_SCALER_PARTITION (default: the local cluster's one partition)."""

    OUT_OF_SERVICE = ("down", "drain", "drng", "drained", "fail", "maint")

    def __init__(self) -> None:
        self.partition = os.environ.get("HPL_SCALER_PARTITION", PARTITION)
        self.log = os.environ.get("HPL_SCALER_LOG", "")

    def _states(self) -> dict[str, str]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-p", self.partition, "-o", "%N %t"], capture_output=True, text=True, check=True
        ).stdout.split()
        return dict(zip(out[0::2], out[1::2], strict=True))

    def _record(self, action: str, nodes: list[str]) -> None:
        if self.log:
            with open(self.log, "a") as log:
                busy = {node: self._running(node) for node in nodes}
                log.write(json.dumps({"action": action, "nodes": nodes, "running": busy, "t": time.time()}) + "\n")

    @staticmethod
    def _running(node: str) -> list[str]:
        out = subprocess.run(
            ["squeue", "-h", "-w", node, "-t", "RUNNING", "-o", "%A %j"], capture_output=True, text=True
        )
        return out.stdout.split("\n")[:-1] if out.stdout else []

    def in_service(self, group: str) -> list[str]:
        return sorted(n for n, s in self._states().items() if not s.rstrip("*~#!%$@^-").startswith(self.OUT_OF_SERVICE))

    def held(self, group: str) -> int:
        return len(self.in_service(group))

    def add(self, group: str, count: int) -> None:
        out = sorted(n for n, s in self._states().items() if s.rstrip("*~#!%$@^-").startswith(self.OUT_OF_SERVICE))
        chosen = out[:count]
        self._record("add", chosen)
        if chosen:
            subprocess.run(["scontrol", "update", f"nodename={','.join(chosen)}", "state=resume"], check=True)

    def remove(self, group: str, nodes) -> dict[str, str]:
        self._record("remove", list(nodes))
        subprocess.run(
            ["scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", "reason=hpl-scaled-in"], check=True
        )
        return {}  # every node removed


class ShortSlurmNodeScaler(SlurmNodeScaler):
    """SlurmNodeScaler whose last asked-for node never comes up (capacity short, a failed lifecycle script)."""

    def add(self, group: str, count: int) -> None:
        super().add(group, count - 1)
