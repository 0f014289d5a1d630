"""MosaicML Streaming, issue 39's peer in the small-cache system: the large chunks' rows
written once as its MDS shards (bench/streaming_loader.py, into the folder the S3 server
serves), then read through the same server and link as scdlfs with its default shuffle,
from a fresh cache holding every shard and from the smallest cache it accepts (four of
its largest shards: it refuses less). Its GETs are the link's requests during the epoch.

`mosaicml-streaming` declares transformers, torchvision and the clouds' SDKs among its
requirements (and a numpy the test venv's bionemo-scdl does not take), so it gets a venv
of its own that sees the test venv's packages (torch, numpy, boto3) through a `.pth` file
and adds the pinned few its import needs, without their requirements."""

import json
import os
import subprocess
import sys

from .config import BUCKET, DROPPED, KEY, REPO, SECRET
from .measure import Epoch, drop_page_cache, run_sampling_rss, tag
from .procs import clean_env, log, run
from .servers import proxy_counters
from .tools import test_venv

STREAMING = "MosaicML Streaming"
ORDER = "its shuffle (py1e)"
# What `import streaming` needs beyond the test venv, at versions that import together
# with its torch; pip resolved them with their requirements once, and these are installed
# without theirs.
STREAMING_PACKAGES = [
    "mosaicml-streaming==0.13.0", "xxhash==4.1.0", "zstd==1.5.7.2", "python-snappy==0.7.3", "cramjam==2.14.0",
    "brotli==1.2.1", "catalogue==2.0.10", "pillow==13.0.0", "transformers==4.57.6", "huggingface_hub==0.36.2",
    "safetensors==0.8.0", "tokenizers==0.22.2", "torchvision==0.29.2",
]
# Its smallest cache, in its largest shards (its writer's default: 64 MiB).
SHARDS_PER_SMALLEST_CACHE = 4


def streaming_python(args):
    """The Python of the Streaming venv (made once in the work directory)."""
    venv = os.path.join(args.work, "streaming-venv")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(os.path.join(venv, "ready")):
        return python
    test_python = os.path.join(test_venv(), "bin", "python")
    if not os.path.exists(test_python):
        sys.exit("the MosaicML Streaming peer needs the venv of scripts/setup-python-venv at %s" % test_venv())
    log("creating a venv with mosaicml-streaming at %s" % venv)
    run([sys.executable, "-m", "venv", "--clear", venv])
    test_site = subprocess.run([test_python, "-c", "import site; print(site.getsitepackages()[0])"],
                               check=True, capture_output=True, text=True).stdout.strip()
    own_site = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                              check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(own_site, "scdlfs-bench-test-venv.pth"), "w") as f:
        f.write(test_site + "\n")
    run([python, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps"] + STREAMING_PACKAGES)
    run([python, "-c", "import streaming"])
    open(os.path.join(venv, "ready"), "w").close()
    return python


def mds_shards(large, python):
    """The prefix of the large chunks' MDS shards in the bucket (written once)."""
    prefix = large.name + "-mds"
    out = os.path.join(large.args.work, "s3root", BUCKET, prefix)
    if not os.path.exists(os.path.join(out, "index.json")):
        log("writing %s's rows as MDS shards" % large.name)
        run([python, os.path.join(REPO, "bench", "streaming_loader.py"), "write", "--dataset",
             os.path.join(large.args.work, "s3root", BUCKET, large.name), "--digests", large.digests, "--out", out])
    return prefix, out


def smallest_cache(shards_dir):
    """The least `cache_limit` Streaming accepts for these shards."""
    index = json.load(open(os.path.join(shards_dir, "index.json")))
    return SHARDS_PER_SMALLEST_CACHE * max(s["raw_data"]["bytes"] for s in index["shards"])


def read_streaming(large, python, source, label, run_i, cache_limit=None, limit=None):
    """One epoch of Streaming's reader from `source` (s3://... or the shards' folder); its
    peak RSS sampled while it runs."""
    cache = os.path.join(large.work, "cache", "streaming")
    cmd = [python, os.path.join(REPO, "bench", "streaming_loader.py"), "read", "--remote", source,
           "--digests", large.digests, "--cache-dir", cache, "--seed", str(run_i)]
    if cache_limit:
        cmd += ["--cache-limit", str(cache_limit)]
    if limit:
        cmd += ["--time-limit", str(limit)]
    env = clean_env()
    env.update(S3_ENDPOINT_URL=large.proxy, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_DEFAULT_REGION="us-east-1")
    drop_page_cache()
    counters0 = proxy_counters(large.stats)
    proc, out, err, rss = run_sampling_rss(cmd, env)
    if proc.returncode != 0:
        raise RuntimeError("MosaicML Streaming failed (%s): %s" % (label, err.strip()[-2000:]))
    counters = proxy_counters(large.stats)
    r = json.loads(out)
    r.update(bytes_fetched=counters["bytes_down"] - counters0["bytes_down"], daemon_peak_rss_kib=rss,
             link_requests=counters["requests"] - counters0["requests"], cache_limit=cache_limit)
    return tag(r, Epoch(label, ORDER, 2 * run_i, DROPPED), "MDS shards")


def sys_streaming(large, run_i, prefix):
    """Streaming's cold epoch with every shard kept and from the shards' local folder (no
    download: its reader and the local disk), both whole (its rate climbs through the epoch, so the first
    seconds do not extrapolate), and with its smallest cache (time-bounded)."""
    python = streaming_python(large.args)
    shards, shards_dir = mds_shards(large, python)
    remote = "s3://%s/%s" % (BUCKET, shards)
    smallest = smallest_cache(shards_dir)
    label = prefix + STREAMING + ", "
    return [read_streaming(large, python, remote, label + "full cache", run_i),
            read_streaming(large, python, shards_dir, label + "local shards", run_i),
            read_streaming(large, python, remote, label + "cache %.0f%% (its least)" % (
                100 * smallest / large.info["bytes"]), run_i, smallest, limit=large.limit)]
