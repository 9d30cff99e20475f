"""The embed stage on 2 ranks, one of which fails mid-write, as on a full disk:

    python -m tests.helpers.embed_fault_worker RANK [OVERRIDE ...]

starts 2 copies of itself under torchrun's launcher (as embed.nproc=2 starts stages.embed); in
each, the stage runs with the overrides, and on rank RANK writing a shard file raises OSError
after the file is half written (np.save writes it, then fails). Exits with the launcher's code.
"""

from __future__ import annotations

import os
import sys

import numpy as np  # noqa: E402

from stages import startup  # noqa: E402

startup.begin()  # first: the portable numerics before torch is imported, as a stage does
from pipeline.core import distributed, numerics  # noqa: E402
from stages import embed  # noqa: E402


def main(argv: list[str]) -> int:
    if not distributed.under_launcher():
        return distributed.launch(2, "tests.helpers.embed_fault_worker", argv, "embed")
    rank, overrides = int(argv[0]), argv[1:]
    if distributed.from_env().rank == rank:
        save = np.save

        def failing_save(path, arr, *args, **kwargs):
            save(path, arr[: len(arr) // 2], *args, **kwargs)
            raise OSError(f"No space left on device (injected on rank {rank})")

        np.save = failing_save
    if not numerics.pinned():  # ENERGY_FLOW_NUMERICS=native: as the stage's __main__ does
        os.environ.setdefault(*embed.STRICT_GEMM)
    return embed.main(overrides)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
