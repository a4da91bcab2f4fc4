"""The `mlbench` command (and `python -m mlbench`): the CLI, imported here so that Ctrl-C while its modules load
(the first few tenths of a second, before the CLI's own handling of signals) ends in one line, exit 130, instead
of a KeyboardInterrupt traceback. Nothing is written before the CLI runs."""

import sys


def main() -> None:
    try:
        from mlbench.cli import main as cli_main
    except KeyboardInterrupt:
        print("mlbench: stopped (SIGINT) while starting; nothing was written", file=sys.stderr)
        sys.exit(130)
    cli_main()


if __name__ == "__main__":
    main()
