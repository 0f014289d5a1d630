"""The ``scdlfs`` command of the wheel: runs the daemon binary that the wheel carries in
``scdlfs/bin/`` (put there by ``scripts/build-wheel``), with the command line as given."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent / "bin" / "scdlfs"


def main() -> None:
    if not BUNDLED.is_file():
        sys.exit(
            "scdlfs: this install of the scdlfs package carries no scdlfs binary (it was built "
            "without scripts/build-wheel); install the wheel, or build the binary with cargo"
        )
    os.execv(BUNDLED, [str(BUNDLED), *sys.argv[1:]])
