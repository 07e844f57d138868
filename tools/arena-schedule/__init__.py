"""arena-schedule: thin command-line front end; all logic lives in libarena.schedule."""
