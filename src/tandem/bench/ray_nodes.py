"""A Ray cluster of separate nodes on this one machine (root only), for the tests and the
benchmark of tandem on several nodes (``tests/place/test_ray_nodes.py``,
``benchmarks/ray_nodes.py``).

Each node is its own network namespace (the head and the workers joined by veth pairs on
one subnet, each with its own address), and, inside it, its own pid, mount and UTS
namespaces: its own host name, ``/proc``, ``/dev/shm``, boot id and runtime directory. Its
processes cannot see another node's, nor reach them but over the network, as on separate
servers; only the filesystem is shared (the state directory must be, as on a lab's NFS).

A node's ``ray start --block`` is the first process of its pid namespace: killing it ends
every process of that node at once (a node's death), and stopping the cluster stops only
the Ray processes it started, never another Ray of this machine. What it makes outside its
root (namespaces, the bridge, cgroups, Ray's temp directories) is written down in
``ROOT/made.txt`` as it is made, so that :func:`remove_made` undoes a cluster whose process
was killed before its :meth:`NodesCluster.close` (an interrupted test run). Where a memory cgroup can
be made (v1, or v2 with the memory controller delegated), each node's processes are in
one of their own limited to the node's RAM, so a node has the RAM it declares and what is
used on it is measured there (:attr:`NodesCluster.mem_limited`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tandem._safepath import module_command

RAY = module_command("ray.scripts.scripts")
MADE = "made.txt"  # in a cluster's root: "KIND VALUE" a line, for what close() undoes


def can_make_nodes() -> str | None:
    """Why separate nodes cannot be made here (not root, no ``ip``/``unshare``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine"
    return None


@dataclass
class Node:
    name: str  # its host name
    netns: str
    ip: str
    dir: Path  # its runtime and temp directories
    proc: subprocess.Popen[bytes] | None = None
    cgroup: Path | None = None  # its memory cgroup (None: none could be made)
    link: str = ""  # its end of the veth pair (in its namespace)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.dir / "ray.log"

    def init_pid(self) -> int | None:
        """The first process of its pid namespace (the child of ``unshare``)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return None
        return children[0].pid if children else None

    def join(self) -> None:
        """Put the calling process in the node's memory cgroup (a ``preexec_fn``)."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def run(self, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` counted in the node's RAM (its cgroup), as another tenant of it."""
        return subprocess.Popen(argv, preexec_fn=self.join, start_new_session=True)

    def cut(self) -> None:
        """A partition: the node's network goes down (its processes run on, the filesystem
        still shared), so no other node reaches it nor it them."""
        subprocess.run(["ip", "-n", self.netns, "link", "set", self.link, "down"], check=True)

    def heal(self) -> None:
        """The partition ends: the node's network comes back."""
        subprocess.run(["ip", "-n", self.netns, "link", "set", self.link, "up"], check=True)

    def kill(self) -> None:
        """The node dies: every process of it, at once (SIGKILL of its namespace's first)."""
        pid = self.init_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)


