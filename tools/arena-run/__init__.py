"""arena-run: thin command-line front end; all logic lives in libarena.run."""


def main() -> None:
    """The console script: imports the CLI (arena_run.main) only once a signal meanwhile has a one-line answer."""
    from libarena.entry import launch

    launch("arena-run", "arena_run.main")
