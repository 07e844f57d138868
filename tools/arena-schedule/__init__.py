"""arena-schedule: thin command-line front end; all logic lives in libarena.schedule."""


def main() -> None:
    """The console script: imports the CLI (arena_schedule.main) only once a signal meanwhile has a one-line answer."""
    from libarena.entry import launch

    launch("arena-schedule", "arena_schedule.main")
