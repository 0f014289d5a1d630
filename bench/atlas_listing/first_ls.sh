#!/bin/bash
# The first `ls` of each atlas through a fresh `scdlfs mount` of serve.py's endpoint, with
# the daemon's CPU seconds for it (docs/manifest.md, "Measured"):
#   python make.py ROOT/atlas/ds24k 100000000 4096; python make.py ROOT/atlas/ds10k 100000000 10000
#   python serve.py ROOT 39111 0.15 &      # (scdlfs manifest s3://atlas/ds24k --endpoint-url ... for the manifest figures)
#   BIN=target/ci/scdlfs bench/atlas_listing/first_ls.sh LABEL
BIN=${BIN:-target/ci/scdlfs}
PORT=${PORT:-39111}
M=$(mktemp -d); C=$(mktemp -d)
export AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for ds in ${DATASETS:-ds24k ds10k}; do
  rm -rf "$C"/*
  $BIN mount s3://atlas "$M" --endpoint-url http://127.0.0.1:$PORT --cache-dir "$C" --cache-size 1GiB --foreground 2> "$C.$ds.log" &
  pid=$!
  for _ in $(seq 100); do mountpoint -q "$M" && break; sleep 0.1; done
  c0=$(cpu $pid); s=$(date +%s.%N); n=$(ls -a "$M/$ds" 2>&1 | wc -l); e=$(date +%s.%N); c1=$(cpu $pid)
  echo "$1 $ds first ls: $(echo "$e - $s" | bc) s, $n entries, daemon CPU $(echo "($c1 - $c0)/100" | bc -l | cut -c1-5) s, load $(cut -d' ' -f1 /proc/loadavg)"
  $BIN unmount "$M"; wait $pid
done
rmdir "$M"; rm -rf "$C" "$C".*.log