class NodesCluster:
    """A head and workers, each a node of its own namespaces (see the module's doc)."""

    def __init__(self, root: Path, cpus: float = 2, mem: int = 4 * 10**9, gpu_mib: int = 16384) -> None:
        self.tag = f"{os.getpid() % 100000}"
        self.root = root
        self.cpus, self.mem, self.gpu_mib = cpus, mem, gpu_mib
        self.subnet = f"10.{77 + os.getpid() % 100}.{os.getpid() % 250}"
        self.bridge = f"tb{self.tag}"
        self.port = 20000 + os.getpid() % 20000
        self.nodes: list[Node] = []
        self.env = dict(os.environ, RAY_AUTH_MODE="disabled")
        # A dead node is noticed within seconds (defaults: 5 failed checks, 3 s apart); the
        # daemon, a driver, is given the same (:attr:`ray_env`).
        self.ray_env = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
        self.env.update(self.ray_env)
        self._made("bridge", self.bridge)
        subprocess.run(["ip", "link", "add", self.bridge, "type", "bridge"], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)
        self.cgroups = _memory_cgroups()  # where a node's memory cgroup is made, or None

    def _made(self, kind: str, value: object) -> None:
        """Write down, before it is made, a thing :func:`remove_made` would undo."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / MADE, "a") as f:
            f.write(f"{kind} {value}\n")

    @property
    def mem_limited(self) -> bool:
        """Whether each node's RAM is limited (and measured) by a cgroup of its own."""
        return self.cgroups is not None

    @property
    def address(self) -> str:
        return f"{self.subnet}.1:{self.port}"

    def _netns(self, name: str) -> tuple[str, str]:
        """A network namespace for a node, joined to the bridge: its name and its link's."""
        netns, i = f"t{self.tag}{name[0]}{len(self.nodes)}", len(self.nodes) + 1
        outer, inner = f"v{self.tag}o{i}", f"v{self.tag}i{i}"
        run = lambda *a: subprocess.run(list(a), check=True, capture_output=True)  # noqa: E731
        self._made("netns", netns)  # deleted, it takes its end of the veth pair, and so the pair
        run("ip", "netns", "add", netns)
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", netns)
        run("ip", "link", "set", outer, "master", self.bridge)
        run("ip", "link", "set", outer, "up")
        run("ip", "-n", netns, "addr", "add", f"{self.subnet}.{i}/24", "dev", inner)
        run("ip", "-n", netns, "link", "set", inner, "up")
        run("ip", "-n", netns, "link", "set", "lo", "up")
        return netns, inner

    def add_node(self, name: str, gpus: int = 1) -> Node:
        """Start a node (the first one is the head) and return it once its Ray runs."""
        head = not self.nodes
        netns, link = self._netns(name)
        node = Node(name, netns, f"{self.subnet}.{len(self.nodes) + 1}", self.root / name, link=link)
        node.dir.mkdir(parents=True)
        if self.cgroups is not None:
            node.cgroup = self.cgroups / f"tandem-node-{self.tag}-{name}"
            self._made("cgroup", node.cgroup)
            node.cgroup.mkdir()
            v2 = (self.cgroups / "cgroup.controllers").exists()
            limit = "memory.max" if v2 else "memory.limit_in_bytes"
            (node.cgroup / limit).write_text(str(self.mem))
        temp = Path(f"/tmp/rn{self.tag}{name[0]}{len(self.nodes)}")  # Ray's socket paths stay short
        self._made("temp", temp)
        shutil.rmtree(temp, ignore_errors=True)
        resources = "{" + ", ".join(f'"tandem_gpu_mem_mib_{i}": {self.gpu_mib}' for i in range(gpus)) + "}"
        args = [
            *RAY, "start", "--block", "--node-ip-address", node.ip, "--num-cpus", str(self.cpus),
            "--memory", str(self.mem), "--num-gpus", str(gpus), "--resources", resources,
            "--object-store-memory", str(200 * 10**6), "--temp-dir", str(temp), "--disable-usage-stats",
        ]  # fmt: skip
        args += (
            ["--head", "--port", str(self.port), "--include-dashboard", "false"]
            if head
            else ["--address", self.address]
        )
        boot = node.dir / "boot_id"
        boot.write_text(str(uuid.uuid4()) + "\n")
        inside = (
            f"hostname {name} && mount -t tmpfs -o size=1g tmpfs /dev/shm && "
            f"mount --bind {boot} /proc/sys/kernel/random/boot_id && "
            f"mkdir -p {node.dir}/run && chmod 700 {node.dir}/run && {self._mount_cgroups()}"
            f"export XDG_RUNTIME_DIR={node.dir}/run && unset TANDEM_RUNTIME_DIR && "
            f"exec {shlex.join(args)}"
        )
        unshare = [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--uts",
            "--mount",
            "--propagation",
            "private",
        ]
        with open(node.log, "ab") as log:
            node.proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, *unshare, "sh", "-c", inside],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=node.join,
            )
        self._made("session", node.proc.pid)  # the node's processes: its session, its pid namespace
        node.temp = temp  # type: ignore[attr-defined]
        self.nodes.append(node)
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in node.log.read_text(errors="replace"):
            if node.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"node {name} did not start:\n{node.log.read_text(errors='replace')[-3000:]}"
                )
            time.sleep(0.2)
        return node

    def _mount_cgroups(self) -> str:
        """The shell words that mount the memory cgroup hierarchy again inside a node, as a
        server has it: ``ip netns exec`` mounts a fresh ``/sys`` without it."""
        if self.cgroups is None:
            return ""
        from tandem.place import Cgroups

        mount = next(m for m in Cgroups().mounts if m.point in (self.cgroups, *self.cgroups.parents))
        point = shlex.quote(str(mount.point))
        kind = "-t cgroup2 cgroup2" if mount.v2 else "-t cgroup -o memory cgroup"
        top = "mount -t tmpfs -o size=1m tmpfs /sys/fs/cgroup"
        return f"{top} && mkdir -p {point} && mount {kind} {point} && "

    def in_head(self, argv: list[str]) -> list[str]:
        """``argv`` run in the head's network namespace (a Ray driver there reaches the head)."""
        return ["ip", "netns", "exec", self.nodes[0].netns, *argv]

    def close(self) -> None:
        for node in reversed(self.nodes):
            try:
                node.kill()
            except Exception:
                pass
            subprocess.run(["ip", "netns", "delete", node.netns], capture_output=True)
            shutil.rmtree(getattr(node, "temp", "/nonexistent"), ignore_errors=True)
            _remove_cgroup(node.cgroup)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        (self.root / MADE).unlink(missing_ok=True)  # nothing of it left to undo


