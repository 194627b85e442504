"""What the kubelet makes of a manifest's pod, rendered on this machine, and the daemon run so.

From the manifest alone: the ConfigMap and Secret volumes as the kubelet's atomic writer
lays them out (a timestamped directory, ``..data``, one symlink a key), files with the
volume's ``defaultMode``, root-owned; with a pod ``fsGroup`` every file and directory is
then group-owned by it with the read bits added (``SetVolumeOwnership``: ``g+r`` on
read-only volumes, ``g+rw`` on the others, setgid directories). An ``emptyDir`` starts
as ``0777``; a fresh ``PersistentVolumeClaim`` as a new filesystem's ``0755`` root.

The daemon then runs as the container would: ``runAsUser``/``runAsGroup`` (else the
image's ``USER``), supplementary groups = ``fsGroup`` + ``supplementalGroups`` only, no
capabilities, no new privileges, and with ``readOnlyRootFilesystem`` a private mount
namespace in which ``/`` is read-only and only the writable volumes are not.

Only what points outside this machine is changed in the rendered files: identity URLs
go to the local simulator, tokens are the simulator's, receivers point at a closed
loopback port, and paths under a mount point are moved under the render root.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
# The atomic writer's timestamped directory name, as the kubelet spells it.
TS_DIR = "..2026_01_01_00_00_00.000000001"
RO_MASK, RW_MASK, EXEC_MASK = 0o440, 0o660, 0o110


def image_user() -> tuple[int, int]:
    """The Dockerfile's ``USER uid:gid``: what runs when the pod says nothing."""
    m = re.search(r"^USER\s+(\d+):(\d+)\s*$", (ROOT / "Dockerfile").read_text(), re.M)
    assert m, "the Dockerfile has no numeric USER uid:gid"
    return int(m.group(1)), int(m.group(2))


@dataclass
class Mount:
    name: str
    path: str  # mountPath in the container
    host: Path  # where it is rendered here
    read_only: bool
    kind: str  # configMap | secret | emptyDir | persistentVolumeClaim


@dataclass
class Pod:
    manifest: Path
    docs: list[dict[str, Any]]
    container: dict[str, Any]
    uid: int
    gid: int
    fs_group: int | None
    groups: list[int]
    read_only_root: bool
    no_new_privs: bool
    mounts: list[Mount] = field(default_factory=list)

    def config_map(self, name: str) -> dict[str, str]:
        return dict(self._object("ConfigMap", name).get("data") or {})

    def secret(self, name: str) -> dict[str, str]:
        """The Secret's data; one the manifest leaves to the operator (kubectl create
        secret) starts empty and gets its keys from the rendered values."""
        if not any(d.get("kind") == "Secret" and d["metadata"]["name"] == name for d in self.docs):
            return {}
        obj = self._object("Secret", name)
        data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        data.update(obj.get("stringData") or {})
        return data

    def _object(self, kind: str, name: str) -> dict[str, Any]:
        for d in self.docs:
            if d.get("kind") == kind and d["metadata"]["name"] == name:
                return d
        raise AssertionError(f"{self.manifest.name}: no {kind} named {name!r}")

    def mount_for(self, path: str) -> Mount | None:
        """The mount that holds a container path (the longest mountPath prefix)."""
        best = None
        for m in self.mounts:
            if (path == m.path or path.startswith(m.path.rstrip("/") + "/")) and (
                best is None or len(m.path) > len(best.path)
            ):
                best = m
        return best

    def host_path(self, path: str) -> Path:
        m = self.mount_for(path)
        assert m is not None, f"{path} is not on any volume of the pod"
        return m.host / os.path.relpath(path, m.path)


