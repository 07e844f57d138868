"""arena-plan: thin command-line front end; all logic lives in libarena.plan."""


def main() -> None:
    """The console script: imports the CLI (arena_plan.main) only once a signal meanwhile has a one-line answer."""
    from libarena.entry import launch

    launch("arena-plan", "arena_plan.main")
