"""`rlplace-report <multirun folder>`: (re)write a sweep's report.md and charts, and print its table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlplace.report.write import write_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "multirun_dir", type=Path, help="a folder under outputs/multiruns/ holding job folders 0, 1, ..."
    )
    args = parser.parse_args(argv)
    if not args.multirun_dir.is_dir():
        parser.error(f"{args.multirun_dir} is not a folder")
    print(f"rlplace: sweep report in {write_report(args.multirun_dir)}")


if __name__ == "__main__":
    main()