def load(manifest: Path, container: str = "watchd") -> Pod:
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    workload = next(d for d in docs if d.get("kind") in ("Deployment", "StatefulSet", "Pod"))
    spec = workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]
    c = next(
        c
        for c in [*spec.get("initContainers", []), *spec.get("containers", [])]
        if c["name"] == container
    )
    pod_sc = spec.get("securityContext") or {}
    sc = {**pod_sc, **(c.get("securityContext") or {})}
    img_uid, img_gid = image_user()
    uid = int(sc.get("runAsUser", img_uid))
    gid = int(sc.get("runAsGroup", img_gid))
    fs_group = pod_sc.get("fsGroup")
    groups = sorted(
        {gid, *([int(fs_group)] if fs_group is not None else [])}
        | set(int(g) for g in pod_sc.get("supplementalGroups", []))
    )
    if sc.get("runAsNonRoot"):
        assert uid != 0, f"{manifest.name}: runAsNonRoot with uid 0 would not start"
    pod = Pod(
        manifest=manifest,
        docs=docs,
        container=c,
        uid=uid,
        gid=gid,
        fs_group=None if fs_group is None else int(fs_group),
        groups=groups,
        read_only_root=bool(sc.get("readOnlyRootFilesystem")),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
    )
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for vm in c.get("volumeMounts", []):
        v = volumes[vm["name"]]
        kind = next(
            k for k in ("configMap", "secret", "emptyDir", "persistentVolumeClaim") if k in v
        )
        # The kubelet mounts configMap and secret volumes read-only whatever the mount says.
        ro = bool(vm.get("readOnly")) or kind in ("configMap", "secret")
        pod.mounts.append(Mount(vm["name"], vm["mountPath"], Path(), ro, kind))
    return pod


def _atomic_write(top: Path, files: dict[str, str], mode: int) -> None:
    """The kubelet's AtomicWriter: files in a timestamped dir, ``..data`` and key links."""
    ts = top / TS_DIR
    ts.mkdir(parents=True)
    ts.chmod(0o755)
    for key, value in files.items():
        (ts / key).write_text(value)
        (ts / key).chmod(mode)
    (top / "..data").symlink_to(TS_DIR)
    for key in files:
        (top / key).symlink_to(f"..data/{key}")


def _set_volume_ownership(top: Path, gid: int, *, read_only: bool) -> None:
    """The kubelet's SetVolumeOwnership for an fsGroup (symlinks are lchown'd only)."""
    mask = RO_MASK if read_only else RW_MASK
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [".", *dirnames, *filenames]:
            p = Path(dirpath) / name if name != "." else Path(dirpath)
            os.lchown(p, -1, gid)
            if p.is_symlink():
                continue
            m = p.stat().st_mode & 0o7777
            if p.is_dir():
                m |= 0o2000 | EXEC_MASK
            p.chmod(m | mask)


def place(pod: Pod, root: Path) -> None:
    """Decide where each volume is rendered: ``root`` + its mountPath."""
    for m in pod.mounts:
        m.host = root / m.path.lstrip("/")


def render(pod: Pod, root: Path, *, values: dict[str, dict[str, str]]) -> None:
    """Lay out every volume of the container under ``root`` as the kubelet would.

    ``values`` replaces the content of files by volume name and key (tokens, config)."""
    volumes = {
        v["name"]: v
        for d in pod.docs
        if d.get("kind") in ("Deployment", "StatefulSet")
        for v in d["spec"]["template"]["spec"].get("volumes", [])
    }
    place(pod, root)
    for m in pod.mounts:
        m.host.parent.mkdir(parents=True, exist_ok=True)
        v = volumes[m.name]
        if m.kind in ("configMap", "secret"):
            src = v[m.kind]
            files = (
                pod.config_map(src["name"])
                if m.kind == "configMap"
                else pod.secret(src["secretName"])
            )
            files.update(values.get(m.name, {}))
            mode = int(src.get("defaultMode", 0o644))
            m.host.mkdir()
            m.host.chmod(0o1777 if m.kind == "secret" else 0o777)
            _atomic_write(m.host, files, mode)
        elif m.kind == "emptyDir":
            m.host.mkdir()
            m.host.chmod(0o777)
        else:  # a fresh filesystem's root
            m.host.mkdir()
            m.host.chmod(0o755)
        for p in [m.host, *m.host.rglob("*")]:
            os.lchown(p, 0, 0)
        if pod.fs_group is not None:
            # configMap and secret volumes are read-only to SetVolumeOwnership.
            _set_volume_ownership(m.host, pod.fs_group, read_only=m.kind in ("configMap", "secret"))


