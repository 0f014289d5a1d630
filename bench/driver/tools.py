"""What a run needs installed and the binaries it measures: Debian's packages (fuse3,
s3fs, rclone, nginx-light, the font of the PNG), s3s-fs from crates.io, a Python with
boto3 for the chunk loader, the test venv with the scdlfs package for the torch system,
and the workspace's `scdlfs` and `scdlfs-bench` of the cargo profile measured."""

import os
import shutil
import subprocess
import sys

from .config import REPO
from .procs import log, run


class Binaries:
    """The `scdlfs` and `scdlfs-bench` a run measures, set once by `use_binaries`."""

    bench = scdlfs = None


BIN = Binaries()


def use_binaries(profile):
    """The binaries of `profile` in cargo's target directory (CARGO_TARGET_DIR, else the
    repository's target/), or those SCDLFS_BIN and SCDLFS_BENCH name (as scripts/test-all
    sets them)."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    out = os.path.join(target, "debug" if profile == "dev" else profile)
    BIN.bench = os.environ.get("SCDLFS_BENCH") or os.path.join(out, "scdlfs-bench")
    BIN.scdlfs = os.environ.get("SCDLFS_BIN") or os.path.join(out, "scdlfs")


def test_venv():
    """The venv of scripts/setup-python-venv (SCDLFS_VENV, else the repository's .venv)."""
    return os.environ.get("SCDLFS_VENV", os.path.join(REPO, ".venv"))


def moto_server():
    """moto_server from the test venv, else from PATH."""
    moto = os.path.join(test_venv(), "bin", "moto_server")
    if os.path.exists(moto):
        return moto
    return shutil.which("moto_server") or sys.exit("moto_server not found (scripts/setup-python-venv)")


def ensure_tools(args):
    need = []
    for cmd, pkg in [("fusermount3", "fuse3"), ("s3fs", "s3fs"), ("rclone", "rclone"),
                     ("nginx", "nginx-light")]:
        # nginx serves the objects of the s3s-nginx server and of the atlas endpoint.
        wants_nginx = args.server == "s3s-nginx" or "atlas" in args.systems.split(",")
        if shutil.which(cmd) is None and not (cmd == "nginx" and not wants_nginx):
            need.append(pkg)
    if not args.quick and not os.path.exists(args.font):
        need.append("fonts-dejavu-core")
    if need:
        log("installing " + " ".join(need))
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + need, env=env,
            stdout=subprocess.DEVNULL)
    if args.server == "s3s-nginx":
        s3s = os.path.join(args.work, "tools", "bin", "s3s-fs")
        if not os.path.exists(s3s):
            log("installing s3s-fs 0.14.1 from crates.io into %s (a few minutes)" % os.path.dirname(s3s))
            run(["cargo", "install", "s3s-fs", "--version", "0.14.1", "--features", "binary", "--locked",
                 "--root", os.path.join(args.work, "tools")],
                env=dict(os.environ, CARGO_TARGET_DIR=os.path.join(args.work, "tools", "target")))
        args.s3s_fs = s3s
    # Python for the chunk loader: boto3 (the repo's test venv has it; else a small venv).
    venv = test_venv()
    for py in [os.path.join(venv, "bin", "python"), os.path.join(args.work, "venv", "bin", "python")]:
        if os.path.exists(py) and subprocess.run([py, "-c", "import boto3"], stderr=subprocess.DEVNULL).returncode == 0:
            args.python = py
            break
    else:
        boto_venv = os.path.join(args.work, "venv")
        log("creating a venv with boto3 at " + boto_venv)
        run([sys.executable, "-m", "venv", boto_venv])
        run([os.path.join(boto_venv, "bin", "pip"), "install", "-q", "boto3==1.40.*"])
        args.python = os.path.join(boto_venv, "bin", "python")
    if {"torch", "node", "planned"} & set(args.systems.split(",")):
        # The test venv (torch, bionemo-scdl) with the scdlfs package installed from this tree
        # (the torch system, and the node scenario's SCDL reader).
        py = os.path.join(venv, "bin", "python")
        if not os.path.exists(py):
            sys.exit("the torch system needs the venv of scripts/setup-python-venv at %s" % venv)
        log("installing the scdlfs Python package into %s" % venv)
        run([py, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-build-isolation",
             "--no-deps", os.path.join(REPO, "crates", "scdlfs-python")],
            env=dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"]))
        args.torch_python = py
    if args.server == "moto":
        args.moto = moto_server()
    build_binaries(args)


def build_binaries(args):
    log("building the binaries (cargo profile %s)" % args.profile)
    run(["cargo", "build", "--profile", args.profile, "-q", "-p", "scdlfs", "-p", "scdlfs-bench"], cwd=REPO)