def remove_made(root: Path) -> None:
    """Undo what the cluster of ``root`` made and left (its process killed before it closed
    it): its nodes' processes (each node's session, where it is still the node's), network
    namespaces, bridge, cgroups and Ray's temp directories. Nothing where it closed."""
    try:
        lines = (root / MADE).read_text().splitlines()
    except OSError:
        return
    made: dict[str, list[str]] = {}
    for line in lines:
        kind, _, value = line.partition(" ")
        made.setdefault(kind, []).append(value)
    sessions = []
    for pid in made.get("session", []):
        try:
            leader = psutil.Process(int(pid))
            if str(root) in " ".join(leader.cmdline()):  # a node's (its folder is in it), not a pid reused
                sessions.append(int(pid))
        except (psutil.Error, ValueError):
            continue
    for sid in sessions:  # the node's first process in its pid namespace ends them all
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) == sid:
                    proc.kill()
            except (psutil.Error, OSError):
                continue
    psutil.wait_procs([p for p in map(_process, sessions) if p is not None], timeout=30)
    for netns in made.get("netns", []):
        subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
    for bridge in made.get("bridge", []):
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
    for temp in made.get("temp", []):
        shutil.rmtree(temp, ignore_errors=True)
    for cgroup in made.get("cgroup", []):
        _remove_cgroup(Path(cgroup))
    (root / MADE).unlink(missing_ok=True)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _memory_cgroups() -> Path | None:
    """This process's memory cgroup, where a node's own (limited) can be made: v1's memory
    hierarchy, or v2 where the memory controller is delegated to children; None elsewhere."""
    from tandem.place import Cgroups

    for d in Cgroups().dirs("memory"):
        v2 = (d / "cgroup.controllers").exists()
        try:
            usable = (
                "memory" in (d / "cgroup.subtree_control").read_text().split()
                if v2
                else (d / "memory.limit_in_bytes").exists()
            )
        except OSError:
            continue
        if usable and os.access(d, os.W_OK):
            return d
    return None


def _remove_cgroup(path: Path | None) -> None:
    """Remove a node's cgroup once its processes are gone (the kernel frees it a moment
    after their exit)."""
    deadline = time.monotonic() + 10
    while path is not None and path.exists():
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
