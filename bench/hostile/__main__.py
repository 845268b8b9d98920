"""``python -m bench.hostile [--part streams|intermediary] [--scale small|full] [--only NAME
...]``: see the package's docstring. The streams part writes ``bench/results/hostile.json``
and ``.md``, the intermediary part ``hostile-intermediary.json`` and ``.md``."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from bench.harness.machine import code_version, machine_info
from bench.harness.progress import say
from bench.harness.report import write_report
from bench.hostile import intermediary, streams
from bench.hostile.runner import SCALES

#: Each part's module: its NAME (the report's), ATTACKS (name -> what), run and markdown.
PARTS = {"streams": streams, "intermediary": intermediary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--part", choices=PARTS, default="streams")
    parser.add_argument("--scale", choices=SCALES, default="full")
    parser.add_argument("--only", nargs="*", default=[], metavar="ATTACK")
    args = parser.parse_args()
    part = PARTS[args.part]
    unknown = sorted(set(args.only) - set(part.ATTACKS))
    if unknown:
        parser.error(
            f"--only: {', '.join(unknown)}: not an attack of the {args.part} part "
            f"(its attacks: {', '.join(part.ATTACKS)})"
        )
    machine = machine_info(spark=False)
    with tempfile.TemporaryDirectory(prefix=f"bench-hostile-{args.part}-") as tmp:
        result = asyncio.run(part.run(Path(tmp), args.scale, args.only))
    result |= {"machine": machine, "code": code_version()}
    json_path, md_path = write_report(part.NAME, result, part.markdown(result, machine))
    say(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
