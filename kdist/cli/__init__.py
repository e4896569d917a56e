"""The `kdist` command line: `kdist demo | inspect | lint | plan | sweep | launch | zoo`."""

from kdist.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
