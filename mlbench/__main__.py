"""The `mlbench` command (and `python -m mlbench`): the CLI, imported here so that Ctrl-C while its modules load
(the first few tenths of a second, before the CLI's own handling of signals) ends in one line, exit 130, instead
of a KeyboardInterrupt traceback, and a dependency that cannot be imported (removed, half installed) in one line,
exit 1. Nothing is written before the CLI runs."""

import sys


def main() -> None:
    try:
        try:
            from mlbench.cli import main as cli_main
        except KeyboardInterrupt:
            print("mlbench: stopped (SIGINT) while starting; nothing was written", file=sys.stderr)
            sys.exit(130)
        cli_main()
    except ModuleNotFoundError as e:  # a dependency removed or half installed: was a traceback ending in its name
        module = (e.name or "").partition(".")[0]
        if module in ("", "mlbench"):
            raise
        from mlbench.errors import missing_package

        print(f"mlbench: {missing_package(module)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
