"""One wheel: `scripts/build-wheel` makes a wheel that, installed with pip into a fresh
venv on a PATH without cargo or rustc, gives the `scdlfs` command (`scdlfs demo` runs)
and `scdlfs.mount(...)` over the moto S3 server, with the binary from the wheel.

The wheel bundles the binary under test (SCDLFS_BIN, the suite's ci build); its
extension is built in release, as `pip install ./crates/scdlfs-python` already did.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import scdl_helpers as H

NAME = "synth_3k"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built as a user would, without the test environment: build-wheel installs the
    maturin it needs (and only that) into a build venv of its own."""
    out = tmp_path_factory.mktemp("wheel")
    build_venv = tmp_path_factory.mktemp("build") / "venv"
    env = {k: v for k, v in os.environ.items() if k != "SCDLFS_VENV"}
    env.update(SCDLFS_BIN=str(H.require_scdlfs()), SCDLFS_BUILD_VENV=str(build_venv))
    H.run([H.REPO_ROOT / "scripts" / "build-wheel", out], timeout=600, env=env)
    wheels = list(out.glob("scdlfs-*.whl"))
    assert len(wheels) == 1, wheels
    assert not (H.REPO_ROOT / "crates/scdlfs-python/python/scdlfs/bin").exists(), "the bundled binary was left in the tree"
    installed = H.run([build_venv / "bin" / "python", "-m", "pip", "list", "--format", "freeze"], env=env).stdout
    assert {line.split("==")[0].lower() for line in installed.split()} <= {"maturin", "pip", "setuptools"}, installed
    return wheels[0]


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory):
    """A venv with nothing but the wheel, and the environment of a machine without Rust."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    path = f"{venv / 'bin'}:/usr/bin:/bin"
    assert shutil.which("cargo", path=path) is None and shutil.which("rustc", path=path) is None
    env = {k: v for k, v in H.safe_aws_env().items() if k not in ("SCDLFS_BIN", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = path
    H.run([sys.executable, "-m", "venv", venv], timeout=120, env=env)
    H.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel], timeout=120,
          env=env)  # fmt: skip
    return venv, env


def test_the_wheel_is_tagged_by_the_glibc_its_binary_needs(wheel):
    assert wheel.name.startswith("scdlfs-0.1.0-cp311-abi3-manylinux_2_") and wheel.name.endswith("_x86_64.whl")


def test_the_installed_command_runs_the_demo(fresh_venv, tmp_path):
    venv, env = fresh_venv
    scdlfs = shutil.which("scdlfs", path=env["PATH"])
    assert scdlfs == str(venv / "bin" / "scdlfs")
    version = H.run([scdlfs, "--version"], env=env)
    assert version.stdout.startswith("scdlfs ")
    demo = H.run([scdlfs, "demo", "--rows", "6000", "--workdir", tmp_path], env=env, timeout=180)
    print(demo.stdout)
    assert "every row matched its source" in demo.stdout
    assert "unmounted cleanly" in demo.stdout


MOUNT_SCRIPT = """
import json, sys
import scdlfs
from scdlfs._mount import scdlfs_binary

source, endpoint, name = sys.argv[1:]
with scdlfs.mount(source, cache_size="64MiB", endpoint_url=endpoint) as m:
    names = sorted(p.name for p in m.mountpoint.iterdir())
    header = (m.mountpoint / name / "header.sch").read_bytes()
print(json.dumps({"binary": scdlfs_binary(), "names": names, "header": header.hex(), "mounted_after": m.mounted}))
"""


def test_python_mounts_with_the_binary_from_the_wheel(fresh_venv, bucket, moto, monolithic):
    venv, env = fresh_venv
    out = H.run([venv / "bin" / "python", "-c", MOUNT_SCRIPT, bucket.source, moto.endpoint, NAME], env=env,
                timeout=180)  # fmt: skip
    got = json.loads(out.stdout)
    assert got["binary"].startswith(str(venv)), got["binary"]
    assert got["names"] == ["edge", NAME]
    assert bytes.fromhex(got["header"]) == (monolithic[NAME] / "header.sch").read_bytes()
    assert got["mounted_after"] is False


def test_the_readmes_first_python_snippet_runs_as_written(bucket, moto, tmp_path):
    """The README's first Python snippet, with only its bucket, cache size, endpoint and
    epochs made this test's: it runs through and exits cleanly (no warning of ours)."""
    readme = (H.REPO_ROOT / "README.md").read_text()
    snippet = readme.split("```python\n", 1)[1].split("```", 1)[0]
    url, size = '"s3://my-bucket/atlas/tahoe", cache_size="200GiB"', "range(10)"
    assert url in snippet and size in snippet, snippet
    snippet = snippet.replace(url, f'"{bucket.source}/{NAME}", cache_size="64MiB", endpoint_url="{moto.endpoint}"')
    snippet = snippet.replace(size, "range(2)")
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    out = H.run([sys.executable, script], env=H.safe_aws_env(), timeout=300)
    # torch warns that sparse CSR tensors (bionemo's collate makes them) are in beta.
    warned = [line for line in out.stderr.splitlines() if "Warning" in line and "Sparse" not in line]
    assert not warned, out.stderr
