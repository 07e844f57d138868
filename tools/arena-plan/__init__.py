"""arena-plan: thin command-line front end; all logic lives in libarena.plan."""
