"""arena-analyze: thin command-line front end; all logic lives in libarena.analyze."""
