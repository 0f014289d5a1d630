"""The scdlfs benchmark driver as a package; bench/run.py is its command line.

Its modules, from the bottom up:
  config         what every module agrees on: paths, bucket and keys, labels, sizes
  procs          child processes, ports and mounts, and their cleanup at exit
  tools          what a run installs (Debian, crates.io, PyPI) and the binaries it measures
  servers        the dataset, the S3 server on 127.0.0.1, the emulated link, the server's ceiling
  measure        one epoch: page-cache state, reader, /proc counters, daemon CPU, RSS, status
  offline_bound  the half-cache case's yardstick (Belady's rule over the epoch's chunks)
  summary        medians, ratios against local disk, and the targets (`Report`)
  systems        the systems under test (local disk, scdlfs, s3fs-fuse, rclone, the loaders)
  restart        the restart system: a cache across a remount, mount to first row
  node           the node scenario: R rank processes reading their shares on one mount
                 (scdlfs-bench ranks, and ranks of the SCDL reader through a DataLoader)
  ceiling        the daemon with no link: its own ceiling beside local disk
  large          large chunks (8 of 180 MB, windows of 2) behind a link of their own
  hostile        another user's cold epoch alone and beside the tests' hostile hint writer
  atlas          an atlas-sized dataset (bench/atlas/): first `ls` with and without a manifest,
                 first row, 8 ranks' samplers and reads, the daemon's RSS
  cpu          the daemon's CPU per GB with no network: sequential readers of a local folder
  node_targets   the targets table of issue 29, every row from the results
  registry       which system reads in which order, in the order a run reads them
  report         docs/benchmarks.md, README's summary block and the PNG
  quick          what the reduced variant (`--quick`) checks
  runner         one run: everything above, in order
bench/chunk_rows.py reuses procs, tools, servers, measure and systems."""
