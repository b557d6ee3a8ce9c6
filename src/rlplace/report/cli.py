"""`rlplace-report <multirun folder>`: (re)write a sweep's report.md and charts, print its table, and log it to
wandb when the sweep's jobs logged there (`--no-wandb`: not).

A folder the report cannot be made from (not a sweep's, a job without run.json or with an empty or damaged
metrics.jsonl) is refused with one line and exit code 2, as the other CLIs refuse bad input (`cli.fail`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from rlplace.cli import fail
from rlplace.report.callback import one_line, publish
from rlplace.report.collect import ReportError
from rlplace.report.dashboard import sweep_logging
from rlplace.report.write import make_report


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a wrong command line refused as every rlplace command refuses bad input: one line, exit 2."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (usage: {self.format_usage().removeprefix('usage: ').strip()})")


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "multirun_dir", type=Path, help="a folder under outputs/multiruns/ holding job folders 0, 1, ..."
    )
    parser.add_argument("--no-wandb", action="store_true", help="do not log the report to wandb")
    args = parser.parse_args(argv)
    try:
        report = make_report(args.multirun_dir)
        settings = sweep_logging(args.multirun_dir)
    except (ReportError, OSError) as err:
        fail(one_line(err))
    print(f"rlplace: sweep report in {report.path}")
    if not args.no_wandb:
        publish(report, settings)


if __name__ == "__main__":
    main()
