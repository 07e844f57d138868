"""arena-profile: thin command-line front end; all logic lives in libarena.profile."""


def main() -> None:
    """The console script: imports the CLI (arena_profile.main) only once a signal meanwhile has a one-line answer."""
    from libarena.entry import launch

    launch("arena-profile", "arena_profile.main")
