"""The Kubernetes deployment (deploy/kubernetes) is valid: every manifest passes the
Kubernetes schemas, and the scdlfs arguments of every container parse with the
binary's own argument parser."""

import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
SCDLFS_BIN = os.environ.get("SCDLFS_BIN", str(REPO / "target" / "release" / "scdlfs"))


def documents():
    for path in MANIFESTS:
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            yield pytest.param(document, id=f"{path.name}#{index}-{document['kind']}")


def scdlfs_argument_lists():
    """The argument lists the manifests give the scdlfs binary: a container of an
    scdlfs image with args, or a command that runs it."""
    for path in MANIFESTS:
        for document in yaml.safe_load_all(path.read_text()):
            spec = document.get("spec", {})
            pod = spec.get("template", {}).get("spec", spec)
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                command = container.get("command", [])
                if command and command[0].endswith("/scdlfs"):
                    yield pytest.param(command[1:], id=f"{path.name}:{container['name']}:command")
                elif not command and container["image"].startswith("scdlfs:"):
                    yield pytest.param(container["args"], id=f"{path.name}:{container['name']}:args")
            for probe in ("readinessProbe", "livenessProbe"):
                for container in pod.get("containers", []):
                    command = container.get(probe, {}).get("exec", {}).get("command", [])
                    if command and command[0].endswith("/scdlfs"):
                        yield pytest.param(command[1:], id=f"{path.name}:{container['name']}:{probe}")
            for container in pod.get("containers", []):
                hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {})
                command = hook.get("command", [])
                if command and command[0].endswith("/scdlfs"):
                    yield pytest.param(command[1:], id=f"{path.name}:{container['name']}:preStop")


def test_there_are_manifests_to_check():
    assert MANIFESTS, "deploy/kubernetes holds no manifests"
    assert len(list(scdlfs_argument_lists())) >= 3


@pytest.mark.parametrize("document", documents())
def test_every_manifest_passes_the_kubernetes_schemas(document):
    kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_a_broken_manifest_fails_the_schema_check():
    daemonset = next(
        d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/scdlfs-daemonset.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )
    daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPropagation"] = 7
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, kubernetes_validate.latest_version(), strict=True)


def test_an_upgrade_replaces_a_mount_pod_only_when_it_is_deleted():
    """A rolling update would replace the mount under running training pods, whose open
    files then fail (docs/kubernetes.md, "Upgrades")."""
    daemonset = next(
        d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/scdlfs-daemonset.yaml").read_text())
        if d["kind"] == "DaemonSet"
    )
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}


def parses(arguments):
    """Whether scdlfs's parser accepts `arguments`: with --help last, clap checks every
    flag and value before it and then prints help instead of running."""
    result = subprocess.run(
        [SCDLFS_BIN, *arguments, "--help"], capture_output=True, text=True, timeout=30
    )
    return result.returncode == 0, result.stderr


@pytest.mark.parametrize("arguments", scdlfs_argument_lists())
def test_the_manifests_scdlfs_arguments_parse(arguments):
    ok, stderr = parses(arguments)
    assert ok, stderr
    assert not parses([*arguments, "--no-such-option"])[0]
    bad_value = [a.replace("200GiB", "200 potatoes") for a in arguments]
    if bad_value != arguments:
        assert not parses(bad_value)[0]
