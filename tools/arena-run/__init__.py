"""arena-run: thin command-line front end; all logic lives in libarena.run."""
