"""Several "hosts" on one machine, for running MPI jobs across a real (virtual) network. Needs root.

Each host is a Linux network namespace with its own host name and its own address, 10.213.0.k on
its ``eth0``; all are joined by a bridge that lives in one more namespace (the "switch"), so the
machine's own network is never touched. ``mpiexec`` runs in the first host; hydra starts its
proxies on the others through a launcher script that enters their namespace, as ``ssh`` would
on a real cluster. The ranks are forced onto TCP over ``eth0`` (UCX_TLS=self,tcp), so their
messages cross the virtual links: the interfaces' byte counters show it.

    with VirtualHosts(3) as hosts:
        run = hosts.mpiexec(["python", "-m", "nnlib", "train", ...])   # one rank per host
        hosts.bytes_sent()                                             # {host: tx bytes on eth0}
        hosts.cut_link(hosts.names[2])                                 # cut a host off the switch

Everything it makes (namespaces, links, the bridge, /etc/netns entries, the launcher script, every
process in the namespaces) is removed on leaving the ``with`` block, also when the block fails.
See ../shared/notes/multihost.md for the facts behind it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "nnlibh"
SWITCH = "nnlibsw"
SUBNET = "10.213.0"

LAUNCHER = """#!/bin/sh
# hydra calls: LAUNCHER [ssh options] HOST COMMAND...; run COMMAND in HOST's namespace, with its host name.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; cd '$PWD'; exec $*"
"""


def ip(*arguments, namespace=None, check=True):
    command = ["ip", *(["-n", namespace] if namespace else []), *arguments]
    return subprocess.run(command, capture_output=True, text=True, check=check)


def can_make_namespaces() -> tuple[bool, str]:
    """(True, '') where this process may create network namespaces, else (False, why)."""
    if os.geteuid() != 0:
        return False, "needs root (CAP_NET_ADMIN) to create network namespaces"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return False, "needs iproute2's ip and util-linux's unshare"
    probe = f"{PREFIX}probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    if made.returncode != 0:
        return False, f"cannot create a network namespace here: {made.stderr.strip()}"
    return True, ""


class VirtualHosts:
    def __init__(self, count: int):
        self.count = count
        self.names = [f"{PREFIX}{index + 1}" for index in range(count)]
        self.address = {name: f"{SUBNET}.{index + 1}" for index, name in enumerate(self.names)}
        self.folder = None

    # -- set-up and clean-up -----------------------------------------------------------------
    def __enter__(self):
        self.remove_everything()  # leftovers of an earlier run that was killed
        try:
            self._build()
        except BaseException:
            self.remove_everything()
            raise
        return self

    def __exit__(self, *exc_info):
        self.remove_everything()
        return False

    def _build(self):
        self.folder = Path(tempfile.mkdtemp(prefix="nnlib-multihost-"))
        self.launcher = self.folder / "launch-in-namespace"
        self.launcher.write_text(LAUNCHER)
        self.launcher.chmod(0o755)
        ip("netns", "add", SWITCH)
        ip("link", "add", "br0", "type", "bridge", namespace=SWITCH)
        ip("link", "set", "br0", "up", namespace=SWITCH)
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{self.address[name]} {name}\n" for name in self.names)
        for index, name in enumerate(self.names):
            ip("netns", "add", name)
            etc = Path("/etc/netns") / name
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            port = f"port{index + 1}"  # the switch's end of this host's cable
            ip("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", SWITCH)
            ip("link", "set", port, "master", "br0", namespace=SWITCH)
            ip("link", "set", port, "up", namespace=SWITCH)
            ip("addr", "add", f"{self.address[name]}/24", "dev", "eth0", namespace=name)
            ip("link", "set", "eth0", "up", namespace=name)
            ip("link", "set", "lo", "up", namespace=name)

    def processes(self) -> list[int]:
        pids = []
        for name in [*self.names, SWITCH]:
            listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            pids += [int(pid) for pid in listed.stdout.split()]
        return pids

    def describe_processes(self) -> str:
        """For a failing test: each process in the hosts, its state and the kernel call it waits in."""
        lines = []
        for pid in self.processes():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:90]
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                waits_in = Path(f"/proc/{pid}/wchan").read_text() or "-"
            except OSError:
                continue
            lines.append(f"{pid} state {state} waits in {waits_in}: {command}")
        neighbours = ip("neigh", "show", namespace=self.names[0], check=False).stdout.strip()
        return "\n".join(lines) + f"\nneighbours of {self.names[0]}: {neighbours}"

    def remove_everything(self):
        """Kill every process in the namespaces, then delete them, their links and files. Never raises."""
        names = [f"{PREFIX}{index + 1}" for index in range(max(self.count, 8))]
        for _ in range(3):
            pids = [int(pid) for name in [*names, SWITCH]
                    for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                              text=True).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for name in [*names, SWITCH]:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Anything of ours still there: namespaces and /etc/netns entries (should be [] after leaving)."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        found = [name for name in listed if name.startswith(PREFIX) or name == SWITCH]
        found += [str(path) for path in Path("/etc/netns").glob(f"{PREFIX}*")] if Path("/etc/netns").is_dir() else []
        return found

    # -- using them ----------------------------------------------------------------------------
    def command(self, program: list[str], ranks_per_host: int = 1) -> list[str]:
        """The command that runs ``program`` as one MPI job across the hosts, from the first host."""
        mpiexec = [_mpiexec(), "-launcher", "ssh", "-launcher-exec", str(self.launcher),
                   "-hosts", ",".join(self.names), "-iface", "eth0", "-ppn", str(ranks_per_host),
                   "-n", str(ranks_per_host * self.count), *program]
        first = self.names[0]
        inner = f"hostname {first}; cd '{os.getcwd()}'; exec " + " ".join(_quote(part) for part in mpiexec)
        return ["ip", "netns", "exec", first, "unshare", "--uts", "sh", "-c", inner]

    def environment(self) -> dict:
        return dict(os.environ, UCX_TLS="self,tcp", UCX_NET_DEVICES="eth0", OMP_NUM_THREADS="1",
                    OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def mpiexec(self, program: list[str], timeout: float = 120, ranks_per_host: int = 1):
        return subprocess.run(self.command(program, ranks_per_host), capture_output=True, text=True,
                              timeout=timeout, env=self.environment())

    def start(self, program: list[str], ranks_per_host: int = 1) -> subprocess.Popen:
        return subprocess.Popen(self.command(program, ranks_per_host), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.environment())

    def bytes_sent(self) -> dict:
        """{host: bytes sent through its eth0 so far}."""
        return {name: int(ip("-s", "-j", "link", "show", "eth0", namespace=name).stdout.split('"tx":{"bytes":')[1]
                          .split(",")[0]) for name in self.names}

    def cut_link(self, host: str) -> None:
        """Cut ``host`` off: its port leaves the switch, so nothing it sends arrives, nor anything sent to it.

        Both ends keep their carrier (as when a switch or a link further on fails): no program is
        told that anything happened, and MPI waits. (Taking the port down instead drops host's
        carrier, and its MPI library may then abort that rank by itself, which is another test.)
        """
        ip("link", "set", f"port{self.names.index(host) + 1}", "nomaster", namespace=SWITCH)


def _mpiexec() -> str:
    from nnlib.course.environment import mpiexec_path

    return mpiexec_path()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