def command(pod: Pod, argv: list[str]) -> list[str]:
    """``argv`` as the container's process: uid, groups, no caps, read-only root."""
    setpriv = [
        "setpriv",
        f"--reuid={pod.uid}",
        f"--regid={pod.gid}",
        f"--groups={','.join(str(g) for g in pod.groups)}",
        "--inh-caps=-all",
        "--bounding-set=-all",
        *(["--no-new-privs"] if pod.no_new_privs else []),
        *argv,
    ]
    if not pod.read_only_root:
        return setpriv
    script = ["set -e", "mount -o remount,bind,ro /"]
    for m in pod.mounts:
        q = shlex.quote(str(m.host))
        script.append(f"mount --bind {q} {q}")
        script.append(f"mount -o remount,bind,{'ro' if m.read_only else 'rw'} {q}")
    script.append("exec " + shlex.join(setpriv))
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "; ".join(script)]


def start(pod: Pod, argv: list[str], *, log: Path) -> subprocess.Popen[bytes]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/nonexistent",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            command(pod, argv), stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/"
        )


def stop(proc: subprocess.Popen[bytes], grace: float) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return proc.returncode


PYTHON = sys.executable
CLOSED = "http://127.0.0.1:9/"  # the discard port: nothing listens, nothing leaves


def _moved(value: Any, pod: Pod) -> Any:
    """Container paths under a mount point → where that volume is rendered here."""
    if isinstance(value, dict):
        return {k: _moved(v, pod) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, pod) for v in value]
    if isinstance(value, str) and value.startswith("/") and pod.mount_for(value):
        return str(pod.host_path(value))
    return value


def prepare(
    pod: Pod, root: Path, *, url: str, tokens: list[str], listen: str | None, move_paths: bool
) -> list[str]:
    """Render the pod's volumes with this machine's endpoints; return the container's args.

    Identity URLs become ``url`` and their tokens ``tokens`` (in order); receivers point
    at a closed loopback port; other secret files the config names get made-up values.
    With ``move_paths`` (no container around the process) paths under a mount point and
    the ``-c`` argument are moved under ``root``; ``listen`` replaces ``server.listen``."""
    args = list(pod.container.get("args") or [])
    config_path = args[args.index("-c") + 1]
    cfg_mount = pod.mount_for(config_path)
    assert cfg_mount is not None and cfg_mount.kind == "configMap", config_path
    volumes = {
        v["name"]: v
        for d in pod.docs
        if d.get("kind") == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
    }
    cm = pod.config_map(volumes[cfg_mount.name]["configMap"]["name"])
    key = Path(config_path).name
    cfg = yaml.safe_load(cm[key])
    values: dict[str, dict[str, str]] = {}

    def secret_value(path: str, value: str) -> None:
        m = pod.mount_for(path)
        assert m is not None and m.kind == "secret", f"{path} is on no Secret volume"
        values.setdefault(m.name, {})[Path(path).name] = value + "\n"

    for ident, token in zip(cfg.get("identities", []), tokens, strict=False):
        ident["url"] = url
        secret_value(ident["token_file"], token)
    for r in cfg.get("receivers", []):
        if "pagerduty" in r:
            r["pagerduty"]["url"] = CLOSED
        if "slack" in r:
            secret_value(r["slack"]["webhook_url_file"], CLOSED)

    # Any other secret file the config references (an admin token, say): a made-up value.
    def refs(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for k, v in node.items():
                if k.endswith("_file") and isinstance(v, str):
                    yield v
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    for path in refs(cfg):
        m = pod.mount_for(path)
        if m is not None and m.kind == "secret" and Path(path).name not in values.get(m.name, {}):
            secret_value(path, secrets.token_hex(16))
    if listen is not None:
        cfg["server"]["listen"] = listen
    place(pod, root)
    if move_paths:
        cfg = _moved(cfg, pod)
    values.setdefault(cfg_mount.name, {})[key] = yaml.safe_dump(cfg)
    render(pod, root, values=values)
    if not move_paths:
        return args
    return [str(pod.host_path(a)) if a == config_path else a for a in args]
