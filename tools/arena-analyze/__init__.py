"""arena-analyze: thin command-line front end; all logic lives in libarena.analyze."""


def main() -> None:
    """The console script: imports the CLI (arena_analyze.main) only once a signal meanwhile has a one-line answer."""
    from libarena.entry import launch

    launch("arena-analyze", "arena_analyze.main")
